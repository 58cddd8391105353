"""The HTTP edge of mig-batchd's metrics: GET /metrics answered with the bytes the last pass published
(:class:`~mig_batch.controller.metrics.ControllerMetrics`); it computes nothing."""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time

from mig_batch.controller.metrics import ControllerMetrics
from mig_batch.node.metrics import OPENMETRICS_TYPE

log = logging.getLogger("mig-batchd")


MAX_CONNECTIONS = 32  # connections held at once (fds); over it the oldest one is closed, not the new one
REQUEST_DEADLINE_S = 5.0  # the whole request (line and headers) must arrive within this, however it trickles
RESPONSE_DEADLINE_S = 10.0  # and the answer must be taken within this after (a client that does not read)
MAX_REQUEST_BYTES = 8192  # the request line and headers
_ACCEPT_PAUSE_S = 0.5  # out of fds: stop accepting a while rather than spin on the listening socket


class _Connection:
    __slots__ = ("deadline", "out", "received", "sent", "sock")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.received = b""
        self.out: memoryview | None = None  # the answer, once the request is whole
        self.sent = 0


class MetricsServer:
    """GET /metrics (or /): the text the last pass published (:meth:`ControllerMetrics.text`). A thin edge: it
    computes nothing, and it holds at most ``max_connections`` sockets, each for at most ``request_deadline_s``
    to send its request (and ``RESPONSE_DEADLINE_S`` to take the answer), whatever the client does.

    One thread, non-blocking sockets (``selectors``): a slow or silent client costs a table entry, not a thread;
    past the cap the oldest connection is closed (a scrape sends its request as it connects and is answered
    within the next turn, so a flood of idle connections cannot keep it out); a client that trickles its
    request is closed at its deadline, not kept alive by each byte. One request per connection
    (``Connection: close``), as a scraper needs."""

    def __init__(self, host: str, port: int, metrics: ControllerMetrics, max_connections: int = MAX_CONNECTIONS,
                 request_deadline_s: float = REQUEST_DEADLINE_S):  # fmt: skip
        self.metrics = metrics
        self.max_connections = max(1, max_connections)
        self.request_deadline_s = request_deadline_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(64)
            self.socket.setblocking(False)
        except BaseException:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self._conns: dict[int, _Connection] = {}  # by fd, oldest first
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # shutdown() wakes the loop
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._accepting_from = 0.0  # monotonic; later while accepting is paused
        self._accept_failed = False
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="mig-batchd-metrics", daemon=True)
        self._stopped.clear()
        thread.start()
        return thread

    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            while not self._stop.is_set():
                try:
                    self._turn()
                except Exception as exc:  # the metrics must never stop mig-batchd; a bug here shows in the log
                    log.warning("metrics server: %s", exc)
                    time.sleep(0.1)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever (from another thread) and wait for it."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn)
        for sock in (self.socket, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()

    def _turn(self) -> None:
        now = time.monotonic()
        if self._accepting_from and now >= self._accepting_from:
            self._accepting_from = 0.0
            self._selector.register(self.socket, selectors.EVENT_READ)
        waits = [c.deadline for c in self._conns.values()]
        if self._accepting_from:
            waits.append(self._accepting_from)
        timeout = max(0.0, min(waits) - now) if waits else None
        listening = False
        for key, events in self._selector.select(timeout):
            sock = key.fileobj
            if sock is self.socket:
                listening = True  # after the connections: one accepted last turn is read before any is evicted
            elif sock is self._wake_r:
                self._wake_r.recv(64)
            else:
                conn = self._conns.get(key.fd)
                if conn is not None:
                    self._serve(conn, events)
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._close(conn)
        if listening:
            self._accept(now)

    def _accept(self, now: float) -> None:
        # at most half the table turns over per turn: the newer half (a scrape accepted last turn) is not evicted
        for _ in range(max(1, self.max_connections // 2)):
            try:
                sock, _addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: wait, rather than spin on a readable socket
                if not self._accept_failed:  # once, until a connection is accepted again
                    log.warning("metrics server: cannot accept connections: %s", exc)
                self._accept_failed = True
                self._selector.unregister(self.socket)
                self._accepting_from = now + _ACCEPT_PAUSE_S
                return
            while len(self._conns) >= self.max_connections:
                self._close(next(iter(self._conns.values())))
            self._accept_failed = False
            sock.setblocking(False)
            conn = _Connection(sock, now + self.request_deadline_s)
            self._conns[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ)

    def _serve(self, conn: _Connection, events: int) -> None:
        try:
            if conn.out is None and events & selectors.EVENT_READ:
                data = conn.sock.recv(4096)
                if not data:
                    self._close(conn)
                    return
                conn.received += data
                if b"\n\r\n" not in conn.received and b"\n\n" not in conn.received:  # the headers not all here
                    if len(conn.received) > MAX_REQUEST_BYTES:
                        self._answer(conn, 431, "Request Header Fields Too Large", b"request too large\n")
                    return
                self._answer(conn, *self._route(conn.received))
            if conn.out is not None:
                conn.sent += conn.sock.send(conn.out[conn.sent:])
                if conn.sent >= len(conn.out):
                    self._close(conn)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # reset, broken pipe: the client left
            self._close(conn)

    def _route(self, request: bytes) -> tuple[int, str, bytes, str]:
        words = request.split(b"\n", 1)[0].split()
        if len(words) != 3 or not words[2].startswith(b"HTTP/"):
            return 400, "Bad Request", b"bad request\n", "text/plain"
        if words[0] != b"GET":
            return 405, "Method Not Allowed", b"mig-batchd serves GET /metrics\n", "text/plain"
        if words[1].split(b"?")[0] not in (b"/metrics", b"/"):
            return 404, "Not Found", b"mig-batchd serves /metrics\n", "text/plain"
        return 200, "OK", self.metrics.text(), OPENMETRICS_TYPE

    def _answer(self, conn: _Connection, status: int, reason: str, body: bytes, kind: str = "text/plain") -> None:
        allow = "Allow: GET\r\n" if status == 405 else ""
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n{allow}"
                "Connection: close\r\n\r\n")  # fmt: skip
        conn.out = memoryview(head.encode() + body)
        conn.deadline = time.monotonic() + RESPONSE_DEADLINE_S
        self._selector.modify(conn.sock, selectors.EVENT_WRITE)

    def _close(self, conn: _Connection) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is not None:
            self._selector.unregister(conn.sock)
        conn.sock.close()
