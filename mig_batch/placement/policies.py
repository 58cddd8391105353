"""Online placement policies: the papers' baselines, MFI, the CC family, and our improvements.

MFI paper §VI baselines choose a GPU by free capacity only and then an index; if the chosen GPU has
enough free slices but no allowed start, the request is rejected (their Fig. 3):
  - ff: first GPU (lowest id) with enough free memory slices, first free start.
  - rr: round robin over GPUs with enough free slices, first free start.
  - bf-bi: GPU with the fewest free slices left after allocation, "best index" start.
  - wf-bi: GPU with the most free slices left after allocation, "best index" start.
MIG-aware:
  - mfi: MFI Alg. 2, the (GPU, start) with the least increase of F (Alg. 1 as printed).
  - mfi-partial: the same with F counting only partly-free windows (the worked example's reading).
  - nvidia: first GPU where the profile fits, start by NVIDIA's default max-CC rule (GRMU §5); this
    is GRMU's FF baseline.
  - bf-cc: GRMU's BF baseline, the GPU left with the fewest free slices, NVIDIA's default start.
  - mcc / mecc: GPU and start with the highest CC (expected CC, profile-frequency weighted) after
    allocation (GRMU §8.3, Alg. 6 and 7).
  - hami: first GPU where it fits, first free start NVML reports; 1g.* and 3g.* from the highest start.
  - grmu: dual-basket pooling with defragmentation and consolidation plans (mig_batch.placement.grmu).
Ours (see docs/placement.md for the evaluation):
  - mfi-pack: MFI, ties broken toward the GPU left with the fewest free slices.
  - emfi: expected MFI, F weighted by the observed frequency of each profile, ties packed.
  - lex / mix: dead slices, best fit and CC combined lexicographically; mix picks the order by the
    recent share of whole-GPU requests (mig_batch.placement.lexicographic).
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from mig_batch.mig.scores import FragVariant
from mig_batch.mig.tables import ModelTables
from mig_batch.placement.base import (
    MaskChoice,
    MaskScoredPolicy,
    Outcome,
    PlacementRequest,
    Policy,
    Rejection,
    max_cc_choice,
    placement_on,
)
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.grmu import Grmu
from mig_batch.placement.lexicographic import Lexicographic, MixAware
from mig_batch.placement.recent import RecentJobs, profile_indexes
from mig_batch.yaml_text import shown


def _free_slices(tables: ModelTables, mask: int) -> int:
    return tables.model.memory_slices - mask.bit_count()


def _size(tables: ModelTables, k: int) -> int:
    return tables.model.profile(tables.base_names[k]).memory_slices


def best_index_order(tables: ModelTables, k: int) -> tuple[int, ...]:
    """Starts of profile k, least restrictive first: fewest windows of *other* profiles overlapped on
    an empty GPU, then the highest start (so 1g.10gb goes to 6 before 0, keeping 0 for 4g.40gb)."""
    model = tables.model
    me = model.profile(tables.base_names[k])
    others = [p for i, p in enumerate(model.base_profiles) if i != k]

    def blocked(start: int) -> int:
        window = me.window(start)
        return sum(1 for p in others for s in p.starts if p.window(s) & window)

    return tuple(sorted(me.starts, key=lambda s: (blocked(s), -s)))


# --------------------------------------------------------------------------------------------- MFI baselines


class FirstFit(MaskScoredPolicy):
    name = "ff"

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        if _free_slices(tables, mask) < _size(tables, k):
            return None
        starts = tables.free_starts[k][mask]
        return (), (starts[0] if starts else None)


class _FitBestIndex(MaskScoredPolicy):
    sign = 1

    def __init__(self) -> None:
        super().__init__()
        self._orders: dict[tuple[str, int], tuple[int, ...]] = {}

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        left = _free_slices(tables, mask) - _size(tables, k)
        if left < 0:
            return None
        key = (tables.model.name, k)
        if key not in self._orders:
            self._orders[key] = best_index_order(tables, k)
        free = set(tables.free_starts[k][mask])
        start = next((s for s in self._orders[key] if s in free), None)
        return (self.sign * left,), start


class BestFitBestIndex(_FitBestIndex):
    name = "bf-bi"
    sign = 1


class WorstFitBestIndex(_FitBestIndex):
    name = "wf-bi"
    sign = -1


class RoundRobin(Policy):
    """Round robin over GPUs with enough free slices; first free start. O(GPUs) in the worst case."""

    name = "rr"

    def __init__(self) -> None:
        self.next_gid = 0

    def decide(self, cluster: Cluster, request: PlacementRequest) -> Outcome:
        n = len(cluster.gpus)
        for step in range(n):
            gid = (self.next_gid + step) % n
            gpu = cluster.gpus[gid]
            profile = request.profiles.get(gpu.model)
            if profile is None or gid in cluster.fenced:
                continue
            tables = cluster.tables[gpu.model]
            k = tables.index(profile)
            if _free_slices(tables, gpu.mask) < _size(tables, k):
                continue
            self.next_gid = (gid + 1) % n
            starts = tables.free_starts[k][gpu.mask]
            if not starts:
                return Rejection(f"GPU {gid} was chosen by free capacity but has no allowed start free for {profile}")
            return placement_on(cluster, gid, profile, starts[0])
        return Rejection("no GPU has enough free memory slices")


# --------------------------------------------------------------------------------------------- MFI


class MinimumFragmentationIncrement(MaskScoredPolicy):
    """MFI Alg. 2: argmin over (GPU, start) of F after - F before; ties to the lowest GPU, then start."""

    name = "mfi"

    def __init__(self, variant: FragVariant = FragVariant.PRINTED, pack_ties: bool = False) -> None:
        super().__init__()
        self.variant = FragVariant(variant)
        self.pack_ties = pack_ties
        if self.variant is FragVariant.PARTIAL:
            self.name = "mfi-partial"
        if pack_ties:
            self.name = "mfi-pack"

    def delta_f(self, tables: ModelTables, k: int, mask: int) -> list[tuple[float, int]]:
        before = tables.frag[self.variant][mask]
        return [(after - before, s) for s, after in tables.frag_after[self.variant][k][mask]]

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        options = self.delta_f(tables, k, mask)
        if not options:
            return None
        delta, start = min(options)
        left = _free_slices(tables, mask) - _size(tables, k)
        return ((delta, left) if self.pack_ties else (delta,)), start

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "variant": str(self.variant), "pack_ties": self.pack_ties}


class _LearnsProfileMix(MaskScoredPolicy):
    """Keeps the per-model profile counts of the last ``window`` jobs (all if None) and recomputes its
    derived per-mask table every ``refresh`` new jobs. A job decided again (it waited a pass, or was
    tried on more nodes) counts once (:class:`~mig_batch.placement.recent.RecentJobs`)."""

    def __init__(self, window: int | None, refresh: int) -> None:
        if refresh < 1:
            raise ValueError(f"refresh must be at least 1; got {refresh}")
        super().__init__()
        self.jobs: RecentJobs[tuple[tuple[str, int], ...]] = RecentJobs(window)  # per job: (model, profile index)
        self.refresh = refresh
        self.counts: Counter[tuple[str, int]] = Counter()  # over the window's jobs, kept as it changes
        self._derived: dict[str, list[float]] = {}

    def decide(self, cluster: Cluster, request: PlacementRequest) -> Outcome:
        added = self.jobs.add(request.job, lambda: profile_indexes(cluster, request))
        if added is not None:
            entry, left = added
            if left is not None:
                self.counts.subtract(left)
            self.counts.update(entry)
            if (self.jobs.new_jobs - 1) % self.refresh == 0:  # the first job, then every ``refresh`` new ones
                self._derived.clear()
                self.invalidate()
        return super().decide(cluster, request)

    @property
    def window(self) -> int | None:
        return self.jobs.window

    def profile_counts(self, model_name: str) -> Counter[int]:
        return Counter({k: n for (m, k), n in self.counts.items() if m == model_name and n > 0})

    def derived_table(self, tables: ModelTables) -> list[float]:
        name = tables.model.name
        if name not in self._derived:
            self._derived[name] = self.build_table(tables)
        return self._derived[name]

    @abstractmethod
    def build_table(self, tables: ModelTables) -> list[float]:
        """The per-mask table this policy derives from the current profile mix."""


class ExpectedMFI(_LearnsProfileMix, MinimumFragmentationIncrement):
    """MFI with F weighted by how often each profile has been requested (learned online, +1 prior).

    A window blocked for a profile nobody asks for costs little; one blocked for the common profile
    costs a lot. Weights are re-estimated every ``refresh`` requests; ties are packed.
    """

    name = "emfi"

    def __init__(self, refresh: int = 64) -> None:
        super().__init__(window=None, refresh=refresh)  # -> MFI with printed F -> MaskScoredPolicy
        self.pack_ties = True
        self.name = "emfi"

    def build_table(self, tables: ModelTables) -> list[float]:
        counts = self.profile_counts(tables.model.name)
        n = len(tables.base_names)
        total = sum(counts.values()) + n
        weights = [(counts[k] + 1) / total * n for k in range(n)]  # mean weight 1
        model = tables.model
        table = []
        for mask in range(1 << model.memory_slices):
            unused = model.memory_slices - mask.bit_count()
            score = 0.0
            for k, profile in enumerate(model.base_profiles):
                if profile.memory_slices > unused:
                    continue
                blocked = sum(1 for s in profile.starts if profile.window(s) & mask)
                score += weights[k] * profile.memory_slices * blocked
            table.append(score)
        return table

    def delta_f(self, tables: ModelTables, k: int, mask: int) -> list[tuple[float, int]]:
        table = self.derived_table(tables)
        name = tables.base_names[k]
        return [(table[mask | tables.window(name, s)] - table[mask], s) for s in tables.free_starts[k][mask]]

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "refresh": self.refresh}


# --------------------------------------------------------------------------------------------- CC family


class NvidiaDefault(MaskScoredPolicy):
    """First GPU where the profile fits; the driver's default start (max CC after, ties lowest)."""

    name = "nvidia"

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        best = max_cc_choice(tables, k, mask)
        return None if best is None else ((), best[1])


class BestFitDefaultStart(MaskScoredPolicy):
    """GRMU's BF baseline: the GPU left with the fewest free slices, the driver's default start."""

    name = "bf-cc"

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        best = max_cc_choice(tables, k, mask)
        return None if best is None else ((_free_slices(tables, mask) - _size(tables, k),), best[1])


class MaxCC(MaskScoredPolicy):
    """GRMU Alg. 6: the GPU (and default start) with the highest CC after allocation."""

    name = "mcc"

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        best = max_cc_choice(tables, k, mask)
        return None if best is None else ((-best[0],), best[1])


class MaxExpectedCC(_LearnsProfileMix):
    """GRMU Alg. 7 (MECC): CC with each profile's count weighted by its share of recent requests.

    GRMU looks back 24 hours; here the window is the last ``window`` requests.
    """

    name = "mecc"

    def __init__(self, window: int = 500, refresh: int = 64) -> None:
        super().__init__(window=window, refresh=refresh)

    def build_table(self, tables: ModelTables) -> list[float]:
        counts = self.profile_counts(tables.model.name)
        total = sum(counts.values()) or 1
        probs = [counts[k] / total for k in range(len(tables.base_names))]
        return [
            sum(p * len(tables.free_starts[k][mask]) for k, p in enumerate(probs))
            for mask in range(1 << tables.model.memory_slices)
        ]

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        starts = tables.free_starts[k][mask]
        if not starts:
            return None
        table = self.derived_table(tables)
        name = tables.base_names[k]
        ecc, neg_start = max((table[mask | tables.window(name, s)], -s) for s in starts)
        return (-ecc,), -neg_start


class Hami(MaskScoredPolicy):
    """HAMi-style dynamic MIG: first GPU where it fits; 1g.* and 3g.* from the highest start."""

    name = "hami"

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        starts = tables.free_starts[k][mask]
        if not starts:
            return None
        name = tables.base_names[k]
        return (), (starts[-1] if name.startswith(("1g.", "3g.")) else starts[0])


POLICIES: dict[str, type[Policy]] = {
    "ff": FirstFit,
    "rr": RoundRobin,
    "bf-bi": BestFitBestIndex,
    "wf-bi": WorstFitBestIndex,
    "mfi": MinimumFragmentationIncrement,
    "nvidia": NvidiaDefault,
    "bf-cc": BestFitDefaultStart,
    "mcc": MaxCC,
    "mecc": MaxExpectedCC,
    "hami": Hami,
    "emfi": ExpectedMFI,
}


EXTRA: dict[str, Callable[..., Policy]] = {
    "mfi-partial": partial(MinimumFragmentationIncrement, FragVariant.PARTIAL),
    "mfi-pack": partial(MinimumFragmentationIncrement, pack_ties=True),
    "grmu": Grmu,
    "lex": Lexicographic,
    "mix": MixAware,
}


def policy_names() -> list[str]:
    return [*POLICIES, *EXTRA]


def make_policy(name: str, **options: Any) -> Policy:
    """A fresh policy by name, ``options`` passed to its constructor; ValueError lists the known names."""
    factory = POLICIES.get(name) or EXTRA.get(name)
    if factory is not None:
        try:
            inspect.signature(factory).bind(**options)
        except TypeError:
            raise ValueError(f"policy {name!r} does not take option(s) {', '.join(options)}") from None
        return factory(**options)
    raise ValueError(f"unknown placement policy {shown(name)}; known: {', '.join(policy_names())}")
