"""What one pass of the controller reads from the batch system, once, and the caches that live one pass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mig_batch.batch.system import After, BatchJob, NodeStatus

# a request as the fences try it: its profiles by model, its instances, the nodes outside its reach
FitKey = tuple[frozenset[tuple[str, str]], int, frozenset[str]]


@dataclass(frozen=True)
class PassSnapshot:
    """The jobs and nodes as listed at ``listed_at`` (just before the listing) and ``now`` (just after), both
    from the controller's clock. Every phase of the pass decides on this one listing."""

    listed_at: float
    now: float
    jobs: Mapping[str, BatchJob]
    nodes: tuple[NodeStatus, ...]
    inventory: frozenset[str]  # the nodes of the site's inventory
    # this pass's caches (filled as phases ask): records by job array, nodes outside each partition list,
    # requests MIG fits on no up node (the view only fills during a pass)
    _arrays: dict[str, list[BatchJob]] = field(default_factory=dict, repr=False)
    _outside_of: dict[tuple[str, ...], frozenset[str]] = field(default_factory=dict, repr=False)
    fits_nowhere: set[FitKey] = field(default_factory=set, repr=False)

    @property
    def cpus(self) -> dict[str, int]:
        """Each node's CPUs, where the batch system says."""
        return {n.node: n.cpus_total for n in self.nodes if n.cpus_total is not None}

    @property
    def partitions(self) -> dict[str, frozenset[str]]:
        """Each node's partitions (a node without any listed takes any job's)."""
        return {n.node: frozenset(n.partitions) for n in self.nodes if n.partitions}

    def outside_partitions(self, partitions: tuple[str, ...]) -> frozenset[str]:
        """The inventory's nodes in none of ``partitions`` (none for a job that names none, or where the
        batch system lists no partitions): Slurm refuses a pin there."""
        outside = self._outside_of.get(partitions)
        if outside is None:
            named = set(partitions)
            outside = frozenset(n.node for n in self.nodes if partitions and n.partitions and n.node in self.inventory
                                and not frozenset(n.partitions) & named)  # fmt: skip
            self._outside_of[partitions] = outside
        return outside

    def awaited(self, after: After) -> list[BatchJob]:
        """This pass's records of what ``after`` names: the job, the array's task or every task of the array."""
        if not after.array:
            job = self.jobs.get(after.job_id)
            return [job] if job is not None else []
        if not self._arrays:
            self._arrays[""] = []  # listed (an array is never named ""): even with no array, list once
            for j in self.jobs.values():
                if j.array:
                    self._arrays.setdefault(j.array, []).append(j)
        records = self._arrays.get(after.array, [])
        task = after.task
        if task is None:
            return records
        own = [r for r in records if r.array_tasks == (range(task, task + 1),)]  # Slurm looks there first
        return own or [r for r in records if any(task in tasks for tasks in r.array_tasks)]
