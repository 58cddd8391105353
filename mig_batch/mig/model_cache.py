"""A cache of the parsed GPU model files, so that a command start does not pay for PyYAML (~10 ms to
import, ~8 ms to parse the shipped models) when no file has changed.

It holds each file's YAML document (plain data, stored with :mod:`marshal`) under its path and a stamp
of the file (modification and change times in ns, size, inode) taken before the file was read. A file
whose stamp differs is parsed again, so an edited, replaced or touched file is always seen; a new file
is seen because the directories are listed at every start. Validation (:func:`models.parse_model`)
runs on every load either way, so a cached document fails the same way its file does.

The cache lives in ``$MIG_BATCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/mig-batch``, else
``~/.cache/mig-batch``; ``MIG_BATCH_CACHE_DIR=`` (empty) turns it off. Any failure to read or write it
(no home, read-only, a corrupt file) just means the files are parsed; so does a cache file that is not
the user's own or that others may write.
"""

from __future__ import annotations

import contextlib
import marshal
import os
from collections.abc import Callable, Sequence
from pathlib import Path

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from typing import Any

CACHE_FILE = "gpu-models.marshal"
FORMAT = 1  # bump when what is stored changes

Stamp = tuple[int, int, int, int]


def cache_dir() -> Path | None:
    chosen = os.environ.get("MIG_BATCH_CACHE_DIR")
    if chosen is not None:
        return Path(chosen) if chosen else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "mig-batch")


def stamp(path: Path) -> Stamp:
    st = path.stat()
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def _read(file: Path) -> dict[str, tuple[Stamp, Any]]:
    try:
        with open(file, "rb") as stream:
            st = os.fstat(stream.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return {}  # a file someone else could have written (a shared MIG_BATCH_CACHE_DIR): not trusted
            version, entries = marshal.loads(stream.read())
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    return entries if version == FORMAT and isinstance(entries, dict) else {}


def _write(file: Path, entries: dict[str, tuple[Stamp, Any]]) -> None:
    try:
        data = marshal.dumps((FORMAT, entries))
    except ValueError:  # a document with something marshal cannot store (a YAML date): no cache
        return
    temporary = file.with_name(f".{file.name}.{os.getpid()}")
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as stream:
            stream.write(data)
        os.replace(temporary, file)  # readers see the old cache or the new one, never half of one
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def load_documents(paths: Sequence[Path], parse: Callable[[Path], Any]) -> list[Any]:
    """The document of each file in ``paths``: from the cache when its stamp matches, else ``parse(path)``
    (whose errors propagate); the cache is rewritten when anything was parsed."""
    folder = cache_dir()
    file = folder / CACHE_FILE if folder is not None else None
    cached = _read(file) if file is not None else {}
    entries: dict[str, tuple[Stamp, Any]] = {}
    documents = []
    for path in paths:
        key, now = str(path), stamp(path)
        hit = cached.get(key)
        fresh = isinstance(hit, tuple) and len(hit) == 2 and hit[0] == now  # marshal keeps tuples tuples
        document = hit[1] if fresh else parse(path)
        entries[key] = (now, document)
        documents.append(document)
    if file is not None and entries != cached:
        _write(file, entries)
    return documents
