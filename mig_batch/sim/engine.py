"""Discrete-event simulation of online placement: arrivals, departures, metrics at demand checkpoints.

Deterministic: the same arrivals and the same policy give the same result. Departures of a slot are
processed before its arrival. Rejected requests are dropped (MFI §VI: "no longer rescheduled").
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from mig_batch.mig.scores import FragVariant
from mig_batch.placement.base import (
    Migration,
    Placement,
    PlacementRequest,
    Policy,
    apply_migrations,
    effective_plan,
)
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


class Replay:
    """Arrivals fed one by one to a policy over a cluster: departures, plans, decisions, counters."""

    def __init__(self, cluster: Cluster, policy: Policy, model: str) -> None:
        self.cluster, self.policy, self.model = cluster, policy, model
        self.departures: list[tuple[int, str]] = []
        self.arrived = self.accepted = self.migrations = 0

    def advance_to(self, time: int) -> None:
        """Free every instance whose job has left by ``time``."""
        departures = self.departures
        while departures and departures[0][0] <= time:
            self.cluster.release(heapq.heappop(departures)[1])

    def _apply(self, plan: list[Migration]) -> None:
        plan = effective_plan(self.cluster, plan)  # count only instances that really move
        apply_migrations(self.cluster, plan)
        self.migrations += len(plan)

    def offer(self, arrival: Arrival) -> bool:
        """Departures up to the arrival, the policy's periodic plan, then the decision; True if placed."""
        self.advance_to(arrival.slot)
        self._apply(self.policy.periodic(self.cluster, arrival.slot))
        self.arrived += 1
        request = PlacementRequest.single(arrival.job, self.model, arrival.profile)
        decision = self.policy.decide(self.cluster, request)
        if isinstance(decision, Placement):
            self.cluster.allocate(decision.gid, arrival.job, decision.profile, decision.start)
            heapq.heappush(self.departures, (arrival.slot + arrival.duration, arrival.job))
            self.accepted += 1
            return True
        self._apply(self.policy.after_rejection(self.cluster, request))
        return False


def run_online(
    cluster: Cluster, policy: Policy, model: str, arrivals: Sequence[Arrival], checkpoints: Sequence[float]
) -> list[Snapshot]:
    """Feed ``arrivals`` to ``policy``; a snapshot each time cumulative demand first reaches a checkpoint."""
    capacity = cluster.total_slices()
    pending = sorted(checkpoints)
    snapshots: list[Snapshot] = []
    replay = Replay(cluster, policy, model)
    requested = 0
    for arrival in arrivals:
        replay.offer(arrival)
        requested += arrival.slices
        demand = requested / capacity
        while pending and demand >= pending[0] - 1e-12:
            snapshots.append(
                _snapshot(
                    cluster, pending.pop(0), replay.arrived, replay.accepted, _frag_sums(cluster), replay.migrations
                )
            )
    return snapshots


@dataclass(frozen=True)
class TimelineSample:
    time: int
    arrived: int
    accepted: int
    active_gpus: int
    allocated_slices: int
    migrations: int


@dataclass(frozen=True)
class Timeline:
    samples: list[TimelineSample]  # state at every multiple of the sampling period
    arrived_by_profile: dict[str, int]
    accepted_by_profile: dict[str, int]
    arrived: int
    accepted: int
    migrations: int


def run_timeline(cluster: Cluster, policy: Policy, model: str, arrivals: Sequence[Arrival], period: int) -> Timeline:
    """Feed time-stamped ``arrivals``; sample the cluster every ``period`` time units (e.g. hourly)."""
    if period < 1:
        raise ValueError("the sampling period must be at least 1")
    replay = Replay(cluster, policy, model)
    samples: list[TimelineSample] = []
    arrived_by: dict[str, int] = {}
    accepted_by: dict[str, int] = {}

    def sample(time: int) -> None:
        replay.advance_to(time)
        samples.append(
            TimelineSample(
                time,
                replay.arrived,
                replay.accepted,
                cluster.active_gpus(),
                cluster.allocated_slices(),
                replay.migrations,
            )
        )

    next_sample = 0
    for arrival in arrivals:
        while next_sample < arrival.slot:
            sample(next_sample)
            next_sample += period
        arrived_by[arrival.profile] = arrived_by.get(arrival.profile, 0) + 1
        if replay.offer(arrival):
            accepted_by[arrival.profile] = accepted_by.get(arrival.profile, 0) + 1
    sample(next_sample)
    return Timeline(samples, arrived_by, accepted_by, replay.arrived, replay.accepted, replay.migrations)
