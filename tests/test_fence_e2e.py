"""Each job fenced to its own MIG instance, end to end on a real local Slurm: two ordinary users submit
MIG jobs with plain sbatch; each job runs as its user, gets its instance from the Prolog and the TaskProlog,
and opens MIG devices as CUDA would (the emulated node's ``cuda-open``): its own instance, and the other
user's once it points CUDA_VISIBLE_DEVICES at it. One node, one A100-40GB (emulated libnvidia-ml)."""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from harness.slurm_cluster import NODE_GPU_DIR, LocalCluster, MigTestbed, ensure_user

from mig_batch.batch.tags import wait_note
from mig_batch.cli.migsub_status import SQUEUE_FORMAT, parse_records, status_row
from mig_batch.gpu import nvml_emu

USERS = ("mig-batch-alice", "mig-batch-bob")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("useradd") is None,
                       reason="two ordinary users are made with useradd and act through setpriv (root)"),
]

# Opens its own instance, says it is up, waits for the test to name another job's MIG device, opens that,
# and lives on until the test ends it (the other job's instance must outlive its try).
JOB = """#!/bin/sh
echo "own $CUDA_VISIBLE_DEVICES"
sh {gpu}/cuda-open; echo "own-rc $?"
wait_for() {{ n=0; while [ ! -f "$1" ] && [ $n -lt 900 ]; do sleep 0.2; n=$((n + 1)); done; }}  # 3 min at most
wait_for {shared}/$SLURM_JOB_ID.other
CUDA_VISIBLE_DEVICES=$(cat {shared}/$SLURM_JOB_ID.other) sh {gpu}/cuda-open; echo "other-rc $?"
wait_for {shared}/$SLURM_JOB_ID.end
"""
# A job over two instances: each task opens its own rank's instance, then the other rank's.
RANKS = """#!/bin/sh
srun sh -c 'echo "rank $SLURM_LOCALID $CUDA_VISIBLE_DEVICES"; sh {gpu}/cuda-open; echo "rank-rc $SLURM_LOCALID $?"'
CUDA_VISIBLE_DEVICES=$MIG_BATCH_INSTANCES sh {gpu}/cuda-open; echo "all-rc $?"
"""


@pytest.fixture(scope="module")
def bed():
    users = [ensure_user(u) for u in USERS]
    # every user reaches the cluster's config, the munge socket and the hooks (the TaskProlog runs as the job's user)
    root = Path(tempfile.mkdtemp(prefix="mig-batch-fence-"))
    os.chmod(root, 0o755)
    shared = root / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o1777)
    testbed = MigTestbed(root, nodes={"n1": ["A100-40GB"]})
    testbed.start()
    yield testbed, users, shared
    for user in users:  # a failed test leaves its jobs waiting: no job process outlives the cluster
        testbed.cluster.run("scancel", "--full", "-u", user.pw_name, check=False)
    testbed.stop()
    shutil.rmtree(root, ignore_errors=True)


def submit(testbed, user, shared, body: str, *options: str) -> str:
    script = shared / f"{user.pw_name}-{time.monotonic_ns()}.sh"
    script.write_text(body.format(gpu=NODE_GPU_DIR, shared=shared))
    script.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(testbed.cluster.conf), "HOME": "/",
           "MIG_BATCH_NVML_EMU_DIR": NODE_GPU_DIR}  # fmt: skip
    done = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups",
                           "sbatch", "--parsable", f"--chdir={shared}", f"--output={shared}/%j.out", *options,
                           str(script)], env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def output(shared: Path, job: str) -> str:
    path = shared / f"{job}.out"
    return path.read_text() if path.exists() else ""


def wait_for(what, timeout=90.0, why=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting: {why}")


def own_uuid(shared, job):
    text = wait_for(lambda: "own-rc" in output(shared, job) and output(shared, job), why=f"job {job} to start")
    return next(line.split()[1] for line in text.splitlines() if line.startswith("own "))


def state(testbed, job):
    return testbed.cluster.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()


def test_two_users_jobs_each_open_their_own_instance_and_not_the_others(bed):
    testbed, (alice, bob), shared = bed
    alice_job = submit(testbed, alice, shared, JOB, "--gres=mig:1g.10gb")
    bob_job = submit(testbed, bob, shared, JOB, "--gres=mig:1g.10gb")
    alice_uuid, bob_uuid = own_uuid(shared, alice_job), own_uuid(shared, bob_job)
    assert alice_uuid.startswith("MIG-") and bob_uuid.startswith("MIG-") and alice_uuid != bob_uuid
    (shared / f"{alice_job}.other").write_text(bob_uuid)
    (shared / f"{bob_job}.other").write_text(alice_uuid)
    for job in (alice_job, bob_job):
        text = wait_for(lambda job=job: "other-rc" in output(shared, job) and output(shared, job), why=f"job {job}")
        assert "own-rc 0" in text, text
        assert "other-rc 1" in text and text.count("Permission denied") == 2, text
    for job in (alice_job, bob_job):
        (shared / f"{job}.end").touch()


def test_the_next_job_on_the_slice_gets_it_and_the_ended_jobs_user_has_none(bed):
    testbed, (alice, bob), shared = bed
    first = submit(testbed, alice, shared, JOB, "--gres=mig:7g.40gb")  # the whole GPU: the next job gets the same
    uuid = own_uuid(shared, first)
    (shared / f"{first}.other").write_text(uuid)
    (shared / f"{first}.end").touch()
    wait_for(lambda: state(testbed, first) == "", why=f"job {first} to end")
    second = submit(testbed, bob, shared, JOB, "--gres=mig:7g.40gb")
    second_uuid = own_uuid(shared, second)
    assert "own-rc 0" in output(shared, second)
    # Alice, her job over, points CUDA at the instance now on her old slice (a process left on the node)
    probe = testbed.in_node("n1", "setpriv", f"--reuid={alice.pw_uid}", f"--regid={alice.pw_gid}", "--clear-groups",
                            "env", f"MIG_BATCH_NVML_EMU_DIR={NODE_GPU_DIR}", f"CUDA_VISIBLE_DEVICES={second_uuid}",
                            "sh", f"{NODE_GPU_DIR}/cuda-open")  # fmt: skip
    assert probe.returncode == 1 and probe.stdout.count("Permission denied") == 2, probe.stdout + probe.stderr
    (shared / f"{second}.other").write_text(second_uuid)
    (shared / f"{second}.end").touch()
    wait_for(lambda: state(testbed, second) == "", why=f"job {second} to end")


def test_a_multi_instance_jobs_ranks_reach_all_their_instances(bed):
    testbed, (alice, _bob), shared = bed
    job = submit(testbed, alice, shared, RANKS, "--gres=mig:1g.10gb:2", "--ntasks=2")
    text = wait_for(lambda: "all-rc" in output(shared, job) and output(shared, job), why=f"job {job}")
    assert "rank-rc 0 0" in text and "rank-rc 1 0" in text and "all-rc 0" in text, text
    ranks = {line.split()[2] for line in text.splitlines() if line.startswith("rank ")}
    assert len(ranks) == 2 and all(r.startswith("MIG-") for r in ranks), text


HOLDS = """#!/bin/sh
echo "own $CUDA_VISIBLE_DEVICES"; echo own-rc
n=0; while [ ! -f {shared}/$SLURM_JOB_ID.end ] && [ $n -lt 900 ]; do sleep 0.2; n=$((n + 1)); done
"""


def as_user(testbed, user, *argv: str) -> str:
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(testbed.cluster.conf), "HOME": "/"}
    done = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", *argv],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_ordinary_user_reads_why_their_job_waits(bed):
    """No root: its owner sees in squeue and scontrol (AdminComment) why a held MIG job waits; its pin takes
    the note off."""
    testbed, (alice, bob), shared = bed
    whole = submit(testbed, alice, shared, HOLDS, "--gres=mig:7g.40gb")
    try:
        saw_why_it_waits(testbed, alice, bob, shared, whole)
    finally:  # a failure must not leave its jobs holding the GPU for the next test
        for user in (alice, bob):
            testbed.cluster.run("scancel", "-u", user.pw_name, check=False)


def saw_why_it_waits(testbed, alice, bob, shared, whole):
    wait_for(lambda: state(testbed, whole) == "RUNNING", why="the whole-GPU job to run")
    waiting = submit(testbed, alice, shared, HOLDS, "--gres=mig:1g.5gb")
    after = submit(testbed, bob, shared, "#!/bin/sh\ntrue\n", "--gres=mig:1g.5gb", f"--dependency=afterany:{waiting}")

    def note(user, job):
        return wait_note(as_user(testbed, user, "squeue", "-h", "-j", job, "-O", "admin_comment:400").strip())

    wait_for(lambda: note(alice, waiting).startswith("no room: every GPU that could hold 1g.5gb is busy"),
             why=f"alice's job {waiting} to show why it waits")  # fmt: skip
    shown = as_user(testbed, alice, "scontrol", "show", "job", waiting)
    assert ";waits=no room: every GPU that could hold 1g.5gb" in shown, shown
    wait_for(lambda: note(bob, after) == f"job {waiting} to end", why=f"bob's job {after} to show its dependency")
    # migsub status's own reading, as alice (its squeue call; the checkout's Python may be out of her reach)
    queue = as_user(testbed, alice, "env", "SLURM_TIME_FORMAT=%s", "squeue", "-h", "-O", SQUEUE_FORMAT, "--me")
    rows = {r["job"]: r for r in (status_row(*rec) for rec in parse_records(queue)) if r is not None}
    assert set(rows) == {whole, waiting}  # hers only
    assert rows[waiting]["waits"].startswith("no room: every GPU that could hold 1g.5gb is busy"), rows
    (spot,) = rows[whole]["placement"]["instances"]
    assert rows[whole]["placement"]["node"] == "n1" and spot["profile"] == "7g.40gb", rows
    assert spot["uuid"] == own_uuid(shared, whole), rows  # the instance its job got
    (shared / f"{whole}.end").write_text("")
    wait_for(lambda: state(testbed, waiting) == "RUNNING", 60, f"job {waiting} to run")
    assert note(alice, waiting) == "" and ";place=n1/0/1g.5gb@" in as_user(testbed, alice, "squeue", "-h", "-j",
                                                                           waiting, "-O", "admin_comment:400")
    (shared / f"{waiting}.end").write_text("")
    wait_for(lambda: not state(testbed, after), 60, f"job {after} to run and end")


def test_an_ordinary_user_reads_that_their_job_waits_on_a_fragmented_gpu(bed):
    """No root: seven 1g.5gb jobs fill the A100-40GB; those at starts 1, 3 and 5 end, which leaves four free
    memory slices but no start a 2g.10gb may use (0, 2 or 4). Its owner reads `fragmented` in squeue and in
    migsub status's reading."""
    testbed, (alice, _), shared = bed
    wait_for(lambda: nvml_emu.live_instances(testbed.gpu_dir("n1")) == [], 60, "earlier jobs' instances to go")
    small = [submit(testbed, alice, shared, HOLDS, "--gres=mig:1g.5gb") for _ in range(7)]
    try:
        starts = {}
        for job in small:
            wait_for(lambda job=job: state(testbed, job) == "RUNNING", 90, f"job {job} to run")
            tag = as_user(testbed, alice, "squeue", "-h", "-j", job, "-O", "admin_comment:400").strip()
            starts[int(tag.split(";place=n1/0/1g.5gb@")[1].split(";")[0])] = job
        assert sorted(starts) == list(range(7)), starts
        for start in (1, 3, 5):
            (shared / f"{starts[start]}.end").write_text("")
        wait_for(lambda: len(nvml_emu.live_instances(testbed.gpu_dir("n1"))) == 4, 60, "three instances to go")
        pair = submit(testbed, alice, shared, HOLDS, "--gres=mig:2g.10gb")
        queue = wait_for(lambda: (q := as_user(testbed, alice, "squeue", "-h", "-O", SQUEUE_FORMAT, "-j", pair))
                         and ";waits=" in q and q, 60, f"job {pair}'s note")  # fmt: skip
        (row,) = [r for r in (status_row(*rec) for rec in parse_records(queue)) if r is not None]
        assert row["job"] == pair and row["placement"] is None, row
        assert row["waits"].startswith("fragmented: GPUs have enough free memory slices for 2g.10gb"), row
    finally:
        testbed.cluster.run("scancel", "-u", alice.pw_name, check=False)


def test_an_interactive_allocation_gets_its_own_instance_and_gives_it_back(bed):
    """salloc --gres=mig:<profile> as an ordinary user: held until mig-batchd places it, like a batch job; its
    step sees exactly one MIG device, the instance made for it, which CUDA opens; gone once the allocation ends."""
    testbed, (alice, _), shared = bed
    wait_for(lambda: nvml_emu.live_instances(testbed.gpu_dir("n1")) == [], 60, "earlier jobs' instances to go")
    end = shared / f"salloc-{time.monotonic_ns()}.end"
    step = (f"echo own $CUDA_VISIBLE_DEVICES; sh {NODE_GPU_DIR}/cuda-open; echo own-rc $?; "
            f"n=0; while [ ! -f {end} ] && [ $n -lt 600 ]; do sleep 0.2; n=$((n + 1)); done")  # fmt: skip
    env = {"PATH": os.environ["PATH"], "SLURM_CONF": str(testbed.cluster.conf), "HOME": "/",
           "MIG_BATCH_NVML_EMU_DIR": NODE_GPU_DIR}  # fmt: skip
    salloc = subprocess.Popen(["setpriv", f"--reuid={alice.pw_uid}", f"--regid={alice.pw_gid}", "--init-groups",
                               "salloc", "--gres=mig:1g.5gb", "srun", "sh", "-c", step], env=env, cwd=shared,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        own = salloc.stdout.readline().split()  # blocks until the step runs
        lines = [salloc.stdout.readline().split() for _ in range(3)]  # cuda-open opens the GPU and compute instance
        assert own[0] == "own" and own[1].startswith("MIG-") and "," not in own[1], own  # exactly one device
        assert [line[:2] for line in lines] == [["opened", own[1]], ["opened", own[1]], ["own-rc", "0"]], lines
        assert nvml_emu.mig_uuids(testbed.gpu_dir("n1")) == {own[1]}  # the instance made for it
    finally:
        end.write_text("")
        _, err = salloc.communicate(timeout=60)
    assert salloc.returncode == 0, err
    assert "Granted job allocation" in err, err
    wait_for(lambda: nvml_emu.live_instances(testbed.gpu_dir("n1")) == [], 60, "its instance to be destroyed")
