"""Exact planner (CP-SAT): valid plans, proven optima, and the lower bound never above the optimum."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.planner.auto import plan_auto
from mig_batch.planner.bounds import lower_bound
from mig_batch.planner.exact import solve_exact
from mig_batch.planner.plan import check_plan
from mig_batch.planner.planners import PLANNERS, make_plan
from mig_batch.planner.problem import Task, gpu_scheme
from mig_batch.planner.workloads import synthetic_dataset

A100 = gpu_scheme("A100-40GB")
A30 = gpu_scheme("A30")


@st.composite
def millisecond_tasks(draw, scheme, max_tasks):
    """Times in whole milliseconds, so the solver's integer model is the real problem exactly."""
    tasks = []
    for i in range(draw(st.integers(1, max_tasks))):
        t = draw(st.integers(2_000, 60_000))
        times = {}
        for size in scheme.sizes:
            times[size] = t / 1000
            t = max(1, int(t * draw(st.floats(0.3, 1.1))))
        tasks.append(Task(f"t{i}", times))
    return tasks


def test_one_task_optimum_is_its_best_create_plus_run():
    task = Task("x", {1: 50.0, 2: 26.0, 3: 18.0, 4: 14.5, 7: 9.0})
    result = solve_exact(A100, [task], time_limit_s=10)
    expected = min(A100.create_s[s] + t for s, t in task.times.items())
    assert result.optimal and result.makespan == pytest.approx(expected)


def test_two_tasks_share_an_instance_rather_than_reconfigure():
    # the 7g instance is best for both; reusing it beats destroying and creating anything in between
    tasks = [Task("a", {1: 70.0, 7: 10.0}), Task("b", {1: 70.0, 7: 10.0})]
    result = solve_exact(A100, tasks, time_limit_s=10)
    assert result.optimal and result.makespan == pytest.approx(A100.create_s[7] + 20.0)
    assert sum(e.kind == "create" for e in result.plan.events) == 1


@settings(max_examples=15, deadline=None)
@given(millisecond_tasks(A100, 5))
def test_optimum_is_valid_between_the_bound_and_every_planner(tasks):
    result = solve_exact(A100, tasks, time_limit_s=30)
    assert result.optimal
    optimum = check_plan(A100, tasks, result.plan)
    assert lower_bound(A100, tasks) <= optimum + 1e-9
    assert result.lower_bound <= optimum + 1e-9
    for name in PLANNERS:
        plan = make_plan(name, A100, tasks) if name != "auto" else plan_auto(A100, tasks, evaluations=1500)
        assert optimum <= plan.makespan + 1e-9


@settings(max_examples=8, deadline=None)
@given(millisecond_tasks(A30, 5))
def test_a30_optimum_is_valid_and_above_the_bound(tasks):
    result = solve_exact(A30, tasks, time_limit_s=30)
    assert result.optimal
    assert lower_bound(A30, tasks) <= check_plan(A30, tasks, result.plan) + 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["poorscaling", "goodscaling", "mixscalinguniform", "mixscalingextreme", "widetimes"])
def test_eight_task_batches_are_proven_optimal_within_a_minute(kind):
    tasks = synthetic_dataset(kind, 100, seed=1)[:8]
    incumbent = make_plan("auto", A100, tasks)
    result = solve_exact(A100, tasks, time_limit_s=60, incumbent=incumbent)
    assert result.optimal and result.wall_s < 60
    assert lower_bound(A100, tasks) <= check_plan(A100, tasks, result.plan) + 1e-9
    assert result.makespan <= incumbent.makespan + 1e-9
