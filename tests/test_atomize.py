"""SJA decision code: memory profiles and admission, gaps, the offer/reply/grant negotiation."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.atomize.gaps import GpuTimeline, Hold, cluster_gaps, earliest_fit, gpu_gaps, start_in_gap
from mig_batch.atomize.profiles import MemoryProfile, ProfileError, Trajectory, min_history, order_statistic_bound
from mig_batch.atomize.protocol import Chain, answer, grant, negotiate
from mig_batch.mig.models import get_model


def training_trajectory(rng: np.random.Generator, duration: float = 60.0, heavy: bool = False) -> Trajectory:
    """A known distribution: base ~ N(12 GiB, 0.8 GiB), a warm-up spike in the first 5 s (Exp, mean
    1.5 GiB, with probability 0.3), a slow drift and sampling noise."""
    times = np.arange(0.0, duration + 1e-9, 1.0)
    base = rng.normal(12_000, 800)
    drift = rng.normal(0, 300) * times / duration
    noise = rng.normal(0, 150 if not heavy else 600, len(times))
    mib = base + drift + noise
    if rng.random() < 0.3:
        spike_at = rng.integers(0, 6)
        mib[spike_at] += rng.exponential(1500 if not heavy else 4000)
    return Trajectory(tuple(times), tuple(mib))


@pytest.mark.parametrize("heavy", [False, True])
@pytest.mark.parametrize("n_history", [19, 59])
def test_admission_violation_rate_is_at_most_eps(heavy, n_history):
    eps, trials = 0.05, 1500
    rng = np.random.default_rng(7 + n_history + heavy)
    violations = 0
    for _ in range(trials):
        history = MemoryProfile(tuple(training_trajectory(rng, heavy=heavy) for _ in range(n_history)))
        capacity = history.peak_bound(60.0, eps)
        assert capacity is not None
        violations += training_trajectory(rng, heavy=heavy).peak() > capacity
    rate = violations / trials
    error = 3 * math.sqrt(eps * (1 - eps) / trials)
    assert rate <= eps + error, f"violation rate {rate:.3f} exceeds eps={eps} (+{error:.3f})"
    # the order statistic is exact for continuous peaks: 1 - k/(n+1), not far below eps
    k = math.ceil((n_history + 1) * (1 - eps))
    assert rate >= (1 - k / (n_history + 1)) - error


def test_admission_with_real_profiles_never_exceeds_eps():
    """Through answer(): the capacity is a real A100-80GB profile, at least the bound."""
    eps, trials = 0.05, 600
    rng = np.random.default_rng(3)
    model = get_model("A100-80GB")
    gap = gpu_gaps(GpuTimeline(0, "n", 0, model.name), 0.0, 3600)[0]
    violations = 0
    for _ in range(trials):
        history = MemoryProfile(tuple(training_trajectory(rng) for _ in range(40)))
        reply = answer(Chain("j", 70_000, history, 10, 60, 0.0), gap, eps)
        assert reply.interested and reply.basis == "history"
        violations += training_trajectory(rng).peak() > model.profile(reply.profile).memory_mib
    assert violations / trials <= eps


def test_short_history_falls_back_to_the_declared_peak():
    rng = np.random.default_rng(1)
    history = MemoryProfile(tuple(training_trajectory(rng) for _ in range(min_history(0.05) - 1)))
    assert history.peak_bound(60, 0.05) is None
    gap = gpu_gaps(GpuTimeline(0, "n", 0, "A100-80GB"), 0.0, 3600)[0]
    reply = answer(Chain("j", 30_000, history, 10, 60, 0.0), gap, 0.05)
    assert (reply.basis, reply.profile) == ("declared", "3g.40gb")


def test_order_statistic_and_bad_eps():
    assert order_statistic_bound(list(range(1, 20)), 0.05) == 19  # k = ceil(20 * 0.95) = 19
    assert order_statistic_bound(list(range(1, 19)), 0.05) is None
    with pytest.raises(ProfileError, match="between 0 and 1"):
        order_statistic_bound([1.0], 0.0)


def test_envelope_modes_and_rolling_max_smoothing():
    spike = Trajectory((0, 1, 2, 3, 4, 5, 6), (10, 10, 50, 10, 50, 10, 10))
    flat = Trajectory((0, 6), (20, 20))
    profile = MemoryProfile((spike, flat) * 10)
    _, functional = profile.envelope(0.05, mode="functional")
    assert functional.max() == 50  # the central band holds the spiky runs
    _, smooth = profile.envelope(0.05, mode="functional", smooth=1.0)
    assert smooth[3] == 50 and (smooth >= functional).all()  # the dip between two spikes is closed
    _, pointwise = profile.envelope(0.5, mode="pointwise")
    assert pointwise[0] == 20 and pointwise[2] == 50
    with pytest.raises(ProfileError, match="not one of"):
        profile.envelope(0.05, mode="mean")


def test_hysteresis_keeps_the_size_unless_the_shrink_is_worth_it():
    model = get_model("A100-80GB")
    gap = gpu_gaps(GpuTimeline(0, "n", 0, model.name), 0.0, 3600)[0]
    small = MemoryProfile(tuple(Trajectory((0, 60), (9_000, 9_000)) for _ in range(30)))
    # bound 9000 MiB -> 1g.10gb; previous subjob had 2g.20gb: shrinking halves it, worth it
    assert answer(Chain("j", 0, small, 1, 60, 0, last_mib=19_968), gap, 0.05).profile == "1g.10gb"
    # a 25% hysteresis keeps 1g.20gb over 1g.10gb when the last was 1g.20gb (gain 50%)... and keeps
    # the previous size when the gain is below the threshold
    assert answer(Chain("j", 0, small, 1, 60, 0, last_mib=11_000), gap, 0.05, hysteresis=0.25).profile == "1g.20gb"
    assert answer(Chain("j", 0, small, 1, 60, 0, last_mib=11_000), gap, 0.05, hysteresis=0.05).profile == "1g.10gb"


def test_decline_reasons():
    gap = gpu_gaps(GpuTimeline(0, "n", 0, "A100-40GB", (Hold(0b11111100),)), 0.0, 600)[0]
    none = MemoryProfile(())
    short = answer(Chain("j", 1000, none, 900, 3600, 0), gap, 0.05)
    assert not short.interested and "minimum subjob" in short.reason
    big = answer(Chain("j", 30_000, none, 10, 3600, 0), gap, 0.05)
    two_slices = get_model("A100-40GB").profile("2g.10gb").memory_mib  # slices 0-1 are the gap
    assert not big.interested and "needs 30000 MiB" in big.reason and f"has {two_slices} MiB" in big.reason


def test_grant_policies():
    gap = gpu_gaps(GpuTimeline(0, "n", 0, "A100-80GB"), 0.0, 3600)[0]
    flat = MemoryProfile(())
    chains = {
        "a": Chain("a", 10_000, flat, 1, 600, submitted=1, attained=500, deadline=900),
        "b": Chain("b", 40_000, flat, 1, 600, submitted=2, attained=100, deadline=None),
        "c": Chain("c", 10_000, flat, 1, 300, submitted=3, attained=900, deadline=100),
    }
    replies = [answer(c, gap, 0.05) for c in chains.values()]
    assert grant(gap, replies, chains, "efficiency").job == "b"  # 4 slices x 600 s
    assert grant(gap, replies, chains, "fairness").job == "b"  # least attained
    assert grant(gap, replies, chains, "deadline").job == "c"  # EDF
    with pytest.raises(ValueError, match="not one of"):
        grant(gap, replies, chains, "random")


def test_negotiate_grants_each_chain_once_and_never_overlapping_gaps():
    gpus = [GpuTimeline(i, "n", i, "A100-80GB") for i in range(2)]
    gaps = cluster_gaps(gpus, 0.0, 3600)
    chains = [Chain(f"j{i}", 10_000, MemoryProfile(()), 1, 600, submitted=i) for i in range(3)]
    rnd = negotiate(gaps, chains, 0.0, 0.05, "fairness")
    granted = rnd.grants()
    assert [r.job for _, r in granted] == ["j0", "j1"]  # two whole-GPU gaps, one grant each
    assert len({g.gid for g, _ in granted}) == 2


def test_reservation_closes_gaps_on_its_slices():
    # a running 4g until t=100 on slices 0-3; the queued 7g can start at 100: reserve the GPU then
    gpu = GpuTimeline(0, "n", 0, "A100-40GB", (Hold(0b1111, until=100.0),))
    where = earliest_fit([gpu], {"A100-40GB": "7g.40gb"}, 0.0, 3600)
    assert where is not None and where[3] == 100.0
    reserved = GpuTimeline(0, "n", 0, "A100-40GB", (*gpu.holds, Hold(0xFF, since=100.0)))
    gaps = gpu_gaps(reserved, 0.0, 3600)
    assert gaps and all(g.closes <= 100.0 for g in gaps)
    assert max(g.window.bit_count() for g in gaps) == 4


def test_a_placement_busy_in_between_has_a_later_gap():
    # slices 0-3 free now, reserved for a moldable job from 100 to 400, free again after
    gpu = GpuTimeline(0, "n", 0, "A100-40GB", (Hold(0b11110000), Hold(0b1111, since=100.0, until=400.0)))
    spans = sorted((g.opens, g.closes) for g in gpu_gaps(gpu, 0.0, 3600) if g.window == 0b1111)
    assert spans == [(0.0, 100.0), (400.0, 3600.0)]
    # the reservation's end is where a queued 4g could start for good
    where = earliest_fit([gpu], {"A100-40GB": "4g.20gb"}, 0.0, 3600)
    assert where is not None and where[3] == 400.0


holds = st.lists(st.tuples(st.integers(0, 7), st.integers(1, 8), st.floats(0, 500), st.floats(0, 500)),
                 max_size=5)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(holds)
def test_gaps_are_free_maximal_and_placeable(raw):
    model = get_model("A100-80GB")
    hs = tuple(Hold(((1 << size) - 1) << start & model.full_mask, until=a + b, since=a if a < 250 else -math.inf)
               for start, size, a, b in raw)  # fmt: skip
    gpu = GpuTimeline(0, "n", 0, model.name, hs)
    gaps = gpu_gaps(gpu, 0.0, 1000.0)
    for g in gaps:
        assert 0 <= g.opens < g.closes <= 1000.0
        probe = [t for t in np.linspace(g.opens, g.closes, 50, endpoint=False) if t < g.closes]  # no rounding up
        for t in probe:  # free for the whole interval
            assert not any(h.window & g.window and h.since <= t < h.until for h in hs)
        assert model.profile(g.profile).window(g.start) == g.window
        if g.opens == 0.0:
            mask = 0
            for h in hs:
                if h.since <= 0 < h.until:
                    mask |= h.window
            assert start_in_gap(g, "1g.10gb", mask) is not None  # the smallest profile fits in any gap
    for a in gaps:
        for b in gaps:
            if a is not b:  # no gap covers another's slices for at least as long
                assert not (a.window & b.window == b.window and a.opens <= b.opens and a.closes >= b.closes)


@settings(max_examples=150, deadline=None)
@given(holds, st.floats(0, 999))
def test_every_free_placement_and_time_lies_in_a_gap(raw, t):
    model = get_model("A100-80GB")
    hs = tuple(Hold(((1 << size) - 1) << start & model.full_mask, until=a + b, since=a if a < 250 else -math.inf)
               for start, size, a, b in raw)  # fmt: skip
    gaps = gpu_gaps(GpuTimeline(0, "n", 0, model.name, hs), 0.0, 1000.0)
    for profile in model.base_profiles:
        for start in profile.starts:
            window = profile.window(start)
            if any(h.window & window and h.since <= t < h.until for h in hs):
                continue  # held at t
            assert any(g.window & window == window and g.opens <= t < g.closes for g in gaps), (profile.name, start)


def test_a_chain_answers_no_gap_on_a_node_it_may_not_run_on():
    from dataclasses import replace

    from mig_batch.atomize.gaps import Gap

    gap = Gap(0, "n1", 0, "A100-80GB", "7g.80gb", 0, 0b11111111, 0.0, 600.0)
    chain = Chain("c", 5000.0, MemoryProfile(()), 30.0, 300.0, 0.0)
    assert answer(chain, gap, 0.05).interested
    elsewhere = answer(replace(chain, hosts=frozenset({"n2"})), gap, 0.05)
    assert not elsewhere.interested and "node n1" in elsewhere.reason
