"""Run one subjob: start the training command, forward signals, keep the deadline, sample memory.

    python -m mig_batch.subjob.runner [--sample-every S] [--grace S] -- COMMAND [ARGS]

* USR1 (Slurm's ``--signal=B:USR1@margin``, or ``scancel -s USR1``) is forwarded to the command's
  process group; the runner also sends it itself ``MIG_BATCH_CHECKPOINT_MARGIN`` seconds before
  ``MIG_BATCH_DEADLINE``, since Slurm's time limits have minute resolution.
* At the deadline plus ``--grace`` seconds the command gets SIGTERM, and SIGKILL 5 s later.
* GPU memory of the job's MIG instance (``CUDA_VISIBLE_DEVICES=MIG-...``) is sampled through the
  site's GPU backend (NVML's memory in use of the MIG device) into the chain's sample file, the
  history admission learns from.
* The exit status is the command's (128 + signal when a signal ended it). Unless the command
  finished the chain (0), the runner first submits the chain's next Slurm job, held until
  mig-batchd grants it a gap: one job per subjob, so no job id is requeued (slurmd skips the Prolog
  of a requeued job id it still caches). Should that fail, mig-batchd requeues this job instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from mig_batch.atomize.samples import samples_file
from mig_batch.subjob import (
    ENV_CHAIN,
    ENV_CHECKPOINT_DIR,
    ENV_DEADLINE,
    ENV_MARGIN,
    EXIT_DONE,
    EXIT_NOT_PREPARED,
    next_job_spec,
)


class _Sampler:
    def __init__(self) -> None:
        self.backend = self.instance = self.out = None
        uuid = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ckpt = os.environ.get(ENV_CHECKPOINT_DIR)
        if not uuid.startswith("MIG-") or not ckpt:
            return
        try:
            from mig_batch.config import load_config
            from mig_batch.factory import open_backend

            config = load_config()
            self.backend = open_backend(config, os.environ.get("SLURMD_NODENAME", ""))
            self.instance = self.backend.find(uuid)
            if self.instance is None:
                raise LookupError(f"no MIG instance {uuid} on this node")
            job, run = os.environ.get("SLURM_JOB_ID", "local"), int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
            self.out = samples_file(ckpt, job, run)
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text("")
        except Exception as exc:  # sampling is advisory: the training runs without it
            print(f"mig-batch subjob: not sampling GPU memory: {exc}", file=sys.stderr)
            self.backend = None
        self.t0 = time.time()

    def sample(self) -> None:
        if self.backend is None or self.instance is None or self.out is None:
            return
        try:
            used = self.backend.memory_used(self.instance.gpu, self.instance.gi_id) / 2**20
        except Exception:
            return
        with open(self.out, "a") as f:
            f.write(f"{time.time() - self.t0:.3f},{used:.1f}\n")


def run(command: list[str], sample_every: float, grace: float) -> int:
    if os.environ.get("SLURM_JOB_ID") and not os.environ.get(ENV_DEADLINE):
        # slurmd skips the Prolog when it still caches a requeued job's id: no instance, no window
        print("mig-batch subjob: this start has no MIG instance (the node's prolog did not run for it); "
              "mig-batchd starts the subjob again", file=sys.stderr)  # fmt: skip
        return EXIT_NOT_PREPARED
    deadline = float(os.environ[ENV_DEADLINE]) if os.environ.get(ENV_DEADLINE) else None
    margin = float(os.environ.get(ENV_MARGIN, "0") or 0)
    # USR1 ignored until the training installs its handler (Subjob does): an early signal must not
    # kill it while it imports; the deadline still reaches it through should_checkpoint()
    child = subprocess.Popen(command, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN))  # fmt: skip

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    sampler = _Sampler()
    warned = terminated = False
    next_sample = time.time()
    while True:
        try:
            code = child.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.time()
        if now >= next_sample:
            sampler.sample()
            next_sample = now + sample_every
        if deadline is None:
            continue
        if not warned and now >= deadline - margin:
            warned = True
            forward(signal.SIGUSR1, None)
        if not terminated and now >= deadline + grace:
            terminated = True
            forward(signal.SIGTERM, None)
        if terminated and now >= deadline + grace + 5:
            forward(signal.SIGKILL, None)
    sampler.sample()
    status = code if code >= 0 else 128 - code
    if status != EXIT_DONE:
        submit_next_job()
    return status


def submit_next_job() -> str | None:
    """The chain's next job, submitted as migsub submitted the first (its sbatch command and script
    from the checkpoint directory) and naming the chain; its id, or None when it could not be."""
    ckpt, chain = os.environ.get(ENV_CHECKPOINT_DIR), os.environ.get(ENV_CHAIN) or os.environ.get("SLURM_JOB_ID")
    if not ckpt or not chain:
        return None
    from mig_batch.batch.system import BatchError
    from mig_batch.factory import Role, open_batch_system
    from mig_batch.slurm.commands import sbatch_args

    try:
        spec = json.loads(next_job_spec(ckpt).read_text())
        argv = [a + f";chain={chain}" if a.startswith("--comment=mig-batch:") else a for a in spec["sbatch"]]
        slurm = open_batch_system(None, Role.SUBMITTER, "slurm", env={**os.environ, ENV_CHAIN: chain})
        job = slurm.submit(sbatch_args(argv), spec["script"])
    except (OSError, ValueError, KeyError, TypeError, BatchError) as exc:
        print(f"mig-batch subjob: could not submit the chain's next job ({exc}); mig-batchd requeues this one",
              file=sys.stderr)  # fmt: skip
        return None
    print(f"mig-batch subjob: the chain's next subjob is job {job}", file=sys.stderr)
    return job


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mig-batch-subjob", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample-every", type=float, default=1.0, help="seconds between GPU memory samples")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds after the deadline before SIGTERM")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. -- bash train.sh")
    return run(command, args.sample_every, args.grace)


if __name__ == "__main__":
    sys.exit(main())
