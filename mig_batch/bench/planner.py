"""``mig-batch bench planner``: every planner on every workload, offline batches of N tasks.

Each dataset (100 synthetic tasks of one type, or a random subset of the Rodinia set) is cut into
consecutive batches of N; a batch's p_opt is measured against its lower bound; the dataset's value
is the mean over its batches (MIG-DRL §5.2). Seeds are fixed: dataset d uses seed d.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mig_batch.planner.bounds import lower_bound, p_opt
from mig_batch.planner.plan import check_plan
from mig_batch.planner.planners import make_plan
from mig_batch.planner.problem import GpuScheme, Task
from mig_batch.planner.workloads import synthetic_dataset


@dataclass(frozen=True)
class PlannerRow:
    workload: str
    planner: str
    batches: int
    mean_p_opt: float
    mean_plan_s: float
    max_plan_s: float


def batches_of(tasks: Sequence[Task], n: int) -> list[list[Task]]:
    return [list(tasks[i : i + n]) for i in range(0, len(tasks) - n + 1, n)]


def bench_planners(
    scheme: GpuScheme,
    planners: Sequence[str],
    workloads: dict[str, Callable[[int], list[Task]]],
    datasets: int,
    batch: int,
) -> list[PlannerRow]:
    rows = []
    for workload, make in workloads.items():
        per: dict[str, list[float]] = {p: [] for p in planners}
        times: dict[str, list[float]] = {p: [] for p in planners}
        count = 0
        for d in range(datasets):
            dataset_values: dict[str, list[float]] = {p: [] for p in planners}
            for tasks in batches_of(make(d), batch):
                bound = lower_bound(scheme, tasks)
                count += 1
                for name in planners:
                    t0 = time.perf_counter()
                    plan = make_plan(name, scheme, tasks)
                    times[name].append(time.perf_counter() - t0)
                    dataset_values[name].append(p_opt(check_plan(scheme, tasks, plan), bound))
            for name in planners:
                if dataset_values[name]:
                    per[name].append(statistics.fmean(dataset_values[name]))
        for name in planners:
            rows.append(
                PlannerRow(
                    workload, name, count,
                    statistics.fmean(per[name]) if per[name] else float("nan"),
                    statistics.fmean(times[name]) if times[name] else 0.0,
                    max(times[name], default=0.0),
                )
            )  # fmt: skip
    return rows


def synthetic_workloads(kinds: Sequence[str], tasks_per_dataset: int = 100) -> dict[str, Callable[[int], list[Task]]]:
    return {kind: (lambda d, kind=kind: synthetic_dataset(kind, tasks_per_dataset, seed=d)) for kind in kinds}


def subset_workload(pool: Sequence[Task], size: int) -> Callable[[int], list[Task]]:
    """Dataset d: ``size`` tasks drawn without replacement from ``pool`` with seed d."""

    def make(d: int) -> list[Task]:
        return random.Random(d).sample(list(pool), min(size, len(pool)))

    return make
