"""After each pass of mig-batchd, good or failed: the backoff, one log line and one event per change of state
(``batch-down`` / ``batch-back``; ``pass-failing`` / ``passes-back`` for a bug), the health file that
``mig-batch status`` reads, and the metrics' text. The decisions are :class:`~.health.Health`'s (pure)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from mig_batch.batch.tags import parse_agent_tag
from mig_batch.controller.health import Change, Health, health_path
from mig_batch.controller.metrics import ControllerMetrics
from mig_batch.controller.snapshot import PassSnapshot
from mig_batch.placement.cluster import Cluster
from mig_batch.safe_files import write_file
from mig_batch.state import Store

log = logging.getLogger("mig-batchd")
HEALTH_WRITE_EVERY_S = 1.0  # the health file is written at most this often, and at each change of state


class PassOutcomes:
    def __init__(self, store: Store, health: Health, clock: Callable[[], float],
                 metrics: ControllerMetrics | None = None):  # fmt: skip
        self.store, self.health, self.clock, self.metrics = store, health, clock, metrics
        path = str(getattr(store, "path", "") or "")
        self.file = health_path(store.path) if path and path != ":memory:" else None
        self._written = -1e300
        if metrics is not None:
            metrics.publish(health, store)  # the event log's end now: its counters count from this start
        self._file_failed = False

    def good(self, seconds: float, placed: int, ended: int, snapshot: PassSnapshot | None, view: Cluster,
             waits: dict[str, str]) -> None:  # fmt: skip
        now = self.clock()
        nodes = [] if snapshot is None else [
            (n.node, n.up, agent.reconciled if (agent := parse_agent_tag(n.agent_tag)) else None)
            for n in snapshot.nodes if n.node in snapshot.inventory]  # fmt: skip
        change = self.health.succeeded(now, nodes)
        if change is not None:
            self._report(change)
        if self.metrics is not None:
            self.metrics.passed(seconds, placed, ended)
            if snapshot is not None and self.metrics.due(now):
                self.metrics.count_snapshot(now, snapshot.jobs.values(), waits, view, snapshot.nodes,
                                            snapshot.inventory)  # fmt: skip
        self._publish(now, change is not None)

    def failed(self, error: str, batch: bool) -> None:
        now = self.clock()
        change = self.health.failed(now, error, batch)
        if change is not None:
            self._report(change)
        if self.metrics is not None:
            self.metrics.failed()
        self._publish(now, change is not None)

    def delay(self) -> float:
        return self.health.delay()

    def _report(self, change: Change) -> None:
        what = "the batch system" if change.batch else "passes"
        if change.kind == "down":
            if change.batch:
                log.warning("the batch system does not answer: %s; passes retried with backoff up to %.0f s "
                            "(a line when it answers again)", change.error, self.health.cap_s)  # fmt: skip
            else:
                log.exception("pass failed: %s; passes retried with backoff up to %.0f s (a line when they "
                              "succeed again)", change.error, self.health.cap_s)  # fmt: skip
            kind = "batch-down" if change.batch else "pass-failing"
            detail: dict[str, object] = {"error": change.error}
        else:
            log.warning("%s back after %.0f s (%d failed passes)", what, change.down_for_s, change.failures)
            kind = "batch-back" if change.batch else "passes-back"
            detail = {"down_for_s": round(change.down_for_s, 1), "failed_passes": change.failures,
                      "error": change.error}  # fmt: skip
        try:
            self.store.event(None, kind, **detail)
        except Exception as exc:  # the store's trouble must not stop the loop
            log.debug("event %s not recorded: %s", kind, exc)

    def _publish(self, now: float, changed: bool) -> None:
        if self.metrics is not None:
            self.metrics.publish(self.health, self.store)
        if self.file is None or (not changed and now - self._written < HEALTH_WRITE_EVERY_S):
            return
        self._written = now
        try:
            write_file(self.file, json.dumps(self.health.to_json(now)), 0o644)
            self._file_failed = False
        except OSError as exc:
            if not self._file_failed:  # once, until it works again
                log.warning("could not write %s (mig-batch status reads it): %s", self.file, exc)
            self._file_failed = True
