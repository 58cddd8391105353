"""MIG jobs end to end on a real HTCondor pool: migsub submits, the schedd's generated policy tags and
checks, mig-batchd over HTCondor decides and pins, the job wrapper asks each node's root agent for the
decided instance on emulated GPUs (A100-80GB on ``nodea``, H100-80GB on ``nodeb``), and the instance
goes when the job leaves its slot. One testbed for the module (tests/harness/htcondor_testbed.py).

The emulated library's history files are the audit trail: every instance ever made, when, where, and
the MIG devices of each; a job prints the MIG device it saw and when it ran.
"""

import random
import re
import signal
import time

import pytest
from harness.htcondor_pool import LocalPool

from mig_batch.gpu import nvml_emu
from mig_batch.state import Store

WHY_NOT = LocalPool.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

SCRIPT = """#!/bin/sh
{directives}
echo "$CUDA_VISIBLE_DEVICES|$(date +%s.%N)"
sleep {seconds}
echo "end|$(date +%s.%N)"
"""


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    from harness.htcondor_testbed import HTCondorTestbed

    bed = HTCondorTestbed(tmp_path_factory.mktemp("htcondor-node"))
    started = time.monotonic()
    try:
        bed.start()
        print(f"\ntestbed up in {time.monotonic() - started:.1f}s: pool {bed.pool.timings}")
        yield bed
    finally:
        bed.stop()


def script(bed, name, directives, seconds=1.0):
    path = bed.pool.shared / f"{name}.sh"
    path.write_text(SCRIPT.format(directives=directives, seconds=f"{seconds:.2f}"))
    path.chmod(0o755)
    return path


def submit(bed, path, *args, backend="htcondor"):
    out = bed.migsub(path, *args, backend=backend).stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+\.0", out), out
    return out


def output(bed, job, path):
    return bed.pool.shared / f"{path.name}.{job.split('.')[0]}.out"


def run_of(bed, job, path):
    """(MIG device seen, start, end) from the job's output."""
    lines = output(bed, job, path).read_text().splitlines()
    cvd, begin = lines[0].split("|")
    end = next(line for line in lines if line.startswith("end|")).split("|")[1]
    return cvd, float(begin), float(end)


def lifetimes(bed):
    return [life for node in bed.nodes for life in nvml_emu.lifetimes(bed.gpu_dir(node))]


def by_mig_uuid(bed):
    return {uuid: life for life in lifetimes(bed) for uuid in life.mig_uuids}


def wait_ended(bed, jobs, timeout=240):
    deadline = time.monotonic() + timeout
    states = {}
    while time.monotonic() < deadline:
        if not bed.store_path.exists():  # mig-batchd makes it at its start
            time.sleep(0.5)
            continue
        with Store.reading(bed.store_path) as store:
            states = {j: (d.state if (d := store.decision(j)) else None) for j in jobs}
        if all(s == "ended" for s in states.values()):
            return
        time.sleep(1.0)
    queue = bed.pool.run("condor_q", "-af", "ClusterId", "JobStatus", "HoldReason").stdout
    raise AssertionError(f"not ended after {timeout}s: {[j for j, s in states.items() if s != 'ended']} {queue}")


def wait_for(what, timeout=30.0, pause=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(pause)
    raise AssertionError(f"not within {timeout}s: {what.__doc__ or what}")


def assert_no_overlap_and_no_leak(bed):
    lives = lifetimes(bed)
    for i, a in enumerate(lives):
        assert a.destroyed is not None, f"instance {a} was never destroyed"
        for b in lives[i + 1 :]:
            same_gpu = a.node == b.node and a.gpu == b.gpu
            slices = a.start < b.start + b.size and b.start < a.start + a.size
            assert not (same_gpu and slices and a.created < b.destroyed and b.created < a.destroyed), (a, b)
    for node in bed.nodes:
        assert nvml_emu.live_instances(bed.gpu_dir(node)) == [], f"{node} still has instances"


def quiet(bed, timeout=60):
    """Every instance gone (the sweep runs every reconcile_interval_s)."""
    wait_for(lambda: all(nvml_emu.live_instances(bed.gpu_dir(n)) == [] for n in bed.nodes), timeout)


KINDS = ["--gpu-mem 8G", "--mig 1g.10gb", "--gpu-mem 18G", "--mig 3g.40gb", "--gpu-compute 2g", "--gpu-mem 30G",
         "--mig 1g.20gb --gpu A100-80GB", "--moldable 1g=8,2g=5,3g=3"]  # fmt: skip


def test_a_burst_of_mixed_migsub_jobs_survives_a_controller_sigkill_and_an_agent_restart(bed):
    rng = random.Random(18)
    started = time.monotonic()
    paths, jobs = {}, []
    for n in range(20):
        kind = KINDS[n % len(KINDS)]
        seconds = rng.uniform(1.0, 3.0)
        if n == 19:  # the last one long, on nodeb's H100: it runs there when that node's agent restarts
            kind, seconds = "--gpu-mem 8G --gpu H100-80GB", 12.0
        path = script(bed, f"mixed{n}", f"#MIG {kind}", seconds=seconds)
        job = submit(bed, path, backend="htcondor" if n % 2 else None)  # None: the site config's batch_system
        paths[job] = path
        jobs.append(job)
    submitted = time.monotonic()
    time.sleep(4.0)
    bed.stop_controller(signal.SIGKILL)  # mid-burst: more jobs than fit at once
    with Store.reading(bed.store_path) as store:
        undecided = [j for j in jobs if store.decision(j) is None or store.decision(j).state != "ended"]
    assert undecided, "the burst was over before the kill; the test would prove nothing"
    time.sleep(1.0)
    bed.start_controller()
    # nodeb's agent restarted while a job runs there on its instance: the job keeps it, nothing leaks
    wait_for(lambda: nvml_emu.live_instances(bed.gpu_dir("nodeb")), 60, 0.1)
    spanning = {life.key for life in lifetimes(bed) if life.node == "nodeb" and life.destroyed is None}
    bed.stop_agent("nodeb")
    bed.start_agent("nodeb")
    wait_ended(bed, jobs)
    elapsed = time.monotonic() - started
    lives = by_mig_uuid(bed)
    seen, after_end = set(), []
    with Store.reading(bed.store_path) as store:
        for job in jobs:
            cvd, begin, end = run_of(bed, job, paths[job])
            after_end.append(lives[cvd].destroyed - end if cvd in lives else None)
            assert cvd.startswith("MIG-") and "," not in cvd, f"job {job} saw {cvd!r}"
            life = lives[cvd]
            assert life.created <= begin and end <= life.destroyed, f"job {job} ran outside its instance"
            d = store.decision(job)
            assert (d.node, d.gpu, d.profile, d.start) == (life.node, life.gpu, life.profile, life.start)
            assert store.count_decisions(job) == 1, f"job {job} was decided more than once"
            seen.add(cvd)
    assert len(seen) == len(jobs)
    # the jobs that ran across the restart: the restarted agent took their wrappers' epilogs
    agent_log = bed.log_path("agent-nodeb").read_text()
    across = [j for j in jobs if lives[run_of(bed, j, paths[j])[0]].key in spanning]
    for job in across:
        assert re.search(rf"job {re.escape(job)} epilog .*: destroyed", agent_log), job
    quiet(bed)
    assert_no_overlap_and_no_leak(bed)
    after_end.sort()
    print(f"20 jobs: submitted in {submitted - started:.1f}s, all ended {elapsed:.1f}s after the first submit; "
          f"instance destroyed {after_end[0]:.3f}-{after_end[-1]:.3f}s (median {after_end[10]:.3f}s) after "
          "the job's last line")  # fmt: skip


def test_an_impossible_request_is_refused_at_submission_naming_the_largest_profile(bed):
    (bed.pool.shared / "huge.sub").write_text('executable = /bin/true\n+MigRequest = "500G"\nqueue\n')
    proc = bed.pool.run("condor_submit", "huge.sub", user=bed.pool.user, cwd=str(bed.pool.shared), check=False)
    assert proc.returncode != 0
    assert "500G fits no MIG profile of A100-80GB, H100-80GB; the largest is 7g.80gb" in proc.stderr + proc.stdout



def test_a_plain_submit_file_with_mig_request_runs_on_its_decided_instance(bed):
    (bed.pool.shared / "plain.sub").write_text(
        "executable = /bin/sh\narguments = \"-c 'echo $CUDA_VISIBLE_DEVICES'\"\noutput = plain.out\n"
        '+MigRequest = "70G"\nshould_transfer_files = NO\nqueue\n')  # fmt: skip
    accepted = bed.pool.run("condor_submit", "plain.sub", user=bed.pool.user, cwd=str(bed.pool.shared))
    job = re.search(r"submitted to cluster (\d+)", accepted.stdout).group(1) + ".0"
    wait_ended(bed, [job], 90)
    cvd = (bed.pool.shared / "plain.out").read_text().strip()
    life = by_mig_uuid(bed)[cvd]
    with Store.reading(bed.store_path) as store:
        d = store.decision(job)
    assert (d.node, d.gpu, d.start, d.profile) == (life.node, life.gpu, life.start, life.profile) == (
        d.node, d.gpu, d.start, "7g.80gb")  # fmt: skip


def live_instance_of(bed, cvd):
    life = by_mig_uuid(bed).get(cvd)
    return life is not None and life.destroyed is None


def test_rm_hold_and_eviction_of_running_jobs_leave_no_instance(bed):
    paths = {}
    for name in ("removed", "held", "evicted", "edited"):
        path = script(bed, name, "#MIG --gpu-mem 8G", seconds=120)
        paths[submit(bed, path)] = path
    for job, path in paths.items():
        wait_for(lambda job=job, path=path: output(bed, job, path).exists()
                 and output(bed, job, path).read_text().startswith("MIG-"), 90)  # fmt: skip
    seen = {job: run_of_start(bed, job, path) for job, path in paths.items()}
    for cvd in seen.values():
        assert live_instance_of(bed, cvd)
    removed, held, evicted, edited = paths
    # the owner's edit of the placement has no effect: refused, the job runs on as decided
    refused = bed.pool.run("condor_qedit", edited, "MigBatchNode", '"elsewhere"', user=bed.pool.user, check=False)
    assert refused.returncode != 0
    assert bed.pool.run("condor_q", edited, "-af", "MigBatchNode").stdout.strip() in bed.nodes
    actions = {removed: ("condor_rm",), held: ("condor_hold",), evicted: ("condor_vacate_job",)}
    for job, command in actions.items():
        t0 = time.monotonic()
        assert bed.pool.run(*command, job, user=bed.pool.user, check=False).returncode == 0
        wait_for(lambda job=job: not live_instance_of(bed, seen[job]), 30)
        print(f"{command[0]}: instance gone {time.monotonic() - t0:.1f}s later")
    assert live_instance_of(bed, seen[edited])
    # the owner's hold stands: mig-batchd does not release the job; the owner's release runs it again
    time.sleep(5)  # 25 controller passes
    assert job_status(bed, held) == "5", "the owner's hold was undone"
    assert bed.pool.run("condor_release", held, user=bed.pool.user, check=False).returncode == 0
    wait_for(lambda: job_status(bed, held) == "2", 90)
    for job in (held, evicted, edited):
        bed.pool.run("condor_rm", job, user=bed.pool.user, check=False)
    quiet(bed)
    assert_no_overlap_and_no_leak(bed)


def job_status(bed, job):
    return bed.pool.run("condor_q", job, "-af", "JobStatus").stdout.strip()


def run_of_start(bed, job, path):
    return output(bed, job, path).read_text().splitlines()[0].split("|")[0]


ASK = """import json, socket, sys
for path in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(json.dumps({"op": "prolog", "job": sys.argv[1]}).encode() + b"\\n")
    print(path, s.makefile().readline().strip(), flush=True)
"""


def ask_agent(path, op, job):
    import json
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall(json.dumps({"op": op, "job": job}).encode() + b"\n")
        return json.loads(s.makefile().readline())


def test_no_caller_gets_another_jobs_instance(bed):
    victim_path = script(bed, "victim", "#MIG --gpu-mem 8G", seconds=60)
    victim = submit(bed, victim_path)
    wait_for(lambda: output(bed, victim, victim_path).exists() and output(bed, victim, victim_path).read_text(), 90)
    sockets = [str(bed.pool.root / "agent" / f"{n}.sock") for n in bed.nodes]
    # a process outside any slot (root on the host, here) is refused
    for path in sockets:
        answer = ask_agent(path, "prolog", victim)
        assert not answer["ok"] and "runs in no HTCondor slot" in answer["detail"], answer
        assert not ask_agent(path, "epilog", victim)["ok"]
    # another job of the same owner, in a slot of either node, asking for the victim's instance
    (bed.pool.shared / "ask.py").write_text(ASK)
    (bed.pool.shared / "thief.sub").write_text(
        f"executable = /usr/bin/python3\narguments = {bed.pool.shared}/ask.py {victim} {' '.join(sockets)}\n"
        "output = thief.out\nerror = thief.err\nshould_transfer_files = NO\nqueue\n")  # fmt: skip
    bed.pool.run("condor_submit", "thief.sub", user=bed.pool.user, cwd=str(bed.pool.shared))
    thief = wait_for(lambda: (bed.pool.shared / "thief.out").exists()
                     and (bed.pool.shared / "thief.out").read_text().count("\n") == 2
                     and (bed.pool.shared / "thief.out").read_text(), 90)  # fmt: skip
    assert thief.count('"ok": false') == 2 and thief.count("refused") == 2, thief
    assert live_instance_of(bed, run_of_start(bed, victim, victim_path))  # untouched
    bed.pool.run("condor_rm", victim, user=bed.pool.user)
    quiet(bed)


def test_mfi_places_what_first_fit_blocks(bed):
    """The same difference as on Slurm: first fit puts a 1g at slice 0 of the A100, the only start of a
    4g; MFI keeps that start free, so the 4g runs beside the 1g."""

    def scenario(policy):
        bed.stop_controller()
        bed.policy = policy
        bed.write_config()
        bed.start_controller()
        small_path = script(bed, f"small-{policy}", "#MIG --mig 1g.10gb --gpu A100-80GB", seconds=12)
        small = submit(bed, small_path)
        wait_for(lambda: output(bed, small, small_path).exists(), 60, 0.2)  # running alone on the A100
        big = submit(bed, script(bed, f"big-{policy}", "#MIG --mig 4g.40gb --gpu A100-80GB", seconds=0.5))
        time.sleep(4.0)
        with Store.reading(bed.store_path) as store:
            big_decided = store.decision(big) is not None
            small_start = store.decision(small).start
        wait_ended(bed, [small, big], 120)
        return big_decided, small_start

    try:
        ff_decided, ff_start = scenario("ff")
        mfi_decided, mfi_start = scenario("mfi")
    finally:
        bed.policy = "mfi"
    assert ff_start == 0 and not ff_decided  # the 1g at 0 blocks the only 4g start
    assert mfi_start != 0 and mfi_decided
    quiet(bed)
    assert_no_overlap_and_no_leak(bed)
