"""Discrete-event simulation of online placement: arrivals, departures, metrics at demand checkpoints.

Deterministic: the same arrivals and the same policy give the same result. Departures of a slot are
processed before its arrival. Rejected requests are dropped (MFI §VI: "no longer rescheduled").
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from mig_batch.mig.scores import FragVariant
from mig_batch.placement.base import Placement, PlacementRequest, Policy, apply_migrations
from mig_batch.placement.cluster import Cluster
from mig_batch.sim.workloads import Arrival


@dataclass(frozen=True)
class Snapshot:
    demand: float  # cumulative requested slices / capacity
    arrived: int
    accepted: int
    acceptance_rate: float
    active_gpus: int
    allocated_slices: int
    mean_frag: float  # mean F over GPUs (MFI Alg. 1 as printed)
    mean_frag_partial: float
    migrations: int  # instances moved so far by the policy's defragmentation/consolidation plans

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


METRICS = (
    "acceptance_rate",
    "accepted",
    "active_gpus",
    "allocated_slices",
    "mean_frag",
    "mean_frag_partial",
    "migrations",
)


def _snapshot(
    cluster: Cluster, demand: float, arrived: int, accepted: int, frag_sums: dict[FragVariant, int], migrations: int
) -> Snapshot:
    n = len(cluster.gpus)
    return Snapshot(
        demand=demand,
        arrived=arrived,
        accepted=accepted,
        acceptance_rate=accepted / arrived if arrived else 1.0,
        active_gpus=cluster.active_gpus(),
        allocated_slices=cluster.allocated_slices(),
        mean_frag=frag_sums[FragVariant.PRINTED] / n,
        mean_frag_partial=frag_sums[FragVariant.PARTIAL] / n,
        migrations=migrations,
    )


def _frag_sums(cluster: Cluster) -> dict[FragVariant, int]:
    sums = dict.fromkeys(FragVariant, 0)
    for model, buckets in cluster.buckets.items():
        tables = cluster.tables[model]
        for mask, bucket in buckets.items():
            if bucket.members:
                for variant in FragVariant:
                    sums[variant] += tables.frag[variant][mask] * len(bucket.members)
    return sums


def run_online(
    cluster: Cluster, policy: Policy, model: str, arrivals: Sequence[Arrival], checkpoints: Sequence[float]
) -> list[Snapshot]:
    """Feed ``arrivals`` to ``policy``; a snapshot each time cumulative demand first reaches a checkpoint."""
    capacity = cluster.total_slices()
    pending = sorted(checkpoints)
    departures: list[tuple[int, str]] = []
    snapshots: list[Snapshot] = []
    requested = accepted = migrations = 0
    for arrived, arrival in enumerate(arrivals, 1):
        while departures and departures[0][0] <= arrival.slot:
            cluster.release(heapq.heappop(departures)[1])
        plan = policy.periodic(cluster, arrival.slot)
        apply_migrations(cluster, plan)
        migrations += len(plan)
        request = PlacementRequest.single(arrival.job, model, arrival.profile)
        decision = policy.decide(cluster, request)
        if isinstance(decision, Placement):
            cluster.allocate(decision.gid, arrival.job, decision.profile, decision.start)
            heapq.heappush(departures, (arrival.slot + arrival.duration, arrival.job))
            accepted += 1
        else:
            plan = policy.after_rejection(cluster, request)
            apply_migrations(cluster, plan)
            migrations += len(plan)
        requested += arrival.slices
        demand = requested / capacity
        while pending and demand >= pending[0] - 1e-12:
            snapshots.append(_snapshot(cluster, pending.pop(0), arrived, accepted, _frag_sums(cluster), migrations))
    return snapshots
