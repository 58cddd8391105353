"""Failures on the cluster in a box: the node agent killed with jobs running, mig-batchd down during a
burst, a node killed hard with MIG jobs on it. Nothing is lost, nothing placed twice, nothing leaked."""

import signal
import time

import pytest

from mig_batch.gpu import nvml_emu
from mig_batch.slurm.local_cluster import LocalCluster, MigTestbed
from mig_batch.state import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]

JOB = "#!/bin/bash\n#SBATCH --output={out}/%j.out\necho \"$SLURM_JOB_ID|$CUDA_VISIBLE_DEVICES\"\nsleep {seconds}\n"


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("failures")
    testbed = MigTestbed(root, nodes={"n1": ["A100-80GB"], "n2": ["A100-80GB"], "n3": ["A100-80GB"]},
                         reconcile_interval_s=3)  # fmt: skip
    testbed.start()
    (root / "out").mkdir()
    yield testbed
    testbed.stop()


def submit(bed, n, seconds, gres="mig:1g.10gb"):
    script = bed.root / f"job-{seconds}.sh"
    script.write_text(JOB.format(out=bed.root / "out", seconds=seconds))
    return [bed.cluster.run("sbatch", "--parsable", f"--gres={gres}", str(script)).stdout.strip() for _ in range(n)]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def states(bed, jobs):
    out = bed.cluster.run("squeue", "-h", "-o", "%i %T %N").stdout.split("\n")
    return {f[0]: (f[1], f[2] if len(f) > 2 else "") for f in (line.split() for line in out) if f and f[0] in jobs}


def done(bed, jobs):
    store = Store(bed.store_path)
    return not states(bed, set(jobs)) and all(store.decision(j) and store.decision(j).state == "ended" for j in jobs)


def instances(bed, node):
    """(GPU, GPU instance id) of the node's MIG instances now, as the emulated library holds them."""
    return nvml_emu.live_instances(bed.gpu_dir(node))


def assert_clean(bed, jobs):
    store = Store(bed.store_path)
    for job in jobs:
        assert store.count_decisions(job) >= 1
        line = (bed.root / "out" / f"{job}.out").read_text().splitlines()[-1]
        assert "|MIG-" in line, f"job {job}: {line}"
    for node in bed.nodes:
        assert instances(bed, node) == [], f"{node} leaked {instances(bed, node)}"
    bad = {n: s for n, s in bed.cluster.node_states().items() if "drain" in s or "down" in s}
    assert not bad, bad


def test_agent_killed_with_jobs_running_leaves_them_unharmed(bed):
    jobs = submit(bed, 6, 6)
    wait_for(lambda: sum(s == "RUNNING" for s, _ in states(bed, set(jobs)).values()) >= 3, 60, "jobs running")
    running = {j for j, (s, _) in states(bed, set(jobs)).items() if s == "RUNNING"}
    for node in bed.nodes:
        bed.stop_agent(node, signal.SIGKILL)  # hooks take the slow path meanwhile
    time.sleep(2)
    for node in bed.nodes:
        bed.start_agent(node)  # its start reconcile keeps what live jobs own
    wait_for(lambda: done(bed, jobs), 120, "all jobs to end")
    store = Store(bed.store_path)
    assert all(store.count_decisions(j) == 1 for j in jobs)
    assert all(store.decision(j).state == "ended" for j in running)
    assert_clean(bed, jobs)


def test_controller_down_for_a_minute_during_a_burst_loses_nothing(bed):
    first = submit(bed, 60, 1)
    wait_for(lambda: any(s == "RUNNING" for s, _ in states(bed, set(first)).values()), 60, "the burst to start")
    bed.stop_controller(signal.SIGKILL)
    arriving = submit(bed, 40, 1)  # submitted while it is down: they stay held
    time.sleep(5)
    held = [j for j, (s, _) in states(bed, set(arriving)).items() if s == "PENDING"]
    assert len(held) == len(arriving), "jobs ran without a decision"
    time.sleep(55)
    bed.start_controller()
    jobs = first + arriving
    wait_for(lambda: done(bed, jobs), 240, "all jobs to end")
    store = Store(bed.store_path)
    assert [j for j in jobs if store.count_decisions(j) != 1] == []  # each decided once
    assert_clean(bed, jobs)


def test_a_node_killed_hard_is_fenced_its_jobs_run_elsewhere_and_its_strays_cleaned(bed):
    for node in ("n1", "n3"):  # every job lands on n2
        bed.cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=test")
    jobs = submit(bed, 5, 40)
    wait_for(lambda: [s for s, _ in states(bed, set(jobs)).values()].count("RUNNING") == 5, 60, "5 jobs on n2")
    assert {n for _, n in states(bed, set(jobs)).values()} == {"n2"}
    # RUNNING shows while the Prolog may still be creating the last instance
    wait_for(lambda: len(instances(bed, "n2")) == 5, 30, "five instances on n2")
    killed = time.time()
    bed.kill_node("n2")
    for node in ("n1", "n3"):
        bed.cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
    wait_for(lambda: "down" in bed.cluster.node_states()["n2"], 120, "Slurm to mark n2 down")
    wait_for(lambda: done(bed, jobs), 420, "the requeued jobs to complete elsewhere")
    store = Store(bed.store_path)
    for job in jobs:
        assert store.decision(job).node in ("n1", "n3")  # decided again, elsewhere
    assert len(instances(bed, "n2")) == 5  # the dead node's instances: strays until it returns
    bed.restart_node("n2")
    wait_for(lambda: instances(bed, "n2") == [], 60, "n2's reconcile to clear its strays")
    wait_for(lambda: [e for e in Store(bed.store_path).events(kind="node-back") if e["node"] == "n2"], 60,
             "mig-batchd to see n2 back")  # fmt: skip
    back = [e for e in Store(bed.store_path).events(kind="node-back") if e["node"] == "n2"]
    placed_on_n2 = [e for e in store.events(kind="decided") if e.get("node") == "n2" and e["time"] > killed]
    assert all(e["time"] > back[0]["time"] for e in placed_on_n2), "placed on n2 before its reconcile"
    bed.cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    assert_clean(bed, jobs)
