"""Prompt slots end to end on the real local Slurm: job_submit.lua binds new MIG jobs to the slots
mig-batchd published, the jobs start without a hold or a pin, and mig-batchd records them; with
mig-batchd stopped the bound jobs still run and are recorded at its return."""

import time

import pytest
from harness.slurm_cluster import LocalCluster, MigTestbed
from test_slurm_e2e import assert_no_overlap_and_no_leak, by_mig_uuid, job_runs, job_script, never_drained, wait_done

from mig_batch.batch.tags import parse_place, parse_slot
from mig_batch.slurm.commands import SlurmCli
from mig_batch.state import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]
SLOTS = 4


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("slots-testbed")
    testbed = MigTestbed(root, prompt_slots=SLOTS)
    testbed.start()
    (root / "out").mkdir()
    yield testbed
    testbed.stop()


def sbatch(bed, script, *args):
    return bed.cluster.run("sbatch", "--parsable", *args, str(script)).stdout.strip()


def open_slots(bed, count, timeout=30):
    """Wait until mig-batchd has published ``count`` slots (of 1g.10gb)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if bed.slots_file.exists() and len(bed.slots_file.read_text().splitlines()) - 1 >= count:
            return
        time.sleep(0.2)
    text = bed.slots_file.read_text() if bed.slots_file.exists() else "(no file)"
    raise AssertionError(f"no {count} slots after {timeout}s: {text}")


def tags(bed):
    return {j.job_id: j.admin_tag for j in SlurmCli(env=bed.cluster.env()).jobs()}


def test_jobs_bound_to_slots_start_without_a_pin_each_on_its_own_instance(bed):
    script = job_script(bed, "slot", "#SBATCH --gres=mig:1g.10gb", seconds=1.0)
    first = sbatch(bed, script)  # the request's first job waits held; mig-batchd then makes its slots
    open_slots(bed, SLOTS)
    jobs = [sbatch(bed, script) for _ in range(10)]
    wait_done(bed, [first, *jobs])
    store = Store(bed.store_path)
    now = tags(bed)
    bound = [j for j in jobs if parse_slot(now[j]) is not None]
    assert len(bound) >= SLOTS, now  # the published slots were taken at submission
    assert parse_slot(now[first]) is None and store.decision(first).policy == "mfi"
    lives = by_mig_uuid(bed)
    for job, (cvd, begin, end) in job_runs(bed, [first, *jobs]).items():
        d = store.decision(job)
        assert d.state == "ended" and store.count_decisions(job) == 1
        assert d.policy == ("slot-mfi" if job in bound else "mfi")
        life = lives[cvd]  # the instance the node made is at the spot recorded, and the job ran inside it
        assert (d.node, d.gpu, d.start) == (life.node, life.gpu, life.start)
        assert life.created <= begin and end <= life.destroyed
        if job in bound:
            p = parse_place(now[job])
            assert (p.node, p.gpu, p.start) == (d.node, d.gpu, d.start)
            assert not store.events(job=job, kind="released")  # never pinned nor released by mig-batchd
    assert_no_overlap_and_no_leak(bed)
    never_drained(bed)


def test_only_a_job_slurm_may_start_at_once_on_the_slots_node_is_bound(bed):
    script = job_script(bed, "later", "#SBATCH --gres=mig:1g.10gb", seconds=0.5)
    open_slots(bed, SLOTS)
    held = [sbatch(bed, script, *args) for args in (["--begin=now+2"], ["--mem=1"], ["--constraint=A100-80GB"])]
    bound = sbatch(bed, script, "--cpus-per-task=2")
    now = tags(bed)
    assert [parse_slot(now[j]) for j in held] == [None] * 3 and parse_slot(now[bound]) is not None, now
    wait_done(bed, [*held, bound])
    store = Store(bed.store_path)
    assert [store.decision(j).policy for j in held] == ["mfi"] * 3
    assert store.decision(held[2]).model == "A100-80GB" and store.decision(bound).policy == "slot-mfi"
    assert_no_overlap_and_no_leak(bed)


def test_jobs_bound_while_mig_batchd_is_down_run_and_are_recorded_at_its_return(bed):
    script = job_script(bed, "down", "#SBATCH --gres=mig:1g.10gb", seconds=0.5)
    open_slots(bed, SLOTS)
    bed.stop_controller()
    try:
        jobs = [sbatch(bed, script) for _ in range(SLOTS)]
        assert all(parse_slot(t) is not None for j, t in tags(bed).items() if j in jobs)
        deadline = time.monotonic() + 60
        while bed.cluster.run("squeue", "-h", "-j", ",".join(jobs), "-o", "%i").stdout.split():
            assert time.monotonic() < deadline, bed.cluster.run("squeue").stdout
            time.sleep(0.3)
        late = sbatch(bed, script)  # the slots are all taken: it waits held
        assert parse_slot(tags(bed)[late]) is None
    finally:
        bed.start_controller()
    wait_done(bed, [*jobs, late])
    store = Store(bed.store_path)
    assert [store.decision(j).policy for j in jobs] == ["slot-mfi"] * SLOTS
    assert all(store.decision(j).state == "ended" for j in [*jobs, late])
    assert_no_overlap_and_no_leak(bed)
    never_drained(bed)
