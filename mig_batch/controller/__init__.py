"""mig-batchd: the controller that places managed jobs and pins them in the batch system."""
