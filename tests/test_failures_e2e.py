"""Failures on the cluster in a box: the node agent killed with jobs running, mig-batchd down during a
burst, a node killed hard with MIG jobs on it, a chain's running subjob requeued by an operator. Nothing is
lost, nothing placed twice, nothing leaked."""

import signal
import sys
import time

import pytest
from harness.slurm_cluster import LocalCluster, MigTestbed

from mig_batch.gpu import nvml_emu
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


# a chain's training: counts to STEPS (0.1 s a step) from its checkpoint; USR1 (the runner's, before the
# window ends) checkpoints and exits 75; each start says whether its Prolog gave it a window and an instance
COUNTER = """import os, pathlib, signal, sys, time
state = pathlib.Path(os.environ["MIG_BATCH_CHECKPOINT_DIR"]) / "count"
step = int(state.read_text()) if state.exists() else 0
print("start", os.environ["SLURM_JOB_ID"], step, os.environ["SLURMD_NODENAME"],
      os.environ.get("MIG_BATCH_DEADLINE") or "-", os.environ.get("CUDA_VISIBLE_DEVICES") or "-", flush=True)
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
while step < {steps} and not stop:
    time.sleep(0.1)
    step += 1
state.write_text(str(step))
sys.exit(0 if step >= {steps} else 75)
"""


def submit_chain(bed, name, steps, window_s=(3, 8)):
    """A chain (migsub --atomize) whose subjobs count to ``steps`` in windows of ``window_s`` (shortest,
    longest); its id and checkpoint directory."""
    ckpt = bed.root / name
    ckpt.mkdir()
    (bed.root / f"{name}.py").write_text(COUNTER.format(steps=steps))
    script = bed.root / f"{name}.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={bed.root / 'out'}/%j.out\n"
                      f"exec {sys.executable} {bed.root / name}.py\n")  # fmt: skip
    job = bed.migsub("--atomize", "--checkpoint-dir", str(ckpt), "--gpu-mem", "6G", "--subjob-min", f"{window_s[0]}s",
                     "--subjob-max", f"{window_s[1]}s", str(script)).stdout.strip()  # fmt: skip
    return job, ckpt


def starts(bed, store, chain):
    """Each start of the chain's jobs: [job, step, node, deadline, CUDA_VISIBLE_DEVICES] ("-": unset), from
    the jobs' output."""
    lines = []
    for job in store.chain_jobs(chain):
        out = bed.root / "out" / f"{job}.out"
        lines += [line.split()[1:] for line in (out.read_text().splitlines() if out.exists() else [])
                  if line.startswith("start ")]  # fmt: skip
    return lines


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


def started_on_mig(bed, job):
    """Whether the job's script started with its instance (its Prolog and TaskProlog are over)."""
    out = bed.root / "out" / f"{job}.out"
    return out.exists() and "|MIG-" in out.read_text()


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


def test_a_journal_lost_while_jobs_run_keeps_their_instances(bed):
    """Each node's journal removed while its agent is down and jobs run: the agent's start reconcile journals
    the running jobs' instances again from their reports (on the old code it destroyed them as strays) and
    their Epilogs destroy them."""
    jobs = submit(bed, 3, 25)
    wait_for(lambda: sum(s == "RUNNING" for s, _ in states(bed, set(jobs)).values()) == 3, 60, "jobs running")
    # Slurm shows a job RUNNING while its Prolog still makes the instance and reports it (seen on 24.11 under
    # load): an agent killed then leaves that Prolog to its slow path, which makes the instance again
    wait_for(lambda: all(started_on_mig(bed, job) for job in jobs), 60, "the jobs' scripts on their instances")
    made = {node: instances(bed, node) for node in bed.nodes}
    assert sum(len(m) for m in made.values()) == 3
    journals = [bed.node_dir(node) / "lib" / "node" / "journal" / "entries.log" for node in bed.nodes]
    for node, journal in zip(bed.nodes, journals, strict=True):
        bed.stop_agent(node, signal.SIGKILL)
        journal.unlink(missing_ok=True)
    for node in bed.nodes:
        bed.start_agent(node, wait=False)
    wait_for(lambda: sum(f.exists() and f.read_text().count('"add"') for f in journals) == 3, 30,
             "the running jobs' instances journaled again")  # fmt: skip
    assert {node: instances(bed, node) for node in bed.nodes} == made
    assert all(s == "RUNNING" for s, _ in states(bed, set(jobs)).values())
    wait_for(lambda: done(bed, jobs), 120, "all jobs to end")
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
    # and a chain whose first subjob dies with the node, its runner too: it goes on in that same job
    chain, ckpt = submit_chain(bed, "killed-chain", 200, window_s=(30, 60))
    wait_for(lambda: [s for s, _ in states(bed, set(jobs)).values()].count("RUNNING") == 5, 60, "5 jobs on n2")
    assert {n for _, n in states(bed, set(jobs)).values()} == {"n2"}
    store = Store(bed.store_path)
    wait_for(lambda: starts(bed, store, chain), 60, "the chain's first subjob to start counting")
    # RUNNING shows while the Prolog may still be creating the last instance
    wait_for(lambda: len(instances(bed, "n2")) == 6, 30, "six instances on n2")
    killed = time.time()
    bed.kill_node("n2")
    for node in ("n1", "n3"):
        bed.cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
    wait_for(lambda: "down" in bed.cluster.node_states()["n2"], 120, "Slurm to mark n2 down")
    wait_for(lambda: done(bed, jobs), 420, "the requeued jobs to complete elsewhere")
    wait_for(lambda: store.chain(chain).state in ("done", "failed", "cancelled"), 240, "the chain to end")
    for job in jobs:
        assert store.decision(job).node in ("n1", "n3")  # decided again, elsewhere
    outcomes = [s.outcome for s in store.subjobs(chain)]
    assert store.chain(chain).state == "done" and outcomes[0] == "requeued", (outcomes, store.events(chain))
    assert "failed" not in outcomes and "not-started" not in outcomes, outcomes
    assert int((ckpt / "count").read_text()) == 200 and store.chain_jobs(chain)[0] == chain
    seen = starts(bed, store, chain)
    assert [node for job, _, node, *_ in seen if job == chain] == ["n2", seen[1][2]] and seen[1][2] != "n2", seen
    assert all(d != "-" and cvd.startswith("MIG-") for *_, d, cvd in seen), seen
    assert len(instances(bed, "n2")) == 6  # the dead node's instances: strays until it returns
    bed.restart_node("n2")
    wait_for(lambda: instances(bed, "n2") == [], 60, "n2's reconcile to clear its strays")
    wait_for(lambda: [e for e in Store(bed.store_path).events(kind="node-back") if e["node"] == "n2"], 60,
             "mig-batchd to see n2 back")  # fmt: skip
    back = [e for e in Store(bed.store_path).events(kind="node-back") if e["node"] == "n2"]
    placed_on_n2 = [e for e in store.events(kind="decided") if e.get("node") == "n2" and e["time"] > killed]
    assert all(e["time"] > back[0]["time"] for e in placed_on_n2), "placed on n2 before its reconcile"
    bed.cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    assert_clean(bed, jobs)


def test_a_chain_subjob_an_operator_requeues_goes_on_in_its_next_job(bed):
    """Requeued while running, the runner submits the chain's next job as it stops: the chain goes on there
    from its checkpoint, the requeued job is cancelled, and every start has its Prolog's window and instance."""
    steps = 150
    chain, ckpt = submit_chain(bed, "requeued-chain", steps)
    store = Store(bed.store_path)
    wait_for(lambda: starts(bed, store, chain), 60, "the chain's first subjob to start counting")
    bed.cluster.run("scontrol", "requeue", chain)
    wait_for(lambda: (c := store.chain(chain)) and c.state in ("done", "failed", "cancelled"), 240,
             "the chain to end")  # fmt: skip
    outcomes = [s.outcome for s in store.subjobs(chain)]
    assert store.chain(chain).state == "done" and outcomes[0] == "requeued", (outcomes, store.events(chain))
    assert "failed" not in outcomes and "not-started" not in outcomes, outcomes
    assert int((ckpt / "count").read_text()) == steps
    jobs = store.chain_jobs(chain)
    assert jobs[0] == chain and len(set(jobs)) == len(outcomes), (jobs, outcomes)
    assert store.decision(chain).state == "requeued"  # and cancelled, not run again:
    assert bed.cluster.run("squeue", "-h", "-t", "all", "-j", chain, "-o", "%T").stdout.split() == ["CANCELLED"]
    seen = starts(bed, store, chain)
    assert len(seen) == len(outcomes) and all(d != "-" and cvd.startswith("MIG-") for *_, d, cvd in seen), seen
    for node in bed.nodes:
        assert instances(bed, node) == [], f"{node} leaked {instances(bed, node)}"
