"""Files that root (the node agents, mig-batchd) writes where others may look: one way to write them, one
way to check the directories they go in.

A file is replaced whole through a temporary file of a unique name in the same directory (``mkstemp``:
``O_EXCL | O_NOFOLLOW``, so no name another process prepared, no symlink followed), its mode set on the open
descriptor, then renamed over the target: a reader sees the old file or the new one, and a symlink at the
target's name is replaced, never written through. Nothing is synced to the disk: these files live under
``/run`` (or beside the node's journal) and mean nothing after a crash of the host, as its MIG instances.

A directory is trusted when it, and every directory above it, is owned by root or by this process's user,
and none is writable by group or others (one above may be, with the sticky bit, as ``/tmp``): only then
can no other user replace what is written there, or the directory itself.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from mig_batch.errors import MigBatchError


class UnsafePath(MigBatchError, OSError):
    """A directory that another user could change (an OSError: a write there fails as any other would)."""


def write_file(path: Path, data: str | bytes, mode: int) -> None:
    """Replace ``path`` with ``data``, ``mode`` whatever the umask (see the module's text)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a full disk stays no fuller
        raise


def make_dir(path: Path, mode: int) -> None:
    """Make ``path`` (and its parents) when missing, ``path`` itself with ``mode`` whatever the umask; then
    refuse it (:class:`UnsafePath`) unless it is trusted (:func:`untrusted_dir`)."""
    path = Path(path)
    try:
        path.mkdir(parents=True)
        os.chmod(path, mode)
    except FileExistsError:
        pass
    why = untrusted_dir(path)
    if why:
        raise UnsafePath(why)


def untrusted_dir(path: Path) -> str:
    """Why another user could change what is written in ``path`` ("" when none could): see the module's
    text. A symlink on the way counts as the directory it leads to, and as a name in its own directory."""
    path = Path(os.path.abspath(path))
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return f"{path} is a symbolic link; give the directory itself"
        return _untrusted_chain(path, final=True)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"


def _untrusted_chain(path: Path, final: bool) -> str:
    me = os.geteuid()
    for at in (*reversed(path.parents), path):
        st = os.lstat(at)
        if st.st_uid not in (0, me):
            return f"{at} is owned by uid {st.st_uid}, not by root" + (f" or uid {me}" if me else "")
        if stat.S_ISLNK(st.st_mode):  # its name is safe in the directory checked before: now where it leads
            why = _untrusted_chain(Path(os.path.realpath(at)), final=final and at == path)
            if why:
                return why
            continue
        if not stat.S_ISDIR(st.st_mode):
            return f"{at} is not a directory"
        sticky_above = (at != path or not final) and st.st_mode & stat.S_ISVTX  # others cannot rename ours there
        if st.st_mode & 0o022 and not sticky_above:
            return f"{at} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""
