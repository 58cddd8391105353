"""Task sets for the planner: MIG-DRL's synthetic generator (§5.1.2, as its text states it), its five
workload types (§5.1.3), and measured Rodinia times (../shared/data/mig-tasks, Villarrubia et al.).

Generator, per task: t(1) ~ U(t_min, t_max); the task scales near-linearly up to its class size c
(p_c of the tasks have class c) and sub-linearly beyond; p_sup of the tasks start memory-bound,
scaling super-linearly while they stay so, and stop being so with probability 0.3 at each step.
t(s+1) = (s + r) / (s + 1) * t(s) with r ~ N(-0.25, 0.25) clipped to [-0.5, 0] (super-linear),
N(0.1, 0.1) on [0, 0.2] (near-linear), N(0.75, 0.25) on [0.5, 1] (sub-linear). Times are built
slice by slice up to the whole GPU and kept for the GPU's sizes. Class counts are floor(p x n), the
remainder going to the most likely classes first. (The authors' public code differs: see
docs/planner.md.)
"""

from __future__ import annotations

import csv
import io
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mig_batch.planner.problem import Task
from mig_batch.yaml_text import read_text

RODINIA_MAX_BYTES = 16 << 20  # the Rodinia A100 files are a few KiB each


@dataclass(frozen=True)
class WorkloadType:
    name: str
    class_shares: Mapping[int, float]  # class size -> share of tasks (the p_s)
    superlinear_share: float  # p_sup
    t_min: float
    t_max: float


WORKLOAD_TYPES: dict[str, WorkloadType] = {
    w.name: w
    for w in (
        WorkloadType("poorscaling", {1: 0.5, 2: 0.5, 3: 0, 4: 0, 7: 0}, 0.25, 90, 100),
        WorkloadType("goodscaling", {1: 0, 2: 0, 3: 0, 4: 0.5, 7: 0.5}, 0.75, 90, 100),
        WorkloadType("mixscalinguniform", {1: 0.2, 2: 0.2, 3: 0.2, 4: 0.2, 7: 0.2}, 0.5, 90, 100),
        WorkloadType("mixscalingextreme", {1: 0.45, 2: 0.05, 3: 0, 4: 0.05, 7: 0.45}, 0.5, 90, 100),
        WorkloadType("widetimes", {1: 0.2, 2: 0.2, 3: 0.2, 4: 0.2, 7: 0.2}, 0.5, 1, 100),
    )
}
STOP_MEMORY_BOUND = 0.3


def _clipped_normal(rng: random.Random, mean: float, sd: float, low: float, high: float) -> float:
    return min(high, max(low, rng.gauss(mean, sd)))


def class_counts(shares: Mapping[int, float], n: int) -> dict[int, int]:
    counts = {c: int(p * n) for c, p in shares.items()}
    for c in sorted(shares, key=lambda c: (-shares[c], c)):
        if sum(counts.values()) >= n:
            break
        counts[c] += 1
    while sum(counts.values()) < n:  # tiny n: keep filling the likeliest class
        counts[max(shares, key=shares.get)] += 1
    return counts


def synthetic_task(
    rng: random.Random, name: str, class_size: int, memory_bound: bool, t_min: float, t_max: float,
    sizes: list[int],
) -> Task:  # fmt: skip
    times = {1: rng.uniform(t_min, t_max)}
    for s in range(1, max(sizes)):
        if s + 1 > class_size:
            r = _clipped_normal(rng, 0.75, 0.25, 0.5, 1.0)
        elif memory_bound:
            r = _clipped_normal(rng, -0.25, 0.25, -0.5, 0.0)
            if rng.random() < STOP_MEMORY_BOUND:
                memory_bound = False
        else:
            r = _clipped_normal(rng, 0.1, 0.1, 0.0, 0.2)
        times[s + 1] = (s + r) / (s + 1) * times[s]
    return Task(name, {s: times[s] for s in sizes})


def synthetic_dataset(kind: str, n: int, seed: int, sizes: list[int] | None = None) -> list[Task]:
    """``n`` tasks of one workload type, shuffled by ``seed``."""
    if kind not in WORKLOAD_TYPES:
        raise ValueError(f"unknown workload type {kind!r}; known: {', '.join(WORKLOAD_TYPES)}")
    spec = WORKLOAD_TYPES[kind]
    sizes = sizes or [1, 2, 3, 4, 7]
    rng = random.Random(seed)
    tasks = []
    for class_size, count in class_counts(spec.class_shares, n).items():
        for _ in range(count):
            memory_bound = rng.random() < spec.superlinear_share
            name = f"{kind}-{len(tasks)}"
            tasks.append(synthetic_task(rng, name, class_size, memory_bound, spec.t_min, spec.t_max, sizes))
    rng.shuffle(tasks)
    return tasks


def read_rodinia(folder: Path, gpu: str) -> list[Task]:
    """Mean measured time per benchmark and size from ``<size>g_<gpu>.csv`` files (``prueba``, t1..)."""
    per: dict[str, dict[int, float]] = {}
    files = sorted(folder.glob(f"*g_{gpu}.csv"))
    if not files:
        raise ValueError(f"no <size>g_{gpu}.csv files in {folder}")
    for path in files:
        size_text = path.name.split("g_")[0]
        if not size_text.isdigit() or len(size_text) > 2:
            raise ValueError(f"{path.name}: expected <size>g_{gpu}.csv, e.g. 3g_{gpu}.csv")
        # read as every input file is (UTF-8 or refused naming the file, at most RODINIA_MAX_BYTES)
        reader = csv.DictReader(io.StringIO(read_text(path, "a Rodinia task-time file (CSV)", RODINIA_MAX_BYTES),
                                            newline=""))  # fmt: skip
        try:
            for line, row in enumerate(reader, 2):
                samples = [float(v) for k, v in row.items() if isinstance(k, str) and k.startswith("t") and v]
                if not samples or not row.get("prueba"):
                    raise ValueError(f"{path}:{line}: expected a benchmark name (prueba) and its times (t1, t2...)")
                per.setdefault(row["prueba"], {})[int(size_text)] = statistics.fmean(samples)
        except csv.Error as exc:  # a field over csv's limit, a quote never closed
            raise ValueError(f"{path}:{reader.line_num}: not CSV: {exc}") from None
    return [Task(name, times) for name, times in per.items()]
