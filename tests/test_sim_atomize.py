"""simulate atomize: the SJA simulator against its baselines on small seeded workloads."""

import itertools
import random

import pytest

from mig_batch.mig.models import get_model
from mig_batch.sim.atomize import DEFAULT_SCHEDULERS, SCHEDULERS, Simulation, run_atomize
from mig_batch.sim.atomize_workloads import AtomizeSetup, from_trace, generate, offered_load
from mig_batch.sim.traces import TracePod

SMALL = AtomizeSetup(gpus=3, hours=6, rigid_per_hour=6, training_per_hour=1.5, min_subjob_s=300,
                     max_subjob_s=1800)  # fmt: skip


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_every_job_finishes_and_the_run_is_deterministic(scheduler):
    jobs, _ = generate(SMALL, 4)
    a = Simulation(SMALL, scheduler, 4).run()
    b = Simulation(SMALL, scheduler, 4).run()
    assert a.summary(1.0) == b.summary(1.0)
    assert a.finished == len(jobs) and a.unfinished == 0
    assert len(a.waits) == len(jobs) and min(a.waits) >= 0
    assert a.allocated_mib_s >= a.used_mib_s > 0


def test_sja_runs_training_as_several_subjobs_and_pays_for_checkpoints():
    sim = Simulation(SMALL, "sja", 2)
    training = [j for j in sim.jobs if j.kind == "training"]
    m = sim.run()
    assert training and m.subjobs > len(training)  # 2-10 h of work in windows of at most 30 min
    assert m.overhead_s == pytest.approx(m.subjobs * SMALL.checkpoint_s, rel=0.05)
    for job in training:  # all the work done, none counted twice
        assert job.done_s >= job.work_s - 1e-6 and job.done_s <= job.work_s + SMALL.checkpoint_s


def test_a_reckless_risk_level_causes_interruptions_and_wasted_work():
    reckless = AtomizeSetup(**{**vars(SMALL), "eps": 0.6, "applications": 1, "training_per_hour": 4})
    m = Simulation(reckless, "sja", 3).run()
    careful = Simulation(AtomizeSetup(**{**vars(reckless), "eps": 0.05}), "sja", 3).run()
    assert m.interruptions > careful.interruptions
    assert m.wasted_s > 0


def test_run_atomize_reports_means_per_scheduler():
    result = run_atomize(SMALL, [1, 2])
    assert set(result["mean"]) == set(DEFAULT_SCHEDULERS)  # sja-defrag only when asked for
    assert all(len(runs) == 2 for runs in result["runs"].values())


def synthetic_pods(n: int, seed: int) -> list[TracePod]:
    """Trace-shaped pods: LS and BE, whole and shared GPUs, run times from seconds to hours."""
    rng = random.Random(seed)
    pods, t = [], 0
    for i in range(n):
        t += rng.randint(0, 600)
        run = rng.choice([30, 300, 900, 3600, 4 * 3600])
        pods.append(TracePod(f"p{i:03d}", 1, rng.choice([250, 500, 1000]), t, t + run, rng.choice(["LS", "BE"])))
    return pods


def test_trace_windows_keep_order_and_sizes_and_hit_the_offered_load():
    pods = synthetic_pods(200, 1)
    setup = AtomizeSetup(gpus=4, trace_jobs=80, load=0.7, min_subjob_s=600)
    jobs, apps = from_trace(pods, setup, 3)
    by_name = {p.name: p for p in pods}
    assert len(jobs) == 80
    names = [j.name for j in jobs]
    assert names == sorted(names)  # consecutive pods, in arrival order
    assert offered_load(jobs, setup) == pytest.approx(0.7)
    model = get_model(setup.model)
    for j in jobs:
        pod = by_name[j.name]
        assert j.work_s == max(60, pod.deletion - pod.creation)
        trains = pod.qos == "BE" and j.work_s >= setup.min_subjob_s
        assert (j.kind == "training") == trains
        if trains:  # declares its profile's memory, really uses less
            assert j.declared_mib == model.profile(j.profile).memory_mib
            assert 0.4 * j.declared_mib <= apps[j.app].base_mib <= 0.77 * j.declared_mib
    gaps = [b.submit - a.submit for a, b in itertools.pairwise(jobs)]
    raw = [by_name[b.name].creation - by_name[a.name].creation for a, b in itertools.pairwise(jobs)]
    ratios = {round(g / r, 9) for g, r in zip(gaps, raw, strict=True) if r}
    assert len(ratios) == 1  # one time scale for the whole window
    assert len({from_trace(pods, setup, seed)[0][0].name for seed in range(1, 6)}) > 1  # seeds pick other windows


def test_a_trace_window_runs_under_every_scheduler():
    pods = synthetic_pods(120, 2)
    setup = AtomizeSetup(gpus=3, trace_jobs=60, load=0.9, min_subjob_s=300, max_subjob_s=1800)
    result = run_atomize(setup, [1], pods=pods)
    assert result["workload"] == "alibaba-2023" and result["workloads"][0]["jobs"] == 60
    for scheduler, (run,) in result["runs"].items():
        assert run["finished"] == 60 and run["unfinished"] == 0, scheduler
    assert result["mean"]["sja"]["subjobs"] > result["workloads"][0]["training"]


def test_a_trace_with_nothing_to_map_is_refused():
    with pytest.raises(ValueError, match="no pod that maps"):
        from_trace([TracePod("multi", 2, 1000, 0, 10)], AtomizeSetup(), 1)


def test_cli_live_defrag_both_runs_sja_with_and_without_it(tmp_path, capsys):
    import json

    from mig_batch.cli.main import main

    out = tmp_path / "out"
    code = main(["simulate", "atomize", "--gpus", "3", "--hours", "4", "--seeds", "1", "--live-defrag", "both",
                 "--out", str(out), "--json"])  # fmt: skip
    assert code == 0
    mean = json.loads(capsys.readouterr().out)
    assert set(mean) == {"fifo-backfill", "moldable", "moldable-eft", "sja", "sja-defrag"}
    assert mean["sja"]["moved"] == 0 and mean["sja-defrag"]["unfinished"] == 0
    for m in mean.values():
        assert m["frag_delay_total_h"] >= 0 and m["frag_blocked"] >= 0
    assert main(["simulate", "atomize", "--gpus", "3", "--hours", "4", "--seeds", "1", "--live-defrag", "on",
                 "--out", str(out), "--json"]) == 0  # fmt: skip
    assert "sja" not in json.loads(capsys.readouterr().out)


def test_fragmentation_delay_counts_only_jobs_that_fit_nowhere_while_the_free_slices_would_hold_them():
    sim = Simulation(SMALL, "sja", 2)
    sim.cluster.allocate(0, "x", "1g.10gb", 0)
    sim.cluster.allocate(1, "y", "1g.10gb", 0)
    sim.cluster.allocate(2, "z", "1g.10gb", 0)
    whole, small = (j for j in sim.jobs[:2])
    whole.profile, small.profile, whole.kind, small.kind = "7g.80gb", "1g.10gb", "rigid", "rigid"
    sim.queue = [whole, small]
    sim._measure_fragmentation()
    assert sim.frag_now == [whole]  # 21 free slices, no whole GPU; the 1g job fits (queue order only)
    sim._account(sim.now + 100)
    assert sim.metrics.frag_delay_s == 100 and sim.metrics.frag_blocked == 1
    for gid in range(3):
        sim.cluster.allocate(gid, f"half{gid}", "3g.40gb", 4)
        sim.cluster.allocate(gid, f"quarter{gid}", "2g.20gb", 2)
    sim._measure_fragmentation()
    assert sim.frag_now == []  # 3 free slices in all: short of capacity, not fragmented
