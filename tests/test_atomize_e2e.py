"""Subjob chains end to end on the real local Slurm: migsub --atomize, offers and grants in
mig-batchd, the runner and the PyTorch example resuming bit-exactly from its checkpoints."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mig_batch.slurm.local_cluster import LocalCluster, MigTestbed
from mig_batch.state import Store

torch = pytest.importorskip("torch")  # the example's dependency (installed by the test extra)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]

TRAIN = Path(__file__).resolve().parents[1] / "docs" / "examples" / "train_torch.py"
STEPS, STEP_SLEEP = 240, 0.04  # about 10 s of training: several 7 s windows


def train_env(**extra):
    return {**os.environ, "TRAIN_STEPS": str(STEPS), "PYTHONWARNINGS": "ignore", **extra}


def uninterrupted_digest(directory: Path) -> str:
    out = subprocess.run([sys.executable, str(TRAIN)], env=train_env(MIG_BATCH_CHECKPOINT_DIR=str(directory)),
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    return re.search(r"sha256 (\w+)", out).group(1)


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("chains")
    testbed = MigTestbed(root)
    testbed.start()
    yield testbed
    testbed.stop()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_chain_resumes_bit_exactly_and_a_killed_subjob_loses_only_its_work(bed, tmp_path):
    reference = uninterrupted_digest(tmp_path / "reference")
    ckpt, log = bed.root / "ckpt", bed.root / "chain.out"
    memory = bed.root / "memory.csv"
    memory.write_text("0,1500\n1,4200\n3,5100\n")
    script = bed.root / "train.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={log}\nexport TRAIN_STEPS={STEPS} TRAIN_STEP_SLEEP={STEP_SLEEP}"
                      f" PYTHONWARNINGS=ignore\nexec {sys.executable} {TRAIN}\n")  # fmt: skip
    job = bed.migsub("--atomize", "--checkpoint-dir", str(ckpt), "--gpu-mem", "6G", "--subjob-min", "3s",
                     "--subjob-max", "7s", "--emulate-memory", str(memory), str(script)).stdout.strip()  # fmt: skip

    def resumes():
        return re.findall(r"resume at step (\d+)", log.read_text()) if log.exists() else []

    # kill the training in the middle of the second subjob: SIGKILL, nothing is checkpointed
    wait_for(lambda: len(resumes()) >= 2, 90, "the second subjob to start")
    time.sleep(1.5)
    pids = subprocess.run(["pgrep", "-f", str(TRAIN)], capture_output=True, text=True).stdout.split()
    assert pids, "the second subjob's training process is not running"
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)

    store = Store(bed.store_path)
    chain = wait_for(lambda: (c := store.chain(job)) and c.state in ("done", "failed") and c, 240, "the chain to end")
    assert chain.state == "done", store.events(job)
    text = log.read_text()
    assert re.search(r"sha256 (\w+)", text).group(1) == reference  # same weights as the uninterrupted run

    subjobs = store.subjobs(job)
    outcomes = [s.outcome for s in subjobs]
    assert len(subjobs) >= 3 and outcomes[-1] == "done" and outcomes.count("failed") == 1, outcomes
    steps = [int(s) for s in resumes()]
    killed = outcomes.index("failed")
    context = f"steps {steps}, outcomes {outcomes}, log:\n{text}"
    assert steps[killed] > 0, context  # the first subjob's work survived
    assert steps[killed + 1] == steps[killed], context  # the killed subjob's own work is all that was lost
    assert steps == sorted(steps), context

    for s in subjobs:  # each subjob ran in its granted window on one MIG instance, then it was destroyed
        assert s.started_at is not None and s.deadline == pytest.approx(s.started_at + s.window_s)
        assert s.window_s <= 7.0 + 1e-6 and s.profile
    assert not store.instances(), store.instances()
    jobs = store.chain_jobs(job)  # one Slurm job per subjob: no job id is requeued, no Prolog is skipped
    assert jobs[0] == job and len(set(jobs)) == len(subjobs), (jobs, outcomes)
    assert "not-started" not in outcomes, context
    granted = [o for o in store.offers(10_000) if o["granted"] in jobs]
    assert len(granted) == len(subjobs)
    samples = list((ckpt / ".mig-batch" / "memory").glob("*.csv"))
    # memory sampled through the backend, replaying memory.csv
    assert samples and any("5100" in p.read_text() for p in samples), [p.read_text() for p in samples]
    store.close()
