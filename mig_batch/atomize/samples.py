"""Memory samples of past subjobs on disk: ``<checkpoint dir>/.mig-batch/memory/<job>.<run>.csv``.

The runner appends ``seconds,MiB`` lines while the subjob runs; the controller reads every file of a
chain into a :class:`MemoryProfile`. Lines that are not two finite, non-negative numbers are skipped (a
subjob killed mid-write leaves at most one torn line), and only the ``max_files`` newest files are read.

The folder belongs to the job's owner and mig-batchd reads it as root, so :func:`read_samples` trusts
nothing in it (issue 45):

- below the checkpoint dir no symbolic link is followed: ``.mig-batch`` and ``memory`` are opened with
  ``O_NOFOLLOW | O_DIRECTORY`` relative to their parent's descriptor, each file with ``O_NOFOLLOW``
  relative to ``memory``'s. The checkpoint dir itself is the path the job named and is followed as the
  job would follow it.
- only regular files are read: a file is skipped unless ``lstat`` says regular (no device is ever
  opened), and it is opened ``O_NONBLOCK`` and checked again with ``fstat`` (a FIFO swapped in between
  never blocks a pass).
- when the job's owner uid is known, the two directories and every file must be owned by that uid: root
  then reads only what the owner could read anyway (no hard link to someone else's file, no directory
  another user made).
- reads are capped: :class:`ReadLimits` (bytes per file, bytes and files per chain, directory entries
  looked at); an oversized file is refused, not truncated (a cut trajectory would look shorter than the
  subjob was).

Reading with the owner's own rights (``setfsuid`` in a thread, or a helper process per read) was
considered and not chosen: Python has no ``setfsuid``, the fsuid is per thread and one missed restore
leaves the daemon's thread unprivileged, and a helper process needs the owner's groups looked up and
costs a fork per chain. The careful open plus the owner check gives the same outcome for the files the
runner writes. Not covered: a checkpoint dir on a hung network file system still blocks in ``open``.

What was refused comes back in :attr:`Samples.refused` (names and reasons, never contents) for the caller
to log; the decisions built on the profile stay pure (:mod:`mig_batch.atomize.profiles`).
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from mig_batch.atomize.profiles import MemoryProfile, ProfileError, Trajectory

SAMPLES_SUBDIRS = (".mig-batch", "memory")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_MAX_REFUSED_LINES = 5  # a folder of ten thousand FIFOs is one log line, not ten thousand


@dataclass(frozen=True)
class ReadLimits:
    """Caps on what one chain's folder may cost a pass. A runner writes about 20 bytes a sample, one
    a second by default: 4 MiB is two days of one subjob, far beyond any window."""

    max_files: int = 200  # newest files read
    max_entries: int = 10_000  # directory entries looked at, samples or not
    max_file_bytes: int = 4 << 20
    max_total_bytes: int = 16 << 20


@dataclass(frozen=True)
class Samples:
    profile: MemoryProfile
    refused: tuple[str, ...] = ()  # what was not read and why, for the log


class _Refused(Exception):
    pass


def samples_dir(checkpoint_dir: Path | str) -> Path:
    return Path(checkpoint_dir).joinpath(*SAMPLES_SUBDIRS)


def samples_file(checkpoint_dir: Path | str, job: str, run: int) -> Path:
    return samples_dir(checkpoint_dir) / f"{job}.{run}.csv"


def parse_trajectory(text: str) -> Trajectory | None:
    """The trajectory of one samples file's text (None when it holds no sample)."""
    times: list[float] = []
    mib: list[float] = []
    for line in text.splitlines():
        parts = line.split(",")
        try:
            t, m = float(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            continue
        if not (math.isfinite(t) and math.isfinite(m)) or t < 0 or m < 0:
            continue  # nan would poison every max and order statistic built on it
        if times and t < times[-1]:
            continue
        times.append(t)
        mib.append(m)
    try:
        return Trajectory(tuple(times), tuple(mib)) if times else None
    except ProfileError:
        return None


def read_trajectory(path: Path) -> Trajectory | None:
    """One samples file the caller trusts (its own, e.g. the emulator's ``--replay``); a user's folder
    read by root goes through :func:`read_samples`."""
    return parse_trajectory(path.read_text(errors="replace"))


def read_samples(checkpoint_dir: Path | str, owner: int | None = None,
                 limits: ReadLimits = ReadLimits()) -> Samples:  # fmt: skip
    """The memory profile of a chain's samples under ``checkpoint_dir``, read as the module says; files
    owned by another uid than ``owner`` (when given) are refused. Never raises for what the folder holds:
    no folder yet is an empty profile, anything refused is an empty or partial one and a reason."""
    refused: list[str] = []
    try:
        fd = _open_samples_dir(os.fspath(checkpoint_dir), owner)
    except _Refused as exc:
        return Samples(MemoryProfile(()), (str(exc),))
    if fd is None:
        return Samples(MemoryProfile(()))
    try:
        trajectories = _read_files(fd, owner, limits, refused)
    except OSError as exc:  # the directory itself failed mid-listing
        refused.append(f"{_where()}: {exc.strerror or exc}")
        trajectories = []
    finally:
        os.close(fd)
    if len(refused) > _MAX_REFUSED_LINES:
        refused[_MAX_REFUSED_LINES:] = [f"and {len(refused) - _MAX_REFUSED_LINES} more"]
    return Samples(MemoryProfile(tuple(trajectories)), tuple(refused))


def _where(name: str | None = None) -> str:
    return "/".join((*SAMPLES_SUBDIRS, *((ascii(name),) if name is not None else ())))


def _owned(st: os.stat_result, owner: int | None, what: str) -> None:
    if owner is not None and st.st_uid != owner:
        raise _Refused(f"{what}: owned by uid {st.st_uid}, not by the job's owner {owner}")


def _open_samples_dir(path: str, owner: int | None) -> int | None:
    """A descriptor of ``<path>/.mig-batch/memory`` reached without following a link below ``path``;
    None when a level does not exist (no subjob has sampled yet)."""
    if not os.path.isabs(path):
        raise _Refused(f"checkpoint dir {path!r} is not absolute")
    try:
        fd = os.open(path, _DIR_FLAGS)  # the folder the job named: followed as the job would follow it
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _Refused(f"checkpoint dir: {exc.strerror or exc}") from None
    walked: list[str] = []
    try:
        for name in SAMPLES_SUBDIRS:
            walked.append(name)
            where = "/".join(walked)
            try:
                sub = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                os.close(fd)
                return None
            except OSError as exc:  # a link gives ELOOP or ENOTDIR (with O_DIRECTORY): say which it was
                raise _Refused(f"{where}: {_why_not_opened(fd, name, exc)}") from None
            os.close(fd)
            fd = sub
            _owned(os.fstat(fd), owner, where)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _why_not_opened(dir_fd: int, name: str, exc: OSError) -> str:
    try:
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return "a symbolic link, not followed"
    except OSError:
        pass
    return exc.strerror or str(exc)


def _read_files(fd: int, owner: int | None, limits: ReadLimits, refused: list[str]) -> list[Trajectory]:
    candidates: list[tuple[float, str]] = []
    with os.scandir(fd) as entries:
        for seen, entry in enumerate(entries):
            if seen >= limits.max_entries:
                refused.append(f"{_where()}: more than {limits.max_entries} entries, the rest not looked at")
                break
            if not entry.name.endswith(".csv"):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since the listing
            if not stat.S_ISREG(st.st_mode):  # a link, FIFO, device...: never opened
                refused.append(f"{_where(entry.name)}: not a regular file")
                continue
            candidates.append((st.st_mtime, entry.name))
    candidates.sort()
    budget = limits.max_total_bytes
    newest_first: list[Trajectory] = []
    for _, name in reversed(candidates[-limits.max_files :]):  # newest first: the byte budget keeps them
        if budget <= 0:
            refused.append(f"{_where()}: {limits.max_total_bytes} bytes read, older files not read")
            break
        try:
            data = _read_capped(fd, name, owner, min(limits.max_file_bytes, budget) + 1)
        except _Refused as exc:
            refused.append(str(exc))
            continue
        except OSError as exc:
            refused.append(f"{_where(name)}: {exc.strerror or exc}")
            continue
        budget -= len(data)
        if len(data) > limits.max_file_bytes:
            refused.append(f"{_where(name)}: larger than {limits.max_file_bytes} bytes, not read")
            continue
        if budget < 0:
            refused.append(f"{_where()}: {limits.max_total_bytes} bytes read, older files not read")
            break
        trajectory = parse_trajectory(data.decode(errors="replace"))
        if trajectory is not None:
            newest_first.append(trajectory)
    return newest_first[::-1]


def _read_capped(dir_fd: int, name: str, owner: int | None, most: int) -> bytes:
    """At most ``most`` bytes of regular file ``name`` in ``dir_fd``, opened without following a link and
    without blocking."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:  # swapped for a link since the listing
        raise _Refused(f"{_where(name)}: {_why_not_opened(dir_fd, name, exc)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped since the listing
            raise _Refused(f"{_where(name)}: not a regular file")
        _owned(st, owner, _where(name))
        chunks: list[bytes] = []
        left = most
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
