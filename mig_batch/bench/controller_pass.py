"""Cost of one mig-batchd pass (``Controller.step``) against cluster size and queue length, on the
in-memory batch system (no Slurm: the batch system's own time is not in the figures).

Each cluster (A100-80GB nodes) gets ``jobs_per_gpu`` times its GPU count of rigid MIG jobs, of mixed
profiles, all at once: the first pass places what fits and the rest stay queued. Then every pass
the batch system starts what was released, ``churn`` running jobs end and ``churn`` new jobs arrive,
as on a busy site; those steady passes are timed. A pass reads every job, follows every running
job's decision, forgets the ended ones' instances and tries every queued job.
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import JobState
from mig_batch.batch.tags import NodeReport, parse_place
from mig_batch.config import SiteConfig
from mig_batch.controller.daemon import Controller
from mig_batch.state import Store

PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@dataclass(frozen=True)
class PassBenchRow:
    gpus: int
    nodes: int
    running: int  # after the last timed pass
    queued: int
    placed_per_pass: float
    p50_ms: float
    max_ms: float


def bench_controller_pass(sizes: list[int], jobs_per_gpu: float = 2.5, gpus_per_node: int = 8, churn: int = 200,
                          passes: int = 5, seed: int = 3) -> list[PassBenchRow]:  # fmt: skip
    return [_bench_one(gpus, jobs_per_gpu, gpus_per_node, churn, passes, seed) for gpus in sizes]


def _bench_one(gpus: int, jobs_per_gpu: float, gpus_per_node: int, churn: int, passes: int,
               seed: int) -> PassBenchRow:  # fmt: skip
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(max(1, gpus // gpus_per_node))]
    root = Path(tempfile.mkdtemp(prefix="mig-batch-bench-pass-"))
    try:
        site = SiteConfig(state=root / "state.db", nodes={n: ("A100-80GB",) * gpus_per_node for n in names})
        batch = FakeBatch(names, cpus_per_node=4 * gpus_per_node * 7)  # CPUs never the limit
        store = Store(site.state)
        controller = Controller(site, store, batch)
        for _ in range(round(jobs_per_gpu * len(names) * gpus_per_node)):
            batch.add(f"mig-batch:v1;req={rng.choice(PROFILES)}")
        times, placed = [], []
        for index in range(passes + 2):  # the first two place the burst and follow its starts: not timed
            t0 = time.perf_counter()
            stats = controller.step()
            if index >= 2:
                times.append(time.perf_counter() - t0)
                placed.append(stats.placed)
            _churn(batch, rng, churn)
        store.close()
        jobs = batch.jobs()
        return PassBenchRow(len(names) * gpus_per_node, len(names), sum(j.state is JobState.RUNNING for j in jobs),
                            sum(j.state is JobState.HELD for j in jobs), statistics.mean(placed),
                            statistics.median(times) * 1e3, max(times) * 1e3)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _churn(batch: FakeBatch, rng: random.Random, churn: int) -> None:
    """The batch system's side between passes: the released jobs start where they were placed, ``churn``
    running jobs end and ``churn`` new ones arrive."""
    for job in batch.jobs():
        if job.state is JobState.PENDING:
            p = parse_place(job.admin_tag)
            if p is not None:
                batch.start(job.job_id, NodeReport("made", p.gpu, p.profile, p.start, 1, f"MIG-{job.job_id}"))
    running = [j.job_id for j in batch.jobs() if j.state is JobState.RUNNING]
    for job_id in rng.sample(running, min(churn, len(running))):
        batch.finish(job_id)
    for _ in range(churn):
        batch.add(f"mig-batch:v1;req={rng.choice(PROFILES)}")
