"""The batch planner live: queued moldable jobs planned together over the GPUs' current state.

Input (:class:`LiveState`): the clock; per GPU its model, the instances that exist now (a slot of the
planner's scheme - size and memory start - and when it frees: its running job's expected end, or
now when idle), other held slices (:class:`~mig_batch.placement.timelines.Hold`: anything that is not
one of the scheme's slots, and holds that begin later), and when its reconfiguration lock frees; the
queued moldable jobs in queue order (predicted seconds per instance size); the waiting rigid jobs'
reservations and the bound ``max_hold_s`` on how long a plan may keep their slices from them.
Reconfiguration times come from the scheme of each model (:func:`~mig_batch.planner.problem.gpu_scheme`:
MIG-DRL Table 1; pass ``schemes`` with measured create/destroy times to override).

Output (:class:`LivePlan`): per job a GPU, size, slot start, expected start and end and the
reconfigurations before it; the steps whose resources are free now are the ones to act on now
(``start_now``); the rest are the plan's reservations, revised at the next pass.

The model is :mod:`mig_batch.planner.plan`'s on many GPUs: reconfigurations run one at a time per GPU
and only on idle instances, a new instance waits for every overlapping instance to be destroyed, and
jobs are never preempted. A rigid job's reservation (from ``since``, for ``seconds``) becomes a hold
that opens ``max_hold_s`` later: no planned job may keep its slices past ``since + max_hold_s``.

Decoder (shared by every planner): jobs in a priority order each take the (GPU, slot) of their size
where they start first - reusing an instance that exists or destroying idle ones and creating one -
with ties to no reconfiguration, then the fuller GPU. Per model, a matrix holds per GPU and slot the
time the slot's slices free up (a lower bound on the start); only the ``shortlist`` GPUs with the
lowest bound are evaluated exactly, which makes a job cost O(GPUs) in numpy plus a constant.

Planners, all anytime (``budget_s`` per pass, ``evaluations`` decodings at most; the best plan so far
when either ends):

* ``eft``: today's rule through this interface - queue order, each job the size that finishes first,
  a smaller one while it finishes within ``min_gain`` of the best run time (docs/moldable.md).
* ``far``: FAR's phases 1-2 on the live state - the allotment family (every job on its least-area
  size, then the longest job grows, until it holds the whole GPU), jobs longest first on the instance
  that frees first; the allotment with the smallest makespan wins. (FAR's partition tree and its
  refinement phase are single-GPU-from-empty constructions; the live decoder replaces them.)
* ``auto``: ours - starting points from EFT's and FAR's rules, least-area and least-time sizes, in
  queue, shortest-first and longest-first orders; then a local search (one job's size, two jobs'
  order) until the budget ends or ``STALL`` moves in a row found nothing better; its sizes are those
  worth their slices by ``min_gain`` (:func:`worth_sizes`). Objective ``mean`` (mean expected end of the
  queued jobs, makespan on ties) or ``makespan``. Never worse on its objective than the ``eft`` plan it
  starts from.

Pure code, no I/O: the controller and the simulator call it with their view and clock.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mig_batch.placement.timelines import GpuTimeline, Hold
from mig_batch.planner.far import allotment_family
from mig_batch.planner.problem import GpuScheme, Task, gpu_scheme

INF = math.inf
EPS = 1e-9
LIVE_PLANNERS = ("eft", "far", "auto")
STALL = 200  # auto's local search ends after this many moves without a better plan (a short queue: well before
# its budget, which a live pass would otherwise spend whole at every pass while such a queue waits)
OBJECTIVES = ("mean", "makespan")


@dataclass(frozen=True)
class LiveInstance:
    """An instance that exists now at one of the scheme's slots; ``free_at`` <= now: idle."""

    size: int
    start: int
    free_at: float


@dataclass(frozen=True)
class LiveGpu:
    gid: int
    model: str
    instances: tuple[LiveInstance, ...] = ()
    holds: tuple[Hold, ...] = ()  # other held slices: not the scheme's slots, or beginning later
    reconfig_free_at: float = -INF


@dataclass(frozen=True)
class LiveJob:
    name: str
    times: Mapping[int, float]  # instance size (compute slices) -> predicted seconds; missing or inf: cannot
    barred: frozenset[int] = frozenset()  # GPUs it may not have, now or later (outside its partitions, down)

    def time(self, size: int) -> float:
        return self.times.get(size, INF)


@dataclass(frozen=True)
class RigidWait:
    """A waiting rigid job's reservation: ``window`` on GPU ``gid`` from ``since`` for ``seconds``."""

    gid: int
    window: int
    since: float
    seconds: float = INF


@dataclass(frozen=True)
class LiveState:
    now: float
    gpus: tuple[LiveGpu, ...]
    jobs: tuple[LiveJob, ...]  # queue order
    rigid: tuple[RigidWait, ...] = ()
    max_hold_s: float = 0.0


@dataclass(frozen=True)
class Reconfig:
    kind: str  # "create" | "destroy"
    size: int
    start: int
    begin: float
    end: float


@dataclass(frozen=True)
class Step:
    job: str
    gid: int
    size: int
    slot: int  # the instance's memory start
    profile: str  # the scheme's profile of that size on the GPU's model
    start: float  # expected run start
    end: float
    opens: float  # when its instance or slices are free (its reconfigurations may begin)
    reconfigs: tuple[Reconfig, ...] = ()
    now: bool = False  # act on it now


@dataclass(frozen=True)
class LivePlan:
    planner: str
    steps: tuple[Step, ...]  # in decode order
    unplaced: tuple[str, ...]  # jobs no GPU can run
    makespan: float
    mean_end: float
    evaluations: int = 0
    elapsed_s: float = 0.0

    def start_now(self) -> list[Step]:
        return [s for s in self.steps if s.now]

    def score(self, objective: str) -> tuple[float, float]:
        return (self.mean_end, self.makespan) if objective == "mean" else (self.makespan, self.mean_end)


def measured_scheme(model: str, create_s: Mapping[int, float] | None = None,
                    destroy_s: Mapping[int, float] | None = None) -> GpuScheme:  # fmt: skip
    """The model's scheme with measured create/destroy seconds per size where known (MIG-DRL Table 1's
    otherwise), for ``plan_live(schemes=...)``."""
    scheme = gpu_scheme(model)
    for name, given in (("create", create_s or {}), ("destroy", destroy_s or {})):
        for size, seconds in given.items():
            if size not in scheme.profiles or not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"{name} time {seconds!r} for size {size}: sizes of {model} are {scheme.sizes}, "
                                 "times finite seconds >= 0")  # fmt: skip
    return replace(scheme, create_s={**scheme.create_s, **(create_s or {})},
                   destroy_s={**scheme.destroy_s, **(destroy_s or {})})  # fmt: skip


def from_timeline(timeline: GpuTimeline) -> LiveGpu:
    """A controller timeline as live state: every hold stays a hold (no instance is reused)."""
    return LiveGpu(timeline.gid, timeline.model, holds=timeline.holds)


def _bits(window: int) -> list[int]:
    return [i for i in range(window.bit_length()) if window >> i & 1]


class _Group:
    """The GPUs of one model: scheme, slots and the per-GPU starting state."""

    def __init__(self, scheme: GpuScheme, gpus: Sequence[LiveGpu], state: LiveState) -> None:
        self.scheme = scheme
        self.slots = [slot for size in scheme.sizes for slot in scheme.slots[size]]
        self.ids = {(s.size, s.start): k for k, s in enumerate(self.slots)}
        self.by_size = {size: [self.ids[(s.size, s.start)] for s in scheme.slots[size]] for size in scheme.sizes}
        self.omask = [sum(1 << j for j, o in enumerate(self.slots) if j != k and o.overlaps(s))
                      for k, s in enumerate(self.slots)]  # fmt: skip
        self.windows = [s.window for s in self.slots]
        self.create = [scheme.create_s[s.size] for s in self.slots]
        self.destroy = [scheme.destroy_s[s.size] for s in self.slots]
        mem = scheme.model.memory_slices
        self.wmat = np.zeros((len(self.slots), mem), dtype=bool)
        for k, s in enumerate(self.slots):
            self.wmat[k, _bits(s.window)] = True
        self.gids = [g.gid for g in gpus]
        now = state.now
        self.hold_free = np.full((len(gpus), mem), -INF)  # present holds, per slice
        self.later: dict[int, list[tuple[int, float, float]]] = {}  # row -> (window, since, until)
        self.alive0: list[dict[int, float]] = []
        self.clock0: list[float] = []
        row_of = {g.gid: r for r, g in enumerate(gpus)}
        self.row_of = row_of
        for r, g in enumerate(gpus):
            for h in g.holds:
                if h.since > now:
                    self.later.setdefault(r, []).append((h.window, h.since, h.until))
                else:
                    cols = _bits(h.window)
                    self.hold_free[r, cols] = np.maximum(self.hold_free[r, cols], h.until)
            alive: dict[int, float] = {}
            for inst in g.instances:
                if (inst.size, inst.start) not in self.ids:
                    raise ValueError(f"GPU {g.gid}: no {inst.size}-slice instance starts at {inst.start} on {g.model}")
                alive[self.ids[(inst.size, inst.start)]] = max(inst.free_at, now)
            self.alive0.append(alive)
            self.clock0.append(max(g.reconfig_free_at, now))
        for w in state.rigid:
            if w.gid in row_of:
                opens = w.since + state.max_hold_s
                self.later.setdefault(row_of[w.gid], []).append((w.window, opens, opens + w.seconds))
        self.held = self._bounds(self.hold_free).tolist()  # row -> slot -> when present holds free it
        self.slice_free0 = self.hold_free.copy()
        for r, alive in enumerate(self.alive0):
            self._refresh_slices(self.slice_free0, r, alive)
        self.lb0 = self._bounds(self.slice_free0)
        self.used0 = np.array([sum(self.slots[k].size for k in a) for a in self.alive0], dtype=float)

    def _refresh_slices(self, slice_free: np.ndarray, r: int, alive: Mapping[int, float]) -> None:
        row = self.hold_free[r].copy()
        for k, free in alive.items():
            cols = self.wmat[k]
            row[cols] = np.maximum(row[cols], free)
        slice_free[r] = row

    def _bounds(self, slice_free: np.ndarray) -> np.ndarray:
        """(GPUs x slots): when each slot's slices all free up."""
        bounds: np.ndarray = np.where(self.wmat[None, :, :], slice_free[:, None, :], -INF).max(axis=2)
        return bounds


_Place = tuple[float, float, int, int, int, int]  # (start, opens, reconfigurations, group, row, slot)


@dataclass
class _Run:
    """One decoding's mutable state: per model group the bounds and the GPUs it changed."""

    slice_free: list[np.ndarray]
    lb: list[np.ndarray]
    used: list[np.ndarray]
    alive: list[dict[int, dict[int, float]]] = field(default_factory=list)  # group -> row -> slot -> free
    clock: list[dict[int, float]] = field(default_factory=list)
    released: list[dict[int, np.ndarray]] = field(default_factory=list)  # per slice: when the plan destroyed it


class LiveDecoder:
    """Decodes (order, size per job) into a plan; size 0: the job's size is chosen by ``rule``."""

    def __init__(self, state: LiveState, schemes: Mapping[str, GpuScheme] | None = None,
                 shortlist: int = 6) -> None:  # fmt: skip
        self.state, self.now, self.shortlist = state, state.now, shortlist
        by_model: dict[str, list[LiveGpu]] = {}
        for g in state.gpus:
            by_model.setdefault(g.model, []).append(g)
        if len({g.gid for g in state.gpus}) != len(state.gpus):
            raise ValueError("GPU ids must be unique")
        self.groups = [_Group((schemes or {}).get(m) or gpu_scheme(m), gs, state) for m, gs in by_model.items()]
        self.jobs = state.jobs
        for job in state.jobs:
            if any(not (t > 0) for t in job.times.values()):
                raise ValueError(f"job {job.name}: predicted times must be positive")
        masks: dict[frozenset[int], list[np.ndarray | None]] = {}  # most jobs share their barred GPUs
        for job in state.jobs:
            if job.barred not in masks:
                rows = [np.array([gid in job.barred for gid in g.gids], dtype=bool) for g in self.groups]
                masks[job.barred] = [m if m.any() else None for m in rows]
        self.barred_rows = [masks[job.barred] for job in state.jobs]  # job -> group -> row barred (None: none)
        self.sizes = [sorted(s for s, t in j.times.items() if math.isfinite(t) and t > 0 and any(
            s in g.by_size and (rows[gi] is None or not rows[gi].all()) for gi, g in enumerate(self.groups)))
            for j, rows in zip(state.jobs, self.barred_rows, strict=True)]  # sizes on a GPU it may have  # fmt: skip

    def fresh(self) -> _Run:
        return _Run([g.slice_free0.copy() for g in self.groups], [g.lb0.copy() for g in self.groups],
                    [g.used0.copy() for g in self.groups], [{} for _ in self.groups],
                    [{} for _ in self.groups], [{} for _ in self.groups])  # fmt: skip

    # -- one (GPU, slot) exactly
    def _exact(self, run: _Run, gi: int, r: int, k: int, seconds: float) -> tuple[float, float, int]:
        """(start, opens, reconfigurations) of a run of ``seconds`` on slot ``k`` of row ``r``."""
        g = self.groups[gi]
        alive = run.alive[gi].get(r, g.alive0[r])
        now = self.now
        if k in alive:
            start = opens = alive[k]
            n = 0
        else:
            c = run.clock[gi].get(r, g.clock0[r])
            held = g.held[r][k]
            blockers = sorted((alive[j], j) for j in alive if g.omask[k] >> j & 1)
            opens = max([now, held, *(free for free, _ in blockers)])
            released = run.released[gi].get(r)
            if released is not None:  # slices an earlier step of this plan frees by a destroy
                opens = max(opens, float(released[g.wmat[k]].max()))
            for free, j in blockers:  # destroyed one at a time, in the order they free up
                c = max(c, free) + g.destroy[j]
            start, n = max(c, held, now) + g.create[k], 1 + len(blockers)
        for window, since, until in g.later.get(r, ()):
            if window & g.windows[k] and since < start + seconds and until > start:
                return INF, opens, n  # it would keep a reservation's slices: not here
        return start, opens, n

    def _candidates(self, run: _Run, gi: int, size: int, every: bool = False,
                    barred: np.ndarray | None = None) -> list[tuple[int, int]]:  # fmt: skip
        g = self.groups[gi]
        ks = g.by_size[size]
        sub = np.maximum(run.lb[gi][:, ks], self.now) - 1e-6 * run.used[gi][:, None]
        if barred is not None:
            sub = np.where(barred[:, None], INF, sub)
        flat = sub.ravel()
        m = flat.size if every else min(self.shortlist, flat.size)
        idx = np.argpartition(flat, m - 1)[:m] if m < flat.size else np.arange(flat.size)
        found = [(int(i) // len(ks), ks[int(i) % len(ks)]) for i in idx]
        return found if barred is None else [(r, k) for r, k in found if not barred[r]]

    def best_place(self, run: _Run, seconds: float, size: int,
                   barred: Sequence[np.ndarray | None] = ()) -> _Place | None:  # fmt: skip
        """(start, opens, reconfigurations, group, row, slot) where a ``size`` run starts first; ``barred``:
        per group, the rows the job may not have."""
        best: _Place | None = None
        best_key: tuple[float, int, float, int, int] | None = None
        for gi, g in enumerate(self.groups):
            if size not in g.by_size:
                continue
            rows_barred = barred[gi] if barred else None
            if rows_barred is not None and rows_barred.all():
                continue
            found = False
            for every in (False, True):  # the whole group only when no shortlisted place is clear
                for r, k in self._candidates(run, gi, size, every, rows_barred):
                    start, opens, n = self._exact(run, gi, r, k, seconds)
                    if not math.isfinite(start):
                        continue
                    found = True
                    key = (start, n, -float(run.used[gi][r]), g.gids[r], k)
                    if best_key is None or key < best_key:
                        best_key, best = key, (start, opens, n, gi, r, k)
                if found or not g.later:
                    break
        return best

    def commit(self, run: _Run, job: str, seconds: float, place: tuple[float, float, int, int, int, int]) -> Step:
        start, opens, _, gi, r, k = place
        g = self.groups[gi]
        alive = dict(run.alive[gi].get(r, g.alive0[r]))
        reconfigs: list[Reconfig] = []
        if k not in alive:
            c = run.clock[gi].get(r, g.clock0[r])
            for j in sorted((j for j in alive if g.omask[k] >> j & 1), key=lambda j: (alive[j], j)):
                begin = max(c, alive.pop(j))
                c = begin + g.destroy[j]
                released = run.released[gi].setdefault(r, np.full(g.wmat.shape[1], -INF))
                released[g.wmat[j]] = np.maximum(released[g.wmat[j]], c)
                reconfigs.append(Reconfig("destroy", g.slots[j].size, g.slots[j].start, begin, c))
            held = g.held[r][k]
            begin = max(c, held, self.now)
            c = begin + g.create[k]
            reconfigs.append(Reconfig("create", g.slots[k].size, g.slots[k].start, begin, c))
            run.clock[gi][r] = c
        alive[k] = start + seconds
        run.alive[gi][r] = alive
        g._refresh_slices(run.slice_free[gi], r, alive)
        run.lb[gi][r] = np.where(g.wmat, run.slice_free[gi][r][None, :], -INF).max(axis=1)
        run.used[gi][r] = sum(g.slots[j].size for j in alive)
        slot = g.slots[k]
        return Step(job, g.gids[r], slot.size, slot.start, g.scheme.profiles[slot.size].name, start, start + seconds,
                    opens, tuple(reconfigs), opens <= self.now + EPS)  # fmt: skip

    def decode(self, order: Sequence[int], sizes: Sequence[int], planner: str = "",
               min_gain: float = 0.1) -> LivePlan:  # fmt: skip
        """``sizes[i]`` 0: job ``i`` takes the size that finishes first (a smaller one within ``min_gain``)."""
        run = self.fresh()
        steps, unplaced = [], []
        for i in order:
            job = self.jobs[i]
            if sizes[i]:
                place = self.best_place(run, job.time(sizes[i]), sizes[i], self.barred_rows[i])
                chosen = (place, job.time(sizes[i])) if place is not None else None
            else:
                chosen = self._eft(run, job, self.sizes[i], min_gain, self.barred_rows[i])
            if chosen is None or chosen[0] is None:
                unplaced.append(job.name)
                continue
            steps.append(self.commit(run, job.name, chosen[1], chosen[0]))
        ends = [s.end for s in steps]
        return LivePlan(planner, tuple(steps), tuple(unplaced), max(ends, default=self.now),
                        sum(ends) / len(ends) if ends else self.now)  # fmt: skip

    def _eft(self, run: _Run, job: LiveJob, sizes: Sequence[int], min_gain: float,
             barred: Sequence[np.ndarray | None] = ()) -> tuple[_Place, float] | None:  # fmt: skip
        options = []
        for s in sizes:
            place = self.best_place(run, job.time(s), s, barred)
            if place is not None:
                options.append((place[0] + job.time(s), s, place))
        if not options:
            return None
        finish, _, place = min(options)
        best_seconds = job.time(min(options)[1])
        limit = finish + min_gain * best_seconds
        small = min((o for o in options if o[0] <= limit), key=lambda o: (o[1], o[0]))
        return small[2], job.time(small[1])


# -- planners


def _eft_plan(dec: LiveDecoder, deadline: float, evaluations: int, clock: Callable[[], float],
              objective: str, min_gain: float, seed: int) -> tuple[LivePlan, int]:  # fmt: skip
    n = len(dec.jobs)
    return dec.decode(range(n), [0] * n, "eft", min_gain), 1


class _Timed:
    """A planner's decodings against its deadline: one more is tried only when the slowest so far would still
    end by the deadline (a pass that overran it by a whole decoding waited for it)."""

    def __init__(self, dec: LiveDecoder, deadline: float, clock: Callable[[], float]):
        self.dec, self.deadline, self.clock, self.slowest = dec, deadline, clock, 0.0

    def decode(self, order: Sequence[int], sizes: Sequence[int], planner: str, *min_gain: float) -> LivePlan:
        t0 = self.clock()
        plan = self.dec.decode(order, sizes, planner, *min_gain)  # (the decoder's own default gain without one)
        self.slowest = max(self.slowest, self.clock() - t0)
        return plan

    def out_of_time(self) -> bool:
        return self.clock() + self.slowest > self.deadline


def _least_area(job: LiveJob, sizes: Sequence[int]) -> int:
    return min(sizes, key=lambda s: (s * job.time(s), s))


def worth_sizes(job: LiveJob, sizes: Sequence[int], min_gain: float) -> list[int]:
    """The sizes worth their slices: each larger one runs over ``min_gain`` shorter than the last kept
    (the site's rule for taking a larger profile; a plan that ignored it took 7 slices to end 5 % sooner)."""
    kept: list[int] = []
    for s in sorted(sizes):
        if not kept or job.time(kept[-1]) > job.time(s) * (1 + min_gain):
            kept.append(s)
    return kept


def _within(worth: Sequence[int], size: int) -> int:
    """The largest of ``worth`` up to ``size`` (its smallest when none is)."""
    return max((s for s in worth if s <= size), default=min(worth))


def _far_candidates(dec: LiveDecoder) -> list[list[int]]:
    """FAR's allotment family over the jobs (sizes the cluster has)."""
    tasks = [Task(j.name, {s: j.time(s) for s in dec.sizes[i]}) for i, j in enumerate(dec.jobs)]
    placeable = [i for i, s in enumerate(dec.sizes) if s]
    if not placeable:
        return []
    full = max(s for g in dec.groups for s in g.by_size)
    family = allotment_family([tasks[i] for i in placeable], full)
    out = []
    for allot in family:
        sizes = [0] * len(dec.jobs)
        for i, s in zip(placeable, allot, strict=True):
            sizes[i] = s
        out.append(sizes)
    return out


def _longest_first(dec: LiveDecoder, sizes: Sequence[int]) -> list[int]:
    return sorted(range(len(dec.jobs)), key=lambda i: (-dec.jobs[i].time(sizes[i]) if sizes[i] else 0.0, i))


def _far_plan(dec: LiveDecoder, deadline: float, evaluations: int, clock: Callable[[], float],
              objective: str, min_gain: float, seed: int) -> tuple[LivePlan, int]:  # fmt: skip
    best: LivePlan | None = None
    used, timed = 0, _Timed(dec, deadline, clock)
    for sizes in _far_candidates(dec) or [[0] * len(dec.jobs)]:
        if best is not None and (used >= evaluations or timed.out_of_time()):
            break
        plan = timed.decode(_longest_first(dec, sizes), sizes, "far")
        used += 1
        if best is None or plan.makespan < best.makespan - EPS:
            best = plan
    assert best is not None
    return best, used


def _auto_plan(dec: LiveDecoder, deadline: float, evaluations: int, clock: Callable[[], float],
               objective: str, min_gain: float, seed: int) -> tuple[LivePlan, int]:  # fmt: skip
    n = len(dec.jobs)
    queue = list(range(n))
    worth = [worth_sizes(j, dec.sizes[i], min_gain) for i, j in enumerate(dec.jobs)]
    area = [_least_area(j, worth[i]) if worth[i] else 0 for i, j in enumerate(dec.jobs)]
    fastest = [min(worth[i], key=lambda s: (j.time(s), s)) if worth[i] else 0 for i, j in enumerate(dec.jobs)]

    def shortest(sizes: Sequence[int]) -> list[int]:
        key = [dec.jobs[i].time(sizes[i]) if sizes[i] else min((dec.jobs[i].time(s) for s in dec.sizes[i]),
                                                               default=0.0) for i in range(n)]  # fmt: skip
        return sorted(range(n), key=lambda i: (key[i], i))

    eft_sizes = [0] * n
    starts: list[tuple[list[int], list[int]]] = [(queue, eft_sizes), (shortest(eft_sizes), eft_sizes)]
    for sizes in (area, fastest):
        starts += [(queue, sizes), (shortest(sizes), sizes), (_longest_first(dec, sizes), sizes)]
    family = [[_within(worth[i], s) if s else 0 for i, s in enumerate(sizes)] for sizes in _far_candidates(dec)]
    if family:
        starts.append((_longest_first(dec, family[0]), family[0]))
        starts += [(_longest_first(dec, s), s) for s in family[1:][:: max(1, len(family) // 8)]]
    best: LivePlan | None = None
    best_cand: tuple[list[int], list[int]] = starts[0]
    used, timed = 0, _Timed(dec, deadline, clock)

    def key(p: LivePlan) -> tuple[float, ...]:
        return (len(p.unplaced), *p.score(objective))

    for order, sizes in starts:
        if best is not None and (used >= evaluations or timed.out_of_time()):
            break
        plan = timed.decode(order, sizes, "auto", min_gain)
        used += 1
        if best is None or key(plan) < key(best):
            best, best_cand = plan, (list(order), list(sizes))
    assert best is not None
    rng = random.Random(seed)
    order, sizes = best_cand
    stalled = 0
    while n > 1 and used < evaluations and stalled < STALL and not timed.out_of_time():
        o, s = list(order), list(sizes)
        move = rng.random()
        if move < 0.5:
            i = rng.randrange(n)
            choices = [c for c in (0, *worth[i]) if c != s[i]]
            if not worth[i]:
                used += 1
                continue
            s[i] = rng.choice(choices)
        else:
            a, b = rng.sample(range(n), 2)
            if move < 0.75:
                o[a], o[b] = o[b], o[a]
            else:
                o.insert(b, o.pop(a))
        plan = timed.decode(o, s, "auto", min_gain)
        used += 1
        stalled = 0 if key(plan) < key(best) else stalled + 1
        if key(plan) <= key(best):
            best, order, sizes = plan, o, s
    return best, used


_PLANNERS = {"eft": _eft_plan, "far": _far_plan, "auto": _auto_plan}


def plan_live(state: LiveState, planner: str = "auto", *, budget_s: float = 1.0, evaluations: int = 10_000,
              objective: str = "mean", min_gain: float = 0.1, seed: int = 0,
              schemes: Mapping[str, GpuScheme] | None = None, shortlist: int = 6,
              clock: Callable[[], float] = time.perf_counter) -> LivePlan:  # fmt: skip
    """The plan of ``planner`` for ``state`` within ``budget_s`` seconds (by ``clock``) and
    ``evaluations`` decodings; at least one decoding always runs."""
    if planner not in _PLANNERS:
        raise ValueError(f"unknown live planner {planner!r}; known: {', '.join(LIVE_PLANNERS)}")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if not 0 <= min_gain < 1:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain}")
    if state.max_hold_s < 0:
        raise ValueError(f"max_hold_s must be >= 0, got {state.max_hold_s}")
    t0 = clock()
    dec = LiveDecoder(state, schemes, shortlist)
    if not state.jobs:
        return LivePlan(planner, (), (), state.now, state.now)
    plan, used = _PLANNERS[planner](dec, t0 + budget_s, max(1, evaluations), clock, objective, min_gain, seed)
    return LivePlan(planner, plan.steps, plan.unplaced, plan.makespan, plan.mean_end, used, clock() - t0)


def check_live_plan(state: LiveState, plan: LivePlan, schemes: Mapping[str, GpuScheme] | None = None) -> None:
    """Validate a live plan against its state; raises ValueError naming the broken rule.

    Every queued job is planned once or listed unplaced; a run takes its predicted time on a size its
    GPU has, at an allowed slot, on a GPU not barred to it; on each GPU, instances alive at the same time
    never share a memory slice (the ones that exist now live until the plan destroys them), runs happen on
    a live instance after its creation and before its destruction, one at a time, reconfigurations never overlap and
    destroy only idle instances; no run shares slices with a hold while it lasts, nor with a rigid
    job's reservation after ``since + max_hold_s``.
    """
    names = [s.job for s in plan.steps] + list(plan.unplaced)
    if sorted(names) != sorted(j.name for j in state.jobs):
        raise ValueError("every queued job must be planned exactly once or listed unplaced")
    jobs = {j.name: j for j in state.jobs}
    gpus = {g.gid: g for g in state.gpus}
    now = state.now
    by_gpu: dict[int, list[Step]] = {}
    for s in plan.steps:
        if s.gid not in gpus:
            raise ValueError(f"job {s.job}: no GPU {s.gid}")
        if s.gid in jobs[s.job].barred:
            raise ValueError(f"job {s.job}: GPU {s.gid} is barred to it")
        expected = jobs[s.job].time(s.size)
        if not math.isfinite(expected) or abs(s.end - s.start - expected) > 1e-6 * max(1.0, expected):
            raise ValueError(f"job {s.job} on size {s.size} must take {expected}, the plan gives {s.end - s.start}")
        if s.start < now - EPS:
            raise ValueError(f"job {s.job} starts at {s.start}, before now ({now})")
        by_gpu.setdefault(s.gid, []).append(s)
    for gid, steps in by_gpu.items():
        gpu = gpus[gid]
        scheme = (schemes or {}).get(gpu.model) or gpu_scheme(gpu.model)
        window = {(s.size, s.start): s.window for size in scheme.sizes for s in scheme.slots[size]}
        busy: list[tuple[int, float, float, str]] = [(h.window, h.since, h.until, "a hold") for h in gpu.holds]
        busy += [(w.window, w.since + state.max_hold_s, w.since + state.max_hold_s + w.seconds,
                  "a rigid job's reservation") for w in state.rigid if w.gid == gid]  # fmt: skip
        reconfigs = sorted((r for s in steps for r in s.reconfigs), key=lambda r: r.begin)
        for a, b in itertools.pairwise(reconfigs):
            if b.begin < a.end - EPS:
                raise ValueError(f"GPU {gid}: reconfigurations overlap at {b.begin}")
        if reconfigs and reconfigs[0].begin < max(now, gpu.reconfig_free_at) - EPS:
            raise ValueError(f"GPU {gid}: a reconfiguration begins before the lock frees")
        # instance lives: (slot, born, created, dead, [runs])
        lives: dict[tuple[int, int], list[list[Any]]] = {}
        for inst in gpu.instances:
            lives.setdefault((inst.size, inst.start), []).append([-INF, -INF, INF, [(-INF, inst.free_at, "")]])
        events = sorted(((r.begin, 0 if r.kind == "destroy" else 1, r, s) for s in steps for r in s.reconfigs),
                        key=lambda e: (e[0], e[1]))  # fmt: skip
        for _, _, r, _s in events:
            key = (r.size, r.start)
            if key not in window:
                raise ValueError(f"GPU {gid}: no {r.size}-slice instance starts at {r.start}")
            if r.end - r.begin < (scheme.destroy_s if r.kind == "destroy" else scheme.create_s)[r.size] - EPS:
                raise ValueError(f"GPU {gid}: {r.kind} {r.size}@{r.start} is shorter than its time")
            open_ = [life for life in lives.get(key, []) if life[2] == INF]
            if r.kind == "create":
                if open_:
                    raise ValueError(f"GPU {gid}: {r.size}@{r.start} created while it exists")
                lives.setdefault(key, []).append([r.begin, r.end, INF, []])
            else:
                if not open_:
                    raise ValueError(f"GPU {gid}: destroy of {r.size}@{r.start}, which does not exist")
                open_[0][2] = r.end
                open_[0].append(r.begin)
        for s in steps:
            key = (s.size, s.slot)
            if key not in window:
                raise ValueError(f"job {s.job}: no {s.size}-slice instance starts at {s.slot}")
            host = [life for life in lives.get(key, []) if life[1] <= s.start + EPS and s.end <= life[2] + EPS]
            if not host:
                raise ValueError(f"job {s.job} runs outside any life of instance {s.size}@{s.slot} on GPU {gid}")
            host[0][3].append((s.start, s.end, s.job))
            for w, since, until, what in busy:
                if w & window[key] and since < s.end - EPS and until > s.start + EPS:
                    raise ValueError(f"job {s.job} on GPU {gid} shares slices with {what}")
        flat = [(key, life) for key, group in lives.items() for life in group]
        for i, (ka, la) in enumerate(flat):
            runs = sorted(la[3])
            for a, b in itertools.pairwise(runs):
                if b[0] < a[1] - EPS:
                    raise ValueError(f"jobs {a[2]} and {b[2]} share instance {ka} on GPU {gid} at once")
            if len(la) > 4 and any(run[1] > la[4] + EPS for run in runs):
                raise ValueError(f"GPU {gid}: instance {ka} destroyed while a job runs on it")
            for kb, lb in flat[i + 1 :]:
                if window[ka] & window[kb] and la[0] < lb[2] - EPS and lb[0] < la[2] - EPS:
                    raise ValueError(f"GPU {gid}: instances {ka} and {kb} share memory while both alive")
