"""The node's GPU work, one holder at a time across processes.

The agent's worker threads and a hook's in-process fallback (the agent did not answer in time) work on the
same GPUs and journal. Between an instance's creation and its journal entry, it is unjournaled: to another
process's reconcile or Epilog it would look like a stray, and be destroyed under its job. So each holds
this lock while it works: a thread lock within the process, and an exclusive ``flock`` on a file beside the
journal between processes.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

LOCK_NAME = "gpus.lock"


class NodeLock:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._mutex = threading.Lock()
        self._fd: int | None = None  # kept open: one open and no close per job

    def __enter__(self) -> NodeLock:
        self._mutex.acquire()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._mutex.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._mutex.release()
