"""The live batch planner (mig_batch.planner.live): plans are valid, rigid reservations are kept, the
anytime bound holds, and the planners differ where they should."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mig_batch.placement.timelines import GpuTimeline, Hold
from mig_batch.planner.live import (
    LIVE_PLANNERS,
    LiveGpu,
    LiveInstance,
    LiveJob,
    LivePlan,
    LiveState,
    RigidWait,
    Step,
    check_live_plan,
    from_timeline,
    plan_live,
)
from mig_batch.planner.problem import gpu_scheme

A100 = "A100-80GB"
SCHEME = gpu_scheme(A100)


def _job(name: str, t1: float, exponent: float = 0.7) -> LiveJob:
    return LiveJob(name, {s: t1 / s**exponent for s in SCHEME.sizes})


def _overlaps(a: Step, b: Step) -> bool:
    wa, wb = SCHEME.slot(a.size, a.slot).window, SCHEME.slot(b.size, b.slot).window
    return a.gid == b.gid and bool(wa & wb) and a.start < b.end - 1e-9 and b.start < a.end - 1e-9


@st.composite
def live_states(draw: st.DrawFn) -> LiveState:
    now = draw(st.floats(0, 100))
    gpus = []
    for gid in range(draw(st.integers(1, 3))):
        partition = draw(st.sampled_from(SCHEME.partitions))
        kept = [s for s in partition if draw(st.booleans())]
        instances = tuple(LiveInstance(s.size, s.start, now + draw(st.sampled_from([-5.0, 0.0, 3.0, 40.0])))
                          for s in kept)  # fmt: skip
        gpus.append(LiveGpu(gid, A100, instances, reconfig_free_at=now + draw(st.sampled_from([0.0, 0.5]))))
    jobs = []
    for i in range(draw(st.integers(0, 9))):
        sizes = draw(st.lists(st.sampled_from(SCHEME.sizes), min_size=1, max_size=5, unique=True))
        t1 = draw(st.floats(1, 60))
        barred = frozenset(draw(st.lists(st.integers(0, len(gpus) - 1), max_size=len(gpus))))  # some: every GPU
        jobs.append(LiveJob(f"j{i}", {s: t1 / s ** draw(st.sampled_from([0.2, 0.7, 1.0])) for s in sizes}, barred))
    rigid = ()
    if draw(st.booleans()):
        slot = draw(st.sampled_from([s for size in SCHEME.sizes for s in SCHEME.slots[size]]))
        rigid = (RigidWait(draw(st.integers(0, len(gpus) - 1)), slot.window, now + draw(st.floats(0, 50)),
                           draw(st.sampled_from([10.0, math.inf]))),)  # fmt: skip
    return LiveState(now, tuple(gpus), tuple(jobs), rigid, draw(st.sampled_from([0.0, 5.0])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(live_states(), st.sampled_from(LIVE_PLANNERS))
def test_every_plan_is_valid(state: LiveState, planner: str) -> None:
    """No two jobs on the same slices at once, reconfigurations one at a time after the lock frees,
    nothing on a rigid job's reserved slices past since + max_hold_s (check_live_plan), every job
    planned once, the start-now steps' slices free now."""
    plan = plan_live(state, planner, evaluations=12, budget_s=math.inf)
    check_live_plan(state, plan)
    for a, b in itertools.combinations(plan.steps, 2):
        assert not _overlaps(a, b)
    for w in state.rigid:
        for s in plan.steps:
            if (
                s.gid == w.gid
                and SCHEME.slot(s.size, s.slot).window & w.window
                and s.start < w.since + state.max_hold_s + w.seconds
            ):
                assert s.end <= w.since + state.max_hold_s + 1e-9
    barred = {j.name: j.barred for j in state.jobs}
    assert all(s.gid not in barred[s.job] for s in plan.steps)
    for s in plan.start_now():
        assert s.opens <= state.now + 1e-9
        for r in s.reconfigs:
            assert r.begin >= state.now - 1e-9


def test_the_checker_catches_an_overlap_and_a_held_slice() -> None:
    state = LiveState(0.0, (LiveGpu(0, A100),), (_job("a", 10), _job("b", 10)))
    plan = plan_live(state, "eft")
    check_live_plan(state, plan)
    a, b = plan.steps
    twin = replace(b, size=a.size, slot=a.slot, start=a.start, end=a.start + (b.end - b.start), reconfigs=())
    with pytest.raises(ValueError, match="share instance|outside"):
        check_live_plan(state, replace(plan, steps=(a, twin)))
    held = replace(state, rigid=(RigidWait(0, SCHEME.slot(a.size, a.slot).window, a.start, 100.0),))
    with pytest.raises(ValueError, match="rigid job's reservation"):
        check_live_plan(held, plan)
    longer = replace(a, end=a.end + 1)
    with pytest.raises(ValueError, match="must take"):
        check_live_plan(state, replace(plan, steps=(longer, b)))


def test_a_rigid_reservation_bounds_the_hold() -> None:
    """A whole-GPU rigid job reserved from t=5: with max_hold_s 0 nothing planned runs past 5 on that
    GPU; with 20 s of hold a job may end by 25, never later."""
    jobs = tuple(_job(f"j{i}", 40) for i in range(4))
    for hold in (0.0, 20.0):
        state = LiveState(0.0, (LiveGpu(0, A100), LiveGpu(1, A100)), jobs, (RigidWait(0, 0xFF, 5.0, 100.0),), hold)
        for planner in LIVE_PLANNERS:
            plan = plan_live(state, planner, evaluations=20, budget_s=math.inf)
            check_live_plan(state, plan)
            on0 = [s for s in plan.steps if s.gid == 0]
            assert all(s.end <= 5.0 + hold + 1e-9 or s.start >= 105.0 + hold - 1e-9 for s in on0)


def test_running_jobs_and_idle_instances_are_respected() -> None:
    """An idle 3-slice instance is reused without reconfiguration; a running 4-slice one is not touched
    before its job's expected end."""
    gpu = LiveGpu(0, A100, (LiveInstance(4, 0, 50.0), LiveInstance(3, 4, 0.0)))
    state = LiveState(0.0, (gpu,), (LiveJob("x", {3: 10.0}),))
    (step,) = plan_live(state, "auto").steps
    assert (step.size, step.slot, step.start, step.reconfigs, step.now) == (3, 4, 0.0, (), True)
    state = LiveState(0.0, (gpu,), (LiveJob("y", {7: 10.0}),))
    (step,) = plan_live(state, "eft").steps
    assert step.start >= 50.0 and not step.now
    assert [r.kind for r in step.reconfigs] == ["destroy", "destroy", "create"]


def test_from_timeline_keeps_the_holds() -> None:
    timeline = GpuTimeline(3, "n1", 0, A100, (Hold(0xF0, until=30.0),))
    state = LiveState(0.0, (from_timeline(timeline),), (LiveJob("z", {4: 5.0}),))
    (step,) = plan_live(state, "eft").steps
    assert step.slot == 0 and step.start < 1.0  # the free half, not the held one


def test_the_budget_is_anytime() -> None:
    """A clock that jumps past the budget after the first decoding: auto stops with a valid plan."""
    ticks = iter(range(1000))
    state = LiveState(0.0, tuple(LiveGpu(g, A100) for g in range(2)), tuple(_job(f"j{i}", 10 + i) for i in range(12)))
    plan = plan_live(state, "auto", budget_s=0.5, clock=lambda: float(next(ticks)))
    check_live_plan(state, plan)
    assert plan.evaluations <= 2


def test_auto_is_never_worse_than_its_starting_points() -> None:
    """auto starts from EFT's rule and FAR's family: its objective is at most theirs, on every seed."""
    from mig_batch.planner.workloads import synthetic_dataset

    for seed in range(3):
        tasks = synthetic_dataset("mixscalinguniform", 16, seed)
        state = LiveState(0.0, tuple(LiveGpu(g, A100) for g in range(2)),
                          tuple(LiveJob(t.name, t.times) for t in tasks))  # fmt: skip
        plans: dict[str, LivePlan] = {p: plan_live(state, p, evaluations=40, budget_s=math.inf) for p in LIVE_PLANNERS}
        for plan in plans.values():
            check_live_plan(state, plan)
        assert plans["auto"].mean_end <= plans["eft"].mean_end + 1e-9
        assert plans["far"].makespan <= plan_live(state, "far", evaluations=1).makespan + 1e-9


def test_bad_input_is_refused() -> None:
    state = LiveState(0.0, (LiveGpu(0, A100),), (LiveJob("a", {1: 1.0}),))
    with pytest.raises(ValueError, match="unknown live planner"):
        plan_live(state, "nope")
    with pytest.raises(ValueError, match="objective"):
        plan_live(state, "auto", objective="x")
    with pytest.raises(ValueError, match="positive"):
        plan_live(replace(state, jobs=(LiveJob("a", {1: -1.0}),)), "eft")
    with pytest.raises(ValueError, match="no 3-slice instance starts at 1"):
        plan_live(replace(state, gpus=(LiveGpu(0, A100, (LiveInstance(3, 1, 0.0),)),)), "eft")


def test_jobs_no_gpu_can_run_are_listed_unplaced() -> None:
    """A30 GPUs have no 3- or 7-slice instance: a job of those sizes only is unplaced, under every planner."""
    state = LiveState(0.0, (LiveGpu(0, "A30-24GB"),), (LiveJob("big", {7: 5.0}), LiveJob("ok", {1: 3.0, 2: 2.0})))
    for planner in LIVE_PLANNERS:
        plan = plan_live(state, planner, evaluations=10, budget_s=math.inf)
        check_live_plan(state, plan)
        assert plan.unplaced == ("big",) and [s.job for s in plan.steps] == ["ok"]
    empty = replace(state, gpus=())
    for planner in LIVE_PLANNERS:
        assert sorted(plan_live(empty, planner).unplaced) == ["big", "ok"]


def test_measured_reconfiguration_times_replace_the_table() -> None:
    """A 2 s create on 7 slices (measured) delays a whole-GPU job by 2 s instead of Table 1's 0.24 s."""
    from mig_batch.planner.live import measured_scheme

    state = LiveState(0.0, (LiveGpu(0, A100),), (LiveJob("w", {7: 10.0}),))
    (table,) = plan_live(state, "eft").steps
    (slow,) = plan_live(state, "eft", schemes={A100: measured_scheme(A100, {7: 2.0})}).steps
    assert (table.start, slow.start, slow.profile) == (pytest.approx(0.24), pytest.approx(2.0), "7g.80gb")
    check_live_plan(state, plan_live(state, "auto", schemes={A100: measured_scheme(A100, {7: 2.0})}),
                    {A100: measured_scheme(A100, {7: 2.0})})  # fmt: skip
    with pytest.raises(ValueError, match="sizes of A100-80GB"):
        measured_scheme(A100, {5: 1.0})


def test_a_job_never_gets_a_barred_gpu_even_where_it_would_finish_first() -> None:
    """GPU 0 is free now and GPU 1 busy for 50 s; a job barred from GPU 0 waits for GPU 1 (a job outside
    a node's partitions: Slurm would refuse it there), and a job barred from both is unplaced."""
    busy = LiveGpu(1, A100, (LiveInstance(7, 0, 50.0),))
    jobs = (LiveJob("elsewhere", {7: 10.0}, frozenset({0})), LiveJob("nowhere", {1: 5.0}, frozenset({0, 1})))
    state = LiveState(0.0, (LiveGpu(0, A100), busy), jobs)
    for planner in LIVE_PLANNERS:
        plan = plan_live(state, planner, evaluations=10, budget_s=math.inf)
        check_live_plan(state, plan)
        (step,) = plan.steps
        assert (step.job, step.gid, step.start, step.now) == ("elsewhere", 1, 50.0, False), planner
        assert plan.unplaced == ("nowhere",)
    forged = replace(plan, steps=(replace(step, gid=0, start=0.0, end=10.0),))
    with pytest.raises(ValueError, match="barred"):
        check_live_plan(state, forged)


def test_auto_takes_a_larger_size_only_when_it_is_worth_its_slices() -> None:
    """min_gain (the site's rule): 7g ending 5 % sooner than 3g is not worth 4 more slices; at 0 it is."""
    from mig_batch.planner.live import worth_sizes

    job = LiveJob("a", {1: 600.0, 3: 20.0, 7: 19.0})
    assert worth_sizes(job, [1, 3, 7], 0.1) == [1, 3] and worth_sizes(job, [1, 3, 7], 0.0) == [1, 3, 7]
    assert worth_sizes(LiveJob("b", {1: 10.0, 2: 9.5, 4: 5.0}), [1, 2, 4], 0.1) == [1, 4]
    state = LiveState(0.0, (LiveGpu(0, A100),), (job,))
    assert [s.size for s in plan_live(state, "auto", budget_s=math.inf, min_gain=0.1).steps] == [3]
    assert [s.size for s in plan_live(state, "auto", budget_s=math.inf, min_gain=0.0).steps] == [7]


def test_auto_stops_searching_a_short_queue_long_before_its_budget() -> None:
    """Five jobs: the local search ends after STALL moves without a better plan, not at 10,000 decodings (a
    live pass would otherwise spend its whole budget at every pass while they wait)."""
    from mig_batch.planner.live import STALL

    state = LiveState(0.0, tuple(LiveGpu(g, A100) for g in range(2)), tuple(_job(f"j{i}", 60.0 + i) for i in range(5)))
    plan = plan_live(state, "auto", budget_s=math.inf, evaluations=10_000)
    assert STALL <= plan.evaluations < 10 * STALL


def test_a_jobs_sizes_are_those_of_the_gpus_it_may_have() -> None:
    """The A100 is barred; the A30 has no 3-slice instance: the job's sizes are 1 and 4 there (3, the A100's
    only, would leave `far` nothing to place and `auto` only the slow 1g)."""
    state = LiveState(0.0, (LiveGpu(0, A100), LiveGpu(1, "A30-24GB")),
                      (LiveJob("j", {1: 200.0, 3: 10.0, 4: 50.0}, frozenset({0})),))  # fmt: skip
    for planner in LIVE_PLANNERS:
        plan = plan_live(state, planner, evaluations=20, budget_s=math.inf)
        check_live_plan(state, plan)
        assert [(s.gid, s.size) for s in plan.steps] == [(1, 4)], planner
