"""Gaps: time x capacity windows on each GPU, derived from what holds its slices and until when.

A GPU's slices are held by running instances (until their expected end: start + time limit), by
decided-but-not-started jobs (until their time limit from now, or unknown) and, from a later time
on, by reservations: the first queued job that fits nowhere now (EASY backfill) and moldable jobs
waiting for a faster slot; gaps must not delay them. A gap is a placement (profile, start) that is
free from ``opens`` to ``closes``: every such interval up to the horizon, so a placement busy in
between (a reservation that ends) has a later gap too. Only maximal gaps are kept (no other gap on
the GPU covers more slices for at least as long), and these are what the controller offers (SJA
§3.5). The job answering an offer picks the smallest profile inside it that covers its memory
envelope.

Times are absolute seconds on the caller's clock; ``math.inf`` means "not known to end". Pure code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from mig_batch.mig.models import Profile, get_model
from mig_batch.mig.scores import FragVariant
from mig_batch.mig.tables import tables_for
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.timelines import GpuTimeline, Hold  # placement's; callers may still take them from here


@dataclass(frozen=True)
class Gap:
    gid: int
    host: str
    gpu_index: int
    model: str
    profile: str  # the largest profile the gap holds at ``start``
    start: int
    window: int  # its memory slices
    opens: float
    closes: float

    @property
    def length(self) -> float:
        return self.closes - self.opens


def _held(holds: Sequence[Hold], window: int, t: float) -> bool:
    return any(h.window & window and h.since <= t < h.until for h in holds)


def _free_intervals(holds: Sequence[Hold], window: int, now: float, end: float) -> list[tuple[float, float]]:
    """Every maximal interval [opens, closes) within [now, end) in which ``window`` is free."""
    mine = [h for h in holds if h.window & window]
    times = sorted({now, *(t for h in mine for t in (h.since, h.until) if now < t < end)})
    out: list[tuple[float, float]] = []
    for t, nxt in zip(times, [*times[1:], end], strict=True):
        if _held(mine, window, t):
            continue
        if out and out[-1][1] == t:
            out[-1] = (out[-1][0], nxt)  # free on both sides of a boundary: one interval
        else:
            out.append((t, nxt))
    return out


def gpu_gaps(gpu: GpuTimeline, now: float, horizon: float) -> list[Gap]:
    """The maximal gaps of one GPU between ``now`` and ``now + horizon``."""
    model = get_model(gpu.model)
    end = now + horizon
    found: dict[tuple[int, float, float], Gap] = {}  # one gap per slice window and interval
    for profile in sorted(model.base_profiles, key=lambda p: -p.compute_slices):  # 4g.20gb before 3g.20gb
        for start in profile.starts:
            window = profile.window(start)
            for interval in _free_intervals(gpu.holds, window, now, end):
                if (window, *interval) not in found:
                    found[(window, *interval)] = Gap(gpu.gid, gpu.host, gpu.index, model.name, profile.name,
                                                     start, window, *interval)  # fmt: skip
    gaps = list(found.values())
    return [g for g in gaps if not any(_dominates(o, g) for o in gaps)]


def _dominates(a: Gap, b: Gap) -> bool:
    covers = a.window & b.window == b.window and a.opens <= b.opens and a.closes >= b.closes
    return covers and (a.window != b.window or a.opens < b.opens or a.closes > b.closes)


def cluster_gaps(gpus: Iterable[GpuTimeline], now: float, horizon: float) -> list[Gap]:
    """Every GPU's maximal gaps: open-now ones first, then the largest areas."""
    gaps = [g for gpu in gpus for g in gpu_gaps(gpu, now, horizon)]
    slices = {g.gid: get_model(g.model) for g in gaps}
    return sorted(gaps, key=lambda g: (g.opens > now, -g.window.bit_count() * g.length / slices[g.gid].memory_slices,
                                       g.gid, g.start))  # fmt: skip


def earliest_fit(gpus: Iterable[GpuTimeline], profiles: Mapping[str, str], now: float,
                 horizon: float) -> tuple[GpuTimeline, Profile, int, float] | None:  # fmt: skip
    """Where and when a job needing ``profiles`` (model -> profile) could start first: the reservation
    that gaps must respect. Ties go to the lowest GPU id and start."""
    best = None
    for gpu in gpus:
        if gpu.model not in profiles:
            continue
        profile = get_model(gpu.model).profile(profiles[gpu.model])
        for start in profile.starts:
            intervals = _free_intervals(gpu.holds, profile.window(start), now, now + horizon)
            last = intervals[-1] if intervals else None  # only the last can stay open to the horizon
            if last is not None and last[1] >= now + horizon and (best is None or last[0] < best[3]):
                best = (gpu, profile, start, last[0])
    return best


def fits_in(profile: Profile, gap_window: int) -> list[int]:
    """Starts at which ``profile`` lies entirely within a gap's slices."""
    return [s for s in profile.starts if profile.window(s) & gap_window == profile.window(s)]


def start_in_gap(gap: Gap, profile_name: str, mask: int) -> int | None:
    """Where in the gap to put ``profile_name`` on a GPU whose occupancy now is ``mask``: the start
    with the least fragmentation afterwards (MFI, printed F), lowest start on ties."""
    tables = tables_for(gap.model)
    after = dict(tables.frag_after[FragVariant.PRINTED][tables.index(profile_name)][mask])
    starts = [s for s in fits_in(get_model(gap.model).profile(profile_name), gap.window) if s in after]
    return min(starts, key=lambda s: (after[s], s)) if starts else None


def cluster_timelines(cluster: Cluster, until: Callable[[str], float]) -> list[GpuTimeline]:
    """The placement view as timelines: each instance holds its slices until ``until(job)``. A fenced GPU
    (its node down, MIG mode off) has none: nothing may be planned there, as no policy may place there."""
    out = []
    for gpu in (g for g in cluster.gpus if g.gid not in cluster.fenced):
        model = get_model(gpu.model)
        holds = tuple(Hold(model.profile(p).window(s), until=until(job)) for job, (p, s) in gpu.instances.items())
        out.append(GpuTimeline(gpu.gid, gpu.host, gpu.index, gpu.model, holds))
    return out


def reservation(timelines: Sequence[GpuTimeline], profiles: Mapping[str, str], now: float,
                horizon: float) -> tuple[int, Hold] | None:  # fmt: skip
    """EASY backfill's reservation for a job that fits nowhere now: (GPU id, the slices it will hold
    from its earliest start on)."""
    where = earliest_fit(timelines, profiles, now, horizon)
    if where is None:
        return None
    gpu, profile, start, at = where
    return gpu.gid, Hold(profile.window(start), since=at)


def with_hold(timelines: Sequence[GpuTimeline], gid: int, hold: Hold) -> list[GpuTimeline]:
    return [GpuTimeline(t.gid, t.host, t.index, t.model, (*t.holds, hold)) if t.gid == gid else t
            for t in timelines]  # fmt: skip
