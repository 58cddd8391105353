"""The environment variables the node agent gives a subjob, read by the subjob helper and its runner.

Here, below both, so that the node agent (which writes them) and :mod:`mig_batch.subjob` (which reads them)
share the names without the node importing the job side.
"""

ENV_DEADLINE = "MIG_BATCH_DEADLINE"  # epoch seconds at which the subjob's window closes
ENV_MARGIN = "MIG_BATCH_CHECKPOINT_MARGIN"  # seconds before the deadline to checkpoint
