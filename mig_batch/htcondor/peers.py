"""Who is at the other end of the HTCondor agent's socket (:mod:`mig_batch.htcondor.server`), decided from
the kernel's records, never from anything the caller says, when the connection is accepted, before a byte
of the request is read.

The uid is the one the kernel recorded at ``connect`` (``SO_PEERCRED``); the process is held by a pidfd,
the kernel's own (``SO_PEERPIDFD``, Linux >= 6.5) or one opened from the peer's pid at accept on older
kernels; its ancestry is read from /proc and counts only when that process still runs afterwards with the
same start time and still as that uid. A connecting process that has exited (its socket handed to a
child, its pid free for a process of another slot) is in no slot. The slot is the one the nearest
``condor_starter`` ancestor (root's) names with ``-a``; what a caller in a slot may ask is the slot
guard's (:class:`mig_batch.htcondor.node.SlotGuard`).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import stat
import struct
from dataclasses import dataclass

from mig_batch.errors import MigBatchError

log = logging.getLogger("mig-batch-agent")
PASSWD_MAX_BYTES = 4 << 20
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5; Python 3.11 has no name for it


class CallerRefused(MigBatchError):
    """The caller is not the job it names (or not in a slot of this node)."""


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    slot: str  # the starter's slot, e.g. slot1_1
    local_name: str  # the startd's -local-name ("" for the plain startd)


@dataclass(frozen=True)
class Identity:
    """Who connected, as decided at accept: the uid, and the slot when the caller is in one."""

    uid: int
    caller: Caller | None
    refusal: str = ""  # why caller is None


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot: a reused pid has another."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        after_name = f.read().rpartition(b")")[2].split()  # the name may hold spaces and parentheses
    return int(after_name[19])  # field 22; after the name the fields start at 3


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1] if flag in args[:-1] else ""


def find_caller(pid: int, uid: int) -> Caller:
    """The slot ``pid`` runs in: its nearest ``condor_starter`` ancestor (root's, so a job cannot forge
    it) and that starter's startd."""
    current, seen = pid, 0
    while current > 1 and seen < 64:
        status = _status(current)
        if status.get("Name") == "condor_starter":
            # the uid before the cmdline: a job may name itself condor_starter, and only root's is read further
            if int(status["Uid"].split()[0]) != 0:
                raise CallerRefused(f"pid {pid}: its condor_starter {current} is not root's")
            slot = _after(_cmdline(current), "-a")
            parent = int(status["PPid"])
            if not slot or _status(parent).get("Name") != "condor_startd":
                raise CallerRefused(f"pid {pid}: its condor_starter {current} is not a root starter of a startd slot")
            return Caller(pid, uid, slot, _after(_cmdline(parent), "-local-name"))
        current, seen = int(status["PPid"]), seen + 1
    raise CallerRefused(f"pid {pid} runs in no HTCondor slot (no condor_starter among its parents)")


def owner_uid(pid: int, owner: str) -> int | None:
    """The uid of ``owner`` in the passwd file of ``pid``'s root (a chroot's own), None if unknown. The job
    may have put anything there (its own mount namespace): a regular file only, opened without following a
    link or blocking, at most PASSWD_MAX_BYTES read."""
    try:
        fd = os.open(f"/proc/{pid}/root/etc/passwd", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, PASSWD_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(text) > PASSWD_MAX_BYTES:
        return None
    for line in text.decode(errors="replace").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[0] == owner and fields[2].isdigit():
            return int(fields[2])
    return None


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected, as the kernel recorded them at ``connect``."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def _pidfd_pid(pidfd: int) -> int:
    """The pid a pidfd stands for in this namespace: -1 once the process exited, 0 outside it."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        for line in f:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    raise OSError(errno.ENOSYS, "no Pid: in the pidfd's fdinfo")


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)  # a pidfd turns readable when its process exits
    return bool(poller.poll(0))


def peer_pidfd(sock: socket.socket, pid: int) -> int:
    """A pidfd of the connecting process: the kernel's (it cannot stand for another process), else one
    opened from its pid now (checked again after the walk: :func:`identify`)."""
    try:
        pidfd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise CallerRefused(f"pid {pid}, which connected, has exited") from None
        if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        try:
            return os.pidfd_open(pid)
        except ProcessLookupError:
            raise CallerRefused(f"pid {pid}, which connected, has exited") from None
    try:
        if _pidfd_pid(pidfd) != pid:  # -1: gone (a kernel that hands out pidfds of exited processes)
            raise CallerRefused(f"pid {pid}, which connected, has exited")
    except BaseException:
        os.close(pidfd)
        raise
    return pidfd


def identify(sock: socket.socket, pid: int, uid: int) -> Identity:
    """Who is at the other end of ``sock``, decided once for the connection: its slot counts only when
    the process that connected is the one whose /proc was read, alive throughout and still that uid."""
    try:
        pidfd = peer_pidfd(sock, pid)
    except CallerRefused as exc:
        return Identity(uid, None, str(exc))
    except OSError as exc:
        return Identity(uid, None, f"pid {pid} could not be checked: {exc.strerror or exc}")
    try:
        started = _start_time(pid)
        caller = find_caller(pid, uid)
        uids = [int(u) for u in _status(pid)["Uid"].split()]
        if uid not in uids:
            raise CallerRefused(f"pid {pid} runs as uid {uids[0]}, not as uid {uid} which connected")
        if _exited(pidfd) or _start_time(pid) != started:
            raise CallerRefused(f"pid {pid} exited while it was checked")
        return Identity(uid, caller)
    except CallerRefused as exc:
        return Identity(uid, None, str(exc))
    except (OSError, ValueError, KeyError, IndexError) as exc:  # its /proc vanished: it exited
        return Identity(uid, None, f"pid {pid} could not be checked: {exc}")
    finally:
        os.close(pidfd)
