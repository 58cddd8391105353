"""The node's local journal: which instance this node made for which job (one JSON file per job).

Owned by the node agent (root, mode 0700 directory). Written before the job may use the instance
and removed after it is destroyed, so a restart of the agent knows what it owns; anything on the GPUs
that the journal does not name, or names for a job that is no longer alive here, is a stray.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mig_batch.batch.tags import job_of


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
        # file name -> (its identity, what it holds), as the last listing found it and this process changed
        # it since (what it wrote has no identity yet: the next listing reads it once). A listed file is only
        # read again when it was replaced (a hook's in-process fallback may write here too); ``held_ids``
        # answers from it without listing.
        self._seen: dict[str, tuple[tuple[int, int, int] | None, Entry | None]] = {}

    def _path(self, job: str) -> Path:
        if not job or "/" in job or job.startswith("."):
            raise ValueError(f"not a job id: {job!r}")
        return self.dir / f"{job}.json"

    def add(self, entry: Entry) -> None:
        path = self._path(entry.job)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(vars(entry)))  # its fields are plain values: no deep copy (asdict) needed
        os.replace(tmp, path)  # atomic: the entry is whole or absent
        self._seen[path.name] = (None, entry)

    def get(self, job: str) -> Entry | None:
        return self._read(self._path(job))

    @staticmethod
    def _read(path: str | Path) -> Entry | None:
        try:
            with open(path, encoding="utf-8") as f:
                return Entry(**json.loads(f.read()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):
            return None  # a torn or foreign file: the reconcile treats its instance as a stray

    def remove(self, job: str) -> None:
        path = self._path(job)
        path.unlink(missing_ok=True)
        self._seen.pop(path.name, None)

    def forget(self, job: str) -> None:
        """Drop what this process knows of ``job``'s entries (every rank's): another writer removed them."""
        for name in [n for n, (_, e) in self._seen.items() if e is not None and job_of(e.job) == job]:
            del self._seen[name]

    def held_ids(self, gpu: int) -> set[int]:
        """The GPU instance ids on ``gpu`` that the entries this process knows of name (those it wrote, and
        those its last listing found, less those it removed or forgot), without reading the directory: an
        id outside it may still be journaled by another writer (a hook's in-process fallback), which only
        ``entries`` sees."""
        return {e.gi_id for _, e in self._seen.values() if e is not None and e.gpu == gpu}

    def entries(self) -> list[Entry]:
        """Every readable entry, by file name."""
        seen: dict[str, tuple[tuple[int, int, int] | None, Entry | None]] = {}
        with os.scandir(self.dir) as found:
            for f in found:
                if not f.name.endswith(".json"):
                    continue
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue  # removed while listed
                identity = (st.st_ino, st.st_mtime_ns, st.st_size)
                known = self._seen.get(f.name)
                seen[f.name] = known if known is not None and known[0] == identity else (identity, self._read(f.path))
        self._seen = seen
        return [entry for _, (_, entry) in sorted(seen.items()) if entry is not None]
