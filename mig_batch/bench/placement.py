"""Decision latency of the placement policies against cluster size.

Each cluster is preloaded once to about ``load`` of its memory slices with random instances at random
free starts (a realistic mix of occupancy masks); every policy then decides the same stream of random
requests. A placed request is applied and immediately released, so all policies see the same state.
Only ``decide`` is timed.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mig_batch.mig.models import get_model
from mig_batch.placement.base import Placement, PlacementRequest
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.policies import make_policy


@dataclass(frozen=True)
class BenchRow:
    policy: str
    gpus: int
    decisions: int
    decisions_per_s: float
    p50_us: float
    p99_us: float
    placed: int


def preload(model: str, n_gpus: int, load: float, seed: int) -> Cluster:
    cluster = Cluster.homogeneous(model, n_gpus)
    tables = cluster.tables[cluster.gpus[0].model]
    names = tables.base_names
    rng = random.Random(seed)
    target = load * cluster.total_slices()
    allocated, job = 0, 0
    while allocated < target:
        gpu = cluster.gpus[rng.randrange(n_gpus)]
        k = rng.randrange(len(names))
        starts = tables.free_starts[k][gpu.mask]
        if starts:
            start = rng.choice(starts)
            cluster.allocate(gpu.gid, f"pre{job}", names[k], start)
            allocated += tables.model.profile(names[k]).memory_slices
            job += 1
    return cluster


def bench_placement(
    policies: Sequence[str],
    sizes: Sequence[int],
    model: str = "A100-80GB",
    decisions: int = 2000,
    load: float = 0.7,
    seed: int = 7,
) -> list[BenchRow]:
    model_name = get_model(model).name
    rows = []
    for size in sizes:
        cluster = preload(model_name, size, load, seed)
        names = cluster.tables[model_name].base_names
        rng = random.Random(seed + 1)
        stream = [rng.choice(names) for _ in range(decisions)]
        ends = [float(rng.randrange(1, 10**6)) for _ in range(decisions)]  # for policies that use end times
        for name in policies:
            policy = make_policy(name)
            timings, placed = [], 0
            for i, profile in enumerate(stream):
                request = PlacementRequest.single(f"b{i}", model_name, profile, now=0.0, end=ends[i])
                t0 = time.perf_counter_ns()
                decision = policy.decide(cluster, request)
                timings.append(time.perf_counter_ns() - t0)
                if isinstance(decision, Placement):
                    placed += 1
                    cluster.allocate(decision.gid, request.job, decision.profile, decision.start)
                    cluster.release(request.job)
            timings.sort()
            rows.append(
                BenchRow(
                    policy=name,
                    gpus=size,
                    decisions=decisions,
                    decisions_per_s=1e9 / statistics.fmean(timings),
                    p50_us=timings[len(timings) // 2] / 1000,
                    p99_us=timings[int(len(timings) * 0.99)] / 1000,
                    placed=placed,
                )
            )
    return rows
