"""The node agent on an HTCondor execute node: the batch-neutral :class:`~mig_batch.node.agent.NodeAgent`
with :class:`~mig_batch.htcondor.adapter.HTCondorBatch` as its channel, served to the job wrapper.

HTCondor runs the job wrapper (``USER_JOB_WRAPPER``, :mod:`mig_batch.htcondor.job_wrapper`) as the job's
user, never root, so the wrapper asks this root service over a Unix socket that any local user may
open. The agent trusts no peer: who asks is decided from the socket's peer credentials, never from
anything the caller says, and it is decided when the connection is accepted, before a byte of the
request is read:

- the uid is the one the kernel recorded at ``connect`` (``SO_PEERCRED``); the process is held by a
  pidfd, the kernel's own (``SO_PEERPIDFD``, Linux >= 6.5) or one opened from the peer's pid at accept
  on older kernels; its ancestry is read from /proc and counts only when that process still runs
  afterwards with the same start time and still as that uid. A connecting process that has exited
  (its socket handed to a child, its pid free for a process of another slot) is in no slot;
- the caller must descend from a ``condor_starter`` of this node's startd (the startd's ``-local-name``,
  none on a node with one startd); the starter (root's) ``-a`` names the slot, and the schedd must show
  the job the caller names running in exactly that slot (``RemoteHost``), so a job can ask only for
  itself;
- the caller's uid must be the job owner's (looked up in the caller's own root), when the owner has
  an account there (sites that run jobs as slot users skip this part);
- the slot and the uid of the prolog's caller are remembered in a root-only directory beside the
  journal (so across a restart of the agent too); a later prolog of that job from that slot under
  another uid is refused, and the epilog is taken only from that slot and that uid (an entry written
  by an earlier release, without a uid, takes no epilog: the reconcile sweeps that instance).

What one user can cost the others is bounded: a non-root uid holds at most ``per_uid_connections``
connections at once, all users together ``max_user_connections`` (more are closed unanswered at accept,
which the wrapper retries for a minute; root is exempt), a request is one line of at most
``max_request_bytes`` that must arrive within ``read_timeout_s`` (one thread waits on all unread
connections), a fixed pool of workers answers with at most ``per_uid_workers`` busy for one uid and one
more kept for root (a ping always gets through), and one slot waits on the schedd's late view of its job
(``settle_s``) once at a time and not again for ``SETTLE_COOLDOWN_S`` after a wait that ran out. A
request that is not a JSON object with a known ``op`` and a ``cluster.proc`` job id is answered with an
error.

Instances are destroyed when the job leaves its slot: the wrapper asks at the job's exit and on the
signals HTCondor sends for ``condor_rm``, ``condor_hold`` and an eviction; whatever the wrapper cannot
report (SIGKILL, a dead wrapper) the agent's reconcile sweeps, every ``reconcile_interval_s``, from the
schedd's view of which managed jobs still run on this node. The reports reach the controller through
HTCondor: the job's ``MigBatchTag`` (the agent's identity is a queue superuser) and the node's
``MigBatchAgent`` machine attribute (a node-local file a startd cron job publishes).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import os
import re
import resource
import select
import selectors
import socket
import socketserver
import stat
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from mig_batch.errors import MigBatchError
from mig_batch.node.agent import NodeAgent
from mig_batch.node.journal import Journal
from mig_batch.node.service import BURST_BACKLOG
from mig_batch.safe_files import write_file

if TYPE_CHECKING:
    from mig_batch.htcondor.adapter import HTCondorBatch

log = logging.getLogger("mig-batch-agent")
RUNNING = 2  # JobStatus
STALE_SLOT_S = 600.0  # a remembered slot without a journal entry this old: its instance is long gone
SETTLE_COOLDOWN_S = 30.0  # a slot whose wait for the schedd ran out waits no more for this long
# a job's prologs within PROLOG_WINDOW_S: a rerun after an eviction needs one, a job looping prolog and epilog
# would make the node create and destroy instances under its lock without end
PROLOGS_PER_WINDOW, PROLOG_WINDOW_S = 3, 60.0
PASSWD_MAX_BYTES = 4 << 20
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5; Python 3.11 has no name for it
OPS = ("ping", "prolog", "epilog")
JOB_ID = re.compile(r"[0-9]{1,18}\.[0-9]{1,9}")  # cluster.proc, as the wrapper sends it


class CallerRefused(MigBatchError):
    """The caller is not the job it names (or not in a slot of this node)."""


class BadRequest(ValueError):
    """A request line that is not ``{"op": ..., "job": "cluster.proc"}``."""


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


def parse_request(line: bytes) -> tuple[str, str]:
    """(op, job) of one request line; ``job`` is "" for a ping. BadRequest for anything else."""
    try:
        request = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: deeply nested arrays
        raise BadRequest("not JSON") from None
    if not isinstance(request, dict):
        raise BadRequest(f"a JSON object is wanted, not {type(request).__name__}")
    op = request.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise BadRequest(f"unknown op {str(op)[:40]!r}; known: {', '.join(OPS)}")
    if op == "ping":
        return op, ""
    job = request.get("job")
    if not isinstance(job, str) or not JOB_ID.fullmatch(job):
        raise BadRequest(f"job {str(job)[:40]!r} is not an HTCondor job id (cluster.proc)")
    return op, job


class SlotGuard:
    """Decides whether a caller may provision or destroy a job's instance (see the module's text)."""

    def __init__(self, batch: HTCondorBatch, node: str, local_name: str = "", settle_s: float = 10.0,
                 directory: Path | None = None, journal: Journal | None = None):  # fmt: skip
        self.batch, self.node, self.local_name, self.settle_s = batch, node, local_name, settle_s
        self.slots: dict[str, tuple[str, int]] = {}  # job -> the slot and uid that provisioned it
        # kept on disk too (root's, beside the journal): a restarted agent still takes the wrapper's epilog
        self.directory, self.journal = directory, journal
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        self._startd = ""
        self._settle_lock = threading.Lock()
        self._settling: set[str] = set()  # slots waiting on the schedd now
        self._quiet_until: dict[str, float] = {}  # slot -> no wait on the schedd before then
        self._prologs: dict[str, collections.deque[float]] = {}  # job -> when its latest prologs were asked

    def _remember(self, job: str, slot: str, uid: int) -> None:
        self.slots[job] = (slot, uid)
        if self.directory is None:
            return
        # drop those whose instance is gone (the sweep took it); not a fresh one, whose instance another
        # thread may be making right now (not journaled yet)
        stale = time.time() - STALE_SLOT_S
        for old in self.directory.iterdir():
            with contextlib.suppress(OSError):
                if self.journal is not None and self.journal.get(old.name) is None and old.stat().st_mtime < stale:
                    old.unlink()
        write_file(self.directory / job, f"{slot} {uid}\n", 0o600)

    def _recalled(self, job: str) -> tuple[str, int] | None:
        """The slot and uid that provisioned ``job``; None when unknown (or written without a uid)."""
        if job in self.slots or self.directory is None:
            return self.slots.get(job)
        try:
            slot, uid = (self.directory / job).read_text().split()
            return slot, int(uid)
        except (OSError, ValueError):
            return None

    def _forget(self, job: str) -> None:
        self.slots.pop(job, None)
        if self.directory is not None:
            (self.directory / job).unlink(missing_ok=True)

    def startd(self) -> str:
        """This node's startd name as HTCondor writes it in RemoteHost (``nodeb@migpool``)."""
        if not self._startd:
            for ad in self.batch._startds():
                if str(ad.get("MigBatchNodeName")) == self.node and "@" in str(ad.get("Name", "")):
                    self._startd = str(ad["Name"]).partition("@")[2]
                    break
        if not self._startd:
            raise CallerRefused(f"the collector knows no startd with MigBatchNodeName {self.node!r}")
        return self._startd

    @contextlib.contextmanager
    def _settle_window(self, slot: str) -> Iterator[float]:
        """How long this request may wait for the schedd: ``settle_s`` for one request of a slot at a
        time and not within SETTLE_COOLDOWN_S of a wait that ran out; else no wait (one look)."""
        now = time.monotonic()
        with self._settle_lock:
            allowed = slot not in self._settling and self._quiet_until.get(slot, 0.0) <= now
            if allowed:
                self._settling.add(slot)
        try:
            yield self.settle_s if allowed else 0.0
        finally:
            if allowed:
                with self._settle_lock:
                    self._settling.discard(slot)

    def check_prolog(self, caller: Caller, job: str) -> None:
        if caller.local_name != self.local_name:
            raise CallerRefused(f"caller in a slot of startd {caller.local_name or '(plain)'}, not of {self.node}")
        self._count_prolog(job)
        recalled = self._recalled(job)
        if recalled is not None and recalled[0] == caller.slot and recalled[1] != caller.uid:
            raise CallerRefused(f"job {job}'s instance was made for uid {recalled[1]}, not uid {caller.uid}")
        want = f"{caller.slot}@{self.startd()}"
        with self._settle_window(caller.slot) as settle_s:
            deadline = time.monotonic() + settle_s  # the schedd may record the start a moment later
            while True:
                ad = self._ad(job)
                if ad is None:
                    raise CallerRefused(f"no job {job} in the queue")
                if int(ad.get("JobStatus", 0)) == RUNNING and ad.get("RemoteHost") == want:
                    break
                if time.monotonic() >= deadline:
                    if settle_s:
                        with self._settle_lock:
                            self._quiet_until[caller.slot] = time.monotonic() + SETTLE_COOLDOWN_S
                    raise CallerRefused(f"job {job} is not running in {want} (status {ad.get('JobStatus')}, "
                                        f"RemoteHost {ad.get('RemoteHost')})")  # fmt: skip
                time.sleep(0.3)
        expected = owner_uid(caller.pid, str(ad.get("Owner", "")))
        if expected is not None and expected != caller.uid:
            raise CallerRefused(f"caller uid {caller.uid} is not job {job}'s owner {ad.get('Owner')} ({expected})")
        self._remember(job, caller.slot, caller.uid)

    def _count_prolog(self, job: str) -> None:
        """Refuse a job's prolog past PROLOGS_PER_WINDOW within PROLOG_WINDOW_S."""
        now = time.monotonic()
        with self._settle_lock:
            for old in [j for j, times in self._prologs.items() if times[-1] < now - PROLOG_WINDOW_S]:
                del self._prologs[old]  # forgotten once quiet: the table stays as small as the busy jobs
            times = self._prologs.setdefault(job, collections.deque(maxlen=PROLOGS_PER_WINDOW))
            if len(times) == PROLOGS_PER_WINDOW and times[0] > now - PROLOG_WINDOW_S:
                raise CallerRefused(f"job {job} asked for its instance {PROLOGS_PER_WINDOW} times within "
                                    f"{PROLOG_WINDOW_S:.0f} s")  # fmt: skip
            times.append(now)

    def check_epilog(self, caller: Caller, job: str) -> None:
        recalled = self._recalled(job)
        if caller.local_name != self.local_name or recalled is None or recalled[0] != caller.slot:
            raise CallerRefused(f"job {job}'s instance was not made for slot {caller.slot}; the reconcile "
                                "destroys it once the job left its slot")  # fmt: skip
        if recalled[1] != caller.uid:
            raise CallerRefused(f"job {job}'s instance was made for uid {recalled[1]}, not uid {caller.uid}")
        self._forget(job)

    def _ad(self, job: str) -> dict[str, Any] | None:
        with self.batch._call(f"read job {job}"):
            ads = self.batch.schedd.query(constraint=_job_constraint(job),
                                          projection=["JobStatus", "RemoteHost", "Owner"])  # fmt: skip
        return self.batch._plain(ads[0]) if ads else None


def exports_env(lines: Sequence[str]) -> dict[str, str]:
    """``export NAME=value`` lines (the agent's job environment) as a mapping."""
    return dict(line.removeprefix("export ").split("=", 1) for line in lines if "=" in line)


def _job_constraint(job: str) -> str:
    from mig_batch.htcondor.adapter import _job_constraint as constraint

    return constraint(job)


def _answer_line(ok: bool, detail: str, env: dict[str, str] | None = None) -> bytes:
    return json.dumps({"ok": ok, "detail": detail, "env": env or {}}).encode() + b"\n"


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    identity: Identity
    deadline: float  # the whole request line by then
    data: bytearray = field(default_factory=bytearray)


_Item = TypeVar("_Item")


class _FairQueue(Generic[_Item]):
    """Requests read in full, waiting for a worker: root's first, then each uid in turn, no uid with more
    than ``per_uid`` of them being answered at once (one job's slow requests take no other job's workers)."""

    def __init__(self, per_uid: int):
        self.per_uid = per_uid
        self._cond = threading.Condition()
        self._pending: dict[int, collections.deque[_Item]] = {}
        self._running: collections.Counter[int] = collections.Counter()
        self._stopped = False

    def put(self, uid: int, item: _Item) -> None:
        with self._cond:
            self._pending.setdefault(uid, collections.deque()).append(item)
            self._cond.notify_all()

    def get(self, root_only: bool) -> tuple[int, _Item] | None:
        """The next (uid, item) to answer; None once stopped."""
        with self._cond:
            while not self._stopped:
                uid = self._choose(root_only)
                if uid is not None:
                    items = self._pending.pop(uid)
                    item = items.popleft()
                    if items:
                        self._pending[uid] = items  # to the back: the next worker serves another uid first
                    self._running[uid] += 1
                    return uid, item
                self._cond.wait()
            return None

    def _choose(self, root_only: bool) -> int | None:
        if 0 in self._pending:
            return 0
        if not root_only:
            for uid in self._pending:
                if self._running[uid] < self.per_uid:
                    return uid
        return None

    def done(self, uid: int) -> None:
        with self._cond:
            self._running[uid] -= 1
            if self._running[uid] <= 0:
                del self._running[uid]
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


class WrapperServer(socketserver.UnixStreamServer):
    """The agent's socket for job wrappers: mode 0666 (the wrappers run as job users). The caller is
    identified at accept (:func:`identify`), its request read by one thread for all connections, and
    answered by a fixed pool of workers, each request checked by :class:`SlotGuard` (see the module's text
    for the limits)."""

    request_queue_size = BURST_BACKLOG

    def __init__(self, path: Path, agent: NodeAgent, guard: SlotGuard, *, workers: int = 8,
                 per_uid_workers: int = 2, per_uid_connections: int = 64, max_user_connections: int = 512,
                 read_timeout_s: float = 5.0, max_request_bytes: int = 4096):  # fmt: skip
        self.agent, self.guard = agent, guard
        self.workers, self.read_timeout_s, self.max_request_bytes = workers, read_timeout_s, max_request_bytes
        self.per_uid_connections, self.max_user_connections = per_uid_connections, max_user_connections
        self._queue: _FairQueue[tuple[_Connection, bytes]] = _FairQueue(per_uid_workers)
        self._open: collections.Counter[int] = collections.Counter()  # uid -> its connections now
        self._open_lock = threading.Lock()
        self._turned_away_logged: dict[int, float] = {}
        self._incoming: collections.deque[_Connection] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = threading.Event()
        self._reader: threading.Thread | None = None
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        super().__init__(str(path), None)  # type: ignore[arg-type]  # no handler class: see process_request
        os.chmod(path, 0o666)

    def server_activate(self) -> None:
        super().server_activate()
        self._reader = threading.Thread(target=self._read, name="mig-batch-reader", daemon=True)
        self._reader.start()
        for k in range(self.workers):
            threading.Thread(target=self._work, args=(False,), name=f"mig-batch-worker-{k}", daemon=True).start()
        # kept for root: a ping answers even while every other worker waits on a slow request
        threading.Thread(target=self._work, args=(True,), name="mig-batch-worker-root", daemon=True).start()

    # --- accept: identify the caller, or turn it away ------------------------------------------------
    # the override's narrower request: a stream server's request is always its socket (BaseServer allows a datagram's)
    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        try:
            pid, uid, _ = peer_credentials(request)
        except OSError:
            request.close()
            return
        if not self._admit(uid):
            self._turn_away(request, uid)
            return
        try:
            identity = identify(request, pid, uid)
            request.setblocking(False)
        except Exception:  # never the accept loop's traceback: this connection alone fails
            log.exception("identifying pid %d uid %d failed", pid, uid)
            self._release(request, uid)
            return
        self._incoming.append(_Connection(request, identity, time.monotonic() + self.read_timeout_s))
        self._wake()

    def _admit(self, uid: int) -> bool:
        with self._open_lock:
            if uid != 0:  # root is exempt: root's own tools and pings
                users = sum(n for u, n in self._open.items() if u != 0)
                if self._open[uid] >= self.per_uid_connections or users >= self.max_user_connections:
                    return False
            self._open[uid] += 1
            return True

    def _turn_away(self, sock: socket.socket, uid: int) -> None:
        sock.close()  # unanswered: a wrapper takes that as an agent restarting and asks again (a burst of jobs)
        now = time.monotonic()
        if now - self._turned_away_logged.get(uid, -1e9) > 60.0:  # one line a minute, not one a connection
            self._turned_away_logged[uid] = now
            log.warning("uid %d: too many connections open (limit %d); further ones closed at accept",
                        uid, self.per_uid_connections)  # fmt: skip

    def _release(self, sock: socket.socket, uid: int) -> None:
        with contextlib.suppress(OSError):
            sock.close()
        with self._open_lock:
            self._open[uid] -= 1
            if self._open[uid] <= 0:
                del self._open[uid]

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    # --- one thread reads every request line ---------------------------------------------------------
    def _read(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        reading: dict[socket.socket, _Connection] = {}
        while not self._stopping.is_set():
            now = time.monotonic()
            first = min((c.deadline for c in reading.values()), default=now + 1.0)
            for key, _ in selector.select(max(0.0, first - now)):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    while self._incoming:
                        conn = self._incoming.popleft()
                        reading[conn.sock] = conn
                        selector.register(conn.sock, selectors.EVENT_READ, conn)
                    continue
                conn = key.data
                line, why = self._receive(conn)
                if line is None and not why:
                    continue  # more to come
                selector.unregister(conn.sock)
                del reading[conn.sock]
                if line is not None:
                    self._queue.put(conn.identity.uid, (conn, line))
                elif why == "closed":
                    self._release(conn.sock, conn.identity.uid)
                else:
                    self._fail(conn, why)
            now = time.monotonic()
            for conn in [c for c in reading.values() if c.deadline <= now]:
                selector.unregister(conn.sock)
                del reading[conn.sock]
                self._fail(conn, f"no request line within {self.read_timeout_s:g} s")
        for conn in reading.values():
            self._release(conn.sock, conn.identity.uid)
        selector.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _receive(self, conn: _Connection) -> tuple[bytes | None, str]:
        """(the request line, "") once complete; (None, "") while more may come; (None, why) when the
        connection is done with: "closed" by the peer, else what was wrong."""
        try:
            chunk = conn.sock.recv(self.max_request_bytes + 1 - len(conn.data))
        except BlockingIOError:
            return None, ""
        except OSError:
            chunk = b""
        conn.data += chunk
        line, newline, _ = conn.data.partition(b"\n")
        if newline or (not chunk and line):  # a last line without its newline counts too
            return bytes(line), ""
        if len(conn.data) > self.max_request_bytes:
            return None, f"request longer than {self.max_request_bytes} bytes"
        return None, "" if chunk else "closed"

    def _fail(self, conn: _Connection, why: str) -> None:
        log.warning("uid %d: %s", conn.identity.uid, why)
        with contextlib.suppress(OSError):
            conn.sock.send(_answer_line(False, f"bad request: {why}"))
        self._release(conn.sock, conn.identity.uid)

    # --- the workers ---------------------------------------------------------------------------------
    def _work(self, root_only: bool) -> None:
        while (got := self._queue.get(root_only)) is not None:
            uid, (conn, line) = got
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(self.read_timeout_s)  # for the answer: a peer that never reads it
                conn.sock.sendall(self._answer(conn.identity, line))
            except OSError as exc:
                log.warning("uid %d: the answer was not delivered: %s", uid, exc)
            except Exception:  # a bug, not a bad request (those are answered): this request alone fails
                log.exception("request of uid %d failed", uid)
            finally:
                self._queue.done(uid)
                self._release(conn.sock, uid)

    def _answer(self, identity: Identity, line: bytes) -> bytes:
        agent, guard = self.agent, self.guard
        try:
            op, job = parse_request(line)
        except BadRequest as exc:
            log.warning("uid %d: bad request: %s", identity.uid, exc)
            return _answer_line(False, f"bad request: {exc}")
        if op == "ping":
            return _answer_line(True, f"agent for {agent.node} up since {agent.started:.0f}")
        t0 = time.perf_counter()
        try:
            caller = identity.caller
            if caller is None:
                raise CallerRefused(identity.refusal)
            if op == "prolog":
                guard.check_prolog(caller, job)
                result = agent.prolog(job, owner_uid=caller.uid)
                detail = result.problem or (result.report.text() if result.report else "nothing to do")
                env = exports_env(result.exports)
                answer = _answer_line(env.get("CUDA_VISIBLE_DEVICES", "").startswith("MIG-"), detail, env)
            else:
                guard.check_epilog(caller, job)
                detail = agent.epilog(job)
                answer = _answer_line(True, detail)
        except CallerRefused as exc:
            log.warning("refused uid %d's %s of job %s: %s", identity.uid, op, job, exc)
            return _answer_line(False, f"refused: {exc}")
        except (OSError, MigBatchError) as exc:
            log.warning("job %s %s failed: %s: %s", job, op, type(exc).__name__, exc)
            return _answer_line(False, f"{type(exc).__name__}: {exc}")
        log.info("job %s %s %.0f ms (slot %s, uid %d): %s", job, op, (time.perf_counter() - t0) * 1e3,
                 caller.slot, caller.uid, detail)  # fmt: skip
        return answer

    def server_close(self) -> None:
        super().server_close()
        self._queue.stop()
        if self._reader is not None:
            self._stopping.set()
            self._wake()
            self._reader.join()  # it closes the wake pipe: no write may reach a reused descriptor after that
            self._reader = None
        elif not self._stopping.is_set():  # never activated (the bind failed): the pipe is still open
            self._stopping.set()
            os.close(self._wake_r)
            os.close(self._wake_w)


def raise_open_files_limit() -> None:
    """Let the agent hold as many files as its hard limit allows (systemd's soft default is 1024)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (65536 if hard == resource.RLIM_INFINITY else hard, hard))
