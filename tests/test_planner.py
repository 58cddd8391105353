"""Planner model, checker, baselines, lower bound and auto: every plan valid, invalid plans refused."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.planner.auto import plan_auto
from mig_batch.planner.bounds import lower_bound
from mig_batch.planner.plan import Create, Destroy, Event, Plan, PlanError, Run, check_plan, schedule
from mig_batch.planner.planners import PLANNERS, make_plan
from mig_batch.planner.problem import Task, gpu_scheme
from mig_batch.planner.workloads import WORKLOAD_TYPES, class_counts, synthetic_dataset

A100 = gpu_scheme("A100-40GB")
A30 = gpu_scheme("A30")


def test_schemes_have_the_papers_partition_counts():
    assert len(A100.partitions) == 19 and len(A30.partitions) == 5  # MIG-DRL §2.1
    assert A100.sizes == [1, 2, 3, 4, 7] and A30.sizes == [1, 2, 4]


@st.composite
def task_sets(draw, scheme=A100):
    n = draw(st.integers(1, 9))
    tasks = []
    for i in range(n):
        t1 = draw(st.floats(1, 100))
        times, t = {}, t1
        for size in scheme.sizes:
            times[size] = t
            t = t * draw(st.floats(0.3, 1.2))
        if draw(st.booleans()) and n > 1:
            times[scheme.sizes[0]] = math.inf  # does not fit the smallest instance
        tasks.append(Task(f"t{i}", times))
    return tasks


@settings(max_examples=60, deadline=None)
@given(task_sets(), st.sampled_from(sorted(PLANNERS)))
def test_every_planner_returns_a_valid_plan_not_below_the_bound(tasks, planner):
    plan = make_plan(planner, A100, tasks) if planner != "auto" else plan_auto(A100, tasks, evaluations=1500)
    makespan = check_plan(A100, tasks, plan)
    assert makespan >= lower_bound(A100, tasks) - 1e-9


@settings(max_examples=25, deadline=None)
@given(task_sets(A30))
def test_a30_plans_are_valid(tasks):
    for planner in PLANNERS:
        plan = make_plan(planner, A30, tasks) if planner != "auto" else plan_auto(A30, tasks, evaluations=1500)
        check_plan(A30, tasks, plan)


def test_auto_is_never_worse_than_the_baselines():
    for seed in range(3):
        tasks = synthetic_dataset("mixscalinguniform", 10, seed)
        auto = plan_auto(A100, tasks).makespan
        for name in ("far", "fixbest", "miso", "nomig"):
            assert auto <= make_plan(name, A100, tasks).makespan + 1e-9


def test_lower_bound_of_one_task_is_below_its_best_plan():
    task = Task("solo", {1: 70.0, 2: 35.0, 3: 24.0, 4: 18.0, 7: 10.0})
    bound = lower_bound(A100, [task])
    assert bound <= A100.create_s[7] + 10.0  # the optimum: create the whole GPU, run
    assert bound > 0


def tasks2():
    return [Task("a", {1: 4.0, 2: 2.0, 3: 1.5, 4: 1.2, 7: 1.0}), Task("b", {1: 4.0, 2: 2.0, 3: 1.5, 4: 1.2, 7: 1.0})]


def test_schedule_times_actions():
    plan = schedule(A100, tasks2(), [Create(2, 0), Create(2, 2), Run(0, 2, 0), Run(1, 2, 2)])
    runs = plan.runs()
    assert runs[0].begin == pytest.approx(0.17) and runs[1].begin == pytest.approx(0.34)  # creates serialised
    assert check_plan(A100, tasks2(), plan) == pytest.approx(2.34)


@pytest.mark.parametrize(
    "actions, message",
    [
        ([Create(4, 0), Create(3, 0)], "overlaps live"),
        ([Run(0, 2, 0)], "no such instance"),
        ([Destroy(2, 0)], "no such instance"),
        ([Create(2, 1)], "no instance of size 2 starts at 1"),
    ],
)
def test_schedule_refuses_impossible_actions(actions, message):
    with pytest.raises((PlanError, ValueError), match=message):
        schedule(A100, tasks2(), actions)


def valid_events():
    return [
        Event("create", 2, 0, 0.0, 0.17),
        Event("run", 2, 0, 0.17, 2.17, 0),
        Event("create", 2, 2, 0.17, 0.34),
        Event("run", 2, 2, 0.34, 2.34, 1),
    ]


def replaced(index, event):
    events = valid_events()
    events[index] = event
    return events


@pytest.mark.parametrize(
    "events, message",
    [
        (valid_events()[:2], "exactly once"),
        (replaced(1, Event("run", 2, 0, 0.17, 1.17, 0)), "must take 2.0"),
        (replaced(3, Event("run", 2, 2, 0.20, 2.20, 1)), "outside its instance"),
        (replaced(2, Event("create", 2, 2, 0.10, 0.27)), "reconfigurations overlap"),
        (replaced(2, Event("create", 2, 2, 0.17, 0.20)), "takes 0.17 s"),
        (
            [*valid_events()[:2], Event("create", 4, 0, 0.17, 0.38), Event("run", 4, 0, 0.38, 1.58, 1)],
            "overlap in memory",
        ),
        ([*valid_events(), Event("destroy", 2, 0, 1.0, 1.2)], "destroyed while a task runs"),
        (replaced(3, Event("run", 2, 0, 1.0, 3.0, 1)), "same time"),
    ],
)
def test_checker_rejects_invalid_plans(events, message):
    with pytest.raises(PlanError, match=message):
        check_plan(A100, tasks2(), Plan("A100-40GB", tuple(events)))


def test_checker_accepts_the_valid_hand_plan():
    assert check_plan(A100, tasks2(), Plan("A100-40GB", tuple(valid_events()))) == pytest.approx(2.34)


def test_generator_follows_the_workload_spec():
    assert class_counts(WORKLOAD_TYPES["mixscalingextreme"].class_shares, 100) == {1: 45, 2: 5, 3: 0, 4: 5, 7: 45}
    tasks = synthetic_dataset("poorscaling", 100, seed=4)
    assert len(tasks) == 100 and synthetic_dataset("poorscaling", 100, seed=4) == tasks
    assert all(90 <= t.time(1) <= 100 for t in tasks)
    # poor scalers gain little from 2 to 7 slices: t(7) >= t(2) * (each step keeps >= (s+0.5)/(s+1))
    assert all(t.time(7) > 0.45 * t.time(2) for t in tasks)
    good = synthetic_dataset("goodscaling", 100, seed=4)
    assert sum(t.time(1) / t.time(7) for t in good) / 100 > sum(t.time(1) / t.time(7) for t in tasks) / 100


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="size 5 is not an instance size"):
        make_plan("far", A100, [Task("x", {5: 1.0})])
    with pytest.raises(ValueError, match="cannot run on any instance size"):
        make_plan("far", A100, [Task("x", {1: math.inf})])
    with pytest.raises(ValueError, match="unknown planner"):
        make_plan("best", A100, tasks2())


def test_cli_plan_writes_table_gantt_and_json(tmp_path, capsys):
    from mig_batch.cli.main import main

    queue = tmp_path / "q.yaml"
    queue.write_text(
        "gpu: A100-40GB\ntasks:\n  - name: cfd\n    times: {1g: 7.12, 2g: 2.43, 3g: 2.07, 4g: 1.19, 7g: 1.24}\n"
        "    count: 6\n  - name: big\n    times: {4g: 3.4, 7g: 3.5}\n"
    )
    assert main(["plan", str(queue), "--planner", "auto", "--out", str(tmp_path / "o"), "--json"]) == 0
    result = __import__("json").loads(capsys.readouterr().out)
    assert result["makespan"] >= result["lower_bound"] > 0
    assert {e["task"] for e in result["events"] if e["kind"] == "run"} == {*(f"cfd-{k}" for k in range(6)), "big"}
    assert (tmp_path / "o" / "q_auto.png").stat().st_size > 0
    queue.write_text("tasks:\n  - name: x\n    times: {5g: 1.0}\n")
    assert main(["plan", str(queue)]) != 0
    assert "size 5 is not an instance size" in capsys.readouterr().err
    queue.write_text("tasks:\n  - name: x\n    times: {1g: -1}\n")
    assert main(["plan", str(queue)]) != 0
    assert "time must be a positive number" in capsys.readouterr().err


def test_cli_bench_planner_runs_a_small_case(capsys):
    from mig_batch.cli.main import main

    code = main(["bench", "planner", "--datasets", "1", "--batch", "6", "--workloads", "poorscaling",
                 "--planners", "far,fixbest", "--gap-batch", "4", "--json"])  # fmt: skip
    assert code == 0
    out = __import__("json").loads(capsys.readouterr().out)
    rows, gaps = out["p_opt"], out["gap"]
    assert {r["planner"] for r in rows} == {"far", "fixbest"} and all(r["mean_p_opt"] >= 0 for r in rows)
    assert {g["planner"] for g in gaps} == {"far", "fixbest", "lower bound"}
    assert all(g["proven"] == 1 for g in gaps) and all(
        g["mean_gap"] >= 0 for g in gaps if g["planner"] != "lower bound"
    )
    assert next(g for g in gaps if g["planner"] == "lower bound")["mean_gap"] <= 0
    assert all(0 < g["mean_plan_s"] <= g["max_plan_s"] for g in gaps if g["planner"] != "lower bound")


@settings(max_examples=25, deadline=None)
@given(task_sets(), st.integers(1, 3), st.sampled_from(["far", "fixbest", "miso"]), st.booleans())
def test_multi_gpu_batches_are_valid(tasks, gpus, planner, with_a30):
    from mig_batch.planner.multi import check_multi
    from mig_batch.planner.planners import make_multi_plan

    schemes = [A100] * gpus + ([A30] if with_a30 else [])
    multi = make_multi_plan(planner, schemes, tasks)
    makespan = check_multi(schemes, tasks, multi)
    assert makespan <= make_plan(planner, A100, tasks).makespan + 1e-9


def test_multi_gpu_spreads_work_and_the_checker_refuses_lost_tasks():
    from dataclasses import replace

    from mig_batch.planner.multi import check_multi
    from mig_batch.planner.planners import make_multi_plan

    tasks = synthetic_dataset("widetimes", 12, seed=3)
    one = make_plan("far", A100, tasks).makespan
    two = make_multi_plan("far", [A100, A100], tasks)
    assert check_multi([A100, A100], tasks, two) < 0.75 * one
    assert all(two.assignment)
    lost = replace(two, assignment=(two.assignment[0][1:], two.assignment[1]))
    with pytest.raises(PlanError, match="exactly one GPU"):
        check_multi([A100, A100], tasks, lost)
    with pytest.raises(ValueError, match="cannot run on any of the GPUs"):
        make_multi_plan("far", [A30], [Task("big", {7: 5.0})])


def test_cli_plan_over_two_gpus(tmp_path, capsys):
    import json

    from mig_batch.cli.main import main

    queue = tmp_path / "q.yaml"
    queue.write_text(
        "tasks:\n  - name: cfd\n    times: {1g: 7.12, 2g: 2.43, 3g: 2.07, 4g: 1.19, 7g: 1.24}\n    count: 6\n"
    )
    assert main(["plan", str(queue), "--gpus", "2", "--planner", "far", "--out", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["gpus"]) == 2 and sum(len([e for e in g["events"] if e["kind"] == "run"]) for g in out["gpus"]) == 6
    assert (tmp_path / "q_far_2gpus_gpu1.png").exists()
    assert main(["plan", str(queue), "--gpus", "0"]) != 0
