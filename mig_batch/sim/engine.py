"""Discrete-event simulation of online placement: arrivals, departures, metrics at demand checkpoints.

Deterministic: the same arrivals and the same policy give the same result. Departures of a slot are
processed before its arrival. Rejected requests are dropped (MFI §VI: "no longer rescheduled").
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

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
    accepted_slices: int  # memory slices of every accepted request (served demand when nothing leaves)
    accepted_slice_time: int  # slices x duration of every accepted request (served demand with departures)
    arrived_by_profile: dict[str, int]
    accepted_by_profile: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


METRICS = (
    "acceptance_rate",
    "accepted",
    "active_gpus",
    "allocated_slices",
    "mean_frag",
    "mean_frag_partial",
    "migrations",
    "accepted_slices",
    "accepted_slice_time",
)


def _snapshot(replay: Replay, demand: float) -> Snapshot:
    cluster = replay.cluster
    n = len(cluster.gpus)
    frag_sums = _frag_sums(cluster)
    return Snapshot(
        demand=demand,
        arrived=replay.arrived,
        accepted=replay.accepted,
        acceptance_rate=replay.accepted / replay.arrived if replay.arrived else 1.0,
        active_gpus=cluster.active_gpus(),
        allocated_slices=cluster.allocated_slices(),
        mean_frag=frag_sums[FragVariant.PRINTED] / n,
        mean_frag_partial=frag_sums[FragVariant.PARTIAL] / n,
        migrations=replay.migrations,
        accepted_slices=replay.accepted_slices,
        accepted_slice_time=replay.accepted_slice_time,
        arrived_by_profile=dict(replay.arrived_by_profile),
        accepted_by_profile=dict(replay.accepted_by_profile),
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
        self.accepted_slices = self.accepted_slice_time = 0
        self.arrived_by_profile: dict[str, int] = {}
        self.accepted_by_profile: dict[str, int] = {}

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
        profile = arrival.profile
        self.arrived_by_profile[profile] = self.arrived_by_profile.get(profile, 0) + 1
        request = PlacementRequest.single(arrival.job, self.model, profile, float(arrival.slot + arrival.duration))
        decision = self.policy.decide(self.cluster, request)
        if isinstance(decision, Placement):
            self.cluster.allocate(decision.gid, arrival.job, decision.profile, decision.start)
            heapq.heappush(self.departures, (arrival.slot + arrival.duration, arrival.job))
            self.accepted += 1
            self.accepted_by_profile[profile] = self.accepted_by_profile.get(profile, 0) + 1
            self.accepted_slices += arrival.slices
            self.accepted_slice_time += arrival.slices * arrival.duration
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
            snapshots.append(_snapshot(replay, pending.pop(0)))
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
    accepted_slice_time: int  # slices x duration (seconds) of every accepted request: the demand served


def run_timeline(cluster: Cluster, policy: Policy, model: str, arrivals: Sequence[Arrival], period: int) -> Timeline:
    """Feed time-stamped ``arrivals``; sample the cluster every ``period`` time units (e.g. hourly)."""
    if period < 1:
        raise ValueError("the sampling period must be at least 1")
    replay = Replay(cluster, policy, model)
    samples: list[TimelineSample] = []

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
        replay.offer(arrival)
    sample(next_sample)
    return Timeline(
        samples,
        dict(replay.arrived_by_profile),
        dict(replay.accepted_by_profile),
        replay.arrived,
        replay.accepted,
        replay.migrations,
        replay.accepted_slice_time,
    )
