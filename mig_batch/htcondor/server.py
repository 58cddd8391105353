"""The HTCondor agent's Unix socket, which any local user may open: the job wrapper's requests, each from a
peer identified at accept (:mod:`mig_batch.htcondor.peers`) and judged by the slot guard
(:class:`mig_batch.htcondor.node.SlotGuard`).

What one user can cost the others is bounded: a non-root uid holds at most ``per_uid_connections``
connections at once, all users together ``max_user_connections`` (more are closed unanswered at accept,
which the wrapper retries for a minute; root is exempt), a request is one line of at most
``max_request_bytes`` that must arrive within ``read_timeout_s`` (one thread waits on all unread
connections), a fixed pool of workers answers with at most ``per_uid_workers`` busy for one uid and one
more kept for root (a ping always gets through), and one slot waits on the schedd's late view of its job
(``settle_s``) once at a time and not again for ``SETTLE_COOLDOWN_S`` after a wait that ran out. A
request that is not a JSON object with a known ``op`` and a ``cluster.proc`` job id is answered with an
error.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import resource
import selectors
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from mig_batch.errors import MigBatchError
from mig_batch.htcondor.node import SlotGuard, exports_env
from mig_batch.htcondor.peers import CallerRefused, Identity, identify, peer_credentials
from mig_batch.node.agent import NodeAgent
from mig_batch.node.service import BURST_BACKLOG

log = logging.getLogger("mig-batch-agent")
OPS = ("ping", "prolog", "epilog")
JOB_ID = re.compile(r"[0-9]{1,18}\.[0-9]{1,9}")  # cluster.proc, as the wrapper sends it


class BadRequest(ValueError):
    """A request line that is not ``{"op": ..., "job": "cluster.proc"}``."""


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
