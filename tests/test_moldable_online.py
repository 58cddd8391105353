"""Moldable jobs in a running cluster: earliest predicted finish, smaller sizes within the gain,
reservations that later jobs cannot delay (mig_batch.placement.moldable)."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.atomize.gaps import Hold, cluster_gaps, cluster_timelines, with_hold
from mig_batch.mig.models import get_model
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.moldable import MoldableJob, MoldablePlanner, expected_end
from mig_batch.placement.policies import make_policy

MODEL = "A100-80GB"
A100 = get_model(MODEL)
NOW = 1000.0


def planner(cluster, ends, min_gain=0.1, reservations=16):
    timelines = cluster_timelines(cluster, ends.__getitem__)
    return MoldablePlanner(cluster, timelines, NOW, make_policy("mfi"), min_gain, reservations)


def job(name, **times):
    return MoldableJob(name, {MODEL: {p.replace("_", "."): s for p, s in times.items()}})


def test_smaller_profile_within_the_gain_starts_now():
    cluster = Cluster.homogeneous(MODEL, 1)
    choice = planner(cluster, {}).decide(job("a", **{"1g_10gb": 300, "2g_20gb": 160, "3g_40gb": 150,
                                                     "7g_80gb": 145}))  # fmt: skip
    assert choice.placement is not None and choice.profile == "3g.40gb"  # 150 <= 145 x 1.1; 2g's 160 is not
    assert choice.finish == NOW + 150
    assert planner(Cluster.homogeneous(MODEL, 1), {}, min_gain=0.0).decide(
        job("a", **{"3g_40gb": 150, "7g_80gb": 145})).profile == "7g.80gb"  # fmt: skip


def test_waits_for_a_faster_slot_and_later_jobs_only_backfill_around_it():
    cluster = Cluster.homogeneous(MODEL, 1)
    cluster.allocate(0, "small", "1g.10gb", 0)
    ends = {"small": NOW + 50}
    p = planner(cluster, ends)
    first = p.decide(job("big", **{"1g_10gb": 1000, "7g_80gb": 200}))
    assert first.placement is None and first.reserved == (0, 0)
    assert (first.profile, first.starts, first.finish) == ("7g.80gb", NOW + 50, NOW + 250)
    short = p.decide(job("short", **{"1g_10gb": 30}))  # ends before the reservation opens: backfills
    assert short.placement is not None and short.finish == NOW + 30
    cluster.allocate(short.placement.gid, "short", short.profile, short.placement.start)
    long = p.decide(job("long", **{"1g_10gb": 100}))  # would delay "big": queued behind it
    assert long.placement is None and long.starts == NOW + 250


def test_gaps_offered_after_a_reservation_stay_clear_of_it():
    cluster = Cluster.homogeneous(MODEL, 1)
    cluster.allocate(0, "small", "1g.10gb", 0)
    timelines = cluster_timelines(cluster, {"small": NOW + 50}.__getitem__)
    p = MoldablePlanner(cluster, timelines, NOW, make_policy("mfi"))
    p.decide(job("big", **{"1g_10gb": 1000, "7g_80gb": 200}))
    [(gid, hold)] = p.reserved
    assert (gid, hold.since, hold.until) == (0, NOW + 50, NOW + 250)
    gaps = cluster_gaps(with_hold(timelines, gid, hold), NOW, 3600)
    assert gaps and all(not (g.window & hold.window) or g.closes <= hold.since or g.opens >= hold.until
                        for g in gaps)  # fmt: skip
    assert any(g.window == A100.full_mask and g.opens == hold.until for g in gaps)  # the GPU again after it


def test_a_gpu_fenced_during_the_pass_is_not_the_way_round_a_reservation():
    """When the policy's choice meets a reservation, the planner looks for another clear place itself: not
    on a GPU fenced since the pass began (its node's CPUs went to this pass's earlier starts)."""
    cluster = Cluster.homogeneous(MODEL, 2)
    p = planner(cluster, {})
    p.hold(0, Hold(A100.profile("7g.80gb").window(0), until=NOW + 500, since=NOW + 10))  # GPU 0 reserved soon
    cluster.fence(1)
    choice = p.decide(job("x", **{"1g_10gb": 100}))  # would run into GPU 0's reservation
    assert choice.placement is None or choice.placement.gid != 1


def test_no_wait_when_the_later_start_gains_too_little():
    cluster = Cluster.homogeneous(MODEL, 1)
    cluster.allocate(0, "small", "1g.10gb", 0)
    choice = planner(cluster, {"small": NOW + 50}).decide(job("a", **{"3g_40gb": 260, "7g_80gb": 200}))
    assert choice.placement is not None and choice.profile == "3g.40gb"  # 250 is not 10 % before 260


def test_lookahead_budget_and_unreachable_jobs_wait_without_reservation():
    cluster = Cluster.homogeneous(MODEL, 1)
    cluster.allocate(0, "big", "7g.80gb", 0)
    p = planner(cluster, {"big": math.inf}, reservations=1)
    assert p.decide(job("a", **{"1g_10gb": 10})).profile is None  # never frees: nothing to reserve
    cluster2 = Cluster.homogeneous(MODEL, 1)
    cluster2.allocate(0, "big", "7g.80gb", 0)
    p2 = planner(cluster2, {"big": NOW + 10}, reservations=1)
    assert p2.decide(job("a", **{"1g_10gb": 10})).reserved is not None
    assert p2.decide(job("b", **{"1g_10gb": 10})).profile is None  # no lookahead left


def test_an_instance_past_its_end_still_holds_its_slices_until_it_is_gone():
    cluster = Cluster.homogeneous(MODEL, 1)
    cluster.allocate(0, "completing", "1g.10gb", 0)
    choice = planner(cluster, {"completing": NOW - 1}).decide(job("a", **{"1g_10gb": 600, "7g_80gb": 30}))
    assert choice.placement is None and choice.profile == "7g.80gb" and choice.starts > NOW


def test_expected_end_gives_overdue_jobs_less_credit():
    assert expected_end(NOW + 5, NOW) == NOW + 5
    assert expected_end(NOW - 10, NOW) == NOW + 60
    assert expected_end(NOW - 500, NOW) == NOW + 500


def test_bad_gain_is_refused():
    with pytest.raises(ValueError, match="min_gain"):
        planner(Cluster.homogeneous(MODEL, 1), {}, min_gain=1.5)


def earliest_finish(holds_by_gid, option, seconds):
    """Brute force: the earliest finish of ``option`` on any GPU and start, given every hold."""
    profile = A100.profile(option)
    best = math.inf
    for holds in holds_by_gid.values():
        for start in profile.starts:
            window = profile.window(start)
            for t in sorted({NOW, *(h.until for h in holds if h.until > NOW)}):
                if not any(h.window & window and h.since < t + seconds and h.until > t for h in holds):
                    best = min(best, t + seconds)
                    break
    return best


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 3), st.integers(1, 8))
def test_choices_are_the_earliest_finish_and_never_collide(seed, n_gpus, n_jobs):
    rng = random.Random(seed)
    cluster = Cluster.homogeneous(MODEL, n_gpus)
    names = [p.name for p in A100.base_profiles]
    ends = {}
    for i in range(rng.randrange(4 * n_gpus)):
        gpu = cluster.gpus[rng.randrange(n_gpus)]
        k = rng.randrange(len(names))
        starts = cluster.tables[MODEL].free_starts[k][gpu.mask]
        if starts:
            cluster.allocate(gpu.gid, f"r{i}", names[k], rng.choice(starts))
            ends[f"r{i}"] = NOW + rng.choice([10, 50, 100, 400])
    p = planner(cluster, ends, min_gain=0.0)
    holds = {g.gid: [Hold(A100.profile(prof).window(s), until=ends[j]) for j, (prof, s) in g.instances.items()]
             for g in cluster.gpus}  # fmt: skip
    for n in range(n_jobs):
        times = {name: float(rng.choice([20, 60, 120, 300])) for name in rng.sample(names, rng.randint(1, 4))}
        best = min(earliest_finish(holds, prof, s) for prof, s in times.items())
        choice = p.decide(MoldableJob(f"m{n}", {MODEL: times}))
        assert choice.finish == pytest.approx(best)  # min_gain 0: exactly the earliest finish
        window_of = A100.profile(choice.profile).window
        if choice.placement is not None:
            gid, start = choice.placement.gid, choice.placement.start
            cluster.allocate(gid, f"m{n}", choice.profile, start)  # raises if it collides with an instance
        else:
            gid, start = choice.reserved
        new = Hold(window_of(start), since=choice.starts, until=choice.finish)
        assert not any(h.window & new.window and h.since < new.until and h.until > new.since for h in holds[gid])
        holds[gid].append(new)


def test_a_reservation_that_opens_now_keeps_a_moldable_job_off_its_slices():
    """A rigid job's EASY reservation whose blocker is overdue opens now (since == now): a moldable job must not
    start on its slices then, any more than on those of a reservation that opens later."""
    cluster = Cluster.homogeneous(MODEL, 1)
    for since in (NOW, NOW - 30):
        p = planner(cluster, {})
        p.hold(0, Hold(A100.profile("7g.80gb").window(0), until=NOW + 500, since=since))  # the whole GPU, from now
        choice = p.decide(job("x", **{"1g_10gb": 90000}))
        assert choice.placement is None, choice
