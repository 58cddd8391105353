"""Moldable jobs in a running cluster: which size, where, and whether to wait for a better one.

A moldable job lists the sizes it can run on with a predicted run time for each. In queue order,
each job gets the option with the earliest predicted finish (start + run time), judged against what
holds every GPU's slices and until when (:mod:`mig_batch.placement.timelines`):

* among the options that can start now, a smaller profile is preferred while its finish is within
  ``min_gain`` of the best one (a few percent are not worth a larger instance);
* a job waits only when a later start finishes earlier by more than ``min_gain`` of the best
  start-now run time (predictions are uncertain; waiting must pay). A waiting job gets a
  reservation where it would start (conservative backfill): the jobs after it in this pass cannot
  delay it. Only the first ``max_reservations`` waiting jobs look ahead, which bounds the work of
  one pass;
* the start now is chosen by the placement policy (MFI by default) among the places that are free
  for the whole predicted run.

Earliest starts are vectorised over the GPUs of a model: per GPU and memory slice, the time at which
the slice frees up; a profile at a start can run from the latest of its slices' times. Reservations
(holds that begin later) are few and checked one by one.

Pure code: the controller and the simulator call it with their view, timelines and clock; the
caller applies a start-now placement to its ``Cluster`` before asking for the next job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mig_batch.mig.models import get_model
from mig_batch.mig.scores import FragVariant
from mig_batch.mig.tables import tables_for
from mig_batch.placement.base import Placement, PlacementRequest, Policy, placement_on
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.timelines import GpuTimeline, Hold

_INSTANT = 1e-3  # seconds: "about to end" for an instance whose expected end has passed


@dataclass(frozen=True)
class MoldableJob:
    job: str
    times: Mapping[str, Mapping[str, float]]  # GPU model -> profile -> predicted seconds


@dataclass(frozen=True)
class MoldableChoice:
    """What a job does now: start (``placement``), wait with a reservation (``reserved``), or wait."""

    job: str
    profile: str | None  # None: no option within reach (or no lookahead left) - it waits
    seconds: float = math.inf
    starts: float = math.inf  # now, or when its reservation opens
    placement: Placement | None = None
    reserved: tuple[int, int] | None = None  # (GPU id, start) of the reservation

    @property
    def finish(self) -> float:
        return self.starts + self.seconds


@dataclass(frozen=True)
class _Option:
    model: str
    profile: str
    seconds: float
    slices: int
    memory: int


def options_of(job: MoldableJob) -> list[_Option]:
    out = []
    for model_name, times in job.times.items():
        model = get_model(model_name)
        for name, seconds in times.items():
            p = model.profile(name)
            if math.isfinite(seconds) and seconds > 0:
                out.append(_Option(model.name, name, float(seconds), p.compute_slices, p.memory_slices))
    return sorted(out, key=lambda o: (o.seconds, o.slices, o.memory))


class MoldablePlanner:
    """One scheduling pass over the waiting moldable jobs, in queue order (see the module text)."""

    def __init__(self, cluster: Cluster, timelines: Sequence[GpuTimeline], now: float, policy: Policy,
                 min_gain: float = 0.1, max_reservations: int = 16) -> None:  # fmt: skip
        if not 0 <= min_gain < 1:
            raise ValueError(f"min_gain must be in [0, 1), got {min_gain}")
        self.cluster, self.now, self.policy = cluster, now, policy
        self.min_gain, self.reservations_left = min_gain, max_reservations
        self._rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # model -> (GPU ids, free-at per slice)
        self._row_of: dict[int, int] = {}
        # GPU id -> holds a start now must stay clear of: those that begin after now, and the reservations
        # (of rigid jobs, of this pass) that opened already, whose slices the cluster does not show taken
        self._later: dict[int, list[Hold]] = {}
        self.reserved: list[tuple[int, Hold]] = []  # this pass's reservations, for the gaps offered after it
        by_model: dict[str, list[GpuTimeline]] = {}
        for t in timelines:
            by_model.setdefault(t.model, []).append(t)
        for model_name, group in by_model.items():
            slices = get_model(model_name).memory_slices
            free_at = np.full((len(group), slices), -math.inf)
            for row, t in enumerate(group):
                self._row_of[t.gid] = row
                for hold in t.holds:
                    if hold.since > now or hold.until > now:
                        self._later.setdefault(t.gid, []).append(hold)
                    if hold.since <= now:  # held now: it frees after now, even if overdue (a job still completing)
                        cols = _bits(hold.window)
                        free_at[row, cols] = np.maximum(free_at[row, cols], max(hold.until, now + _INSTANT))
            self._rows[model_name] = (np.array([t.gid for t in group]), free_at)

    def hold(self, gid: int, hold: Hold) -> None:
        """Slices taken by a decision made outside this planner (a rigid job, its reservation)."""
        if hold.since > self.now or hold.until > self.now:
            self._later.setdefault(gid, []).append(hold)
        if hold.since > self.now:
            return
        _, free_at = self._rows[self.cluster.gpus[gid].model]
        cols = _bits(hold.window)
        row = self._row_of[gid]
        free_at[row, cols] = np.maximum(free_at[row, cols], hold.until)

    def decide(self, job: MoldableJob, barred: frozenset[int] = frozenset()) -> MoldableChoice:
        """``barred``: GPU ids the job may not have later either (outside its partitions, on a node that is
        down), where no reservation goes; starting now goes by the cluster's fences."""
        options = options_of(job)
        now_choice = self._start_now(job.job, options)
        if self.reservations_left > 0:
            later = self._earliest_later(options, now_choice, barred)
            if later is not None:
                gid, option, start, opens = later
                window = get_model(option.model).profile(option.profile).window(start)
                reserved = Hold(window, until=opens + option.seconds, since=opens)
                self.hold(gid, reserved)
                self.reserved.append((gid, reserved))
                self.reservations_left -= 1
                return MoldableChoice(job.job, option.profile, option.seconds, opens, reserved=(gid, start))
        if now_choice is None:
            return MoldableChoice(job.job, None)
        placement, option = now_choice
        window = get_model(option.model).profile(option.profile).window(placement.start)
        self.hold(placement.gid, Hold(window, until=self.now + option.seconds))
        return MoldableChoice(job.job, option.profile, option.seconds, self.now, placement=placement)

    # -- start now
    def _start_now(self, job: str, options: list[_Option]) -> tuple[Placement, _Option] | None:
        best = next(((p, o) for o in options if (p := self._place_now(job, o)) is not None), None)
        if best is None:
            return None
        limit = best[1].seconds * (1 + self.min_gain)
        for o in sorted((o for o in options if o.seconds <= limit), key=lambda o: (o.slices, o.memory, o.seconds)):
            if (o.slices, o.memory) >= (best[1].slices, best[1].memory):
                break
            placed = self._place_now(job, o)
            if placed is not None:
                return placed, o
        return best

    def _place_now(self, job: str, option: _Option) -> Placement | None:
        if option.model not in self._rows:
            return None
        decision = self.policy.decide(self.cluster, PlacementRequest.single(job, option.model, option.profile))
        if not isinstance(decision, Placement) or decision.gid not in self._row_of:  # not one of our GPUs
            return None
        profile = get_model(option.model).profile(option.profile)
        end = self.now + option.seconds
        if self.clear(decision.gid, profile.window(decision.start), self.now, end):
            return decision
        # the policy's choice meets a reservation: the least fragmenting free place that stays clear
        tables = tables_for(option.model)
        after = tables.frag_after[FragVariant.PRINTED][tables.index(option.profile)]
        usable = [int(gid) for gid in self._rows[option.model][0] if int(gid) not in self.cluster.fenced]
        best = min(((frag, gid, start) for gid in usable for start, frag in after[self.cluster.gpus[gid].mask]
                    if self.clear(gid, profile.window(start), self.now, end)), default=None)  # fmt: skip
        return None if best is None else placement_on(self.cluster, best[1], option.profile, best[2])

    def clear(self, gid: int, window: int, begin: float, end: float) -> bool:
        """Whether ``window`` on GPU ``gid`` meets no reservation between ``begin`` and ``end``."""
        return not any(h.window & window and h.since < end and h.until > begin for h in self._later.get(gid, ()))

    # -- wait for a better start
    def _earliest_later(self, options: list[_Option], now_choice: tuple[Placement, _Option] | None,
                        barred: frozenset[int]) -> tuple[int, _Option, int, float] | None:  # fmt: skip
        """The best later start, on no ``barred`` GPU, when it beats starting now by more than ``min_gain``."""
        target = math.inf
        if now_choice is not None:
            seconds = now_choice[1].seconds
            target = self.now + seconds - self.min_gain * seconds
        best: tuple[float, float, int, int, _Option] | None = None  # (finish, opens, gid, start, option)
        never: dict[str, np.ndarray] = {}  # model -> its rows on barred GPUs
        for option in options:
            bar = min(target, best[0]) if best else target
            if option.model not in self._rows or self.now + option.seconds >= bar:
                continue
            gids, free_at = self._rows[option.model]
            if barred and option.model not in never:
                never[option.model] = np.isin(gids, list(barred))
            profile = get_model(option.model).profile(option.profile)
            for start in profile.starts:
                window = profile.window(start)
                opens = np.maximum(free_at[:, _bits(window)].max(axis=1), self.now)
                if barred:
                    opens[never[option.model]] = math.inf  # sorted last, and never clear
                for row in np.argsort(opens, kind="stable")[: 1 + len(self._later)]:
                    gid = int(gids[row])
                    at = self._clear_from(gid, window, float(opens[row]), option.seconds)
                    if math.isfinite(at) and at + option.seconds < target and \
                            (best is None or (at + option.seconds, at, gid, start) < best[:4]):
                        best = (at + option.seconds, at, gid, start, option)
        if best is None or best[1] <= self.now:
            return None  # nothing better, or the best is now after all (the start-now path places it)
        return best[2], best[4], best[3], best[1]

    def _clear_from(self, gid: int, window: int, at: float, seconds: float) -> float:
        """The first time from ``at`` at which ``window`` stays clear of reservations for ``seconds``."""
        holds = [h for h in self._later.get(gid, ()) if h.window & window]
        moved = True
        while moved and math.isfinite(at):
            moved = False
            for h in holds:
                if h.since < at + seconds and h.until > at:
                    at, moved = h.until, True
        return at


def _bits(window: int) -> list[int]:
    return [i for i in range(window.bit_length()) if window >> i & 1]


def expected_end(predicted: float, now: float, floor_s: float = 60.0) -> float:
    """When a running job should end: its prediction, or once it is overdue, as far ahead as it has
    overrun (at least ``floor_s``), so that a badly predicted job earns less and less waiting."""
    return predicted if predicted > now else now + max(floor_s, now - predicted)
