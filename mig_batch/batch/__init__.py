"""The batch-system seam: what the controller and the node agent need from Slurm or HTCondor.

``system`` holds the protocol and the neutral job record, ``tags`` the text the controller and the
nodes exchange through the batch system (operator-only job fields), ``states`` the decision and chain
life cycles, ``fake`` an in-memory batch system for unit tests. Implementations live beside it
(``mig_batch.slurm``); nothing here imports them.
"""
