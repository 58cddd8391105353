"""MIG slices in HTCondor's accounting and limits: the config ``mig-batch htcondor install`` writes for them.

What a MIG job holds is its instance's memory slices (a 3g.40gb on an A100-80GB: 4 of 8), as on Slurm
(``slice_gres``, docs/slurm.md "Accounting"). HTCondor sees them through a custom machine resource:

- every execute node advertises ``MigSlices``, the memory slices of its GPUs (from the site's ``nodes:``);
- mig-batchd's pin writes the job's count into ``MigBatchSlices`` (``HTCondorBatch.pin_and_release``, from
  ``Pin.slices``), a protected job attribute the schedd drops from every new job, so that only the
  controller's identity sets it; the schedd makes every job's ``RequestMigSlices`` the expression
  ``MigBatchSlices ?: 0`` (and protects it), so the startd carves exactly the pinned count out of the node's
  partitionable slot, and a job that is not mig_batch's asks for none;
- the startd's ``SLOT_WEIGHT`` is the slot's ``MigSlices`` when it holds any, else its ``Cpus`` (HTCondor's
  default weight): user priority (``condor_userprio``'s weighted use), accounting-group quotas (counted in
  slot weight) and the negotiator's fair share count a MIG job's slices, and every other job its cores.

- each MIG job also takes its slices from the concurrency limit ``mig_slices.<Owner>``: a site caps a user's
  slices with ``CONCURRENCY_LIMIT_DEFAULT_MIG_SLICES = 16`` (every user) or ``MIG_SLICES.ALICE_LIMIT = 32`` (one
  user) on the central manager, and a job over the cap stays idle with ``LastRejMatchReason = "concurrency
  limit mig_slices.alice reached"``. The owner's own ``concurrency_limits`` are kept (moved to
  ``MigBatchOwnLimits``, which the owner may still edit) and the controller's part appended.

Group quotas are the site's (``GROUP_QUOTA_<group>`` on the central manager, in slot weight, so slices for
MIG jobs): docs/htcondor.md "Accounting".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mig_batch.mig.models import GpuModel

SLICES_ATTR = "MigBatchSlices"  # job: the memory slices the pinned instance holds (the controller's, protected)
RESOURCE = "MigSlices"  # machine resource: the node's memory slices; a job's RequestMigSlices
TRANSFORM = "MigBatchSlices"
SLOT_WEIGHT = f"ifThenElse({RESOURCE} > 0, {RESOURCE}, Cpus)"
LIMIT = "mig_slices"  # the concurrency limit a MIG job's slices count against: mig_slices.<Owner>
OWN_LIMITS_ATTR = "MigBatchOwnLimits"  # the owner's own concurrency_limits, kept
# the owner's limits, then (once pinned) mig_slices.<Owner>:<slices>; Owner is the schedd's, not the user's to set
LIMITS = (f"ifThenElse({SLICES_ATTR} is undefined, {OWN_LIMITS_ATTR}, strcat(ifThenElse({OWN_LIMITS_ATTR} is "
          f'undefined, "", strcat({OWN_LIMITS_ATTR}, ",")), "{LIMIT}.", Owner, ":", {SLICES_ATTR}))')


def node_slices(models: Sequence[GpuModel]) -> int:
    """The memory slices of a node's GPUs (8 per A100/H100, 4 per A30)."""
    return sum(m.memory_slices for m in models)


def schedd_config() -> str:
    """The schedd's part: the pin's count protected and dropped at submission, every job's slice request and
    concurrency limits made from it (both protected: expressions over the pin's count, evaluated at matching)."""
    return "\n".join([
        f"PROTECTED_JOB_ATTRS = $(PROTECTED_JOB_ATTRS) {SLICES_ATTR} Request{RESOURCE} ConcurrencyLimits",
        f"JOB_TRANSFORM_NAMES = $(JOB_TRANSFORM_NAMES) {TRANSFORM}",
        f"JOB_TRANSFORM_{TRANSFORM} @=end",
        f"   DELETE {SLICES_ATTR}",
        f"   SET Request{RESOURCE} {SLICES_ATTR} ?: 0",
        f"   RENAME ConcurrencyLimits {OWN_LIMITS_ATTR}",
        f"   SET ConcurrencyLimits {LIMITS}",
        "@end",
        "",
    ])  # fmt: skip


def node_resource(slices: int, prefix: str = "") -> str:
    """One startd's ``MigSlices`` count; ``prefix``: a local-name prefix (``NODEB.``) for a second startd."""
    return f"{prefix}MACHINE_RESOURCE_{RESOURCE} = {slices}\n"


def execute_config(nodes: Mapping[str, Sequence[GpuModel]]) -> str:
    """The execute nodes' part: each node's count by its name (``$(HOSTNAME)``, as ``MigBatchNodeName``; 0 for a
    node not in the inventory) and the slot weight."""
    return "\n".join([
        *(f"MIG_BATCH_SLICES_{node} = {node_slices(models)}" for node, models in sorted(nodes.items())),
        f"MACHINE_RESOURCE_{RESOURCE} = $(MIG_BATCH_SLICES_$(HOSTNAME):0)",
        f"SLOT_WEIGHT = {SLOT_WEIGHT}",
        "",
    ])  # fmt: skip
