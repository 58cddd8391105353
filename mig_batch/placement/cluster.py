"""Cluster state for placement: hosts -> GPUs -> instances, indexed by occupancy mask.

Every score the policies use depends only on a GPU's model and occupancy mask, so GPUs are kept in
buckets keyed by (model, mask). A decision looks at buckets (at most a few hundred per model), never at
every GPU: it costs about the same for 100 GPUs as for 100,000. Each bucket is a min-heap of GPU ids
with lazy deletion, so "the lowest-numbered GPU in this bucket" (the papers' tie-break) is O(log n).

Pure data: no I/O. The simulator and the live controller both drive it through allocate/release.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from mig_batch.mig.models import GpuModel, get_model
from mig_batch.mig.tables import ModelTables, tables_for


@dataclass
class Gpu:
    gid: int  # global index: the order first-fit scans in
    host: str
    index: int  # GPU index on its host
    model: str
    mask: int = 0
    instances: dict[str, tuple[str, int]] = field(default_factory=dict)  # job -> (profile, start)


class _Bucket:
    """GPU ids with one (model, mask): a min-heap with lazy deletion."""

    __slots__ = ("heap", "members")

    def __init__(self) -> None:
        self.heap: list[int] = []
        self.members: set[int] = set()

    def add(self, gid: int) -> None:
        self.members.add(gid)
        heapq.heappush(self.heap, gid)
        if len(self.heap) > 2 * len(self.members) + 64:  # keep stale entries bounded
            self.heap = sorted(self.members)

    def discard(self, gid: int) -> None:
        self.members.discard(gid)

    def lowest(self) -> int | None:
        heap, members = self.heap, self.members
        while heap and heap[0] not in members:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def __len__(self) -> int:
        return len(self.members)


class PlacementConflict(ValueError):
    """An allocate/release that does not match the state (a bug in the caller, never a user error)."""


class Cluster:
    def __init__(self, gpus: Iterable[Gpu]):
        self.gpus: list[Gpu] = list(gpus)
        for expected, gpu in enumerate(self.gpus):
            if gpu.gid != expected:
                raise ValueError("GPU ids must be 0..n-1 in order")
        self.models: dict[str, GpuModel] = {g.model: get_model(g.model) for g in self.gpus}
        self.tables: dict[str, ModelTables] = {name: tables_for(name) for name in self.models}
        self.buckets: dict[str, dict[int, _Bucket]] = {name: {} for name in self.models}
        # per model, the masks at least one unfenced GPU has: a request none of whose masks is here is
        # refused without visiting the masks (a saturated cluster's long queue is mostly such requests)
        self.present: dict[str, set[int]] = {name: set() for name in self.models}
        self.job_gpu: dict[str, int] = {}
        self.fenced: set[int] = set()  # GPUs no policy may place on (their node is down or not reconciled)
        for gpu in self.gpus:
            self._enter_bucket(gpu)

    @classmethod
    def homogeneous(cls, model: str, n_gpus: int, gpus_per_host: int = 8) -> Cluster:
        name = get_model(model).name
        return cls(
            Gpu(gid=i, host=f"node{i // gpus_per_host:05d}", index=i % gpus_per_host, model=name) for i in range(n_gpus)
        )

    # -- index -----------------------------------------------------------------------------
    def _bucket(self, model: str, mask: int) -> _Bucket:
        buckets = self.buckets[model]
        bucket = buckets.get(mask)
        if bucket is None:
            bucket = buckets[mask] = _Bucket()
        return bucket

    def occupied_masks(self, model: str) -> Iterator[tuple[int, _Bucket]]:
        """(mask, bucket) for every mask that at least one unfenced GPU of ``model`` has now."""
        buckets = self.buckets[model]
        return ((m, buckets[m]) for m in self.present[model])

    def lowest_gpu(self, model: str, mask: int) -> int | None:
        bucket = self.buckets[model].get(mask)
        return bucket.lowest() if bucket is not None else None

    # -- changes ---------------------------------------------------------------------------
    def allocate(self, gid: int, job: str, profile: str, start: int) -> None:
        gpu = self.gpus[gid]
        if job in self.job_gpu:
            raise PlacementConflict(f"job {job} already holds an instance on GPU {self.job_gpu[job]}")
        window = self.models[gpu.model].profile(profile).window(start)
        if window & gpu.mask or start not in self.models[gpu.model].profile(profile).starts:
            raise PlacementConflict(f"{profile}@{start} does not fit GPU {gid} (occupancy {gpu.mask:#x})")
        self._move(gpu, gpu.mask | window)
        gpu.instances[job] = (profile, start)
        self.job_gpu[job] = gid

    def release(self, job: str) -> tuple[int, str, int]:
        """Free a job's instance; returns (gpu id, profile, start)."""
        gid = self.job_gpu.pop(job, None)
        if gid is None:
            raise PlacementConflict(f"job {job} holds no instance")
        gpu = self.gpus[gid]
        profile, start = gpu.instances.pop(job)
        self._move(gpu, gpu.mask & ~self.models[gpu.model].profile(profile).window(start))
        return gid, profile, start

    def relocate(self, job: str, gid: int, start: int) -> None:
        """Move a job's instance (same profile) to another GPU and/or start: a migration."""
        _, profile, _ = self.release(job)
        self.allocate(gid, job, profile, start)

    def fence(self, gid: int) -> None:
        """Keep the GPU's instances but hide it from every placement until :meth:`unfence`."""
        if gid not in self.fenced:
            self.fenced.add(gid)
            self._leave_bucket(self.gpus[gid])

    def unfence(self, gid: int) -> None:
        if gid in self.fenced:
            self.fenced.discard(gid)
            self._enter_bucket(self.gpus[gid])

    def _enter_bucket(self, gpu: Gpu) -> None:
        self._bucket(gpu.model, gpu.mask).add(gpu.gid)
        self.present[gpu.model].add(gpu.mask)

    def _leave_bucket(self, gpu: Gpu) -> None:
        bucket = self.buckets[gpu.model].get(gpu.mask)  # a GPU fenced before its mask was ever seen has none
        if bucket is not None:
            bucket.discard(gpu.gid)
            if not bucket.members:
                self.present[gpu.model].discard(gpu.mask)

    def _move(self, gpu: Gpu, new_mask: int) -> None:
        self._leave_bucket(gpu)
        gpu.mask = new_mask
        if gpu.gid not in self.fenced:
            self._enter_bucket(gpu)

    # -- metrics ---------------------------------------------------------------------------
    def active_gpus(self) -> int:
        return sum(1 for g in self.gpus if g.mask)

    def allocated_slices(self) -> int:
        return sum(g.mask.bit_count() for g in self.gpus)

    def total_slices(self) -> int:
        return sum(self.models[g.model].memory_slices for g in self.gpus)
