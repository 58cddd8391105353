"""simulate atomize: the SJA simulator against its baselines on small seeded workloads."""

import pytest

from mig_batch.sim.atomize import SCHEDULERS, AtomizeSetup, Simulation, generate, run_atomize

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
    assert set(result["mean"]) == set(SCHEDULERS)
    assert all(len(runs) == 2 for runs in result["runs"].values())
