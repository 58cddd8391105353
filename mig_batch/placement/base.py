"""Placement decisions and the mask-scored policy engine shared by most policies.

A request names, per GPU model, the profile it needs there. A policy answers with a
:class:`Placement` (GPU, start) or a :class:`Rejection` with a reason; it never changes the cluster
(the caller applies the decision with ``Cluster.allocate``).

Most policies rank GPUs by a key that depends only on the GPU's (model, occupancy mask) and break
ties by the lowest GPU id. :class:`MaskScoredPolicy` precomputes, per (model, profile), every mask's
key and chosen start, sorted by key; a decision walks that list and stops at the first key held by
some GPU, so it never scans the cluster.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mig_batch.mig.tables import ModelTables
from mig_batch.placement.cluster import Cluster


@dataclass(frozen=True)
class PlacementRequest:
    job: str
    profiles: Mapping[str, str]  # GPU model -> profile name on that model
    # what the batch system knows about the job's end (issue 20): the decision time and an estimate
    # of the end, e.g. start + time limit (an upper bound); None where unknown. Only end-aware
    # policies read them.
    now: float | None = None
    end: float | None = None

    @classmethod
    def single(
        cls, job: str, model: str, profile: str, now: float | None = None, end: float | None = None
    ) -> PlacementRequest:
        return cls(job, {model: profile}, now, end)


@dataclass(frozen=True)
class Placement:
    gid: int
    host: str
    gpu_index: int
    model: str
    profile: str
    start: int


@dataclass(frozen=True)
class Rejection:
    reason: str


Outcome = Placement | Rejection  # what a policy decides for one request (the store's record of a job is state.Decision)


@dataclass(frozen=True)
class Migration:
    """Move a running job's instance (same profile) to another GPU and/or start.

    The live system may execute it only for checkpointable jobs; the simulator applies it at once.
    """

    job: str
    from_gid: int
    from_start: int
    to_gid: int
    to_start: int


# (key, start or None): lower keys win; a None start means "chosen but no allowed start fits"
MaskChoice = tuple[tuple[Any, ...], int | None]


def max_cc_choice(tables: ModelTables, k: int, mask: int) -> tuple[int, int] | None:
    """(CC after, start) of NVIDIA's default start on this mask: highest CC after, ties lowest start."""
    options = tables.cc_after[k][mask]
    if not options:
        return None
    cc, neg_start = max((cc, -s) for s, cc in options)
    return cc, -neg_start


def placement_on(cluster: Cluster, gid: int, profile: str, start: int) -> Placement:
    gpu = cluster.gpus[gid]
    return Placement(gid, gpu.host, gpu.index, gpu.model, profile, start)


class Policy(ABC):
    """A placement policy. Stateful policies (round robin, learned weights) keep their state here."""

    name = "policy"

    @abstractmethod
    def decide(self, cluster: Cluster, request: PlacementRequest) -> Outcome:
        """Place ``request`` or say why not; never changes ``cluster``."""

    def after_rejection(self, cluster: Cluster, request: PlacementRequest) -> list[Migration]:
        """A defragmentation plan to run after a rejection (none by default)."""
        return []

    def periodic(self, cluster: Cluster, step: int) -> list[Migration]:
        """A consolidation plan to run at the start of time step ``step`` (none by default)."""
        return []

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name}


def occupancy_after(cluster: Cluster, plan: list[Migration]) -> dict[int, int]:
    """The occupancy mask of every GPU the plan touches, as it would be after the plan (pure)."""
    masks = {}
    for move in plan:
        masks.setdefault(move.from_gid, cluster.gpus[move.from_gid].mask)
        masks.setdefault(move.to_gid, cluster.gpus[move.to_gid].mask)
    for move in plan:
        gpu = cluster.gpus[move.from_gid]
        masks[move.from_gid] &= ~cluster.tables[gpu.model].window(gpu.instances[move.job][0], move.from_start)
    for move in plan:
        gpu = cluster.gpus[move.from_gid]
        target = cluster.gpus[move.to_gid]
        masks[move.to_gid] |= cluster.tables[target.model].window(gpu.instances[move.job][0], move.to_start)
    return masks


def effective_plan(cluster: Cluster, plan: list[Migration]) -> list[Migration]:
    """``plan`` without moves that go nowhere, or [] when it would leave every GPU's occupancy as it is.

    Trading places between same-size instances frees nothing (issue 20: GRMU's rebuild swapped two
    1g.5gb instances 6 <-> 4 on every rejection), so such a plan is no plan and counts no migration.
    """
    moves = [m for m in plan if (m.from_gid, m.from_start) != (m.to_gid, m.to_start)]
    if not moves:
        return []
    after = occupancy_after(cluster, moves)
    if all(cluster.gpus[gid].mask == mask for gid, mask in after.items()):
        return []
    return moves


def apply_migrations(cluster: Cluster, plan: list[Migration]) -> None:
    """Execute a plan as one step: free every moved instance, then create them at their targets."""
    profiles = {}
    for move in plan:
        gid, profile, start = cluster.release(move.job)
        if (gid, start) != (move.from_gid, move.from_start):
            raise ValueError(f"migration of {move.job} expected it on GPU {move.from_gid} at {move.from_start}")
        profiles[move.job] = profile
    for move in plan:
        cluster.allocate(move.to_gid, move.job, profiles[move.job], move.to_start)


@dataclass
class _Ranked:
    entries: list[tuple[tuple[Any, ...], int, int | None]] = field(default_factory=list)  # (key, mask, start)
    masks: frozenset[int] = frozenset()  # the entries' masks


class MaskScoredPolicy(Policy):
    """Policies whose GPU ranking depends only on (model, mask); ties go to the lowest GPU id."""

    def __init__(self) -> None:
        self._ranked: dict[tuple[str, int], _Ranked] = {}

    @abstractmethod
    def mask_choice(self, tables: ModelTables, profile_index: int, mask: int) -> MaskChoice | None:
        """The key and start for a GPU with ``mask``; None if the policy would not consider it."""

    def invalidate(self) -> None:
        """Forget precomputed rankings (for policies whose keys change over time)."""
        self._ranked.clear()

    def _ranking(self, tables: ModelTables, profile_index: int) -> _Ranked:
        key = (tables.model.name, profile_index)
        ranked = self._ranked.get(key)
        if ranked is None:
            entries = []
            for mask in range(1 << tables.model.memory_slices):
                choice = self.mask_choice(tables, profile_index, mask)
                if choice is not None:
                    entries.append((choice[0], mask, choice[1]))
            entries.sort(key=lambda e: e[0])
            ranked = self._ranked[key] = _Ranked(entries, frozenset(mask for _, mask, _ in entries))
        return ranked

    def decide(self, cluster: Cluster, request: PlacementRequest) -> Outcome:
        best: tuple[tuple[Any, ...], int, str, int | None] | None = None  # (key, gid, model, start)
        for model, profile in request.profiles.items():
            tables = cluster.tables.get(model)
            if tables is None:
                continue
            ranked = self._ranking(tables, tables.index(profile))
            if cluster.present[model].isdisjoint(ranked.masks):
                continue  # no GPU has a mask this policy would take: the loop below would find none
            found_key = None
            for key, mask, start in ranked.entries:
                if found_key is not None and key != found_key:
                    break
                gid = cluster.lowest_gpu(model, mask)
                if gid is None:
                    continue
                found_key = key
                if best is None or (key, gid) < (best[0], best[1]):
                    best = (key, gid, model, start)
        if best is None:
            return Rejection("no GPU can host the request")
        key, gid, model, start = best
        profile = request.profiles[model]
        if start is None:
            return Rejection(f"GPU {gid} was chosen by free capacity but has no allowed start free for {profile}")
        return placement_on(cluster, gid, profile, start)
