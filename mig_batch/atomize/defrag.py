"""Live defragmentation at checkpoint boundaries: where a chain's next subjob goes, and which windows
its next grants must leave alone.

A checkpointed chain stops at the end of every subjob and starts again wherever its next grant puts
it, so every grant is a migration that costs nothing beyond the checkpoint it pays anyway. GRMU
consolidates by migrating running instances; here only grants move, no running job is ever stopped.

* **Consolidation** (:func:`choose_spot`): once the grant policy has picked a chain and its profile,
  the subjob goes to the open spot (GPU, start) that keeps the most useful capacity free, among the
  spots where the chain gets the same profile for at least as long. Useful capacity is judged in
  order: (1) how much longer the GPU stays short of a whole free GPU (a GPU free or emptying soon is
  kept for whole-GPU jobs; one already busy past the subjob's end costs nothing), (2) which profiles
  the GPU could still host, largest first (GRMU's consolidation favours the same: fill busy GPUs),
  (3) the busiest GPU, (4) the lowest GPU id and start.
* **Steering** (:func:`steer`): a queued rigid job that fits nowhere now, but would fit on a window
  that only chain subjobs hold now, is blocked by fragmentation and not by capacity. That window
  gets a reservation from when its chain subjobs end: the gaps over it close then, so the chains'
  next grants go elsewhere (or wait) and the window opens at their checkpoints. The wait a chain
  pays for it is bounded by the caller: chains waiting longer than a limit are offered the gaps
  without the steering holds.

Times are absolute seconds; pure code, shared by ``mig-batch simulate atomize`` and mig-batchd.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from mig_batch.atomize.gaps import Gap, GpuTimeline, Hold, earliest_fit, fits_in
from mig_batch.atomize.protocol import Chain, Reply, answer
from mig_batch.mig.models import get_model


@dataclass(frozen=True)
class Steer:
    """A window kept for a rigid job blocked by chain subjobs: no grant may overlap it from ``opens``."""

    gid: int
    window: int
    opens: float  # when the chain subjobs holding it now end

    @property
    def hold(self) -> Hold:
        return Hold(self.window, since=self.opens)


def _now_mask(gpu: GpuTimeline, now: float) -> int:
    mask = 0
    for h in gpu.holds:
        if h.since <= now < h.until:
            mask |= h.window
    return mask


def _whole_free_at(gpu: GpuTimeline, now: float) -> float:
    """When every instance on the GPU now has ended (``now`` for a free GPU)."""
    return max((h.until for h in gpu.holds if h.since <= now < h.until), default=now)


def _hostable(model_name: str, mask: int) -> tuple[int, ...]:
    """For each profile size, largest first: 1 when the free slices can still host one."""
    model = get_model(model_name)
    sizes = sorted({p.memory_slices for p in model.base_profiles}, reverse=True)
    out = []
    for size in sizes:
        profiles = [p for p in model.base_profiles if p.memory_slices == size]
        out.append(int(any(p.window(s) & mask == 0 for p in profiles for s in p.starts)))
    return tuple(out)


def spot_key(gpu: GpuTimeline, window: int, start: int, end: float, now: float) -> tuple:
    """Lower is better: the cost to useful capacity of holding ``window`` on ``gpu`` until ``end``."""
    mask = _now_mask(gpu, now)
    delay = max(0.0, end - max(_whole_free_at(gpu, now), now))  # how much later the GPU is whole-free
    before, after = _hostable(gpu.model, mask), _hostable(gpu.model, mask | window)
    lost = tuple(b - a for b, a in zip(before, after, strict=True))
    return (round(delay, 6), lost, -mask.bit_count(), gpu.gid, start)


def choose_spot(chain: Chain, reply: Reply, offered: Gap, gaps: Sequence[Gap], timelines: Sequence[GpuTimeline],
                taken: Mapping[int, int], now: float, eps: float, hysteresis: float) -> tuple[Gap, Reply]:  # fmt: skip
    """Where a granted subjob goes: the open spot with the least cost to useful capacity
    (:func:`spot_key`) among those where the chain answers the same profile for at least as long as
    in the offered gap. The spot comes back as a gap narrowed to the profile's own slices, so that
    :func:`~mig_batch.atomize.gaps.start_in_gap` puts it there; the offered gap is one candidate."""
    by_gid = {t.gid: t for t in timelines}
    best: tuple[tuple, Gap, Reply] | None = None
    for gap in gaps:
        if gap.opens > now or gap.gid not in by_gid or gap.window & taken.get(gap.gid, 0):
            continue
        alt = reply if gap is offered else answer(chain, gap, eps, hysteresis)
        if not alt.interested or alt.profile != reply.profile or alt.duration < reply.duration - 1e-6:
            continue
        profile = get_model(gap.model).profile(reply.profile)
        for start in fits_in(profile, gap.window):
            window = profile.window(start)
            if _now_mask(by_gid[gap.gid], now) & window:
                continue
            key = spot_key(by_gid[gap.gid], window, start, now + alt.duration, now)
            if best is None or key < best[0]:
                spot = replace(gap, profile=profile.name, start=start, window=window)
                best = (key, spot, alt)
    if best is None:
        return offered, reply
    return best[1], best[2]


def blocking_chains(gpu: GpuTimeline, chain_mask: int, window: int, now: float) -> float | None:
    """When ``window`` opens if only the chain subjobs holding part of it now are in its way
    (``chain_mask``: the slices chain subjobs hold now); None when something else holds it now or
    a reservation claims it later."""
    opens = now
    for h in gpu.holds:
        if not h.window & window or h.until <= now:
            continue
        if h.since > now:
            return None  # a reservation: not ours to take
        if h.window & ~chain_mask:
            return None  # a rigid job (or an unstarted decision) holds it
        opens = max(opens, h.until)
    return opens


def steer(timelines: Sequence[GpuTimeline], chain_masks: Mapping[int, int],
          blocked: Sequence[Mapping[str, str]], now: float, limit: int) -> list[Steer]:  # fmt: skip
    """Windows kept for rigid jobs blocked by fragmentation, in queue order, at most ``limit``.

    ``blocked``: each waiting rigid job's profile per GPU model, in queue order. A job is steered
    for when it fits on no GPU now and some window of its profile is held now only by chain
    subjobs: the one that opens first (then the fewest chain slices in the way, lowest GPU and
    start). Each window kept is a hold for the next job's search, so no two jobs share one."""
    current = list(timelines)
    out: list[Steer] = []
    for profiles in blocked:
        if len(out) >= limit:
            break
        best: tuple[tuple, Steer] | None = None
        fits_now = False
        for gpu in current:
            if gpu.model not in profiles:
                continue
            profile = get_model(gpu.model).profile(profiles[gpu.model])
            mask = _now_mask(gpu, now)
            for start in profile.starts:
                window = profile.window(start)
                if not window & mask and not any(h.window & window and h.since > now for h in gpu.holds):
                    fits_now = True
                    break
                opens = blocking_chains(gpu, chain_masks.get(gpu.gid, 0), window, now)
                if opens is None or math.isinf(opens):
                    continue
                key = (opens, (window & mask).bit_count(), gpu.gid, start)
                if best is None or key < best[0]:
                    best = (key, Steer(gpu.gid, window, opens))
            if fits_now:
                break
        if fits_now or best is None:
            continue
        s = best[1]
        out.append(s)
        current = [GpuTimeline(t.gid, t.host, t.index, t.model, (*t.holds, s.hold)) if t.gid == s.gid else t
                   for t in current]  # fmt: skip
    return out


def with_steering(timelines: Sequence[GpuTimeline], steers: Sequence[Steer]) -> list[GpuTimeline]:
    holds: dict[int, list[Hold]] = {}
    for s in steers:
        holds.setdefault(s.gid, []).append(s.hold)
    return [GpuTimeline(t.gid, t.host, t.index, t.model, (*t.holds, *holds[t.gid])) if t.gid in holds else t
            for t in timelines]  # fmt: skip


def offer_groups(chains: Sequence[Chain], timelines: Sequence[GpuTimeline], steers: Sequence[Steer],
                 waited_s: Mapping[str, float], max_hold_s: float) -> list[tuple[list[Chain], list[GpuTimeline]]]:
    """The chains in the order their groups are offered gaps, each with the timelines it sees. Steering
    delays a chain a bounded time: those that have waited (``waited_s``, by job) longer than ``max_hold_s``
    come first and see the real timelines; the others see them with the steering holds. Without steers,
    one group."""
    if not steers:
        return [(list(chains), list(timelines))]
    overdue = [c for c in chains if waited_s.get(c.job, 0.0) > max_hold_s]
    rest = [c for c in chains if c not in overdue]
    return [(overdue, list(timelines)), (rest, with_steering(timelines, steers))]


def keep_windows(timelines: Sequence[GpuTimeline], chain_masks: Mapping[int, int],
                 blocked: Sequence[Mapping[str, str]], now: float, limit: int,
                 horizon: float) -> list[Steer | None]:  # fmt: skip
    """For each blocked rigid job in queue order, the window kept for it (or None): a
    :func:`steer` window, unless another window opens sooner anyway (EASY's earliest fit, which
    then is the job's reservation as before). At most ``limit`` windows are kept."""
    views = list(timelines)
    out: list[Steer | None] = []
    for profiles in blocked:
        found = steer(views, chain_masks, [profiles], now, 1) if sum(s is not None for s in out) < limit else []
        if found:
            easy = earliest_fit(views, profiles, now, horizon)
            if easy is not None and easy[3] < found[0].opens:
                found = []
        if found:
            views = with_steering(views, found)
        out.append(found[0] if found else None)
    return out
