"""mig-batchd's metrics (OpenMetrics), for ``metrics_listen``.

The numbers are computed from a pass's snapshot and the view by pure functions (:func:`job_counts`,
:func:`slice_counts`, :func:`node_families`) and from the store's events as they are written
(:class:`EventTally`, tailing the event log by id: counters since this daemon started); the pass's own
(duration, outcome, last good pass, backoff) come from :class:`~mig_batch.controller.health.Health`. The
controller's thread computes the families and renders their text after each pass (:class:`ControllerMetrics`);
the HTTP server (:mod:`mig_batch.controller.metrics_server`, one thread on non-blocking sockets) only sends the
last pass's bytes, so a scrape never touches the view or the store nor renders anything, and a scrape while the
batch system is down still answers, with the last good pass. The server holds at most a few dozen sockets, each
for a few seconds at most: no client, however slow or numerous, can take mig-batchd's file descriptors or keep
a scrape out.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from typing import Any

from mig_batch.batch.system import BatchJob, JobState, NodeStatus
from mig_batch.batch.tags import parse_agent_tag
from mig_batch.controller.health import Health
from mig_batch.node.metrics import Family, Histogram, Labels, counter, gauge, render
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
