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
import time
from pathlib import Path

LOCK_NAME = "gpus.lock"


class NodeBusy(OSError):
    """The lock was not free within the wait allowed."""


class NodeLock:
    def __init__(self, path: Path, wait_s: float | None = None):
        """``wait_s``: how long to wait for another process's turn (None: as long as it takes, the agent; a
        hook's fallback waits less than its client's own timeout, so that it can still report)."""
        self.path, self.wait_s = Path(path), wait_s
        self._mutex = threading.Lock()
        self._fd: int | None = None  # kept open: one open and no close per job

    def __enter__(self) -> NodeLock:
        self._mutex.acquire()
        try:
            self._lock_file()
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

    def _lock_file(self) -> None:
        deadline = None if self.wait_s is None else time.monotonic() + self.wait_s
        while True:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            self._flock(self._fd, deadline)
            if self._is_the_file(self._fd):
                return
            fcntl.flock(self._fd, fcntl.LOCK_UN)  # the file was removed or replaced: lock the one now there
            os.close(self._fd)
            self._fd = None

    def _flock(self, fd: int, deadline: float | None) -> None:
        if deadline is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NodeBusy(f"the node's GPU work is held by another process (the node agent) for over "
                                   f"{self.wait_s:.0f} s ({self.path})") from None  # fmt: skip
                time.sleep(0.05)

    def _is_the_file(self, fd: int) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
