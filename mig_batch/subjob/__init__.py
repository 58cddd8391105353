"""Helper for training code that runs as a chain of subjobs (SJA): deadline, checkpoint, resume.

    from mig_batch.subjob import Subjob
    sj = Subjob()                      # checkpoint dir and deadline from the environment
    state = sj.latest()                # newest complete checkpoint (a Path) or None: resume from it
    for step in ...:
        ...
        if sj.should_checkpoint():     # the window is about to close, or Slurm sent USR1
            sj.save(lambda path: torch.save(state, path), step)
            sj.pause()                 # exit 75: "checkpointed, more to do"
    sj.done()                          # exit 0: the chain is finished

The runner (``python -m mig_batch.subjob.runner``, ``wrappers/mig-batch-subjob``) starts the
training, forwards USR1 to it, warns it ``margin`` seconds before the deadline and stops it at the
deadline; the controller turns exit 75 into the next subjob. Checkpoints are written to a temporary
file, fsynced and renamed, and the ``LATEST`` pointer is replaced the same way: a subjob killed at
any moment leaves the previous checkpoint intact, so it loses only its own work.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mig_batch.errors import MigBatchError
from mig_batch.job_env import ENV_DEADLINE, ENV_MARGIN  # the node agent sets them

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from typing import NoReturn

EXIT_DONE = 0
EXIT_CONTINUE = 75  # EX_TEMPFAIL: checkpointed, more work left
EXIT_NOT_PREPARED = 76  # the runner found no instance/deadline: the node's prolog did not run for this start
ENV_CHECKPOINT_DIR = "MIG_BATCH_CHECKPOINT_DIR"
ENV_CHAIN = "MIG_BATCH_CHAIN"  # the chain's first Slurm job, set for the later jobs the runner submits
SLURM_SIGNAL_MARGIN_S = 60  # migsub's --signal=B:USR1@60: Slurm's own warning, a backstop after the runner's
KEEP = 2  # checkpoints kept: the newest and the one before it
_NAME = re.compile(r"^ckpt-(\d+)$")


class SubjobError(MigBatchError, RuntimeError):
    pass


class Subjob:
    def __init__(self, checkpoint_dir: str | os.PathLike | None = None, deadline: float | None = None,
                 margin: float | None = None, handle_signal: bool = True):  # fmt: skip
        directory = checkpoint_dir or os.environ.get(ENV_CHECKPOINT_DIR)
        if not directory:
            raise SubjobError(f"no checkpoint directory: pass one or set {ENV_CHECKPOINT_DIR}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        env_deadline = os.environ.get(ENV_DEADLINE)
        self.deadline = deadline if deadline is not None else (float(env_deadline) if env_deadline else None)
        self.margin = margin if margin is not None else float(os.environ.get(ENV_MARGIN, "0") or 0)
        self.signalled = False
        if handle_signal:
            signal.signal(signal.SIGUSR1, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True

    @property
    def time_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.time()

    def should_checkpoint(self) -> bool:
        """True once the scheduler asked (USR1) or the window closes within ``margin`` seconds."""
        return self.signalled or self.time_left <= self.margin

    def latest(self) -> Path | None:
        pointer = self.directory / "LATEST"
        if pointer.exists():
            path = self.directory / pointer.read_text().strip()
            if path.exists():
                return path
        steps = sorted((int(m.group(1)), p) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))
        return steps[-1][1] if steps else None

    def latest_step(self) -> int | None:
        path = self.latest()
        return int(_NAME.match(path.name).group(1)) if path else None

    def save(self, write: Callable[[Path], None], step: int) -> Path:
        """Checkpoint ``step`` atomically: ``write(path)`` writes the file; it becomes the latest."""
        final = self.directory / f"ckpt-{step}"
        tmp = self.directory / f".ckpt-{step}.tmp-{os.getpid()}"
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, final)
        pointer_tmp = self.directory / f".LATEST.tmp-{os.getpid()}"
        pointer_tmp.write_text(final.name)
        _fsync(pointer_tmp)
        os.replace(pointer_tmp, self.directory / "LATEST")
        _fsync(self.directory)
        for _, old in sorted((int(m.group(1)), p) for p in self.directory.iterdir()
                             if (m := _NAME.match(p.name)))[:-KEEP]:  # fmt: skip
            old.unlink(missing_ok=True)
        return final

    def pause(self) -> NoReturn:
        """End this subjob: checkpointed, more to do."""
        _exit(EXIT_CONTINUE)

    def done(self) -> NoReturn:
        """End the chain: the work is finished."""
        _exit(EXIT_DONE)


def _exit(code: int) -> NoReturn:
    # a late USR1 (the runner's or Slurm's warning) must not kill an interpreter that is shutting down
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    sys.stdout.flush()
    sys.exit(code)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def next_job_spec(checkpoint_dir: Path | str) -> Path:
    """Where migsub leaves the sbatch command and script of a chain, for the runner to submit the
    chain's next job (one Slurm job per subjob)."""
    return Path(checkpoint_dir) / ".mig-batch" / "next-job.json"
