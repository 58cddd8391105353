"""Live defragmentation at checkpoint boundaries (mig_batch.atomize.defrag): where a chain's next
subjob goes, which windows are kept for rigid jobs blocked by fragmentation, and the invariants:
nothing running is touched, chains still get grants, the same input gives the same decision."""

import math
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.atomize.defrag import Steer, choose_spot, keep_windows, offer_groups, spot_key, steer, with_steering
from mig_batch.atomize.gaps import GpuTimeline, Hold, cluster_gaps, start_in_gap
from mig_batch.atomize.profiles import MemoryProfile
from mig_batch.atomize.protocol import Chain, negotiate
from mig_batch.mig.models import get_model

MODEL = get_model("A100-80GB")
WHOLE = {MODEL.name: "7g.80gb"}
EPS, HYST = 0.05, 0.25


def window(profile: str, start: int) -> int:
    return MODEL.profile(profile).window(start)


def gpu(gid: int, *holds: Hold) -> GpuTimeline:
    return GpuTimeline(gid, f"n{gid}", 0, MODEL.name, holds)


def chain(job: str = "c", mib: float = 9_000, smin: float = 60, smax: float = 600) -> Chain:
    return Chain(job, mib, MemoryProfile(()), smin, smax, 0.0)


def place(timelines, now=0.0):
    return partial(_place, timelines=timelines, now=now)


def _place(c, reply, offered, gaps, taken, *, timelines, now):
    return choose_spot(c, reply, offered, gaps, timelines, taken, now, EPS, HYST)


def grant_round(timelines, chains, now=0.0, defrag=True):
    gaps = cluster_gaps(timelines, now, 3600)
    return negotiate(gaps, chains, now, EPS, "efficiency", HYST, place(timelines, now) if defrag else None)


def test_a_grant_goes_next_to_a_long_running_job_and_keeps_the_free_gpu_whole():
    timelines = [gpu(0), gpu(1, Hold(window("1g.10gb", 0), until=5000))]
    plain = grant_round(timelines, [chain()], defrag=False).grants()
    assert [g.gid for g, _ in plain] == [0]  # SJA alone fills the largest gap: the free GPU
    (spot, reply), = grant_round(timelines, [chain()]).grants()
    assert spot.gid == 1 and reply.profile == "1g.10gb" and reply.duration == 600
    assert start_in_gap(spot, reply.profile, window("1g.10gb", 0)) is not None


def test_a_gpu_that_empties_before_the_subjob_ends_is_left_alone():
    # GPU 0 empties at t=100, GPU 1 is busy until t=5000: a 600 s subjob delays GPU 0's emptying
    timelines = [gpu(0, Hold(window("1g.10gb", 0), until=100)), gpu(1, Hold(window("3g.40gb", 0), until=5000))]
    (spot, _), = grant_round(timelines, [chain()]).grants()
    assert spot.gid == 1
    assert spot_key(timelines[1], window("1g.10gb", 4), 4, 600, 0)[0] == 0
    assert spot_key(timelines[0], window("1g.10gb", 4), 4, 600, 0)[0] == 500


def test_a_spot_with_a_shorter_window_is_not_taken():
    # GPU 1 is busy longer, but only 200 s are free there before a reservation: the chain would lose time
    timelines = [gpu(0), gpu(1, Hold(window("1g.10gb", 0), until=5000), Hold(MODEL.full_mask, since=200))]
    (spot, reply), = grant_round(timelines, [chain()]).grants()
    assert spot.gid == 0 and reply.duration == 600


def test_a_whole_gpu_job_blocked_by_a_chain_gets_its_window_kept():
    chains_at = window("1g.10gb", 0)
    timelines = [gpu(0, Hold(chains_at, until=300)), gpu(1, Hold(window("1g.10gb", 0), until=5000))]
    (kept,) = steer(timelines, {0: chains_at}, [WHOLE], 0.0, 4)
    assert (kept.gid, kept.window, kept.opens) == (0, MODEL.full_mask, 300)
    # the chain's next grant may use GPU 0 only until the window opens, so a 600 s subjob goes elsewhere
    (spot, _), = grant_round(with_steering(timelines, [kept]), [chain(smin=400)]).grants()
    assert spot.gid == 1


def test_no_window_is_kept_when_a_rigid_job_or_a_reservation_is_in_the_way_or_the_job_fits():
    rigid = [gpu(0, Hold(window("1g.10gb", 0), until=300))]
    assert steer(rigid, {}, [WHOLE], 0.0, 4) == []  # a rigid job, not a chain: nothing to steer
    reserved = [gpu(0, Hold(window("1g.10gb", 0), until=300), Hold(MODEL.full_mask, since=400))]
    assert steer(reserved, {0: window("1g.10gb", 0)}, [WHOLE], 0.0, 4) == []
    free = [gpu(0, Hold(window("1g.10gb", 0), until=300)), gpu(1)]
    assert steer(free, {0: window("1g.10gb", 0)}, [WHOLE], 0.0, 4) == []  # fits on GPU 1 now
    assert steer([gpu(0, Hold(window("1g.10gb", 0), until=300))], {0: window("1g.10gb", 0)}, [WHOLE], 0.0, 0) == []


def test_a_window_is_kept_only_when_it_opens_no_later_than_easy_would_start_the_job():
    chains_at = window("1g.10gb", 0)
    slow = [gpu(0, Hold(chains_at, until=900)), gpu(1, Hold(window("1g.10gb", 0), until=100))]
    assert keep_windows(slow, {0: chains_at}, [WHOLE], 0.0, 4, 3600) == [None]  # GPU 1 frees first anyway
    fast = [gpu(0, Hold(chains_at, until=90)), gpu(1, Hold(window("1g.10gb", 0), until=100))]
    (kept,) = keep_windows(fast, {0: chains_at}, [WHOLE], 0.0, 4, 3600)
    assert kept is not None and kept.gid == 0


def test_chains_held_back_longer_than_the_bound_are_offered_first_without_the_steering_holds():
    """The rule the simulator and mig-batchd share: steering delays a chain a bounded time."""
    timelines = [gpu(0), gpu(1)]
    steers = [Steer(1, window("7g.80gb", 0), 30.0)]
    waited = {"old": 400.0, "new": 10.0}
    chains = [chain("new"), chain("old")]
    [(first, seen_first), (rest, seen_rest)] = offer_groups(chains, timelines, steers, waited, max_hold_s=300)
    assert [c.job for c in first] == ["old"] and seen_first == timelines
    assert [c.job for c in rest] == ["new"] and seen_rest == with_steering(timelines, steers) != timelines
    assert offer_groups(chains, timelines, [], waited, 300) == [(chains, timelines)]  # nothing steered: one group


def test_two_blocked_jobs_get_two_windows():
    a, b = window("1g.10gb", 0), window("1g.10gb", 6)
    timelines = [gpu(0, Hold(a, until=300)), gpu(1, Hold(b, until=200))]
    kept = keep_windows(timelines, {0: a, 1: b}, [WHOLE, WHOLE], 0.0, 4, 3600)
    assert [(k.gid, k.opens) for k in kept] == [(1, 200), (0, 300)]


# -- properties over random clusters ------------------------------------------------------------
PROFILES = [p.name for p in MODEL.base_profiles]


@st.composite
def clusters(draw):
    """Up to 4 GPUs, each with instances placed left to right: (window, until, is a chain subjob)."""
    timelines, chain_masks = [], {}
    for gid in range(draw(st.integers(1, 4))):
        holds, used = [], 0
        for _ in range(draw(st.integers(0, 3))):
            profile = MODEL.profile(draw(st.sampled_from(PROFILES)))
            starts = [s for s in profile.starts if not profile.window(s) & used]
            if not starts:
                continue
            w = profile.window(draw(st.sampled_from(starts)))
            used |= w
            holds.append(Hold(w, until=float(draw(st.integers(1, 4000)))))
            if draw(st.booleans()):
                chain_masks[gid] = chain_masks.get(gid, 0) | w
        timelines.append(gpu(gid, *holds))
    blocked = [{MODEL.name: draw(st.sampled_from(PROFILES))} for _ in range(draw(st.integers(0, 3)))]
    chains = [chain(f"c{i}", draw(st.sampled_from([5_000, 9_000, 30_000])), smin=draw(st.sampled_from([30, 600])),
                    smax=draw(st.sampled_from([600, 3000]))) for i in range(draw(st.integers(1, 3)))]  # fmt: skip
    return timelines, chain_masks, blocked, chains


@settings(max_examples=60, deadline=None)
@given(clusters())
def test_steering_only_adds_future_holds_and_never_touches_a_running_instance(case):
    timelines, chain_masks, blocked, _ = case
    kept = [k for k in keep_windows(timelines, chain_masks, blocked, 0.0, 4, 3600) if k is not None]
    steered = with_steering(timelines, kept)
    for before, after in zip(timelines, steered, strict=True):
        assert after.holds[: len(before.holds)] == before.holds  # every instance keeps its slices and end
    for k in kept:
        assert k.opens > 0 and not math.isinf(k.opens)  # from when chain subjobs end on their own
        for h in timelines[k.gid].holds:
            if h.window & k.window and h.until > 0:
                assert h.window & chain_masks.get(k.gid, 0) == h.window  # only chain subjobs were in the way
                assert h.until <= k.opens  # and the window opens when they have ended
    windows = [(k.gid, k.window) for k in kept]
    assert all(not (g1 == g2 and w1 & w2) for i, (g1, w1) in enumerate(windows) for g2, w2 in windows[i + 1:])


@settings(max_examples=60, deadline=None)
@given(clusters())
def test_grants_take_only_free_slices_chains_still_progress_and_decisions_repeat(case):
    timelines, chain_masks, blocked, chains = case
    kept = [k for k in keep_windows(timelines, chain_masks, blocked, 0.0, 4, 3600) if k is not None]
    plain = grant_round(timelines, chains, defrag=False).grants()
    moved = grant_round(timelines, chains).grants()
    if plain:
        assert moved  # consolidation never leaves a round without a grant that SJA alone would make
    for spot, reply in moved:
        profile = MODEL.profile(reply.profile)
        busy = [h.window for h in timelines[spot.gid].holds if h.until > 0]
        assert spot.window == profile.window(spot.start) and not any(spot.window & w for w in busy)
    spots = [(s.gid, s.window) for s, _ in moved]
    assert all(not (g1 == g2 and w1 & w2) for i, (g1, w1) in enumerate(spots) for g2, w2 in spots[i + 1:])
    again = grant_round(timelines, chains).grants()
    assert again == moved  # deterministic
    assert [k for k in keep_windows(timelines, chain_masks, blocked, 0.0, 4, 3600) if k is not None] == kept
    # steered grants never overlap a kept window once it opens
    for spot, reply in grant_round(with_steering(timelines, kept), chains).grants():
        for k in kept:
            if k.gid == spot.gid and k.window & spot.window:
                assert reply.duration <= k.opens + 1e-6
