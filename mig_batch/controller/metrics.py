"""mig-batchd's metrics (OpenMetrics), for ``metrics_listen``.

The numbers are computed from a pass's snapshot and the view by pure functions (:func:`job_counts`,
:func:`slice_counts`, :func:`node_families`) and from the store's events as they are written
(:class:`EventTally`, tailing the event log by id: counters since this daemon started); the pass's own
(duration, outcome, last good pass, backoff) come from :class:`~mig_batch.controller.health.Health`. The
controller's thread computes the families after each pass (:class:`ControllerMetrics`); the HTTP server
(:class:`MetricsServer`, a thread of the standard library's http.server) only renders the last pass's, so a
scrape never touches the view or the store, and a scrape while the batch system is down still answers, with
the last good pass.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
        self._families: list[Family] = []  # what the last pass published; rendered when scraped
        self._lock = threading.Lock()

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

    def publish(self, health: Health, store: Store | None) -> None:
        """Hand the server this pass's families (after each pass, good or failed); a scrape renders them."""
        if store is not None:
            try:
                self.events.read(store)
            except Exception as exc:  # the metrics must never stop a pass
                log.debug("metrics: events not read: %s", exc)
        families = [*health_families(health, self.passes, self.seconds, self.placed, self.ended),
                    *self._snapshot, *self.events.families()]  # fmt: skip
        with self._lock:
            self._families = families  # a new list each pass: a scrape renders one pass's, whole

    def text(self) -> str:
        with self._lock:
            families = self._families
        return render(families)


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    timeout = 10  # seconds a client may take to send its request: a silent one must not keep a thread

    def do_GET(self) -> None:
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404, "mig-batchd serves /metrics")
            return
        body = self.server.metrics.text().encode()
        self.send_response(200)
        self.send_header("Content-Type", OPENMETRICS_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every 15 s is not worth a log line


class MetricsServer(ThreadingHTTPServer):
    """GET /metrics: the last text :class:`ControllerMetrics` rendered. A thin edge: it computes nothing."""

    daemon_threads = True

    def __init__(self, host: str, port: int, metrics: ControllerMetrics):
        import socket

        self.metrics = metrics
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="mig-batchd-metrics", daemon=True)
        thread.start()
        return thread
