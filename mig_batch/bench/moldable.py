"""Cost of one controller pass over waiting moldable jobs, against cluster size.

Each cluster is preloaded (``bench.placement.preload``) and every instance gets a random expected
end within two hours. One pass then decides a queue of moldable jobs (3 or 4 sizes each, predicted
times shrinking with size): the time to build the timelines and the planner, and each ``decide``,
are measured. Started jobs are applied to the cluster as the controller does.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mig_batch.atomize.gaps import cluster_timelines
from mig_batch.bench.placement import preload
from mig_batch.mig.models import get_model
from mig_batch.placement.moldable import MoldableJob, MoldablePlanner
from mig_batch.placement.policies import make_policy


@dataclass(frozen=True)
class MoldableBenchRow:
    gpus: int
    jobs: int
    setup_ms: float  # timelines + planner for the pass
    p50_us: float
    p99_us: float
    pass_ms: float
    started: int
    reserved: int
    waiting: int


def bench_moldable(sizes: Sequence[int], jobs: int = 200, model: str = "A100-80GB", load: float = 0.9,
                   seed: int = 7) -> list[MoldableBenchRow]:  # fmt: skip
    rows = []
    base = list(get_model(model).base_profiles)
    for n in sizes:
        rng = random.Random(seed)
        cluster = preload(model, n, load, seed)
        now = 1e6
        ends = {job: now + rng.uniform(60, 7200) for gpu in cluster.gpus for job in gpu.instances}
        t0 = time.perf_counter()
        planner = MoldablePlanner(cluster, cluster_timelines(cluster, ends.__getitem__), now, make_policy("mfi"))
        setup = time.perf_counter() - t0
        times, started, reserved = [], 0, 0
        for j in range(jobs):
            work = rng.uniform(600, 7200)
            sizes_ = rng.sample(base, rng.choice([3, 4]))
            job = MoldableJob(f"m{j}", {model: {p.name: work * (3 / p.compute_slices) ** 0.6 for p in sizes_}})
            t = time.perf_counter()
            choice = planner.decide(job)
            times.append(time.perf_counter() - t)
            if choice.placement is not None:
                cluster.allocate(choice.placement.gid, job.job, choice.profile, choice.placement.start)
                started += 1
            reserved += choice.reserved is not None
        us = sorted(t * 1e6 for t in times)
        p99 = us[int(0.99 * (len(us) - 1))]
        rows.append(MoldableBenchRow(n, jobs, setup * 1e3, statistics.median(us), p99, (setup + sum(times)) * 1e3,
                                     started, reserved, jobs - started - reserved))  # fmt: skip
    return rows
