"""mig-batchd's metrics (OpenMetrics), for ``metrics_listen``.

The numbers are computed from a pass's snapshot and the view by pure functions (:func:`job_counts`,
:func:`slice_counts`, :func:`node_families`) and from the store's events as they are written
(:class:`EventTally`, tailing the event log by id: counters since this daemon started); the pass's own
(duration, outcome, last good pass, backoff) come from :class:`~mig_batch.controller.health.Health`. The
controller's thread computes the families and renders their text after each pass (:class:`ControllerMetrics`);
the HTTP server (:class:`MetricsServer`, one thread on non-blocking sockets) only sends the last pass's bytes, so
a scrape never touches the view or the store nor renders anything, and a scrape while the batch system is down
still answers, with the last good pass. The server holds at most MAX_CONNECTIONS sockets, each for a few seconds
at most: no client, however slow or numerous, can take mig-batchd's file descriptors or keep a scrape out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from typing import Any

from mig_batch.batch.system import BatchJob, JobState, NodeStatus
from mig_batch.batch.tags import parse_agent_tag
from mig_batch.controller.health import Health
from mig_batch.node.metrics import OPENMETRICS_TYPE, Family, Histogram, Labels, counter, gauge, render
from mig_batch.placement.cluster import Cluster
from mig_batch.state import Store

log = logging.getLogger("mig-batchd")
SNAPSHOT_EVERY_S = 1.0  # the jobs, slices and nodes are counted again at most this often (passes are faster)
_REASON_CHARS = re.compile(r"[^A-Za-z0-9_]+")
_Sample = tuple[str, Labels, float]  # a Family's (suffix, labels, value)


# --- pure: what a pass's snapshot and view hold -----------------------------------------------------


def wait_category(reason: str) -> str:
    """A waiting job's reason (``waits.WaitNotes``' words) as a label with few values."""
    text = reason.lower()
    if text.startswith("no room"):  # MIG fits nowhere now (placement/waiting.py's words)
        return "no-room"
    if "begin time" in text:
        return "begin-time"
    if "dependency" in text or text.startswith("job "):
        return "dependency"
    if "partition" in text:
        return "partition"
    return "request"


def job_counts(jobs: Iterable[BatchJob], waits: Mapping[str, str], decided: Container[str]) -> Counter[Labels]:
    """Managed jobs by (state, reason): held jobs by why mig-batchd has not released them (``pinned``: decided,
    to be released; ``no-room``: MIG fits nowhere now; ``held-by-user``; or a wait's category), pending ones by
    the batch system's reason, running ones without one."""
    counts: Counter[Labels] = Counter()
    for job in jobs:
        if not job.managed or job.state is JobState.FINISHED:
            continue
        reason = ""
        if job.state is JobState.HELD:
            if job.held_by_user:
                reason = "held-by-user"
            elif job.job_id in waits:
                reason = wait_category(waits[job.job_id])
            else:
                reason = "pinned" if job.job_id in decided else "no-room"
        elif job.state is JobState.PENDING:
            reason = _REASON_CHARS.sub("_", job.reason)[:40] or "none"
        counts[(("state", job.state.value), ("reason", reason))] += 1
    return counts


def slice_counts(view: Cluster) -> dict[Labels, float]:
    """Memory slices per (node, model, state): ``used`` by an instance, ``free``, or ``fenced`` (free on a GPU
    that may take no placement now: node down, MIG mode off)."""
    counts: dict[Labels, float] = {}
    for gpu in view.gpus:
        total = view.models[gpu.model].memory_slices
        used = gpu.mask.bit_count()
        free_state = "fenced" if gpu.gid in view.fenced else "free"
        for state, n in (("used", used), (free_state, total - used)):
            key = (("node", gpu.host), ("model", gpu.model), ("state", state))
            counts[key] = counts.get(key, 0) + n
    for (node, model, _state) in list(counts):  # every state of a (node, model) present, 0 or not
        for state in ("used", "free", "fenced"):
            counts.setdefault((node, model, ("state", state)), 0)
    return dict(sorted(counts.items()))


def node_families(nodes: Iterable[NodeStatus], inventory: Container[str]) -> list[Family]:
    up: dict[Labels, float] = {}
    reconciled: dict[Labels, float] = {}
    for n in nodes:
        if n.node not in inventory:
            continue
        up[(("node", n.node),)] = float(n.up)
        agent = parse_agent_tag(n.agent_tag)
        if agent is not None:
            reconciled[(("node", n.node),)] = agent.reconciled
    return [gauge("mig_batch_node_up", "1 when the batch system reports the node up at the last good pass", up),
            gauge("mig_batch_node_agent_reconciled_timestamp_seconds",
                  "the node agent's last reconcile, as it published it (epoch)", reconciled)]  # fmt: skip


class EventTally:
    """Counters from the store's event log since this daemon started: every kind, and the ones an operator
    graphs (decisions, chain grants, requeues, instances made and destroyed, strays, node problems by node)."""

    def __init__(self) -> None:
        self.last_id: int | None = None
        self.kinds: Counter[str] = Counter()
        self.grants = 0
        self.strays = 0
        self.node_problems: Counter[str] = Counter()

    def add(self, rows: Iterable[tuple[int, str, str]]) -> None:
        """Events as (id, kind, detail JSON), oldest first."""
        for event_id, kind, detail in rows:
            self.last_id = event_id
            self.kinds[kind] += 1
            if kind in ("decided", "node-back", "node-problem"):
                try:
                    data: Any = json.loads(detail)
                except ValueError:
                    continue
                if not isinstance(data, dict):
                    continue
                if kind == "decided" and data.get("subjob") is not None:
                    self.grants += 1
                elif kind == "node-back" and isinstance(data.get("strays"), int):
                    self.strays += data["strays"]
                elif kind == "node-problem":
                    self.node_problems[str(data.get("node", ""))] += 1

    def read(self, store: Store) -> None:
        """The events written since the last read (the first read only notes where the log ends)."""
        db = store.db
        if self.last_id is None:
            self.last_id = db.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
            return
        self.add(db.execute("SELECT id, kind, detail FROM events WHERE id>? ORDER BY id", (self.last_id,)))

    def families(self) -> list[Family]:
        k = self.kinds
        return [
            counter("mig_batch_events", "events recorded in the store, by kind", {(("kind", kind),): n
                                                                                 for kind, n in sorted(k.items())}),
            counter("mig_batch_decisions", "placements decided (subjob grants included)", k["decided"]),
            counter("mig_batch_chain_grants", "gaps granted to subjob chains", self.grants),
            counter("mig_batch_requeues", "jobs requeued (a node's report, a node lost, ...)", k["requeued"]),
            counter("mig_batch_instances_created", "MIG instances the nodes reported made", k["instance-created"]),
            counter("mig_batch_instances_destroyed", "MIG instances reported destroyed", k["instance-destroyed"]),
            counter("mig_batch_strays_destroyed", "stray instances the nodes destroyed before coming back",
                    self.strays),
            counter("mig_batch_node_problems", "node problems (node-problem events), by node",
                    {(("node", n),): c for n, c in sorted(self.node_problems.items())}),
        ]


def health_families(health: Health, passes: Mapping[str, int], seconds: Histogram, placed: int,
                    ended: int) -> list[Family]:  # fmt: skip
    return [
        counter("mig_batch_passes", "mig-batchd's passes by result", {(("result", r),): n for r, n in passes.items()}),
        seconds.family("mig_batch_pass_duration_seconds", "how long a good pass took"),
        gauge("mig_batch_last_good_pass_timestamp_seconds", "the end of the last good pass (epoch; 0: none yet)",
              health.last_good or 0.0),
        gauge("mig_batch_batch_system_up", "0 while passes fail because the batch system does not answer",
              float(not (health.down and health.batch_failure))),
        gauge("mig_batch_failing_passes", "passes failed in a row", health.failures),
        gauge("mig_batch_next_pass_delay_seconds", "the wait before the next pass (backoff while failing)",
              health.delay()),
        counter("mig_batch_placed", "jobs placed (pinned and released, or bound to a prompt slot)", placed),
        counter("mig_batch_ended", "decided jobs seen ended", ended),
    ]


# --- the controller's side: what the pass hands over -------------------------------------------------


class ControllerMetrics:
    """What the controller thread keeps for the metrics, and the last text rendered (read by the server)."""

    def __init__(self) -> None:
        self.passes: dict[str, int] = {"ok": 0, "failed": 0}
        self.seconds = Histogram()
        self.placed = 0
        self.ended = 0
        self.events = EventTally()
        self._snapshot: list[Family] = []  # jobs, slices and nodes at the last good pass (at most each second)
        self._counted_at = -1e300
        self._snapshot_text: str | None = ""  # _snapshot rendered (None: counted again since)
        self._snapshot_lines = LineCache()
        self._text = render([]).encode()  # what the last pass published: the bytes a scrape sends

    def passed(self, seconds: float, placed: int, ended: int) -> None:
        self.passes["ok"] += 1
        self.seconds.observe(seconds)
        self.placed += placed
        self.ended += ended

    def failed(self) -> None:
        self.passes["failed"] += 1

    def due(self, now: float) -> bool:
        """Whether the jobs, slices and nodes are to be counted again (at most every SNAPSHOT_EVERY_S)."""
        return now - self._counted_at >= SNAPSHOT_EVERY_S

    def count_snapshot(self, now: float, jobs: Iterable[BatchJob], waits: Mapping[str, str],
                       view: Cluster, nodes: Iterable[NodeStatus], inventory: Container[str]) -> None:  # fmt: skip
        self._counted_at = now
        self._snapshot = [
            gauge("mig_batch_jobs", "managed jobs the batch system lists, by state and why they wait",
                  dict(sorted(job_counts(jobs, waits, view.job_gpu).items()))),
            gauge("mig_batch_slices", "MIG memory slices per node and model: used, free, fenced (free, not placeable)",
                  slice_counts(view)),
            *node_families(nodes, inventory),
        ]
        self._snapshot_text = None

    def publish(self, health: Health, store: Store | None) -> None:
        """Hand the server this pass's text (after each pass, good or failed), rendered here once: a scrape only
        sends these bytes. The jobs, slices and nodes (most of the text on a large inventory) are rendered only
        when they were counted again (at most each SNAPSHOT_EVERY_S)."""
        if store is not None:
            try:
                self.events.read(store)
            except Exception as exc:  # the metrics must never stop a pass
                log.debug("metrics: events not read: %s", exc)
        if self._snapshot_text is None:
            self._snapshot_text = self._snapshot_lines.text(self._snapshot)
        body = (_body(health_families(health, self.passes, self.seconds, self.placed, self.ended))
                + self._snapshot_text + render(self.events.families()))  # ends with # EOF
        self._text = body.encode()  # one assignment: a scrape sends one pass's text, whole

    def text(self) -> bytes:
        """The last pass's text (OpenMetrics, UTF-8), as published."""
        return self._text


def _body(families: list[Family]) -> str:
    """The families' lines without the closing ``# EOF`` (the text ends once, after the last family)."""
    return render(families).removesuffix("# EOF\n")


class LineCache:
    """Families rendered as :func:`render` does (less ``# EOF``), kept from the last time: counted again each
    second, the jobs, slices and nodes of a large inventory change in few samples, and only those are rendered
    again (a family whose samples are all the same is not looked at further). A sample is known by its value's
    equality: 1 and 1.0 render alike, as any two equal numbers below 1e15 do (the snapshot's are)."""

    def __init__(self) -> None:
        self._families: dict[tuple[str, str, str], tuple[list[_Sample], str]] = {}  # samples and text by family
        self._lines: dict[tuple[str, str], dict[_Sample, str]] = {}  # each sample's line by family

    def text(self, families: Iterable[Family]) -> str:
        out: list[str] = []
        kept: dict[tuple[str, str, str], tuple[list[_Sample], str]] = {}
        kept_lines: dict[tuple[str, str], dict[_Sample, str]] = {}
        for f in families:
            which = (f.kind, f.name, f.help)
            before = self._families.get(which)
            old = self._lines.get((f.kind, f.name), {})
            if before is not None and before[0] == f.samples:
                text, lines = before[1], old
            else:
                missing = [s for s in f.samples if s not in old]
                rendered = _body([Family(f.name, f.kind, f.help, missing)]).split("\n")  # TYPE, HELP, a line each
                new = dict(zip(missing, (line + "\n" for line in rendered[2:]), strict=False))
                lines = {**{s: old[s] for s in f.samples if s in old}, **new}
                text = "\n".join(rendered[:2]) + "\n" + "".join([lines[s] for s in f.samples])
            kept[which] = (list(f.samples), text)
            kept_lines[(f.kind, f.name)] = lines
            out.append(text)
        self._families, self._lines = kept, kept_lines  # the last text's only: nodes gone are forgotten
        return "".join(out)


# --- the HTTP edge ---------------------------------------------------------------------------------------

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
