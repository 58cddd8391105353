"""Metrics as text: the OpenMetrics exposition mig-batchd serves, the Prometheus text format a node-exporter
textfile collector reads, and the node agent's own metrics (written to such a file).

The standard library only: a :class:`Family` is a name, a type, a help line and its samples; :func:`render`
writes families as OpenMetrics 1.0 (``openmetrics=True``: counters' TYPE lines name the family, ``# EOF`` at
the end) or as the Prometheus text format 0.0.4 (node-exporter's textfile collector).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    name: str  # without _total for a counter
    kind: str  # counter | gauge | histogram
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)  # (suffix, labels, value)

    def add(self, value: float, suffix: str = "", **labels: str) -> Family:
        self.samples.append((suffix, tuple(labels.items()), value))
        return self


def counter(name: str, help: str, values: Mapping[Labels, float] | float) -> Family:
    family = Family(name, "counter", help)
    for labels, value in (values.items() if isinstance(values, Mapping) else [((), values)]):
        family.samples.append(("_total", labels, value))
    return family


def gauge(name: str, help: str, values: Mapping[Labels, float] | float) -> Family:
    family = Family(name, "gauge", help)
    for labels, value in (values.items() if isinstance(values, Mapping) else [((), values)]):
        family.samples.append(("", labels, value))
    return family


class Histogram:
    """A histogram of observations (seconds), cumulative as OpenMetrics has it. Thread-safe."""

    def __init__(self, buckets: Sequence[float] = PASS_BUCKETS):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, value)] += 1
            self.sum += value

    def family(self, name: str, help: str) -> Family:
        with self._lock:
            counts, total = list(self.counts), self.sum
        family = Family(name, "histogram", help)
        running = 0
        for bound, count in zip([*self.buckets, math.inf], counts, strict=True):
            running += count
            family.samples.append(("_bucket", (("le", _number(bound)),), running))
        family.samples.append(("_count", (), running))
        family.samples.append(("_sum", (), total))
        return family


def render(families: Iterable[Family], openmetrics: bool = True) -> str:
    lines = []
    for f in families:
        typed = f.name if openmetrics or f.kind != "counter" else f.name + "_total"
        lines.append(f"# TYPE {typed} {f.kind}")
        lines.append(f"# HELP {typed} {_escape(f.help)}")
        for suffix, labels, value in f.samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{f.name}{suffix}{'{' + text + '}' if text else ''} {_number(value)}")
    if openmetrics:
        lines.append("# EOF")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) or abs(value) >= 1e15 else str(int(value))


# --- the node agent's metrics ----------------------------------------------------------------------


class AgentMetrics:
    """What the node agent counts: hooks answered by outcome and how long a prolog took, reconciles and the
    strays they destroyed. :meth:`families` adds what the agent itself knows (its start, last reconcile,
    problems, instances in its journal). Thread-safe: the socket's workers and the sweep count into it."""

    def __init__(self) -> None:
        self.hooks: dict[tuple[str, str], int] = {}  # (hook, outcome) -> count
        self.prolog_seconds = Histogram()
        self.reconciles = 0
        self.reconcile_failures = 0
        self.strays = 0
        self._lock = threading.Lock()
        self.changed = threading.Event()  # set at each count: the writer writes the file again

    def hook(self, hook: str, outcome: str, seconds: float | None = None) -> None:
        with self._lock:
            key = (hook, outcome)
            self.hooks[key] = self.hooks.get(key, 0) + 1
        if seconds is not None:
            self.prolog_seconds.observe(seconds)
        self.changed.set()

    def reconciled(self, strays: int, failed: bool = False) -> None:
        with self._lock:
            self.reconciles += 1
            self.reconcile_failures += failed
            self.strays += strays
        self.changed.set()

    def families(self, node: str, started: float, reconciled: float, problems: int,
                 instances: int) -> list[Family]:  # fmt: skip
        with self._lock:
            hooks: dict[Labels, float] = {(("node", node), ("hook", h), ("outcome", o)): float(n)
                                          for (h, o), n in sorted(self.hooks.items())}
            reconciles, failures, strays = self.reconciles, self.reconcile_failures, self.strays
        at = (("node", node),)
        return [
            counter("mig_batch_agent_hooks", "hooks the node agent answered, by hook and outcome", hooks),
            _with_node(self.prolog_seconds.family("mig_batch_agent_prolog_seconds",
                                                  "how long the agent took to answer a prolog"), node),
            counter("mig_batch_agent_reconciles", "reconciles the agent ran", {at: reconciles}),
            counter("mig_batch_agent_reconcile_failures", "reconciles that failed", {at: failures}),
            counter("mig_batch_agent_strays_destroyed", "stray MIG instances reconciles destroyed", {at: strays}),
            counter("mig_batch_agent_problems", "problems the agent published (a prolog that could not place, an "
                    "epilog that could not destroy, strays)", {at: problems}),
            gauge("mig_batch_agent_instances", "MIG instances in the agent's journal", {at: instances}),
            gauge("mig_batch_agent_start_time_seconds", "when the agent started (epoch)", {at: started}),
            gauge("mig_batch_agent_last_reconcile_timestamp_seconds", "the agent's last reconcile (epoch; 0: none)",
                  {at: reconciled}),
        ]


def _with_node(family: Family, node: str) -> Family:
    family.samples = [(s, (("node", node), *labels), v) for s, labels, v in family.samples]
    return family


def write_textfile(path: Path, text: str) -> None:
    """Replace a node-exporter textfile collector file whole (its directory must be trusted: safe_files)."""
    from mig_batch.safe_files import untrusted_dir, write_file

    why = untrusted_dir(path.parent)
    if why:
        from mig_batch.safe_files import UnsafePath

        raise UnsafePath(why)
    write_file(path, text, 0o644)
