"""End to end on a real local Slurm (munge, slurmctld, 3 slurmd, emulated GPUs) with mig-batchd.

Every job goes through migsub or sbatch, job_submit.lua, the controller, the prolog, the TaskProlog
and the epilog, and every MIG instance through NVML (pynvml on the emulated libnvidia-ml). The
emulated library's history files are the audit trail for overlaps and leaks.
"""

import os
import random
import signal
import time
from pathlib import Path

import pytest
from harness.slurm_cluster import LocalCluster, MigTestbed, unprivileged

from mig_batch.batch.tags import parse_report
from mig_batch.cli.migsub_status import ARRAY_WAITS, SQUEUE_FORMAT, parse_records, status_row
from mig_batch.gpu import nvml_emu
from mig_batch.mig.models import get_model
from mig_batch.slurm.commands import SlurmCli
from mig_batch.state import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]

JOB = """#!/bin/bash
#SBATCH --output={out}/%j.out
{directives}
echo "$SLURM_JOB_ID|$CUDA_VISIBLE_DEVICES|$(date +%s.%N)"
sleep {seconds}
echo "end|$(date +%s.%N)"
"""


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("testbed")
    testbed = MigTestbed(root)
    testbed.start()
    (root / "out").mkdir()
    yield testbed
    testbed.stop()


def job_script(bed, name, directives, seconds=1.0):
    path = bed.root / f"{name}.sh"
    path.write_text(JOB.format(out=bed.root / "out", directives=directives, seconds=seconds))
    return path


def submit(bed, *args):
    return bed.migsub(*map(str, args)).stdout.strip()


def wait_done(bed, jobs, timeout=120):
    deadline = time.monotonic() + timeout
    store = Store(bed.store_path)
    while time.monotonic() < deadline:
        out = bed.cluster.run("squeue", "-h", "-o", "%i").stdout.split()
        decisions = [store.decision(j) for j in jobs]
        if not set(out) & set(jobs) and all(d is None or d.state == "ended" for d in decisions):
            return  # Slurm is done with them and the controller has seen them end
        time.sleep(0.5)
    raise AssertionError(f"jobs still queued after {timeout}s: {bed.cluster.run('squeue').stdout}")


def never_drained(bed):
    states = bed.cluster.node_states()  # "planned": backfill has a pending job in mind for the node
    bad = {n: s for n, s in states.items() if s not in ("idle", "mixed", "allocated", "planned")}
    assert not bad, f"{bad}\n{bed.cluster.run('squeue').stdout}"


def history(bed) -> list[nvml_emu.Lifetime]:
    """Every GPU instance the emulated library ever made on the testbed's nodes."""
    return [life for node in bed.nodes for life in nvml_emu.lifetimes(bed.gpu_dir(node))]


def by_mig_uuid(bed) -> dict[str, nvml_emu.Lifetime]:
    """The GPU instance behind each MIG device (what a job's CUDA_VISIBLE_DEVICES names)."""
    return {uuid: life for life in history(bed) for uuid in life.mig_uuids}


def job_runs(bed, jobs):
    runs = {}
    for job in jobs:
        lines = (bed.root / "out" / f"{job}.out").read_text().splitlines()
        first = next(line for line in lines if line.startswith(f"{job}|"))
        _, cvd, begin = first.split("|")
        end = next(line for line in lines if line.startswith("end|")).split("|")[1]
        runs[job] = (cvd, float(begin), float(end))
    return runs


def assert_no_overlap_and_no_leak(bed):
    lives = history(bed)
    for i, a in enumerate(lives):
        assert a.destroyed is not None, f"instance {a} was never destroyed"
        for b in lives[i + 1 :]:
            same_gpu = a.node == b.node and a.gpu == b.gpu
            slices = a.start < b.start + b.size and b.start < a.start + a.size
            times = a.created < b.destroyed and b.created < a.destroyed
            assert not (same_gpu and slices and times), f"instances overlap: {a} and {b}"
    for node in bed.nodes:
        assert nvml_emu.live_instances(bed.gpu_dir(node)) == [], f"{node} still has instances"
    assert Store(bed.store_path).instances() == []


def test_nodes_cannot_reach_the_controllers_store(bed):
    assert bed.store_path.exists()
    for node in bed.nodes:
        seen = bed.in_node(node, "ls", "-A", str(bed.controller_dir)).stdout.split()
        assert seen == [], f"{node} sees {seen} in the controller's directory"
        assert bed.in_node(node, "test", "-e", str(bed.store_path.parent)).returncode != 0
        assert bed.in_node(node, "test", "-S", "/run/mig-batch/agent.sock").returncode == 0  # its own agent
    config = bed.config_path.read_text()
    assert "state:" not in config  # the nodes' config names no store


def test_thirty_mixed_jobs_complete_each_with_one_mig_device(bed):
    rng = random.Random(5)
    kinds = ["--mig 1g.10gb", "--gpu-mem 8G", "--gpu-mem 18G", "--mig 3g.40gb", "--gpu-compute 2g",
             "--gpu-mem 30G", "--mig 1g.20gb --gpu A100-80GB", "--gpu-mem 5G --gpu-compute 0.4"]  # fmt: skip
    jobs = []
    for n in range(30):
        script = job_script(bed, f"mixed{n}", f"#MIG {rng.choice(kinds)}", seconds=rng.uniform(0.5, 2.5))
        jobs.append(submit(bed, script))
    wait_done(bed, jobs)
    runs = job_runs(bed, jobs)
    lives = by_mig_uuid(bed)
    store = Store(bed.store_path)
    for job, (cvd, begin, end) in runs.items():
        assert cvd.startswith("MIG-") and "," not in cvd, f"job {job} saw {cvd!r}"
        life = lives[cvd]
        assert life.created <= begin and end <= life.destroyed, f"job {job} ran outside its instance"
        d = store.decision(job)
        assert d.state == "ended" and (d.node, d.gpu, d.start) == (life.node, life.gpu, life.start)
    assert len({cvd for cvd, _, _ in runs.values()}) == 30
    # what each node reported went back through Slurm intact, Prologs that reported at once included
    tags = {j.job_id: j.admin_tag for j in SlurmCli(env=bed.cluster.env()).jobs()}
    for job, (cvd, _, _) in runs.items():
        assert tags[job].startswith("mig-batch:v1;"), f"job {job}'s tag: {tags[job]!r}"
        assert parse_report(tags[job]).uuid == cvd, f"job {job}'s tag: {tags[job]!r}"
    assert_no_overlap_and_no_leak(bed)
    never_drained(bed)


def test_static_mig_forms_run_as_mig_jobs_on_their_own_instances(bed):
    """What users of Slurm's own MIG support write, unchanged: sbatch --gres=gpu:<profile>[:n] and
    --gpus=<profile>:n are MIG jobs (job_submit.lua reads them as mig: requests), each on its own instances."""
    script = job_script(bed, "static", "", seconds=1)
    one = bed.cluster.run("sbatch", "--parsable", "--gres=gpu:3g.40gb:1", str(script)).stdout.strip()
    two = bed.cluster.run("sbatch", "--parsable", "--gpus=1g.10gb:2", str(script)).stdout.strip()
    rounded = bed.cluster.run("sbatch", "--parsable", "--gres=mig:20G", str(script))  # told, and accepted
    told = rounded.stderr
    assert "mig-batch: mig:20G rounds up: " in told and "A100-80GB: 20.00 GiB GPU memory asked, 3g.40gb" in told, told
    wait_done(bed, [one, two, rounded.stdout.strip()])
    store = Store(bed.store_path)
    assert store.decision(one).profile == "3g.40gb" and store.spots(one) == []
    assert [profile for _, profile, _ in store.spots(two)] == ["1g.10gb", "1g.10gb"]
    lives = by_mig_uuid(bed)
    for job in (one, two):
        cvd = job_runs(bed, [job])[job][0]  # the batch step's device: its (first) instance
        assert cvd.startswith("MIG-") and "," not in cvd and lives[cvd].node == store.decision(job).node, cvd
    assert_no_overlap_and_no_leak(bed)
    never_drained(bed)


def test_a_mig_job_whose_task_nothing_binds_sees_no_gpu_and_still_ends_clean(bed):
    """job_submit.lua gives a MIG batch job CUDA_VISIBLE_DEVICES=NoDevFiles, which its TaskProlog replaces
    with its instance. Where nothing replaces it (a TaskProlog that printed nothing: replaced, or missing
    from a node's slurm.conf), the job sees no GPU rather than every one, and its instance is still
    destroyed."""
    taskprolog = bed.root / "etc" / "mig-batch-taskprolog"
    bound = submit(bed, job_script(bed, "bound", "#MIG --mig 1g.10gb", seconds=0.5))
    wait_done(bed, [bound])
    moved = taskprolog.with_name("taskprolog.moved")
    os.replace(taskprolog, moved)
    try:
        taskprolog.write_text("#!/bin/sh\nexit 0\n")
        taskprolog.chmod(0o755)
        unbound = submit(bed, job_script(bed, "unbound", "#MIG --mig 1g.10gb", seconds=0.5))
        wait_done(bed, [unbound])
    finally:
        os.replace(moved, taskprolog)
    runs = job_runs(bed, [bound, unbound])
    assert runs[bound][0].startswith("MIG-"), runs
    assert runs[unbound][0] == "NoDevFiles", runs
    assert Store(bed.store_path).decision(unbound).state == "ended"
    assert_no_overlap_and_no_leak(bed)
    never_drained(bed)


def test_impossible_request_is_rejected_at_submission_naming_the_largest(bed):
    proc = bed.cluster.run("sbatch", "--gres=mig:500G", "--wrap", "true", check=False)
    assert proc.returncode != 0
    assert "7g.80gb" in proc.stderr and "500.0 GiB" in proc.stderr
    proc = bed.cluster.run("sbatch", "--gres=mig:9g.90gb", "--wrap", "true", check=False)
    assert proc.returncode != 0 and "no GPU of this site has MIG profile 9g.90gb" in proc.stderr
    script = job_script(bed, "huge", "#MIG --gpu-mem 500G")
    proc = bed.migsub(str(script), check=False)
    assert proc.returncode != 0 and "the largest is 7g.80gb" in proc.stderr
    proc = bed.cluster.run("sbatch", "--array=1-2", "--gres=mig:1g.10gb:2", "--wrap", "true", check=False)
    assert proc.returncode != 0
    assert "a job over several MIG instances cannot be a job array (--array 1-2)" in proc.stderr, proc.stderr
    for first, second in (("--gres=mig:1g.10gb", "-n1"), ("-n1", "--gres=mig:1g.10gb")):
        het = bed.root / "het.sh"
        het.write_text(f"#!/bin/sh\n#SBATCH {first}\n#SBATCH hetjob\n#SBATCH {second}\ntrue\n")
        proc = bed.cluster.run("sbatch", str(het), check=False)
        component = 0 if "mig" in first else 1
        assert proc.returncode != 0, proc.stdout
        assert f"cannot be a component of a heterogeneous job (component {component})" in proc.stderr, proc.stderr


ARRAY_TASK = """#!/bin/bash
#SBATCH --output={out}/array_%A_%a.out
echo "$SLURM_ARRAY_JOB_ID|$SLURM_ARRAY_TASK_ID|$SLURM_JOB_ID|$CUDA_VISIBLE_DEVICES|$(date +%s.%N)"
sleep 1.5
echo "end|$(date +%s.%N)"
"""


def test_a_job_array_runs_each_task_on_its_own_instance_within_its_limit(bed):
    script = bed.root / "array.sh"
    script.write_text(ARRAY_TASK.format(out=bed.root / "out"))
    array = bed.cluster.run("sbatch", "--parsable", "--array=1-40%8", "--gres=mig:1g.10gb", str(script)).stdout.strip()
    seen: dict[str, dict] = {}  # what migsub status shows of the array while it runs, by squeue's names
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(r["placement"] for r in seen.values()):
        out = bed.cluster.run("squeue", "-h", "-O", SQUEUE_FORMAT, "-j", array)
        seen = {row["job"]: row for record in parse_records(out.stdout) if (row := status_row(*record))}
        time.sleep(0.5)
    placed = [job for job, row in seen.items() if row["placement"]]
    assert placed and all(job.startswith(f"{array}_") and job.split("_")[1].isdigit() for job in placed), seen
    assert all(row["waits"] == ARRAY_WAITS for job, row in seen.items() if "_[" in job), seen
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and bed.cluster.run("squeue", "-h", "-j", array).stdout.strip():
        time.sleep(1)
    assert not bed.cluster.run("squeue", "-h", "-j", array).stdout.strip(), bed.cluster.run("squeue").stdout
    runs = {}
    for task in range(1, 41):
        lines = (bed.root / "out" / f"array_{array}_{task}.out").read_text().splitlines()
        array_id, task_id, job, cvd, begin = lines[0].split("|")
        assert (array_id, task_id) == (array, str(task)), lines
        runs[task] = (job, cvd, float(begin), float(lines[-1].split("|")[1]))
    wait_done(bed, [job for job, *_ in runs.values()])  # and mig-batchd saw each end
    lives = by_mig_uuid(bed)
    store = Store(bed.store_path)
    for task, (job, cvd, begin, end) in runs.items():
        assert cvd.startswith("MIG-") and "," not in cvd, f"task {task} saw {cvd!r}"
        life = lives[cvd]
        assert life.created <= begin and end <= life.destroyed, f"task {task} ran outside its instance"
        d = store.decision(job)
        assert d is not None and d.state == "ended", (task, job, d)
        assert (d.node, d.gpu, d.start, d.profile) == (life.node, life.gpu, life.start, "1g.10gb")
    assert len({cvd for _, cvd, _, _ in runs.values()}) == 40  # an instance of its own for each task
    edges = sorted([(begin, 1) for _, _, begin, _ in runs.values()] + [(end, -1) for *_, end in runs.values()])
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    assert 2 <= most <= 8, most  # several at once, never more than the array's %8
    assert_no_overlap_and_no_leak(bed)
    never_drained(bed)


def test_forged_placement_in_user_fields_has_no_effect(bed):
    forged = "mig-batch:v1;req=7g.80gb;place=n3/0/7g.80gb@0"
    script = job_script(bed, "forged", f"#SBATCH --comment={forged}", seconds=0.5)
    job = bed.cluster.run("sbatch", "--parsable", "--gres=mig:1g.10gb", str(script)).stdout.strip()
    wait_done(bed, [job])
    cvd, _, _ = job_runs(bed, [job])[job]
    life = by_mig_uuid(bed)[cvd]
    d = Store(bed.store_path).decision(job)
    assert d.request == "mig-batch:v1;req=1g.10gb" and d.profile == "1g.10gb"
    size = get_model(d.model).profile(d.profile).memory_slices
    assert (life.node, life.gpu, life.start, life.size) == (d.node, d.gpu, d.start, size)
    assert_no_overlap_and_no_leak(bed)


def test_mfi_places_what_first_fit_leaves_pending(bed):
    def scenario(policy):
        bed.stop_controller()
        bed.write_config(policy)
        bed.start_controller()
        small = submit(bed, job_script(bed, f"small-{policy}", "#MIG --mig 1g.5gb --gpu A100-40GB", seconds=6))
        time.sleep(1.5)  # placed and running alone on n1's A100-40GB
        big = submit(bed, job_script(bed, f"big-{policy}", "#MIG --mig 4g.20gb --gpu A100-40GB", seconds=0.5))
        time.sleep(3)
        big_state = bed.cluster.run("squeue", "-h", "-j", big, "-o", "%T").stdout.strip()
        wait_done(bed, [small, big])
        return big_state, Store(bed.store_path).decision(small).start

    ff_state, ff_start = scenario("ff")
    mfi_state, mfi_start = scenario("mfi")
    assert ff_start == 0 and ff_state == "PENDING"  # 1g at 0 blocks the only 4g start
    assert mfi_start != 0 and mfi_state in ("RUNNING", "COMPLETING", "")
    assert_no_overlap_and_no_leak(bed)


def test_moldable_jobs_get_the_size_that_finishes_first(bed):
    # alone on the A100-40GB: 3g is within 10% of 7g's time (min_gain), so the smaller size starts now
    now = submit(bed, job_script(bed, "mold-now", "#MIG --moldable 1g=600,3g=20,7g=19 --gpu A100-40GB", seconds=1))
    wait_done(bed, [now])
    # a rigid 1g runs 4 s (limit 1 min): 7g after it finishes far sooner than 1g now, so the job waits
    rigid = submit(bed, job_script(bed, "mold-rigid", "#SBATCH --time=1\n#MIG --mig 1g.5gb --gpu A100-40GB", seconds=4))
    time.sleep(1.5)
    later = submit(bed, job_script(bed, "mold-later", "#MIG --moldable 1g=600,7g=30 --gpu A100-40GB", seconds=1))
    time.sleep(1.5)
    waited = bed.cluster.run("squeue", "-h", "-j", later, "-o", "%T").stdout.strip()
    wait_done(bed, [rigid, later])
    store = Store(bed.store_path)
    assert (store.decision(now).profile, store.decision(now).policy) == ("3g.20gb", "moldable-auto")  # the default
    assert waited == "PENDING" and store.decision(later).profile == "7g.40gb"
    cvd, begin, _ = job_runs(bed, [later])[later]
    assert cvd.startswith("MIG-") and begin >= job_runs(bed, [rigid])[rigid][2]  # after the rigid job
    # malformed sizes are refused at submission, naming the entry
    proc = bed.cluster.run("sbatch", "--gres=mig:1g", "--comment=mig-batch:moldable=1g:abc", "--wrap", "true",
                           check=False)  # fmt: skip
    assert proc.returncode != 0 and "cannot read '1g:abc'" in proc.stderr
    proc = bed.cluster.run("sbatch", "--gres=mig:1g", "--comment=mig-batch:moldable=1g:60,9g.90gb:5", "--wrap",
                           "true", check=False)  # fmt: skip
    assert proc.returncode != 0 and "no GPU of this site has MIG profile 9g.90gb" in proc.stderr
    assert_no_overlap_and_no_leak(bed)
    never_drained(bed)


def test_controller_sigkill_and_slurmd_restart_lose_nothing(bed):
    script = job_script(bed, "burst", "", seconds=1.5)
    jobs = [bed.cluster.run("sbatch", "--parsable", "--gres=mig:18G", str(script)).stdout.strip() for _ in range(40)]
    time.sleep(0.7)
    bed.stop_controller(signal.SIGKILL)  # mid-burst: more jobs than fit at once, some still held
    held = bed.cluster.run("squeue", "-h", "-t", "PD", "-o", "%i").stdout.split()
    assert held, "the burst was over before the kill; the test would prove nothing"
    time.sleep(1.0)
    bed.start_controller()
    time.sleep(2.0)
    bed.cluster.stop_node("n2")
    bed.cluster.start_node("n2")
    wait_done(bed, jobs, timeout=180)
    store = Store(bed.store_path)
    for job in jobs:
        assert store.decision(job).state == "ended"
        assert store.count_decisions(job) == 1, f"job {job} was placed more than once"
    assert all(cvd.startswith("MIG-") for cvd, _, _ in job_runs(bed, jobs).values())
    assert_no_overlap_and_no_leak(bed)
    never_drained(bed)
    log = Path(bed.root / "log" / "slurmctld.log").read_text()
    assert "drain" not in log.lower()


def test_the_agents_scontrol_session_updates_a_long_tag_and_names_a_refused_job(bed):
    """The node agent's long-lived scontrol against the real one, started as systemd starts the agent
    (no TERM): a tag longer than a terminal line comes back whole; a refused update names its job."""
    from mig_batch.slurm.commands import SlurmCli, SlurmError

    script = job_script(bed, "session", "", seconds=0.1)
    job = bed.cluster.run("sbatch", "--parsable", "--hold", str(script)).stdout.strip()
    env = {k: v for k, v in bed.env().items() if k not in ("TERM", "COLUMNS")}
    cli = SlurmCli(env=env, session=True)
    try:
        tag = "session-check;" + ";".join(f"field{i}=value{i}" for i in range(20))  # ~280 characters
        cli.set_job_tag(job, tag)
        assert cli.job(job).admin_tag == tag
        with pytest.raises(SlurmError, match="999999"):
            cli.set_job_tag("999999", tag)
        cli.set_job_tag(job, tag + ";again")  # the session goes on after a refusal
        assert cli.job(job).admin_tag == tag + ";again"
        assert cli._session is not None and cli._session.usable
    finally:
        bed.cluster.run("scancel", job, check=False)
        if cli._session is not None:
            cli._session.close()


def test_a_users_mig_job_waits_unplaced_for_its_dependency_and_only_mig_batchd_releases_it(bed, tmp_path):
    """Slurm 22.05 shows the submission hold as JobHeldUser, which the job's owner may release: released
    before mig-batchd placed it, a job ran with no MIG instance. Placed before a job it depends on ended,
    its slice idled until then."""
    shared, as_user, sbatch = unprivileged(bed, tmp_path)
    first = sbatch(seconds=8, env=["MIG_BATCH_JOB=1"])  # no MIG: Slurm starts it at once; as if sent from a MIG job
    job = sbatch("--gres=mig:1g.10gb", f"--dependency=afterok:{first}", seconds=0.5)
    refused = as_user("sbatch", "-H", "--gres=mig:1g.10gb", "--wrap", "true")
    assert refused.returncode != 0 and "cannot be submitted held (-H)" in refused.stderr
    update, scontrol = ("scontrol", "update", f"jobid={job}"), "scontrol"
    for argv in ((scontrol, "release", job), (scontrol, "hold", job), (*update, "priority=1"), (*update, "nice=10")):
        proc = as_user(*argv)
        assert proc.returncode != 0 and "Job is in held state, pending scheduler release" in proc.stderr, argv
    time.sleep(3)  # several passes of mig-batchd while the job it depends on runs
    store = Store(bed.store_path)
    assert store.decision(job) is None
    assert [e["reason"] for e in store.events(job=job, kind="waiting")] == [f"job {first} to end"]
    assert bed.cluster.run("squeue", "-h", "-j", job, "-o", "%r").stdout.strip() == "JobHeldUser"
    wait_done(bed, [first, job], timeout=60)
    out = (shared / f"{job}.out").read_text()
    assert out.startswith(f"{job}|MIG-") and out.splitlines()[0].endswith("|1"), out  # marked a MIG job
    out = (shared / f"{first}.out").read_text()  # job_submit.lua took the mark it inherited away
    assert out.splitlines()[0] == f"{first}||", out  # (marked, its TaskProlog would have printed NoDevFiles)
    assert store.decision(job).state == "ended"
    assert_no_overlap_and_no_leak(bed)


def test_a_mig_job_after_a_job_array_waits_unplaced_for_the_tasks_it_names(bed, tmp_path):
    """A job after a whole array waits until every task has ended; one after a single task, only for that
    task. Placed sooner, its slice would idle while the array runs (Slurm lists the pending tasks in one
    record, 12_[1-2], and each started task in its own, 12_0)."""
    _, _, sbatch = unprivileged(bed, tmp_path)
    array = sbatch("--array=0-2%1", seconds=4)  # no MIG: one task at a time, ~4 s each
    whole = sbatch("--gres=mig:1g.10gb", f"--dependency=afterok:{array}", seconds=0.5)
    first = sbatch("--gres=mig:1g.10gb", f"--dependency=afterok:{array}_0", seconds=0.5)
    store = Store(bed.store_path)
    first_placed_while_the_array_ran = False
    deadline = time.monotonic() + 90
    while store.decision(whole) is None or store.decision(first) is None:
        placed = {j: store.decision(j) is not None for j in (whole, first)}  # read before the array's records
        states = bed.cluster.run("squeue", "-h", "-r", "-t", "all", "-j", array, "-o", "%i %T").stdout.split("\n")
        running = [line for line in states if line.split(" ")[-1] in ("PENDING", "RUNNING", "CONFIGURING",
                                                                        "COMPLETING")]  # fmt: skip
        assert not (placed[whole] and running), (states, store.events(job=whole))
        assert not (placed[first] and [r for r in running if r.startswith(f"{array}_0 ")]), states
        first_placed_while_the_array_ran |= placed[first] and bool(running)
        assert time.monotonic() < deadline, bed.cluster.run("squeue").stdout
        time.sleep(0.2)
    assert first_placed_while_the_array_ran, store.events(job=first)
    assert [e["reason"] for e in store.events(job=whole, kind="waiting")] == [f"job {array}_* to end"]
    assert [e["reason"] for e in store.events(job=first, kind="waiting")] == [f"job {array}_0 to end"]
    wait_done(bed, [whole, first], timeout=60)
    assert store.decision(whole).state == "ended" and store.decision(first).state == "ended"
    assert_no_overlap_and_no_leak(bed)


def test_a_placed_job_gives_its_slice_back_when_its_dependency_fails_or_its_begin_moves(bed, tmp_path):
    """A dependency on one of several jobs (``?``) is Slurm's to judge, so mig-batchd places such a job at once;
    when they all fail, Slurm never starts it. Its owner may also move a placed job's begin time. Either way
    its slice would idle: mig-batchd holds it again and frees the slice."""
    _, as_user, sbatch = unprivileged(bed, tmp_path)
    one, other = (sbatch(seconds=6, status=1) for _ in range(2))  # no MIG: both fail after 6 s
    failing = sbatch("--gres=mig:1g.10gb", f"--dependency=afterok:{one}?afterok:{other}", seconds=0.5)
    later = sbatch("--gres=mig:1g.10gb", f"--dependency=afterany:{one}?afterany:{other}", seconds=0.5)
    store = Store(bed.store_path)
    deadline = time.monotonic() + 20
    while not all((d := store.decision(j)) is not None and d.state == "released" for j in (failing, later)):
        assert time.monotonic() < deadline, bed.cluster.run("squeue").stdout
        time.sleep(0.2)
    moved = as_user("scontrol", "update", f"jobid={later}", "starttime=now+1hour")
    assert moved.returncode == 0, moved.stderr  # placed: job_submit.lua lets its owner change it
    deadline = time.monotonic() + 30
    while not all(store.decision(j).state == "requeued" for j in (failing, later)):
        assert time.monotonic() < deadline, (bed.cluster.run("squeue").stdout, store.events(job=failing))
        time.sleep(0.5)
    time.sleep(2)  # passes enough to decide them again, were they placeable
    assert store.count_decisions(failing) == 1 and store.count_decisions(later) == 1
    squeue = bed.cluster.run("squeue", "-h", "-j", f"{failing},{later}", "-O", "JobID:|,PriorityLong:|,admin_comment")
    lines = squeue.stdout.splitlines()
    assert len(lines) == 2, squeue.stdout
    for line in lines:
        _, priority, tag = line.split("|", 2)
        assert priority == "0" and ";place=" not in tag, line  # held, unplaced
    never = store.events(job=failing, kind="waiting")[-1]["reason"]
    assert never.endswith("which the batch system says can never be met"), never
    assert store.events(job=later, kind="waiting")[-1]["reason"].startswith("its begin time")
    bed.cluster.run("scancel", failing, later)
    deadline = time.monotonic() + 60  # never started: their decisions stay requeued, as for any job cancelled held
    while {failing, later} & set(bed.cluster.run("squeue", "-h", "-o", "%i").stdout.split()):
        assert time.monotonic() < deadline, bed.cluster.run("squeue").stdout
        time.sleep(0.5)
    assert_no_overlap_and_no_leak(bed)
