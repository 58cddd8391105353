"""The node agent as a local service: a root-owned Unix socket (mode 0600) that the hooks ask.

One JSON line in, one JSON line out: ``{"op": "prolog"|"epilog"|"ping", "job": "<id>"}`` ->
``{"ok": true, "detail": "..."}``. Only root may ask (the peer's credentials are checked: the batch
system's hooks run as root). A fixed set of worker threads answers (:class:`WorkerPool`); the agent
serializes the GPU work. A reconcile runs at start and every ``reconcile_interval_s`` (:func:`serve`,
shared with HTCondor's agent).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mig_batch.node.agent import NodeAgent, valid_job_id
from mig_batch.node.metrics import AgentMetrics, render, write_textfile

log = logging.getLogger("mig-batch-agent")
# the agents' listen backlog: a node's whole burst of job starts may connect at once (socketserver's default: 5)
BURST_BACKLOG = 256
TEXTFILE_EVERY_S = 5.0  # the metrics' textfile is written at most this often (and after each reconcile)


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    uid: int = struct.unpack("3i", creds)[1]
    return uid


class _Handler(socketserver.StreamRequestHandler):
    server: AgentServer
    timeout = 30  # seconds each read of the request may wait: a silent client must not hold a worker

    def handle(self) -> None:
        agent = self.server.agent
        try:
            if peer_uid(self.request) != 0:
                self._answer(False, "only root may ask the node agent")
                return
            request = json.loads(self.rfile.readline(65536) or b"{}")
            op, job = request.get("op"), str(request.get("job", ""))
            t0 = time.perf_counter()
            if op == "ping":
                self._answer(True, f"agent for {agent.node} up since {agent.started:.0f}")
            elif op in ("prolog", "epilog") and not valid_job_id(job):  # before it is logged or names a file
                self._answer(False, f"not a job id: {job[:64]!r}")
            elif op == "prolog":
                try:
                    result = agent.prolog(job)
                except Exception:
                    self.server.metrics.hook("prolog", "error")
                    raise
                detail = result.report.text() if result.report else "nothing to do"
                if result.problem:
                    log.warning("job %s prolog: %s", job, result.problem)
                self._answer(True, detail)
                seconds = time.perf_counter() - t0
                outcome = result.report.kind if result.report else ("problem" if result.problem else "nothing")
                self.server.metrics.hook("prolog", outcome, seconds)
                log.info("job %s prolog %.0f ms: %s", job, seconds * 1e3, detail)
            elif op == "epilog":
                try:
                    detail = agent.epilog(job)
                except Exception:
                    self.server.metrics.hook("epilog", "error")
                    raise
                self._answer(True, detail)
                self.server.metrics.hook("epilog", "done")
                log.info("job %s epilog %.0f ms: %s", job, (time.perf_counter() - t0) * 1e3, detail)
            else:
                self._answer(False, f"unknown op {op!r}; known: ping, prolog, epilog")
        except (OSError, ValueError) as exc:
            log.warning("bad request: %s", exc)

    def _answer(self, ok: bool, detail: str) -> None:
        self.wfile.write(json.dumps({"ok": ok, "detail": detail}).encode() + b"\n")


# what socketserver hands a stream server's process_request, and a connection waiting for a worker: it, its
# peer's address, when it was queued (time.monotonic)
_Request = socket.socket | tuple[bytes, socket.socket]
_Queued = tuple[_Request, Any, float]

if TYPE_CHECKING:  # the server WorkerPool is mixed into, for the type check; at run time a plain mix-in
    _Server = socketserver.BaseServer
else:
    _Server = object


class WorkerPool(_Server):
    """A socketserver mix-in: connections are queued to ``workers`` long-lived threads instead of one new
    thread each. A burst of job starts opens dozens of connections at once; a new thread per connection
    cost more CPU than the agent's own work on some of them, and the GPU work is serialized anyway. Each
    worker still overlaps its batch-system calls with the others'. Only for a socket that only root may
    open: a user holding connections open would stall the workers (HTCondor's wrapper socket is open to
    job users and keeps a thread per connection)."""

    workers = 8
    # a connection still queued after this long is closed unanswered: the hook (120 s timeout) then does
    # the work on its slow path, which it would otherwise do too once its wait ran out
    queue_limit_s = 60.0
    _waiting: queue.SimpleQueue[_Queued | None] | None = None

    def server_activate(self) -> None:
        super().server_activate()
        self._waiting = queue.SimpleQueue()
        for k in range(self.workers):
            threading.Thread(target=self._work, args=(self._waiting,), name=f"mig-batch-worker-{k}",
                             daemon=True).start()  # fmt: skip

    def process_request(self, request: _Request, client_address: Any) -> None:
        assert self._waiting is not None
        self._waiting.put((request, client_address, time.monotonic()))

    def _work(self, waiting: queue.SimpleQueue[_Queued | None]) -> None:
        while (item := waiting.get()) is not None:
            request, client_address, queued = item
            try:
                if time.monotonic() - queued > self.queue_limit_s:
                    log.warning("a request waited %.0f s for a worker; closed unanswered (the hook takes its "
                                "slow path)", time.monotonic() - queued)  # fmt: skip
                else:
                    self.finish_request(request, client_address)
            except Exception:  # one bad request must not end a worker
                log.exception("request failed")
            finally:
                with contextlib.suppress(Exception):
                    self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        if self._waiting is not None:  # None when binding the socket failed
            for _ in range(self.workers):
                self._waiting.put(None)


class AgentServer(WorkerPool, socketserver.UnixStreamServer):
    request_queue_size = BURST_BACKLOG

    def __init__(self, path: Path, agent: NodeAgent):
        self.agent = agent
        self.metrics = AgentMetrics()  # what the hooks' answers count (the textfile: serve)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        old = os.umask(0o177)
        try:
            super().__init__(str(path), _Handler)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)


def sweep_once(agent: NodeAgent, when: str, metrics: AgentMetrics | None = None) -> None:
    """One reconcile pass, its strays logged; an exception is logged, not raised, so that one NVML or
    journal hiccup does not end the sweep for good."""
    try:
        strays = agent.reconcile()
        for stray in strays:
            log.warning("reconcile %s: destroyed stray %s", when, stray)
        if metrics is not None:
            metrics.reconciled(len(strays))
    except Exception:
        log.exception("reconcile %s failed; the next pass tries again", when)
        if metrics is not None:
            metrics.reconciled(0, failed=True)


def agent_metrics_text(agent: NodeAgent, metrics: AgentMetrics) -> str:
    """The agent's metrics in the Prometheus text format node-exporter's textfile collector reads."""
    return render(metrics.families(agent.node, agent.started, agent.reconciled, agent.problems,
                                   len(agent.journal.entries())), openmetrics=False)  # fmt: skip


class TextfileWriter:
    """Writes the agent's metrics to ``path`` (a node-exporter textfile collector file) when they changed,
    at most every ``TEXTFILE_EVERY_S``; a failure is logged once until a write works again."""

    def __init__(self, path: Path, agent: NodeAgent, metrics: AgentMetrics):
        self.path, self.agent, self.metrics = path, agent, metrics
        self._failed = False

    def write(self) -> None:
        self.metrics.changed.clear()
        try:
            write_textfile(self.path, agent_metrics_text(self.agent, self.metrics))
            self._failed = False
        except OSError as exc:
            if not self._failed:
                log.warning("could not write the metrics to %s: %s", self.path, exc)
            self._failed = True

    def loop(self, stop: threading.Event) -> None:
        while not stop.wait(TEXTFILE_EVERY_S):
            if self.metrics.changed.is_set():
                self.write()


def serve(server: socketserver.BaseServer, agent: NodeAgent, reconcile_interval_s: float,
          metrics_textfile: str = "") -> None:  # fmt: skip
    """The agent's loop for either batch system: reconcile (strays from before a restart), then answer
    on ``server`` until stopped, reconciling again every ``reconcile_interval_s`` (the sweep of
    instances whose job ended without its epilog). With ``metrics_textfile``, the agent's metrics are
    written there (node-exporter's textfile collector reads it)."""
    metrics: AgentMetrics = getattr(server, "metrics", None) or AgentMetrics()
    sweep_once(agent, "at start", metrics)
    stop = threading.Event()
    writer = TextfileWriter(Path(metrics_textfile), agent, metrics) if metrics_textfile else None
    if writer is not None:
        writer.write()
        threading.Thread(target=writer.loop, args=(stop,), name="mig-batch-metrics", daemon=True).start()

    def sweep() -> None:
        while not stop.wait(reconcile_interval_s):
            sweep_once(agent, "sweep", metrics)

    threading.Thread(target=sweep, name="mig-batch-sweep", daemon=True).start()
    log.info("agent for %s listening on %s", agent.node, server.server_address)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        stop.set()
        server.server_close()
