"""The Alibaba GPU trace 2023 ("openb") as MIG requests, the way GRMU §8.1 builds its workload.

Nodes become hosts and every GPU an A100; each pod asks for one MIG profile chosen by GRMU's
eqs. 27-30: pod GPU demand g = num_gpu x gpu_milli / 1000, pods with g > 1 dropped, g normalised by
its maximum, profile value = compute units + memory units normalised by the largest, closest value
wins. Arrival-time outliers are dropped first with the IQR rule. Data: Weng et al., "Beware of
Fragmentation", USENIX ATC'23 (alibaba/clusterdata, cluster-trace-gpu-v2023); research/study use.

Reading the CSVs is the only I/O here; the mapping is pure.
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mig_batch.errors import MigBatchError
from mig_batch.mig.models import GpuModel
from mig_batch.sim.workloads import Arrival
from mig_batch.yaml_text import NotTextError, read_text, shown

POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time")
NODE_COLUMNS = ("sn", "gpu")
MAX_TRACE_BYTES = 64 << 20  # the Alibaba 2023 files are under 1 MiB each


class TraceError(MigBatchError, ValueError):
    """A trace file that is missing, malformed or lacks a column we need."""


@dataclass(frozen=True)
class TracePod:
    name: str
    num_gpu: int
    gpu_milli: int
    creation: int  # seconds from trace start
    deletion: int
    qos: str = ""  # LS (latency-sensitive), BE (best-effort batch), ...; "" when the file has no column

    @property
    def gpu_demand(self) -> float:
        return self.num_gpu * self.gpu_milli / 1000


@dataclass(frozen=True)
class TraceNode:
    name: str
    gpus: int


def _rows(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a trace CSV file (read as every file we are given is: :func:`read_text`), each with every
    ``required`` column."""
    try:
        text = read_text(path, "a trace file (CSV)", MAX_TRACE_BYTES)
    except OSError as exc:
        raise TraceError(f"cannot read trace file {path}: {exc.strerror}") from exc
    except NotTextError as exc:
        raise TraceError(str(exc)) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; need {', '.join(required)} in its "
                             f"first line")  # fmt: skip
        rows = list(reader)
    except csv.Error as exc:  # a field over csv's limit (128 KiB), a quote never closed...
        raise TraceError(f"{path}:{reader.line_num}: not CSV as a trace is: {exc}") from None
    for line, row in enumerate(rows, 2):
        short = [c for c in required if row.get(c) is None]
        if short:
            raise TraceError(f"{path}:{line}: no value for column(s) {', '.join(short)}; each line has one per "
                             f"column of the first")  # fmt: skip
    return rows


def _int(path: Path, line: int, column: str, text: str) -> int:
    if len(text) <= 30:  # no trace counts past 30 digits (and int() refuses over 4,300 with its own words)
        with contextlib.suppress(ValueError):
            return int(text)
    raise TraceError(f"{path}:{line}: column {column} must be an integer, got {shown(text)}")


def read_pods(path: Path) -> list[TracePod]:
    pods = []
    for line, row in enumerate(_rows(path, POD_COLUMNS), 2):
        fields = {c: _int(path, line, c, row[c]) for c in POD_COLUMNS[1:]}
        pods.append(
            TracePod(
                row["name"],
                fields["num_gpu"],
                fields["gpu_milli"],
                fields["creation_time"],
                fields["deletion_time"],
                row.get("qos") or "",
            )
        )
    return pods


def read_variant_pods(path: Path, timed: Sequence[TracePod]) -> list[TracePod]:
    """A pod list of any trace variant. The ``multigpu*`` files have no time columns: their pods take
    creation and deletion times from ``timed`` (the default trace) by name; the added pods, which
    the default trace lacks, must all ask for more than one GPU and are dropped here, as GRMU §8.1
    drops every multi-GPU pod."""
    with_times = _rows(path, ("name",))
    if with_times and "creation_time" in with_times[0]:
        return read_pods(path)
    times = {p.name: p for p in timed}
    pods = []
    for line, row in enumerate(_rows(path, POD_COLUMNS[:3]), 2):
        num_gpu, gpu_milli = (_int(path, line, c, row[c]) for c in POD_COLUMNS[1:3])
        known = times.get(row["name"])
        if known is None:
            if num_gpu * gpu_milli / 1000 <= 1:
                raise TraceError(f"{path}:{line}: pod {row['name']} has no time columns and is not in the timed trace")
            continue
        pods.append(TracePod(row["name"], num_gpu, gpu_milli, known.creation, known.deletion, known.qos))
    return pods


def read_nodes(path: Path) -> list[TraceNode]:
    """GPU nodes only (nodes with no GPU cannot host a MIG request)."""
    nodes = []
    for line, row in enumerate(_rows(path, NODE_COLUMNS), 2):
        gpus = _int(path, line, "gpu", row["gpu"])
        if gpus > 0:
            nodes.append(TraceNode(row["sn"], gpus))
    return nodes


def _quantile(sorted_values: Sequence[int], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    position = (len(sorted_values) - 1) * q
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def drop_arrival_outliers(pods: Sequence[TracePod]) -> list[TracePod]:
    """IQR rule on creation time: keep pods within [Q1 - 1.5 IQR, Q3 + 1.5 IQR]."""
    if not pods:
        return []
    times = sorted(p.creation for p in pods)
    q1, q3 = _quantile(times, 0.25), _quantile(times, 0.75)
    low, high = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
    return [p for p in pods if low <= p.creation <= high]


def profile_values(model: GpuModel) -> dict[str, float]:
    """GRMU eqs. 28-29: (compute + memory units) / max over the model's profiles (no +me variants)."""
    raw = {p.name: p.compute_slices + p.memory_slices for p in model.base_profiles}
    top = max(raw.values())
    return {name: value / top for name, value in raw.items()}


def map_pods_to_profiles(pods: Sequence[TracePod], model: GpuModel) -> list[tuple[TracePod, str]]:
    """GRMU eqs. 27-30 after the outlier and >1-GPU filters; ties go to the smaller profile."""
    kept = [p for p in drop_arrival_outliers(pods) if p.gpu_demand <= 1]
    if not kept:
        return []
    top = max(p.gpu_demand for p in kept) or 1.0
    values = sorted(profile_values(model).items(), key=lambda kv: kv[1])
    mapped = []
    for pod in kept:
        demand = pod.gpu_demand / top
        name = min(values, key=lambda kv: abs(kv[1] - demand))[0]
        mapped.append((pod, name))
    return mapped


def trace_arrivals(pods: Sequence[TracePod], model: GpuModel) -> list[Arrival]:
    """Arrivals in creation order (ties by name), time in seconds from the first kept arrival."""
    mapped = sorted(map_pods_to_profiles(pods, model), key=lambda pm: (pm[0].creation, pm[0].name))
    if not mapped:
        return []
    origin = mapped[0][0].creation
    return [
        Arrival(
            pod.name,
            pod.creation - origin,
            profile,
            max(1, pod.deletion - pod.creation),  # zero-length pods still hold an instance briefly
            model.profile(profile).memory_slices,
        )
        for pod, profile in mapped
    ]
