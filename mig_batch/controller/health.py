"""How mig-batchd's passes are going, and how fresh its view of each node is: pure, on an injected clock.

A failing pass (the batch system does not answer, or a bug) backs off exponentially from the poll interval to
``BACKOFF_CAP_S``; the daemon logs and records one line per change of state (down, back), not one per pass.
What ``mig-batch status`` and the metrics say of it comes from :class:`Health` through a small JSON file
beside the store (:func:`health_path`), written by the daemon (the store's schema stays as it is).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKOFF_CAP_S = 30.0  # the longest wait between two failing passes
STALE_MIN_S = 15.0  # a node not read for this long (or 5 poll intervals, if longer) is stale
HEALTH_SUFFIX = ".health.json"

FRESH, STALE, NEVER_READ, DOWN = "fresh", "stale", "never read", "down"


def health_path(store: Path) -> Path:
    """The file beside the store where mig-batchd says how its passes go (``state.db.health.json``)."""
    return store.with_name(store.name + HEALTH_SUFFIX)


def stale_after(poll_interval_s: float) -> float:
    return max(STALE_MIN_S, 5 * poll_interval_s)


@dataclass(frozen=True)
class Change:
    """A change of state of the passes: ``down`` (the first failing pass) or ``back`` (the first good one after)."""

    kind: str  # "down" | "back"
    batch: bool  # the batch system failed (else a bug: an unexpected exception)
    error: str  # down: why; back: the last error
    down_for_s: float = 0.0  # back: since the first failing pass
    failures: int = 0  # back: how many passes failed


@dataclass
class Health:
    """The passes' state: when the last good one ended, since when they fail, and the next wait."""

    poll_interval_s: float
    cap_s: float = BACKOFF_CAP_S
    last_good: float | None = None  # the clock's time at the end of the last good pass
    failing_since: float | None = None
    failures: int = 0  # failing passes in a row
    error: str = ""  # the last failure, one line
    batch_failure: bool = False  # the last failure was the batch system's
    node_read: dict[str, float] = field(default_factory=dict)  # node -> the last good pass that listed it
    node_up: dict[str, bool] = field(default_factory=dict)  # node -> up at that read
    node_reconciled: dict[str, float] = field(default_factory=dict)  # node -> its agent's last reconcile

    def succeeded(self, now: float, nodes: Iterable[tuple[str, bool, float | None]] = ()) -> Change | None:
        """A good pass ended at ``now``, having read ``nodes`` (name, up, agent's reconcile time or None).
        The change to report when passes had been failing."""
        for name, up, reconciled in nodes:
            self.node_read[name] = now
            self.node_up[name] = up
            if reconciled is not None:
                self.node_reconciled[name] = reconciled
        self.last_good = now
        if self.failing_since is None:
            return None
        change = Change("back", self.batch_failure, self.error, now - self.failing_since, self.failures)
        self.failing_since, self.failures = None, 0
        return change

    def failed(self, now: float, error: str, batch: bool) -> Change | None:
        """A pass failed at ``now``; the change to report when it is the first to fail, or when the failure
        turns from the batch system's to a bug or back (each is logged once)."""
        line = " ".join(error.split()) or "(no message)"
        if len(line) > 300:  # a failed command's line is long; its reason comes last
            line = f"{line[:100]} ... {line[-195:]}"
        first = self.failing_since is None
        changed = not first and batch != self.batch_failure
        if first:
            self.failing_since = now
        self.failures += 1
        self.error, self.batch_failure = line, batch
        return Change("down", batch, line) if first or changed else None

    def delay(self) -> float:
        """Seconds to wait before the next pass: the poll interval, doubled per failing pass to the cap."""
        if not self.failures:
            return self.poll_interval_s
        base = max(self.poll_interval_s, 0.1)
        return min(self.cap_s, base * 2.0 ** min(self.failures, 30))

    @property
    def down(self) -> bool:
        return self.failing_since is not None

    def to_json(self, now: float) -> dict[str, Any]:
        return {"written": now, "poll_interval_s": self.poll_interval_s, "last_good_pass": self.last_good,
                "failing_since": self.failing_since, "failures": self.failures, "error": self.error,
                "batch_failure": self.batch_failure, "next_pass_in_s": self.delay(),
                "nodes": {n: {"read": t, "up": self.node_up.get(n, False), "reconciled": self.node_reconciled.get(n)}
                          for n, t in sorted(self.node_read.items())}}  # fmt: skip


def node_state(health: Mapping[str, Any] | None, node: str, now: float) -> tuple[str, float | None]:
    """What ``mig-batch status`` may say of ``node`` from mig-batchd's health file (None: no file): fresh,
    stale (not read for :func:`stale_after`), never read, or down (the batch system said so at its last
    read); and when it was last read. Only a fresh node's free slices are shown free."""
    if not health:
        return NEVER_READ, None
    seen = health.get("nodes", {}).get(node)
    if not isinstance(seen, Mapping) or not isinstance(seen.get("read"), int | float):
        return NEVER_READ, None
    read = float(seen["read"])
    if now - read > stale_after(float(health.get("poll_interval_s", 1.0))):
        return STALE, read
    return (FRESH if seen.get("up") else DOWN), read


def read_health(path: Path) -> dict[str, Any] | None:
    """The health file's content; None when there is none, or it cannot be read as one."""
    try:
        data = json.loads(path.read_bytes()[:1 << 22])
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def age_text(seconds: float | None) -> str:
    """``3 s``, ``4 min``, ``2.5 h``, ``never``."""
    if seconds is None or not math.isfinite(seconds):
        return "never"
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
