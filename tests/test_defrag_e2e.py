"""Live defragmentation at checkpoint boundaries on the real local Slurm (docs/atomize.md): a 7g job
that waits on a GPU fragmented by two chains runs once their next subjobs are granted on the other
GPU. No job is stopped for it, and every subjob resumes from its checkpoint (bit-exact weights).

One node, two A100-80GB. GPU "rigid" holds a long 4g job R and a 3g job F; GPU "chains" holds the
first subjobs of chains A and B (1g each, the only room when they arrive). The 7g job W then waits:
its whole GPU is held only by chain subjobs, so mig-batchd keeps that window from the chains' next
grants. F ends (its owner releases it) and leaves room beside R. The chains' next subjobs go there,
and W starts on the GPU they left, while both chains still have work to do.
"""

import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.slurm_cluster import LocalCluster, MigTestbed

from mig_batch.config import load_config
from mig_batch.state import Store

torch = pytest.importorskip("torch")  # the example's dependency (installed by the test extra)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]

TRAIN = Path(__file__).resolve().parents[1] / "docs" / "examples" / "train_torch.py"
NODES = {"n1": ["A100-80GB", "A100-80GB"]}
SUBJOB_MIN_S, SUBJOB_MAX_S = 4, 20
STAGGER_S = 2.0  # B starts after A: when A checkpoints, B still holds the GPU W waits for
STEP_SLEEP = 0.04
ALL_STATES = ("decided", "released", "running", "requeue", "requeued", "ended")


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    testbed = MigTestbed(tmp_path_factory.mktemp("defrag"), nodes=NODES, atomize={"live_defrag": True})
    testbed.start()
    yield testbed
    for name in ("R", "F", "W"):  # a failed test leaves its rigid jobs waiting: end them before Slurm stops
        (testbed.root / f"end-{name}").touch()
    time.sleep(1)
    testbed.stop()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def rigid(bed, name: str, profile: str, flag: Path) -> str:
    """A rigid job that runs until ``flag`` exists (its owner ends it; nothing else does)."""
    script = bed.root / f"{name}.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={bed.root / name}.out\n#SBATCH --time=10\n#MIG --mig {profile}\n"
                      f"date +%s.%N\nwhile [ ! -e {flag} ]; do sleep 0.1; done\n")  # fmt: skip
    return bed.migsub(str(script)).stdout.strip()


def chain(bed, name: str, steps: int) -> str:
    log, script = bed.root / f"{name}.out", bed.root / f"{name}.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={log}\n"
                      f"export TRAIN_STEPS={steps} TRAIN_STEP_SLEEP={STEP_SLEEP} PYTHONWARNINGS=ignore\n"
                      f"exec {sys.executable} {TRAIN}\n")  # fmt: skip
    return bed.migsub("--atomize", "--checkpoint-dir", str(bed.root / f"ckpt-{name}"), "--gpu-mem", "6G",
                      "--subjob-min", f"{SUBJOB_MIN_S}s", "--subjob-max", f"{SUBJOB_MAX_S}s",
                      str(script)).stdout.strip()  # fmt: skip


def slurm_records(bed) -> dict[str, dict[str, str]]:
    """Every job slurmctld remembers (MinJobAge=600), as its key=value fields."""
    out = bed.cluster.run("scontrol", "-o", "show", "job").stdout
    records = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        records[fields["JobId"]] = fields
    return records


def test_a_waiting_7g_job_runs_after_the_chains_next_subjobs_are_granted_elsewhere(bed, tmp_path):
    atomize = load_config(bed.controller_config).atomize
    assert atomize.live_defrag
    margin = min(atomize.checkpoint_margin_s, SUBJOB_MAX_S / 4)
    steps = math.floor((SUBJOB_MAX_S - margin) / STEP_SLEEP) + 1  # more than one window's worth: two subjobs or more
    env = {**os.environ, "TRAIN_STEPS": str(steps), "PYTHONWARNINGS": "ignore",
           "MIG_BATCH_CHECKPOINT_DIR": str(tmp_path / "reference")}  # fmt: skip
    reference = subprocess.Popen([sys.executable, str(TRAIN)], env=env, stdout=subprocess.PIPE, text=True)
    store = Store(bed.store_path)

    def state(job):
        d = store.decision(job)
        return d.state if d else None

    r = rigid(bed, "R", "4g.40gb", bed.root / "end-R")
    wait_for(lambda: state(r) == "running", 60, "R to run")
    f = rigid(bed, "F", "3g.40gb", bed.root / "end-F")
    wait_for(lambda: state(f) == "running", 60, "F to run")
    full = store.decision(r).gpu
    assert store.decision(f).gpu == full  # F fills R's GPU: only the other GPU has room
    a = chain(bed, "A", steps)
    wait_for(lambda: state(a) == "running", 60, "A's first subjob to run")
    time.sleep(STAGGER_S)
    b = chain(bed, "B", steps)
    wait_for(lambda: state(b) == "running", 60, "B's first subjob to run")
    chain_gpu = store.decision(a).gpu
    assert chain_gpu != full and store.decision(b).gpu == chain_gpu

    w = rigid(bed, "W", "7g.80gb", bed.root / "end-W")  # fits on no GPU: blocked by the chains' 1g subjobs
    time.sleep(5 * bed.poll_interval_s)  # mig-batchd's passes see W blocked
    (bed.root / "end-F").touch()  # F's owner ends it: room beside R
    wait_for(lambda: state(f) == "ended", 30, "F to end")
    assert all(s.ended_at is None for c in (a, b) for s in store.subjobs(c)), "a subjob ended before F did: too slow"
    assert state(w) is None, "W started while both chains held its GPU"

    wait_for(lambda: state(w) == "running", 3 * SUBJOB_MAX_S, "W to start")
    out = bed.root / "W.out"
    started = wait_for(lambda: out.exists() and re.search(r"^(\d+\.\d+)$", out.read_text(), re.M), 30, "W's output")
    w_started = float(started.group(1))
    assert store.decision(w).gpu == chain_gpu  # the GPU the chains left
    (bed.root / "end-W").touch()
    for c in (a, b):
        wait_for(lambda c=c: (rec := store.chain(c)) and rec.state in ("done", "failed"), 6 * SUBJOB_MAX_S + 60,
                 f"chain {c} to end")  # fmt: skip
    (bed.root / "end-R").touch()
    wait_for(lambda: state(r) == "ended" and state(w) == "ended", 30, "R and W to end")
    digest = re.search(r"sha256 (\w+)", reference.communicate(timeout=120)[0]).group(1)

    for c, name in ((a, "A"), (b, "B")):
        record, subjobs, jobs = store.chain(c), store.subjobs(c), store.chain_jobs(c)
        text = (bed.root / f"{name}.out").read_text()
        assert record.state == "done", (store.events(c), text)
        assert re.search(r"sha256 (\w+)", text).group(1) == digest  # the uninterrupted run's weights
        outcomes = [s.outcome for s in subjobs]
        assert len(subjobs) >= 2 and outcomes == ["continue"] * (len(subjobs) - 1) + ["done"], outcomes
        resumes = [int(s) for s in re.findall(r"resume at step (\d+)", text)]
        assert resumes[0] == 0 and resumes == sorted(resumes) and len(resumes) == len(subjobs), text
        gpus = [store.decision(j).gpu for j in jobs]
        assert gpus[0] == chain_gpu and set(gpus[1:]) == {full}, gpus  # every next subjob granted beside R
        assert w_started < subjobs[-1].ended_at  # W ran before the chain ended
        assert subjobs[0].ended_at <= w_started  # ... once the chains' first subjobs had left its GPU

    # the first chain to checkpoint got its next subjob beside R while the other still held W's
    # GPU, before W was decided
    first, other = sorted((a, b), key=lambda c: store.subjobs(c)[0].ended_at)
    granted = store.subjobs(first)[1].granted_at
    assert granted < store.subjobs(other)[0].ended_at and granted < store.events(w, kind="decided")[0]["time"]

    # the window was kept from the chains' next grants (mig-batchd's debug log names it)
    log = (bed.root / "log" / "mig-batchd.log").read_text()
    assert re.search(rf"live defrag: GPU {chain_gpu} window 0xff kept from chain grants", log)

    # nothing was stopped to make room: no job cancelled, requeued, preempted or timed out in
    # Slurm's records, none requeued or cancelled by mig-batchd
    everyone = [r, f, w, *store.chain_jobs(a), *store.chain_jobs(b)]
    records = slurm_records(bed)
    for job in everyone:
        rec = records[job]
        assert rec["Restarts"] == "0" and rec["JobState"] in ("COMPLETED", "FAILED"), rec
        assert rec["JobState"] == "COMPLETED" or rec["ExitCode"] == "75:0", rec  # FAILED: a checkpointed subjob
    decisions = store.decisions(ALL_STATES)
    assert {d.job for d in decisions} == set(everyone) and {d.state for d in decisions} == {"ended"}
    kinds = {e["kind"] for e in store.events()}
    assert not kinds & {"chain-job-cancelled", "node-replaced", "node-problem", "view-conflict"}, kinds
    store.close()
