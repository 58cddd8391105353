"""``mig-batch bench live-planner``: one live planning pass at cluster scale.

A cluster of A100-80GB GPUs, each holding a random maximal partition of which about half the
instances exist (running jobs with expected ends up to two hours ahead, or idle), plus one waiting
rigid job's reservation; a queue of moldable jobs of the MIG-DRL ``mixscalinguniform`` type with
their times scaled to 10-120 minutes. Each live planner plans the queue within the pass budget; the
row says how long it took, how many decodings fitted, and the plan's mean end and makespan.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from mig_batch.planner.live import (
    LiveGpu,
    LiveInstance,
    LiveJob,
    LiveState,
    RigidWait,
    check_live_plan,
    plan_live,
)
from mig_batch.planner.problem import gpu_scheme
from mig_batch.planner.workloads import synthetic_dataset

MODEL = "A100-80GB"


@dataclass(frozen=True)
class LiveBenchRow:
    planner: str
    gpus: int
    jobs: int
    budget_s: float
    wall_s: float
    evaluations: int
    decode_ms: float  # wall time per decoding
    start_now: int
    mean_end_s: float  # from now
    makespan_s: float  # from now
    valid: bool


def live_cluster(gpus: int, jobs: int, seed: int = 7) -> LiveState:
    rng = random.Random(seed)
    scheme = gpu_scheme(MODEL)
    now = 1e6
    out = []
    for gid in range(gpus):
        partition = rng.choice(scheme.partitions)
        kept = [s for s in partition if rng.random() < 0.5]
        instances = tuple(
            LiveInstance(s.size, s.start, now + (rng.uniform(60, 7200) if rng.random() < 0.8 else 0.0)) for s in kept
        )
        out.append(LiveGpu(gid, MODEL, instances))
    tasks = synthetic_dataset("mixscalinguniform", jobs, seed)
    queue = tuple(LiveJob(t.name, {s: v * 6 * rng.uniform(1, 12) for s, v in t.times.items()}) for t in tasks)
    rigid = (RigidWait(0, scheme.slots[7][0].window, now + 3600.0, 3600.0),)
    return LiveState(now, tuple(out), queue, rigid, 0.0)


def bench_live(gpus: int = 1000, jobs: int = 500, budget_s: float = 5.0,
               planners: tuple[str, ...] = ("eft", "far", "auto"), check: bool = True,
               seed: int = 7) -> list[LiveBenchRow]:  # fmt: skip
    state = live_cluster(gpus, jobs, seed)
    rows = []
    for planner in planners:
        t0 = time.perf_counter()
        plan = plan_live(state, planner, budget_s=budget_s, evaluations=10_000, seed=seed)
        wall = time.perf_counter() - t0
        valid = True
        if check:
            try:
                check_live_plan(state, plan)
            except ValueError:
                valid = False
        rows.append(LiveBenchRow(planner, gpus, jobs, budget_s, wall, plan.evaluations,
                                 wall / max(1, plan.evaluations) * 1e3, len(plan.start_now()),
                                 plan.mean_end - state.now, plan.makespan - state.now, valid))  # fmt: skip
    return rows
