"""Subjob chains end to end on the real local Slurm: migsub --atomize, offers and grants in
mig-batchd, the runner and the PyTorch example resuming bit-exactly from its checkpoints."""

import json
import math
import os
import re
import signal
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
SUBJOB_MIN_S, SUBJOB_MAX_S = 3, 16  # windows; the longest leaves room for torch's slow start on busy cores
STEP_SLEEP = 0.04  # each step lasts at least this long: it bounds the steps one window can do
KILL_SLACK_S = 1.0  # the kill is sent at least this long before the subjob would checkpoint
POLL_S = 0.05


def uninterrupted_digest(directory: Path, steps: int) -> str:
    env = {**os.environ, "TRAIN_STEPS": str(steps), "PYTHONWARNINGS": "ignore",
           "MIG_BATCH_CHECKPOINT_DIR": str(directory)}  # fmt: skip
    out = subprocess.run([sys.executable, str(TRAIN)], env=env, capture_output=True, text=True, timeout=300,
                         check=True).stdout  # fmt: skip
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


def progress(path: Path) -> dict[int, dict]:
    """The example's progress lines per training process: its start record, last step and end event."""
    runs: dict[int, dict] = {}
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # still being written
        event = json.loads(line)
        run = runs.setdefault(event["pid"], {"start": None, "step": None, "end": None})
        if event["event"] == "start":
            run["start"] = event
        elif event["event"] == "step":
            run["step"] = event["step"]
        else:
            run["end"] = event
    return runs


def kill_mid_window(path: Path, store: Store, job: str, timeout: float) -> dict:
    """SIGKILL one subjob's training while it is known to be mid-window: it resumed from a checkpoint
    (step > 0), reported a step past that (it has work of its own to lose), and its checkpoint (at
    deadline - margin, the values it was given) is more than KILL_SLACK_S away. A subjob first seen
    later than that is left alone: a later subjob is killed instead. Returns the victim's start record."""
    too_late: set[int] = set()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for pid, run in progress(path).items():
            start = run["start"]
            if pid in too_late or start is None or run["end"] is not None or start["step"] == 0:
                continue
            if run["step"] is None or run["step"] <= start["step"]:
                continue  # no step past its resume point yet
            if time.time() >= start["deadline"] - start["margin"] - KILL_SLACK_S:
                too_late.add(pid)
                continue
            os.kill(pid, signal.SIGKILL)
            return start
        chain = store.chain(job)
        assert not (chain and chain.state in ("done", "failed")), (
            f"the chain ended ({chain.state}) before any subjob could be killed mid-window; too late: {too_late}")
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for a subjob to kill mid-window; too late: {too_late}")


def test_chain_resumes_bit_exactly_and_a_killed_subjob_loses_only_its_work(bed, tmp_path):
    atomize = load_config(bed.config_path).atomize
    margin = min(atomize.checkpoint_margin_s, SUBJOB_MAX_S / 4)  # the prolog's margin for the longest window
    most_per_window = math.floor((SUBJOB_MAX_S - margin) / STEP_SLEEP) + 1  # steps before its checkpoint
    steps_total = 2 * most_per_window + 1  # the second subjob cannot finish the training, however fast
    windows = math.ceil(steps_total * STEP_SLEEP / (SUBJOB_MAX_S - margin)) + 1  # at full speed, + the killed one
    chain_timeout = 4 * windows * (SUBJOB_MAX_S + atomize.grace_s)  # generous: slow starts, Slurm's turnarounds

    reference = uninterrupted_digest(tmp_path / "reference", steps_total)
    ckpt, log, watch = bed.root / "ckpt", bed.root / "chain.out", bed.root / "progress.jsonl"
    memory = bed.root / "memory.csv"
    memory.write_text("0,1500\n1,4200\n3,5100\n")
    script = bed.root / "train.sh"
    # the job tells its emulated GPU what runs on it: this process (the training, once exec'd), using
    # memory.csv's memory; the runner samples it through NVML like any GPU's
    script.write_text(f"#!/bin/bash\n#SBATCH --output={log}\n"
                      f"{sys.executable} -m mig_batch.gpu.nvml_emu attach --pid $$ --replay {memory} "
                      f"\"$CUDA_VISIBLE_DEVICES\"\n"
                      f"export TRAIN_STEPS={steps_total} "
                      f"TRAIN_STEP_SLEEP={STEP_SLEEP} TRAIN_PROGRESS_FILE={watch} PYTHONWARNINGS=ignore\n"
                      f"exec {sys.executable} {TRAIN}\n")  # fmt: skip
    job = bed.migsub("--atomize", "--checkpoint-dir", str(ckpt), "--gpu-mem", "6G", "--subjob-min",
                     f"{SUBJOB_MIN_S}s", "--subjob-max", f"{SUBJOB_MAX_S}s", str(script)).stdout.strip()  # fmt: skip

    def resumes():
        return re.findall(r"resume at step (\d+)", log.read_text()) if log.exists() else []

    store = Store(bed.store_path)
    # kill a subjob's training mid-window: SIGKILL, nothing is checkpointed
    victim = kill_mid_window(watch, store, job, chain_timeout)

    chain = wait_for(lambda: (c := store.chain(job)) and c.state in ("done", "failed") and c, chain_timeout,
                     "the chain to end")  # fmt: skip
    assert chain.state == "done", store.events(job)
    text = log.read_text()
    assert re.search(r"sha256 (\w+)", text).group(1) == reference  # same weights as the uninterrupted run

    subjobs = store.subjobs(job)
    outcomes = [s.outcome for s in subjobs]
    assert len(subjobs) >= 3 and outcomes[-1] == "done" and outcomes.count("failed") == 1, outcomes
    steps = [int(s) for s in resumes()]
    killed = outcomes.index("failed")
    runs = progress(watch)
    context = f"victim {victim}, steps {steps}, outcomes {outcomes}, log:\n{text}"
    jobs = store.chain_jobs(job)  # one Slurm job per subjob: no job id is requeued, no Prolog is skipped
    assert jobs[0] == job and len(set(jobs)) == len(subjobs), (jobs, outcomes)
    # the failed subjob is the one killed, killed inside the window it was given, before its checkpoint
    assert (subjobs[killed].run, jobs[killed]) == (int(victim["subjob"]), victim["job"]), context
    # the node starts the window in its Prolog; the store knows the start from Slurm, to the second
    assert victim["deadline"] == pytest.approx(subjobs[killed].deadline, abs=1.5), context
    assert victim["margin"] == pytest.approx(min(atomize.checkpoint_margin_s, subjobs[killed].window_s / 4), abs=1e-3)
    assert runs[victim["pid"]]["end"] is None and runs[victim["pid"]]["step"] > victim["step"], context
    assert steps[killed] == victim["step"] > 0, context  # the first subjob's work survived
    assert steps[killed + 1] == steps[killed], context  # the killed subjob's own work is all that was lost
    assert steps == sorted(steps), context

    for s in subjobs:  # each subjob ran in its granted window on one MIG instance, then it was destroyed
        assert s.started_at is not None and s.deadline == pytest.approx(s.started_at + s.window_s)
        assert s.window_s <= SUBJOB_MAX_S + 1e-6 and s.profile
    assert not store.instances(), store.instances()
    assert "not-started" not in outcomes, context
    granted = [o for o in store.offers(10_000) if o["granted"] in jobs]
    assert len(granted) == len(subjobs)
    samples = list((ckpt / ".mig-batch" / "memory").glob("*.csv"))
    # memory sampled through NVML, the emulated device replaying memory.csv
    assert samples and any("5100" in p.read_text() for p in samples), [p.read_text() for p in samples]
    store.close()
