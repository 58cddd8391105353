"""The batch-neutral node room: the agent that provisions, binds, destroys and reconciles a node's MIG
instances (``agent``), its local journal (``journal``), its socket service (``service``) and the hook
client the batch system's hooks run (``hook_client``, standard library only)."""
