"""The node's local journal: which instance this node made for which job.

Owned by the node agent (root, mode 0700 directory). An entry is written before the job may use the
instance and removed after it is destroyed, so a restart of the agent knows what it owns; anything on
the GPUs that the journal does not name, or names for a job that is no longer alive here, is a stray.

One append-only file, ``entries.log``: a JSON line per change (``{"add": {...}}``, ``{"remove": job}``),
so that a job costs two appends to a file kept open and no file of its own (creating and deleting a
file a job cost the agent ~1 ms of CPU a job on a disk, and the disk's other writers as much again).
Several processes may write it (the agent, a hook's in-process fallback): each line is one ``write``
to the end of the file, under a shared ``flock``; rewriting the file without its dead lines takes the
lock exclusively and replaces the file, which the others notice by its inode (or, emptied in place, by
its size) and read again. A line cut short (a writer killed, a disk full) is ended by the next writer
and skipped by readers. Nothing is synced to the disk: a crash that loses the page cache restarts the
node, and MIG instances do not outlive that either.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mig_batch.batch.tags import rank_key
from mig_batch.safe_files import make_dir, write_file

log = logging.getLogger("mig-batch-agent")
LOG_NAME = "entries.log"
OWNER_UNKNOWN = -1  # an entry's uid when it was journaled without one
NO_HOLDER = -2  # an entry's uid once its Epilog took its instance's device nodes back
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
    # the job owner's: the instance's device nodes are theirs (mig_batch/node/fence.py); OWNER_UNKNOWN: journaled
    # by a release without the fence (the reconcile takes the owner from the batch system); NO_HOLDER: taken
    # back by its Epilog, the instance not destroyed yet
    uid: int = -1


class Journal:
    def __init__(self, directory: Path, adopt_old_files: bool = False):
        """``adopt_old_files``: take the entries an earlier release kept as a ``<job>.json`` file each into
        the log and remove the files (the agent: at start and at each :meth:`look_for_old_files`); without
        it they are read as entries too (the log's own record of a job wins), and a file is removed with
        its entry."""
        self.dir = Path(directory)
        make_dir(self.dir, 0o700)  # refused (UnsafePath) where another user could change it
        os.chmod(self.dir, 0o700)  # an older one tightened: the entries name every job's instance
        self.path = self.dir / LOG_NAME
        self._fd: int | None = None  # the log, opened for reading and appending
        self._identity: tuple[int, int] = (0, 0)  # (device, inode) of the file behind _fd
        self._offset = 0  # how far _live has read the file
        self._lines = 0  # lines in the file up to _offset
        self._appended = 0  # lines this process appended since it last read to the end
        self._compact_at = COMPACT_MIN_LINES  # raised after a rewrite that failed: appending goes on
        self._live: dict[str, Entry] = {}  # the file's entries up to _offset, with this process's changes
        self._old: dict[str, Entry] = {}  # entries in an earlier release's files, not adopted
        self._mutex = threading.RLock()  # one reader or writer of the fields above at a time
        self._adopting = adopt_old_files
        self.look_for_old_files()

    def add(self, entry: Entry) -> None:
        _check_job(entry.job)
        with self._mutex:
            self._append({"add": vars(entry)})  # its fields are plain values: no deep copy (asdict) needed
            self._live[entry.job] = entry
            if entry.job in self._old:  # an earlier release's record of the job: the log's is newer
                self._drop_old_file(entry.job)

    def remove(self, job: str) -> None:
        _check_job(job)
        with self._mutex:
            if job in self._old:
                self._drop_old_file(job)
            if job not in self._live:
                self._sync()  # another writer may have added it since this process last read
                if job not in self._live:
                    return
            self._append({"remove": job})
            self._live.pop(job, None)

    def get(self, job: str) -> Entry | None:
        _check_job(job)
        with self._mutex:
            self._sync()
            return self._known(job)

    def ranks(self, job: str) -> list[Entry]:
        """A job's entries in rank order (``job``, then ``job#1``...: one for a single-instance job), the
        file read once."""
        _check_job(job)
        with self._mutex:
            self._sync()
            out: list[Entry] = []
            while (entry := self._known(rank_key(job, len(out)))) is not None:
                out.append(entry)
            return out

    def held_ids(self, gpu: int) -> set[int]:
        """The GPU instance ids on ``gpu`` that the entries this process knows of name (as it last read the
        file, with its own changes since), without reading the file: an id outside it may still be
        journaled by another writer (a hook's in-process fallback), which ``entries`` sees."""
        with self._mutex:
            return {e.gi_id for e in self._known_entries() if e.gpu == gpu}

    def holders(self, gpu: int, gi_id: int) -> list[Entry]:
        """The entries naming GPU instance ``gi_id`` on ``gpu``, as this process last read the file (``ranks``
        and ``get`` read it): two when the id was made again after the first one's instance was destroyed."""
        with self._mutex:
            return [e for e in self._known_entries() if e.gpu == gpu and e.gi_id == gi_id]

    def entries(self) -> list[Entry]:
        """Every entry, by job."""
        with self._mutex:
            self._sync()
            every = {**self._old_now(), **self._live}
            return [every[job] for job in sorted(every)]

    def look_for_old_files(self) -> None:
        """Read (or adopt) an earlier release's per-job files again: one of its processes may have written
        one since (a hook's fallback running across the upgrade)."""
        with self._mutex:
            self._read_old_files(self._adopting)

    def _known_entries(self) -> tuple[Entry, ...]:
        """The log's entries as last read, with this process's changes, and an earlier release's still there."""
        return (*self._live.values(), *self._old_now().values())

    def _known(self, job: str) -> Entry | None:
        found = self._live.get(job)
        return found if found is not None or not self._old else self._old_now().get(job)

    # --- the file ---------------------------------------------------------------------------
    def _open(self) -> int:
        """The log's descriptor, opened again when the file was replaced or removed since (and read again
        from its start when it was emptied in place)."""
        if self._fd is not None:
            try:
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self._identity:
                    if st.st_size < self._offset:  # truncated: what was read is not the file any more
                        self._reset()
                    return self._fd
            except FileNotFoundError:
                pass
            self._close()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        st = os.fstat(fd)
        self._fd, self._identity = fd, (st.st_dev, st.st_ino)
        self._reset()
        return fd

    def _reset(self) -> None:
        """Read the file again from its start: another writer's rewrite holds every live entry."""
        self._offset = self._lines = self._appended = 0
        self._live = {}

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
            if not whole:  # a line still being written (or cut short): not read yet
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
                _check_job(entry.job)
                job = entry.job
                self._live[job] = entry
            else:
                job = record["remove"]
                self._live.pop(job, None)
            self._old.pop(job, None)  # the log's record is the newer
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("journal %s: an unreadable line skipped: %.80r", self.path, line)

    def _append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record) + "\n").encode()
        while True:
            fd = self._open()
            with _locked(fd, fcntl.LOCK_SH):
                st = os.fstat(fd)
                if st.st_nlink == 0:  # replaced while this process waited for the lock
                    continue
                if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n":
                    line = b"\n" + line  # the last line was cut short: this one starts on its own
                written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"journal {self.path}: wrote {written} of {len(line)} bytes")
            self._appended += 1
            lines = self._lines + self._appended
            if lines >= self._compact_at and lines >= 4 * len(self._live):
                try:
                    self._compact()
                except OSError as exc:  # the line is written: a rewrite only saves space
                    self._compact_at = self._lines + self._appended + COMPACT_MIN_LINES
                    log.warning("journal %s: could not rewrite it (%s); tried again in %d lines", self.path, exc,
                                COMPACT_MIN_LINES)  # fmt: skip
            return

    def _compact(self) -> None:
        """Rewrite the log with only its live entries, all other writers held off."""
        fd = self._open()
        with _locked(fd, fcntl.LOCK_EX):
            if os.fstat(fd).st_nlink == 0:
                return  # another writer rewrote it first
            self._reset()
            self._sync()  # every line, every writer's: none can append now
            text = "".join(json.dumps({"add": vars(self._live[job])}) + "\n" for job in sorted(self._live))
            write_file(self.path, text, 0o600)  # atomic: the old file or the new one, whole
        self._compact_at = COMPACT_MIN_LINES
        self._sync()  # opens the new file and reads it (with what others appended since)

    def _read_old_files(self, adopt: bool) -> None:
        """Entries an earlier release kept as one ``<job>.json`` file each (and its half-written ``.tmp``
        files): adopted, or read as they are. A file that cannot be read is left where it is."""
        with os.scandir(self.dir) as found:
            old = sorted(f.path for f in found if f.name.endswith((".json", ".tmp")) and f.name != LOG_NAME + ".tmp")
        if old:
            self._sync()  # the log's records of these jobs are the newer
        for path in old:
            try:
                if path.endswith(".tmp"):
                    if adopt:
                        os.unlink(path)  # an entry the earlier release never finished writing
                    continue
                with open(path, encoding="utf-8") as f:
                    entry = Entry(**json.loads(f.read()))
                _check_job(entry.job)
                if os.path.basename(path) != f"{entry.job}.json":
                    raise ValueError(f"names job {entry.job!r}")
            except FileNotFoundError:
                continue  # another process adopted it
            except (OSError, ValueError, TypeError) as exc:
                log.warning("journal %s: an earlier release's entry %s left as it is: %s", self.dir, path, exc)
                continue
            if entry.job in self._live:  # the log has a record of this job: it is the newer
                self._old.pop(entry.job, None)
                if adopt:
                    self._drop_old_file(entry.job)
            elif not adopt:
                self._old[entry.job] = entry
            else:
                self.add(entry)
                self._drop_old_file(entry.job)

    def _old_now(self) -> dict[str, Entry]:
        """The earlier release's entries whose files are still there (another process may have adopted or
        removed one since this one read it)."""
        for job in [j for j in self._old if not os.path.exists(self.dir / f"{j}.json")]:
            del self._old[job]
        return self._old

    def _drop_old_file(self, job: str) -> None:
        self._old.pop(job, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.dir / f"{job}.json")


def _check_job(job: str) -> None:
    if not isinstance(job, str) or not job or "\n" in job or "/" in job:
        raise ValueError(f"not a job id: {job!r}")


@contextlib.contextmanager
def _locked(fd: int, how: int) -> Iterator[None]:
    fcntl.flock(fd, how)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
