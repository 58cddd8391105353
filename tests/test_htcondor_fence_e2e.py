"""Each job fenced to its own MIG instance, end to end on the real HTCondor pool: two ordinary users of the
pool (unix accounts in its chroot) submit MIG jobs with plain condor_submit; each job runs as its user,
gets its instance from the job wrapper and the node's root agent, and opens MIG devices as CUDA would (the
emulated node's ``cuda-open``, in the node's GPU directory bind-mounted into the chroot): its own
instance, and the other user's once it points CUDA_VISIBLE_DEVICES at it. One node, one A100-40GB
(emulated libnvidia-ml); one testbed for the module (tests/harness/htcondor_testbed.py).

The chroot shares the host's kernel: a job's uid is the same number on the host, where the agent reads
it (SO_PEERCRED) and gives it the device nodes, although the host's passwd does not know these users."""

import re
import time

import pytest
from harness.htcondor_pool import LocalPool

from mig_batch.state import Store

WHY_NOT = LocalPool.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

NODE = "nodea"
# Opens its own instance, says it is up, waits for the test to name another job's MIG device, opens that,
# and lives on until the test ends it (the other job's instance must outlive its try).
JOB = """#!/bin/sh
export MIG_BATCH_NVML_EMU_DIR={gpu}
echo "uid $(id -u)"
echo "own $CUDA_VISIBLE_DEVICES"
sh {gpu}/cuda-open; echo "own-rc $?"
wait_for() {{ n=0; while [ ! -f "$1" ] && [ $n -lt 900 ]; do sleep 0.2; n=$((n + 1)); done; }}  # 3 min at most
wait_for {shared}/$1.other
CUDA_VISIBLE_DEVICES=$(cat {shared}/$1.other) sh {gpu}/cuda-open; echo "other-rc $?"
wait_for {shared}/$1.end
"""
SUBMIT = """executable = {shared}/fence-job.sh
arguments = {name}
output = {name}.out
error = {name}.err
should_transfer_files = NO
+MigRequest = "{request}"
queue
"""


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    from harness.htcondor_testbed import HTCondorTestbed

    bed = HTCondorTestbed(tmp_path_factory.mktemp("htcondor-fence"), nodes={NODE: ["A100-40GB"]})
    started = time.monotonic()
    try:
        bed.start()
        print(f"\ntestbed up in {time.monotonic() - started:.1f}s: pool {bed.pool.timings}")
        job = bed.pool.shared / "fence-job.sh"
        job.write_text(JOB.format(gpu=bed.gpu_dir(NODE), shared=bed.pool.shared))
        job.chmod(0o755)
        yield bed
    finally:
        bed.stop()


def submit(bed, user, name, request):
    """condor_submit run by ``user`` inside the pool; the job id."""
    (bed.pool.shared / f"{name}.sub").write_text(SUBMIT.format(shared=bed.pool.shared, name=name, request=request))
    done = bed.pool.run("condor_submit", f"{name}.sub", user=user, cwd=str(bed.pool.shared))
    return re.search(r"submitted to cluster (\d+)", done.stdout).group(1) + ".0"


def output(bed, name):
    path = bed.pool.shared / f"{name}.out"
    return path.read_text() if path.exists() else ""


def wait_for(what, timeout=90.0, why=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting: {why}")


def started(bed, name):
    """(uid, own MIG device) the job printed once it had opened its own instance."""
    text = wait_for(lambda: "own-rc" in output(bed, name) and output(bed, name), why=f"job {name} to start")
    lines = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    return int(lines["uid"]), lines["own"]


def ended(bed, job):
    with Store.reading(bed.store_path) as store:
        decision = store.decision(job)
    return decision is not None and decision.state == "ended"


def tell(bed, name, uuid):
    """The MIG device job ``name`` tries next, put in place whole (the job acts as soon as the file is there)."""
    partial = bed.pool.shared / f".{name}.other"
    partial.write_text(uuid)
    partial.rename(bed.pool.shared / f"{name}.other")


def end(bed, *names):
    for name in names:
        (bed.pool.shared / f"{name}.other").touch()  # an empty name: a job still waiting for one tries nothing
        (bed.pool.shared / f"{name}.end").touch()


def test_two_users_jobs_each_open_their_own_instance_and_not_the_others(bed):
    (alice, alice_uid), (bob, bob_uid) = list(bed.pool.users.items())[:2]
    try:
        alice_job = submit(bed, alice, "alice", "1g.10gb")
        bob_job = submit(bed, bob, "bob", "1g.10gb")
        (alice_seen, alice_uuid), (bob_seen, bob_uuid) = started(bed, "alice"), started(bed, "bob")
        assert (alice_seen, bob_seen) == (alice_uid, bob_uid)  # each job runs as its owner, same uid as the host's
        assert alice_uuid.startswith("MIG-") and bob_uuid.startswith("MIG-") and alice_uuid != bob_uuid
        tell(bed, "alice", bob_uuid)
        tell(bed, "bob", alice_uuid)
        for name in ("alice", "bob"):
            text = wait_for(lambda name=name: "other-rc" in output(bed, name) and output(bed, name), why=name)
            assert "own-rc 0" in text, text
            assert "other-rc 1" in text and text.count("Permission denied") == 2, text  # the GI's and the CI's
    finally:
        end(bed, "alice", "bob")
    wait_for(lambda: ended(bed, alice_job) and ended(bed, bob_job), why="both jobs to end")


def test_the_next_job_on_the_slice_gets_it_and_the_ended_jobs_user_has_none(bed):
    alice, bob = list(bed.pool.users)[:2]
    gpu = bed.gpu_dir(NODE)
    try:
        first = submit(bed, alice, "first", "7g.40gb")  # the whole GPU: the next job gets the same slices
        started(bed, "first")
        end(bed, "first")
        wait_for(lambda: ended(bed, first), why=f"job {first} to end")
        second = submit(bed, bob, "second", "7g.40gb")
        _, second_uuid = started(bed, "second")
        assert "own-rc 0" in output(bed, "second"), output(bed, "second")
        # Alice, her job over, points CUDA at the instance now on her old slices (a process left on the node)
        probe = bed.pool.run("env", f"MIG_BATCH_NVML_EMU_DIR={gpu}", f"CUDA_VISIBLE_DEVICES={second_uuid}",
                             "sh", f"{gpu}/cuda-open", user=alice, check=False)  # fmt: skip
        assert probe.returncode == 1 and probe.stdout.count("Permission denied") == 2, probe.stdout + probe.stderr
    finally:
        end(bed, "first", "second")
    wait_for(lambda: ended(bed, second), why=f"job {second} to end")
    with Store.reading(bed.store_path) as store:
        one, two = store.decision(first), store.decision(second)
    assert (one.node, one.gpu, one.start) == (two.node, two.gpu, two.start)
