"""Test harnesses: real batch systems on one machine, kept out of the wheel (they only serve tests and
``mig-batch bench controller`` from a checkout).

- ``slurm_cluster``: ``LocalCluster`` (munged, slurmctld, several slurmd) and ``MigTestbed`` (that cluster
  with mig_batch installed on emulated GPUs, each node in its own mount namespace)
- ``htcondor_pool``: ``LocalPool``, a real HTCondor pool in a Debian sid chroot
- ``htcondor_testbed``: ``HTCondorTestbed``, mig_batch on that pool

Imported as ``harness``: pytest puts ``tests/`` on ``sys.path`` (``tests/conftest.py`` with no
``tests/__init__.py``, the default import mode), also under ``PYTHONSAFEPATH=1``, which only stops
Python itself from adding the working directory. Elsewhere put ``tests/`` on the path
(``PYTHONPATH=tests``). Nothing here runs in the processes the harnesses start: those run
``python -m mig_batch...`` from the installed package.
"""
