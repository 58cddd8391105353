"""The node's local journal: which instance this node made for which job.

Owned by the node agent (root, mode 0700 directory). An entry is written before the job may use the
instance and removed after it is destroyed, so a restart of the agent knows what it owns; anything on
the GPUs that the journal does not name, or names for a job that is no longer alive here, is a stray.

One append-only file, ``entries.log``: a JSON line per change (``{"add": {...}}``, ``{"remove": job}``),
so that a job costs two appends to a file kept open and no file of its own (creating and deleting a
file a job cost the agent ~1 ms of CPU a job on a disk, and the disk's other writers as much again).
Several processes may write it (the agent, a hook's in-process fallback): each line is one ``write``
to the end of the file, under a shared ``flock``; rewriting the file without its dead lines takes the
lock exclusively and replaces the file, which the others notice by its inode and open again. A line a
crash left unfinished is closed by the next writer that opens the file, and skipped by readers. Nothing
is synced to the disk: a crash that loses the page cache restarts the node, and MIG instances do not
outlive that either.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from mig_batch.batch.tags import job_of

log = logging.getLogger("mig-batch-agent")
LOG_NAME = "entries.log"
COMPACT_MIN_LINES = 4096  # rewrite the log once it holds this many lines and four times as many as live entries


@dataclass(frozen=True)
class Entry:
    job: str
    gpu: int
    gi_id: int
    profile: str
    start: int
    uuid: str
    created: float


class Journal:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.path = self.dir / LOG_NAME
        self._fd: int | None = None  # the log, opened for reading and appending
        self._identity: tuple[int, int] = (0, 0)  # (device, inode) of the file behind _fd
        self._offset = 0  # how far _live has read the file
        self._lines = 0  # lines in the file up to _offset
        self._appended = 0  # lines this process appended since it last read to the end
        self._live: dict[str, Entry] = {}  # the file's entries up to _offset, with this process's changes
        self._mutex = threading.RLock()  # one reader or writer of the fields above at a time
        with self._mutex:
            self._adopt_files()

    def add(self, entry: Entry) -> None:
        _check_job(entry.job)
        with self._mutex:
            self._append({"add": vars(entry)})  # its fields are plain values: no deep copy (asdict) needed
            self._live[entry.job] = entry

    def remove(self, job: str) -> None:
        _check_job(job)
        with self._mutex:
            if self._live.pop(job, None) is None:
                self._sync()  # another writer may have added it since this process last read
                if self._live.pop(job, None) is None:
                    return
            self._append({"remove": job})

    def get(self, job: str) -> Entry | None:
        _check_job(job)
        with self._mutex:
            self._sync()
            return self._live.get(job)

    def forget(self, job: str) -> None:
        """Drop what this process knows of ``job``'s entries (every rank's): another writer removed them."""
        with self._mutex:
            for name in [n for n, e in self._live.items() if job_of(e.job) == job]:
                del self._live[name]

    def held_ids(self, gpu: int) -> set[int]:
        """The GPU instance ids on ``gpu`` that the entries this process knows of name (those it wrote, and
        those it last read, less those it removed or forgot), without reading the file: an id outside it
        may still be journaled by another writer (a hook's in-process fallback), which only ``entries``
        sees."""
        with self._mutex:
            return {e.gi_id for e in self._live.values() if e.gpu == gpu}

    def entries(self) -> list[Entry]:
        """Every entry, by job."""
        with self._mutex:
            self._sync()
            return [self._live[job] for job in sorted(self._live)]

    # --- the file ---------------------------------------------------------------------------
    def _open(self) -> int:
        """The log's descriptor, opened again when the file was replaced (or removed) since."""
        if self._fd is not None:
            try:
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self._identity:
                    return self._fd
            except FileNotFoundError:
                pass
            self._close()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        st = os.fstat(fd)
        self._fd, self._identity = fd, (st.st_dev, st.st_ino)
        self._offset = self._lines = self._appended = 0
        self._live = {}  # read again from the start: another writer's rewrite holds every live entry
        if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
            with _locked(fd, fcntl.LOCK_SH):
                os.write(fd, b"\n")  # a crash cut the last line: the next one starts on a line of its own
        return fd

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None

    def _sync(self) -> None:
        """Read what was appended since (every writer's lines, this process's own again: replaying the file
        in order from where it was read gives the file's state)."""
        fd = self._open()
        while chunk := os.pread(fd, 1 << 16, self._offset):
            whole = chunk.rfind(b"\n") + 1
            if not whole:  # a line still being written (or cut by a crash): not read yet
                if len(chunk) < 1 << 16:
                    break
                whole = len(chunk)  # a line longer than any entry: not ours, skipped
            for line in chunk[:whole].splitlines():
                self._apply(line)
            self._offset += whole
        self._appended = 0  # its own lines were read with the others

    def _apply(self, line: bytes) -> None:
        if not line.strip():
            return
        self._lines += 1
        try:
            record = json.loads(line)
            if "add" in record:
                entry = Entry(**record["add"])
                self._live[entry.job] = entry
            else:
                self._live.pop(str(record["remove"]), None)
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("journal %s: an unreadable line skipped: %.80r", self.path, line)

    def _append(self, record: dict) -> None:
        line = (json.dumps(record) + "\n").encode()
        while True:
            fd = self._open()
            with _locked(fd, fcntl.LOCK_SH):
                if os.fstat(fd).st_nlink == 0:  # replaced while this process waited for the lock
                    continue
                written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"journal {self.path}: wrote {written} of {len(line)} bytes")
            self._appended += 1
            lines = self._lines + self._appended
            if lines >= COMPACT_MIN_LINES and lines >= 4 * len(self._live):
                self._compact()
            return

    def _compact(self) -> None:
        """Rewrite the log with only its live entries, all other writers held off."""
        fd = self._open()
        with _locked(fd, fcntl.LOCK_EX):
            if os.fstat(fd).st_nlink == 0:
                return  # another writer rewrote it first
            self._offset = self._lines = 0
            self._live = {}
            self._sync()  # every line, every writer's: none can append now
            tmp = self.dir / (LOG_NAME + ".tmp")
            text = "".join(json.dumps({"add": vars(self._live[job])}) + "\n" for job in sorted(self._live))
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w") as f:
                f.write(text)
            os.replace(tmp, self.path)  # atomic: the old file or the new one, whole
        live = self._live
        self._open()  # the new file
        self._sync()
        if self._live != live:
            log.warning("journal %s: rewritten with %d entries, read back %d", self.path, len(live), len(self._live))

    def _adopt_files(self) -> None:
        """Entries an earlier version kept as one ``<job>.json`` file each: appended to the log, then removed."""
        with os.scandir(self.dir) as found:
            old = sorted(f.path for f in found if f.name.endswith((".json", ".tmp")) and f.name != LOG_NAME + ".tmp")
        for path in old:
            entry = None
            if path.endswith(".json"):
                try:
                    with open(path, encoding="utf-8") as f:
                        entry = Entry(**json.loads(f.read()))
                except FileNotFoundError:
                    continue  # another process adopted it
                except (ValueError, TypeError):
                    log.warning("journal %s: an unreadable entry file skipped: %s", self.dir, path)
            if entry is not None and self.get(entry.job) != entry:
                self.add(entry)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _check_job(job: str) -> None:
    if not job or "\n" in job:
        raise ValueError(f"not a job id: {job!r}")


@contextlib.contextmanager
def _locked(fd: int, how: int):
    fcntl.flock(fd, how)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
