"""A lexicographic placement policy of ours (issue 20 point 4): best fit first, then waste, expected fill,
CC and F.

Every criterion depends only on the GPU's (model, occupancy mask) and the chosen start, so the policy
is a :class:`MaskScoredPolicy`: all keys are precomputed per (model, profile, mask) and a decision
never visits GPUs.

Criteria (lower is better), combined in the order given:
- ``new``: 1 when the GPU is empty (placing there uses up a whole free GPU), else 0;
- ``left``: free memory slices left on the GPU after placing (best fit: fill GPUs that are nearly full);
- ``dead``: free slices that no profile can use any more after placing (no allowed window of any
  profile fits in the free slices covering them) minus those dead before; wasted capacity;
- ``cc``: minus the configuration capability after placing (GRMU's CC: more ways to place later);
- ``df``: the increase of F (MFI Alg. 1 as printed);
- ``ev``: the expected fill lost under the recent request mix (:func:`expected_fill`): what the GPU would
  still take before the placement, minus the placed slices, minus what it would still take after. The
  only criterion that changes over time; the policy learns the mix of the jobs it decides.
The start is the one with the lowest tuple on the start-dependent criteria, ties to the lowest start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import Any

from mig_batch.mig.models import get_model
from mig_batch.mig.scores import FragVariant
from mig_batch.mig.tables import ModelTables, tables_for
from mig_batch.placement.base import (
    MaskChoice,
    MaskScoredPolicy,
    Outcome,
    Placement,
    PlacementRequest,
    Policy,
    Rejection,
    placement_on,
)
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.recent import RecentJobs, profile_indexes

CRITERIA = ("new", "left", "dead", "cc", "df", "ev")
DEFAULT_ORDER = ("left", "dead", "cc", "df")


def dead_slices(tables: ModelTables) -> tuple[int, ...]:
    """[mask] -> free slices that no allowed window of any profile can cover (all its slices free)."""
    return _dead_slices(tables.model.name)


@cache
def _dead_slices(model_name: str) -> tuple[int, ...]:
    model = get_model(model_name)
    full = (1 << model.memory_slices) - 1
    windows = [p.window(s) for p in model.base_profiles for s in p.starts]
    out = []
    for mask in range(1 << model.memory_slices):
        usable = 0
        for window in windows:
            if not window & mask:
                usable |= window
        out.append((full & ~mask & ~usable).bit_count())
    return tuple(out)


@lru_cache(maxsize=64)  # one per model and learned mix in use; a long-lived daemon sees a few
def expected_fill(model_name: str, shares: tuple[float, ...]) -> tuple[float, ...]:
    """[mask] -> memory slices a GPU with this mask is still expected to take, nothing leaving.

    A one-GPU model of "look ahead at the request mix": requests keep coming, profile k with weight
    ``shares[k]`` (base profile order); one that fits is placed at the start that keeps the most expected
    fill, one that does not fit goes elsewhere (it is not counted: the expectation is over the requests
    this GPU can take). So V[mask] = sum over fitting k of shares[k] * max over free starts s of
    (size_k + V[mask | window(k, s)]), divided by the sum of those shares; 0 when no weighted profile fits.
    Unlike dead slices it weighs a blocked window by how often its profile is asked for.
    """
    tables = tables_for(model_name)
    model = tables.model
    sizes = [p.memory_slices for p in model.base_profiles]
    windows = [[p.window(s) for s in p.starts] for p in model.base_profiles]
    values = [0.0] * (1 << model.memory_slices)
    for mask in sorted(range(1 << model.memory_slices), key=lambda m: -m.bit_count()):  # fuller masks first
        total = weight = 0.0
        for k, share in enumerate(shares):
            fits = [values[mask | w] for w in windows[k] if not w & mask]
            if share > 0 and fits:
                total += share * (sizes[k] + max(fits))
                weight += share
        values[mask] = total / weight if weight else 0.0
    return tuple(values)


class Lexicographic(MaskScoredPolicy):
    """Keys combined lexicographically in ``order`` (a subset of ``CRITERIA``); see the module doc.

    With ``ev`` in the order the policy keeps the profiles of the last ``mix_window`` jobs it decided
    (a job decided again counts once), estimates their shares with one pseudo-count per profile, rounded
    to ``quantum`` so that the rankings change rarely, and re-estimates every ``refresh`` new jobs.
    """

    name = "lex"

    def __init__(
        self,
        order: Sequence[str] = DEFAULT_ORDER,
        end_after: int | None = None,
        mix_window: int = 2000,
        refresh: int = 256,
        quantum: float = 0.05,
    ) -> None:
        super().__init__()
        self.end_after = end_after  # end-time criterion after this many criteria (None: never)
        self.gpu_end: dict[int, int] = {}  # gid -> latest estimated end of the jobs placed there since it was empty
        unknown = [c for c in order if c not in CRITERIA]
        if unknown or not order:
            raise ValueError(f"unknown criteria {unknown}; known: {', '.join(CRITERIA)}")
        if mix_window < 1 or refresh < 1 or not 0 < quantum <= 1:
            raise ValueError(
                f"mix_window and refresh must be at least 1 and quantum in (0, 1]; got {mix_window}, {refresh}, "
                f"{quantum}"
            )
        self.order = tuple(order)
        self.refresh, self.quantum = refresh, quantum
        # per job: ((model, base profile index), ...), one entry whatever models it names
        self.mix: RecentJobs[tuple[tuple[str, int], ...]] = RecentJobs(mix_window)
        self.shares: dict[str, tuple[float, ...]] = {}  # model -> rounded profile shares used by ``ev``

    def observe(self, cluster: Cluster, request: PlacementRequest) -> None:
        """Count a new job in the request mix; re-estimate the shares at the first job and every ``refresh``."""
        if "ev" not in self.order:
            return
        added = self.mix.add(request.job, lambda: profile_indexes(cluster, request))
        if added is None or (self.mix.new_jobs % self.refresh != 1 and self.refresh != 1):
            return
        counts = Counter(entry for profiles in self.mix.values for entry in profiles)
        shares = {}
        for model, tables in cluster.tables.items():
            n = len(tables.base_names)
            total = sum(counts[(model, k)] for k in range(n)) + n
            q = self.quantum
            shares[model] = tuple(round((counts[(model, k)] + 1) / total / q) * q for k in range(n))
        if shares != self.shares:
            self.shares = shares
            self.invalidate()

    def _shares(self, tables: ModelTables) -> tuple[float, ...]:
        n = len(tables.base_names)
        return self.shares.get(tables.model.name) or (1 / n,) * n

    def mask_choice(self, tables: ModelTables, k: int, mask: int) -> MaskChoice | None:
        starts = tables.free_starts[k][mask]
        if not starts:
            return None
        model = tables.model
        size = model.profile(tables.base_names[k]).memory_slices
        left = model.memory_slices - mask.bit_count() - size
        dead = dead_slices(tables)
        frag = tables.frag[FragVariant.PRINTED]
        cc_after = dict(tables.cc_after[k][mask])
        name = tables.base_names[k]
        fill = expected_fill(model.name, self._shares(tables)) if "ev" in self.order else None
        best: tuple[tuple[Any, ...], int] | None = None
        for s in starts:
            after = mask | tables.window(name, s)
            values = {
                "new": int(mask == 0),
                "left": left,
                "dead": dead[after] - dead[mask],
                "cc": -cc_after[s],
                "df": frag[after] - frag[mask],
                "ev": round(fill[mask] - size - fill[after], 6) if fill else 0,  # rounded: float noise ties
            }
            key = tuple(values[c] for c in self.order)
            if best is None or (key, s) < best:
                best = (key, s)
        assert best is not None
        return best

    def decide(self, cluster: Cluster, request: PlacementRequest) -> Outcome:
        self.observe(cluster, request)
        if self.end_after is None or request.end is None or request.now is None or len(request.profiles) != 1:
            decision = super().decide(cluster, request)
        else:
            decision = self._decide_by_end(cluster, request)
        if self.end_after is not None and isinstance(decision, Placement) and request.end is not None:
            emptied = cluster.gpus[decision.gid].mask == 0
            self.gpu_end[decision.gid] = request.end if emptied else max(self.gpu_end.get(decision.gid, 0), request.end)
        return decision

    def _decide_by_end(self, cluster: Cluster, request: PlacementRequest) -> Outcome:
        """Among the masks tied on the first ``end_after`` criteria, the GPU (each mask's lowest id) whose
        busy horizon the job extends least, then whose jobs end closest after it: jobs that end together
        share a GPU, so whole GPUs free up together. Visits masks, never GPUs."""
        ((model, profile),) = request.profiles.items()
        tables = cluster.tables.get(model)
        if tables is None:
            return Rejection("no GPU can host the request")
        assert request.end is not None and request.now is not None
        group: tuple[Any, ...] | None = None
        best: tuple[tuple[Any, ...], int, int] | None = None  # (rank, gid, start)
        for key, mask, start in self._ranking(tables, tables.index(profile)).entries:
            prefix = key[: self.end_after]
            if group is not None and prefix != group:
                break
            gid = cluster.lowest_gpu(model, mask)
            if gid is None:
                continue
            group = prefix
            horizon = self.gpu_end.get(gid, request.now) if mask else request.now
            rank = (max(0, request.end - horizon), max(0, horizon - request.end), key, gid)
            if best is None or rank < best[0]:
                best = (rank, gid, start)
        if best is None:
            return Rejection("no GPU can host the request")
        return placement_on(cluster, best[1], profile, best[2])

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"policy": self.name, "order": list(self.order), "end_after": self.end_after}
        if "ev" in self.order:
            out.update(mix_window=self.mix.window, refresh=self.refresh, quantum=self.quantum)
        return out


class MixAware(Policy):
    """Waste-first or fit-first by the recent request mix (issue 20's "look ahead at the request mix").

    When whole-GPU requests are common (at least ``whole_share`` of the last ``window`` requests), empty
    GPUs are worth keeping for them: best fit first, then dead slices, then the expected fill lost under
    the recent mix (``fit_order``). Otherwise a dead slice is the bigger loss: dead slices first, then
    best fit (``waste_order``). Both rankings are precomputed per mask (the fit ranking again when the
    learned mix changes), so a decision stays flat in the cluster size.
    """

    name = "mix"

    def __init__(
        self,
        whole_share: float = 0.4,
        window: int = 2000,
        fit_order: Sequence[str] = ("left", "dead", "ev", "cc"),
        waste_order: Sequence[str] = ("dead", "left", "cc"),
        end_after: int | None = None,
    ) -> None:
        if not 0 <= whole_share <= 1:
            raise ValueError(f"whole_share must be a share of the requests, from 0 to 1; got {whole_share}")
        self.whole_share = whole_share
        self.fit = Lexicographic(fit_order, end_after=end_after)
        self.waste = Lexicographic(waste_order, end_after=end_after)
        self.recent: RecentJobs[bool] = RecentJobs(window)  # per job: whether it needs a whole GPU
        self.whole_recent = 0

    @staticmethod
    def _whole(cluster: Cluster, request: PlacementRequest) -> bool:
        return any(cluster.models[model].profile(profile).memory_slices == cluster.models[model].memory_slices
                   for model, profile in request.profiles.items() if model in cluster.models)  # fmt: skip

    def decide(self, cluster: Cluster, request: PlacementRequest) -> Outcome:
        added = self.recent.add(request.job, lambda: self._whole(cluster, request))
        if added is not None:
            whole, left = added
            self.whole_recent += whole - bool(left)
        return (self.fit if self.fit_first() else self.waste).decide(cluster, request)

    def fit_first(self) -> bool:
        """Whether whole-GPU requests are common enough in the recent mix (``window=None``: every job)."""
        jobs = len(self.recent.values) if self.recent.window is not None else self.recent.new_jobs
        return self.whole_recent >= self.whole_share * jobs

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, "whole_share": self.whole_share, "window": self.recent.window,
                "fit_order": list(self.fit.order), "waste_order": list(self.waste.order)}  # fmt: skip
