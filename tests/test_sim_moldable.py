"""The live moldable simulation (mig_batch.sim.moldable_live) and `mig-batch simulate moldable`."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.sim.moldable_experiment import run_live_matrix, verdict
from mig_batch.sim.moldable_live import LIVE_SIM_PLANNERS, TODAY, LiveSimSetup, SimJob, simulate_live
from mig_batch.sim.moldable_workloads import build_workload

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
RODINIA = DATA / "mig-tasks" / "rodinia_A100"
PODS = DATA / "alibaba-gpu-2023" / "openb_pod_list_default.csv"
SETUP = LiveSimSetup(gpus=2, window=8, evaluations=6)


def test_every_job_runs_and_the_numbers_add_up() -> None:
    jobs = build_workload("migdrl-mixscalinguniform", 30, 2, 1.0, 3)
    assert sum(j.rigid for j in jobs) > 0 and sum(not j.rigid for j in jobs) > 0
    for planner in (*LIVE_SIM_PLANNERS, TODAY):
        r = simulate_live(jobs, SETUP, planner)
        assert r.jobs == 30 and r.passes > 0 and r.reconfigs > 0
        assert 0 <= r.idle < 1 and r.rigid_wait >= 0
        # a moldable job completes no sooner than its fastest predicted time (noise aside, >= 0.5 of it)
        fastest = min(min(j.times.values()) * j.noise for j in jobs if not j.rigid)
        assert r.mean_completion >= fastest
        work = sum(min(s * t for s, t in j.times.items()) * (1 if j.rigid else j.noise) for j in jobs)
        assert r.makespan >= work / (2 * 7)  # the cluster cannot do the work faster than all slices busy


def test_runs_repeat_exactly() -> None:
    jobs = build_workload("migdrl-widetimes", 25, 2, 1.2, 5)
    assert simulate_live(jobs, SETUP, "auto") == simulate_live(jobs, SETUP, "auto")


def test_a_rigid_job_is_not_starved_by_moldable_arrivals() -> None:
    """A whole-GPU rigid job behind a stream of 1-slice moldable jobs on one GPU: it holds a reservation
    and starts when the jobs running at its arrival end (max_hold_s 0), under every planner."""
    stream = [SimJob(f"m{i}", i * 1.0, {1: 20.0, 2: 19.0}) for i in range(40)]
    rigid = SimJob("big", 3.5, {7: 5.0}, rigid=True)
    for planner in (*LIVE_SIM_PLANNERS, TODAY):
        sim_setup = LiveSimSetup(gpus=1, window=8, evaluations=6)
        r = simulate_live([*stream, rigid], sim_setup, planner)
        # jobs started by 3.5 end by 3 + 20 (+ reconfigurations); the rigid job starts then, not after the stream
        assert r.rigid_wait < 21.0, planner


def test_the_matrix_and_its_verdict() -> None:
    result = run_live_matrix(["migdrl-poorscaling"], [0.9], [1], SETUP, 16, planners=("eft", "auto"))
    assert len(result["cells"]) == 2
    (line,) = verdict(result)
    assert line.startswith("migdrl-poorscaling load 0.9 auto vs eft: ")
    assert not math.isnan(result["vs_baseline"]["migdrl-poorscaling"]["0.9"]["auto"]["makespan"])
    against_today = run_live_matrix(["migdrl-poorscaling"], [0.9], [1], SETUP, 16, planners=("eft-today", "auto"),
                                    baseline="eft-today")  # fmt: skip
    (line,) = verdict(against_today)
    assert line.startswith("migdrl-poorscaling load 0.9 auto vs eft-today: ")


@pytest.mark.skipif(not RODINIA.is_dir(), reason="the Rodinia task times (../shared/data) are absent")
def test_rodinia_workload() -> None:
    from mig_batch.planner.workloads import read_rodinia

    jobs = build_workload("rodinia", 20, 2, 1.0, 1, rodinia=read_rodinia(RODINIA, "A100"))
    assert simulate_live(jobs, SETUP, "far").jobs == 20


@pytest.mark.skipif(not PODS.is_file(), reason="the Alibaba 2023 trace (../shared/data) is absent")
def test_alibaba_mix_workload() -> None:
    from mig_batch.sim.traces import read_pods

    jobs = build_workload("alibaba-mix", 20, 2, 1.0, 1, pods=read_pods(PODS))
    assert {j.rigid for j in jobs} == {True, False}
    assert simulate_live(jobs, SETUP, "eft").jobs == 20


def _cli(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mig_batch.cli.main", "simulate", "moldable", "--out", str(tmp), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_cli_runs_and_refuses_bad_input(tmp_path: Path) -> None:
    ok = _cli("--workloads", "migdrl-goodscaling", "--loads", "1.0", "--seeds", "1", "--gpus", "1", "--jobs", "8",
              "--evaluations", "4", "--json", tmp=tmp_path)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert set(json.loads(ok.stdout)["mean"]["migdrl-goodscaling"]["1.0"]) == {"eft", "far", "auto"}
    for bad, said in ((["--loads", "fast"], "--loads"), (["--workloads", "nope"], "--workloads"),
                      (["--planners", "x"], "--planners"), (["--workloads", "rodinia", "--rodinia-dir", str(tmp_path)],
                                                            "Rodinia")):  # fmt: skip
        out = _cli(*bad, tmp=tmp_path)
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("argv", [["simulate", "moldable", "--seeds", "1"], ["bench", "live-planner"]])
def test_the_commands_name_a_missing_extra(monkeypatch, capsys, argv) -> None:
    from mig_batch.cli.main import main
    from mig_batch.entry import EXTRA_MODULES

    monkeypatch.setitem(EXTRA_MODULES, "controller", ("mig_batch_no_such_module",))
    assert main(argv) == 2
    assert "needs the controller extra" in capsys.readouterr().err


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 30), st.sampled_from([1, 2, 3, 4, 7]), st.floats(1, 40), st.booleans(),
                          st.sampled_from([0.5, 1.0, 1.7])), min_size=1, max_size=14),
       st.sampled_from([*LIVE_SIM_PLANNERS, TODAY]), st.integers(1, 2))  # fmt: skip
def test_no_two_jobs_ever_share_slices(specs, planner, gpus) -> None:
    """Random arrivals of rigid and moldable jobs: every job runs once, for its time, and no two jobs on a
    GPU hold a memory slice at the same time, moldable jobs ending early or late (noise 0.5-1.7)."""
    jobs = [SimJob(f"j{i}", at, {size: t} if rigid else {s: t * size / s**0.8 for s in (1, 2, 3, 4, 7)}, rigid,
                   1.0 if rigid else noise) for i, (at, size, t, rigid, noise) in enumerate(specs)]  # fmt: skip
    runs: list[tuple[str, int, int, float, float]] = []
    result = simulate_live(jobs, LiveSimSetup(gpus=gpus, window=6, evaluations=4), planner, runs)
    assert sorted(r[0] for r in runs) == sorted(j.name for j in jobs) and result.jobs == len(jobs)
    arrival = {j.name: j.arrival for j in jobs}
    for name, _, _, start, _ in runs:
        assert start >= arrival[name]
    for a, b in itertools.combinations(runs, 2):
        if a[1] == b[1] and a[2] & b[2]:
            assert a[4] <= b[3] + 1e-9 or b[4] <= a[3] + 1e-9, (a, b)
