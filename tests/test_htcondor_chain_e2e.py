"""Subjob chains (SJA) end to end on the real HTCondor pool: ``migsub --backend htcondor --atomize``, the
schedd's chain transform and exit policy, mig-batchd's offers and grants, the node agent's window and the job
wrapper keeping it, a training that checkpoints resuming bit-exactly (one testbed for the module,
tests/harness/htcondor_testbed.py).

The pool's chroot has no PyTorch and may not read the checkout (CI clones it into a 0700 folder), so the
training is a stand-in written into the pool's shared folder: standard library only, run by the chroot's
Python, with the example's checkpoint protocol (docs/examples/train_torch.py: atomic checkpoint and LATEST
pointer, USR1 or deadline - margin, exit 75 / 0) and a state that a lost or repeated step would change
(weights and the random generator's state)."""

import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml
from harness.htcondor_pool import LocalPool

from mig_batch.gpu import nvml_emu
from mig_batch.state import Store

WHY_NOT = LocalPool.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

NODE = "nodea"
GPUS = ["A100-80GB", "A100-80GB"]
SUBJOB_MIN_S, SUBJOB_MAX_S = 3, 10
MARGIN_S = 2.0  # the site's checkpoint margin (the agent takes at most a quarter of the window)
STEP_SLEEP = 0.05
KILL_SLACK_S = 1.0  # the kill is sent at least this long before the subjob would checkpoint
OWN_STEPS = 20  # ... and after the subjob did this many steps of its own (work to lose; a pass sees it run)
CHROOT_PYTHON = "/usr/bin/python3"

TRAIN = r'''
import hashlib, json, os, random, signal, sys, time

CKPT = os.environ["MIG_BATCH_CHECKPOINT_DIR"]
STEPS = int(os.environ["TRAIN_STEPS"])
SLEEP = float(os.environ.get("TRAIN_STEP_SLEEP", "0"))
PROGRESS = os.environ.get("TRAIN_PROGRESS_FILE")
DEADLINE = float(os.environ["MIG_BATCH_DEADLINE"]) if os.environ.get("MIG_BATCH_DEADLINE") else None
MARGIN = float(os.environ.get("MIG_BATCH_CHECKPOINT_MARGIN") or 0)
asked = []
signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))


def report(event, step, **fields):
    if PROGRESS:
        with open(PROGRESS, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), "step": step, **fields}) + "\n")


def fsynced(path, text):
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def save(step, weights, rng):
    final = os.path.join(CKPT, f"ckpt-{step}")
    fsynced(final + ".tmp", json.dumps({"step": step, "w": weights, "rng": rng.getstate()}))
    os.replace(final + ".tmp", final)
    fsynced(os.path.join(CKPT, ".LATEST.tmp"), f"ckpt-{step}")
    os.replace(os.path.join(CKPT, ".LATEST.tmp"), os.path.join(CKPT, "LATEST"))
    for name in sorted((n for n in os.listdir(CKPT) if n.startswith("ckpt-") and n[5:].isdigit()),
                       key=lambda n: int(n[5:]))[:-2]:
        os.unlink(os.path.join(CKPT, name))


os.makedirs(CKPT, exist_ok=True)
rng, weights, step = random.Random(0), [0.0] * 8, 0
if os.path.exists(os.path.join(CKPT, "LATEST")):
    with open(os.path.join(CKPT, "LATEST")) as f, open(os.path.join(CKPT, f.read().strip())) as g:
        state = json.load(g)
    step, weights = state["step"], state["w"]
    rng.setstate((state["rng"][0], tuple(state["rng"][1]), state["rng"][2]))
print(f"resume at step {step}", flush=True)
report("start", step, subjob=os.environ.get("MIG_BATCH_SUBJOB"), deadline=DEADLINE, margin=MARGIN,
       gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), instance=os.environ.get("MIG_BATCH_INSTANCE"))
while step < STEPS:
    if asked or (DEADLINE is not None and time.time() >= DEADLINE - MARGIN):
        save(step, weights, rng)
        report("checkpointed", step)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a late warning must not kill it while it exits
        sys.exit(75)
    weights = [w * 0.999 + rng.gauss(0.0, 1.0) * 0.01 for w in weights]
    step += 1
    if SLEEP:
        time.sleep(SLEEP)
    report("step", step)
save(step, weights, rng)
digest = hashlib.sha256(repr(weights).encode()).hexdigest()
report("done", step, sha256=digest)
print(f"sha256 {digest}", flush=True)
sys.exit(0)
'''


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    from harness.htcondor_testbed import HTCondorTestbed

    class ChainBed(HTCondorTestbed):
        def write_config(self) -> None:  # the site's chain settings: short windows, live defragmentation on
            super().write_config()
            config = yaml.safe_load(self.config_path.read_text())
            config["atomize"] = {"checkpoint_margin_s": MARGIN_S, "grace_s": 5.0, "live_defrag": True}
            self.config_path.write_text(yaml.safe_dump(config))

        def start_controller(self) -> None:  # its debug log names the windows live defragmentation keeps
            super().start_controller()
            assert self.controller is not None and self.pool is not None
            self.controller.terminate()
            self.controller.wait(timeout=30)
            argv = [sys.executable, "-m", "mig_batch.controller", "--config", str(self.config_path),
                    "--log-level", "DEBUG"]  # fmt: skip
            self.controller = self._spawn("mig-batchd", argv, self.pool.client_env(self.pool.controller))

    bed = ChainBed(tmp_path_factory.mktemp("htcondor-chain"), nodes={NODE: GPUS})
    started = time.monotonic()
    try:
        bed.start()
        print(f"\ntestbed up in {time.monotonic() - started:.1f}s: pool {bed.pool.timings}")
        yield bed
    finally:
        for flag in ("R", "F", "W"):  # a failed test leaves its rigid jobs running: end them before the pool stops
            (bed.pool.shared / f"end-{flag}").touch()
        time.sleep(1)
        bed.stop()


def wait_for(what, timeout=90.0, pause=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(pause)
    raise AssertionError(f"not within {timeout:.0f}s: {what.__doc__ or what}")


def progress(path: Path) -> dict[int, dict]:
    """The stand-in's progress lines per training process: its start record, last step and end event."""
    runs: dict[int, dict] = {}
    for line in (path.read_text() if path.exists() else "").splitlines(keepends=True):
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


def train_files(bed, name: str, steps: int) -> tuple[Path, Path, Path]:
    """The stand-in, a job script running it, and its progress file, in the pool's shared folder."""
    shared = bed.pool.shared / name
    shared.mkdir(mode=0o755)
    os.chown(shared, bed.pool.uid, bed.pool.uid)
    train, script, watch = shared / "train.py", shared / "train.sh", shared / "progress.jsonl"
    train.write_text(TRAIN)
    script.write_text(f"#!/bin/sh\nexport TRAIN_STEPS={steps} TRAIN_STEP_SLEEP={STEP_SLEEP} "
                      f"TRAIN_PROGRESS_FILE={watch}\nexec {CHROOT_PYTHON} {train}\n")  # fmt: skip
    script.chmod(0o755)
    return train, script, watch


def submit_chain(bed, script: Path, ckpt: Path, *args: str) -> str:
    """``migsub --backend htcondor --atomize`` as the job's owner; the job id."""
    out = bed.migsub(script, "--atomize", "--checkpoint-dir", str(ckpt), "--gpu-mem", "6G", "--subjob-min",
                     f"{SUBJOB_MIN_S}s", "--subjob-max", f"{SUBJOB_MAX_S}s", *args).stdout  # fmt: skip
    job = out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+\.0", job), out
    return job


def uninterrupted_digest(bed, train: Path, steps: int, directory: str) -> str:
    """The stand-in run once, without a window, by the job's owner in the chroot: the reference weights."""
    proc = bed.pool.run("env", f"TRAIN_STEPS={steps}", f"MIG_BATCH_CHECKPOINT_DIR={directory}", CHROOT_PYTHON,
                        str(train), user=bed.pool.user, timeout=120)  # fmt: skip
    return re.search(r"sha256 (\w+)", proc.stdout).group(1)


def kill_mid_window(watch: Path, store: Store, job: str, timeout: float) -> dict:
    """SIGKILL one subjob's training while it is known to be mid-window: it resumed from a checkpoint (step >
    0), did OWN_STEPS past it (work of its own to lose), and its checkpoint (deadline - margin, as it was told) is
    more than KILL_SLACK_S away; a subjob first seen later than that is left alone. The victim's start record."""
    too_late: set[int] = set()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for pid, run in progress(watch).items():
            start = run["start"]
            if pid in too_late or start is None or run["end"] is not None or start["step"] == 0:
                continue
            if run["step"] is None or run["step"] < start["step"] + OWN_STEPS:
                continue
            if time.time() >= start["deadline"] - start["margin"] - KILL_SLACK_S:
                too_late.add(pid)
                continue
            os.kill(pid, signal.SIGKILL)
            return start
        chain = store.chain(job)
        assert not (chain and chain.state in ("done", "failed")), f"the chain ended first; too late: {too_late}"
        time.sleep(0.05)
    raise AssertionError(f"no subjob to kill mid-window within {timeout:.0f}s; too late: {too_late}")


def test_a_chain_resumes_bit_exactly_and_a_killed_subjob_loses_only_its_own_work(bed):
    margin = min(MARGIN_S, SUBJOB_MAX_S / 4)
    most_per_window = math.floor((SUBJOB_MAX_S - margin) / STEP_SLEEP) + 1
    steps = 2 * most_per_window + 1  # at least three subjobs, however fast
    train, script, watch = train_files(bed, "chain", steps)
    reference = uninterrupted_digest(bed, train, steps, str(train.parent / "reference"))
    ckpt = train.parent / "ckpt"
    job = submit_chain(bed, script, ckpt)
    tag = bed.pool.run("condor_q", job, "-af", "MigBatchTag", "OnExitHoldSubCode").stdout
    assert f";atomize=1;ckpt={ckpt};smin={SUBJOB_MIN_S};smax={SUBJOB_MAX_S}" in tag and tag.split()[-1] == "75", tag

    store = Store(bed.store_path)
    try:
        victim = kill_mid_window(watch, store, job, 150)
        chain = wait_for(lambda: (c := store.chain(job)) and c.state in ("done", "failed") and c, 240)
        assert chain.state == "done", store.events(job)
        runs = sorted(progress(watch).values(), key=lambda r: r["start"]["step"] if r["start"] else -1)
        done = [r["end"] for r in runs if r["end"] and r["end"]["event"] == "done"]
        assert len(done) == 1 and done[0]["sha256"] == reference, runs  # the uninterrupted run's weights
        subjobs = store.subjobs(job)
        outcomes = [s.outcome for s in subjobs]
        assert len(subjobs) >= 3 and outcomes[-1] == "done" and outcomes.count("failed") == 1, outcomes
        starts = [r["start"] for r in sorted(progress(watch).values(), key=lambda r: r["start"]["deadline"])]
        resumed = [s["step"] for s in starts]
        killed = outcomes.index("failed")
        context = f"victim {victim}, resumed at {resumed}, outcomes {outcomes}"
        assert int(victim["subjob"]) == subjobs[killed].run, context
        assert resumed[killed] == victim["step"] > 0, context  # the earlier subjobs' work survived
        assert resumed[killed + 1] == resumed[killed], context  # only the killed subjob's own work was lost
        assert resumed == sorted(resumed) and len(resumed) == len(subjobs), context
        assert store.chain_jobs(job) in ([], [job]), "one HTCondor job runs every subjob"
        assert victim["margin"] == pytest.approx(min(MARGIN_S, subjobs[killed].window_s / 4), abs=1e-3)
        for s, start in zip(subjobs, starts, strict=True):  # each in its granted window, on its own instance
            assert s.window_s <= SUBJOB_MAX_S + 1e-6 and s.profile
            if s.started_at is not None:  # a pass saw it run (HTCondor's start time is in whole seconds)
                assert start["deadline"] == pytest.approx(s.started_at + s.window_s, abs=2.5), (s, start)
            assert start["gpu"].startswith("MIG-") and start["instance"].startswith(f"{NODE}/"), start
        granted = [o for o in store.offers(10_000) if o["granted"] == job]
        assert len(granted) == len(subjobs)
        assert store.instances() == []
        assert bed.pool.run("condor_q", job, "-af", "JobStatus").stdout.strip() == "", "the chain's job left the queue"
    finally:
        store.close()
    wait_for(lambda: nvml_emu.live_instances(bed.gpu_dir(NODE)) == [], 30)


def rigid(bed, name: str, profile: str) -> str:
    """A rigid job that runs until its owner ends it (``end-<name>`` in the shared folder); its output names its
    start."""
    script = bed.pool.shared / f"{name}.sh"
    script.write_text(f"#!/bin/sh\n#MIG --mig {profile}\ndate +%s.%N\n"
                      f"while [ ! -e {bed.pool.shared}/end-{name} ]; do sleep 0.1; done\n")  # fmt: skip
    script.chmod(0o755)
    out = bed.migsub(script).stdout
    job = out.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+\.0", job), out
    return job


def test_a_waiting_whole_gpu_job_runs_once_the_chains_next_subjobs_are_steered_elsewhere(bed):
    """One node, two A100-80GB. R (4g) and F (3g) fill one GPU; chains A and B (1g each, B a little later) take
    the other. W (7g) then waits: its GPU is held only by chain subjobs, so mig-batchd keeps that window from the
    chains' next grants. F ends and leaves room beside R. The first chain to checkpoint gets its next subjob
    there while the other still holds W's GPU; when that one checkpoints, W runs on the GPU they left. Nothing is
    stopped for it, and both chains end with the uninterrupted run's weights (docs/atomize.md, the Slurm test's
    case on HTCondor)."""
    window = 24  # the chains' longest subjob: B starts, W is submitted and seen blocked, and F ends inside it
    margin = min(MARGIN_S, window / 4)
    # more than two windows' work: a chain still works when the other's checkpoint lets W start (B starts 5-10 s
    # after A: migsub, a pass, HTCondor's start)
    steps = 2 * (math.floor((window - margin) / STEP_SLEEP) + 1) + 1
    files = {name: train_files(bed, f"defrag-{name}", steps) for name in "AB"}
    reference = uninterrupted_digest(bed, files["A"][0], steps, str(files["A"][0].parent / "reference"))
    store = Store(bed.store_path)

    def state(job):
        d = store.decision(job)
        return d.state if d else None

    def chain(name):
        train, script, _ = files[name]
        job = submit_chain(bed, script, train.parent / "ckpt", "--subjob-max", f"{window}s")
        wait_for(lambda: state(job) == "running", 60)
        return job

    try:
        r = rigid(bed, "R", "4g.40gb")
        wait_for(lambda: state(r) == "running", 60)
        f = rigid(bed, "F", "3g.40gb")
        wait_for(lambda: state(f) == "running", 60)
        full = store.decision(r).gpu
        assert store.decision(f).gpu == full  # F fills R's GPU: only the other GPU has room
        a = chain("A")
        b = chain("B")  # later: when A checkpoints, B still holds the GPU W waits for
        chain_gpu = store.decision(a).gpu
        assert chain_gpu != full and store.decision(b).gpu == chain_gpu

        w = rigid(bed, "W", "7g.80gb")  # fits on no GPU: blocked by the chains' 1g subjobs
        time.sleep(5 * bed.poll_interval_s)  # mig-batchd's passes see W blocked
        (bed.pool.shared / "end-F").touch()  # F's owner ends it: room beside R
        wait_for(lambda: state(f) == "ended", 30)
        assert all(s.ended_at is None for c in (a, b) for s in store.subjobs(c)), "a subjob ended before F: too slow"
        assert state(w) is None, "W was decided while the chains held its GPU"

        wait_for(lambda: state(w) == "running", 3 * window + 30)
        out = bed.pool.shared / f"W.sh.{w.split('.')[0]}.out"
        started = wait_for(lambda: out.exists() and re.search(r"^(\d+\.\d+)$", out.read_text(), re.M), 30)
        w_started = float(started.group(1))
        assert store.decision(w).gpu == chain_gpu  # the GPU the chains left
        (bed.pool.shared / "end-W").touch()
        records = [wait_for(lambda c=c: (rec := store.chain(c)) and rec.state in ("done", "failed") and rec,
                            4 * window + 60) for c in (a, b)]  # fmt: skip
        (bed.pool.shared / "end-R").touch()
        wait_for(lambda: state(r) == "ended" and state(w) == "ended", 30)

        for c, name, record in ((a, "A", records[0]), (b, "B", records[1])):
            assert record.state == "done", store.events(c)
            runs = progress(files[name][2]).values()
            done = [run["end"] for run in runs if run["end"] and run["end"]["event"] == "done"]
            assert len(done) == 1 and done[0]["sha256"] == reference  # the uninterrupted run's weights
            subjobs = store.subjobs(c)
            outcomes = [s.outcome for s in subjobs]
            assert len(subjobs) >= 3 and outcomes == ["continue"] * (len(subjobs) - 1) + ["done"], outcomes
            gpus = [e["gpu"] for e in store.events(c, kind="decided")]
            assert len(gpus) == len(subjobs) and gpus[0] == chain_gpu and set(gpus[1:]) == {full}, gpus  # beside R
            assert subjobs[0].ended_at <= w_started < subjobs[-1].ended_at  # W ran before the chain ended

        # the first chain to checkpoint got its next subjob beside R while the other still held W's GPU, before W
        # was decided: the window was kept from its grant
        first, other = sorted((a, b), key=lambda c: store.subjobs(c)[0].ended_at)
        granted = store.subjobs(first)[1].granted_at
        w_decided = store.events(w, kind="decided")[0]["time"]
        print(f"\n{first}'s next subjob granted {granted:.2f}, {other}'s first subjob ended "
              f"{store.subjobs(other)[0].ended_at:.2f}, W decided {w_decided:.2f}, W started {w_started:.2f}")
        assert granted < store.subjobs(other)[0].ended_at and granted < w_decided
        log = bed.log_path("mig-batchd").read_text()
        assert re.search(rf"live defrag: GPU {chain_gpu} window 0xff kept from chain grants", log)

        # nothing was stopped to make room: every rigid job decided once, nothing cancelled or moved
        for job in (r, f, w):
            assert store.count_decisions(job) == 1, store.events(job)
        kinds = {e["kind"] for e in store.events()}
        assert not kinds & {"chain-job-cancelled", "node-replaced", "node-problem", "view-conflict"}, kinds
        assert all(s.outcome != "failed" for c in (a, b) for s in store.subjobs(c))
        assert store.instances() == []
    finally:
        store.close()
    wait_for(lambda: nvml_emu.live_instances(bed.gpu_dir(NODE)) == [], 30)
