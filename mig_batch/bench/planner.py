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
from mig_batch.planner.exact import solve_exact
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
    progress: Callable[[], None] = lambda: None,
) -> list[PlannerRow]:
    """``progress()`` is called after each dataset of each workload (``len(workloads) * datasets`` calls)."""
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
            progress()
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


@dataclass(frozen=True)
class GapRow:
    workload: str
    planner: str  # a planner, or "lower bound" for the MIG-DRL bound's own distance below the optimum
    batches: int
    proven: int  # batches whose optimum the exact solver proved
    mean_gap: float  # mean (makespan / optimum - 1) x 100 over proven batches
    max_gap: float
    mean_plan_s: float = 0.0  # the planner's time per batch (0 for the lower bound)
    max_plan_s: float = 0.0


@dataclass(frozen=True)
class ExactStats:
    workload: str
    batches: int
    proven: int
    mean_solve_s: float
    max_solve_s: float


def bench_gaps(
    scheme: GpuScheme,
    planners: Sequence[str],
    workloads: dict[str, Callable[[int], list[Task]]],
    datasets: int,
    batch: int,
    time_limit_s: float = 60.0,
    progress: Callable[[], None] = lambda: None,
) -> tuple[list[GapRow], list[ExactStats]]:
    """True gap to the optimum: the first ``batch`` tasks of each dataset, solved exactly; ``progress()`` after
    each dataset of each workload."""
    rows: list[GapRow] = []
    stats: list[ExactStats] = []
    for workload, make in workloads.items():
        gaps: dict[str, list[float]] = {p: [] for p in [*planners, "lower bound"]}
        solve_s: list[float] = []
        plan_s: dict[str, list[float]] = {p: [] for p in planners}
        count = proven = 0
        for d in range(datasets):
            tasks = make(d)[:batch]
            if len(tasks) < batch:
                progress()
                continue
            count += 1
            plans = {}
            for name in planners:
                t0 = time.perf_counter()
                plans[name] = make_plan(name, scheme, tasks)
                plan_s[name].append(time.perf_counter() - t0)
            incumbent = min(plans.values(), key=lambda p: p.makespan)
            result = solve_exact(scheme, tasks, time_limit_s=time_limit_s, incumbent=incumbent)
            solve_s.append(result.wall_s)
            progress()
            if not result.optimal:
                continue
            proven += 1
            assert result.plan is not None  # proven optimal: the solver returned its plan
            optimum = check_plan(scheme, tasks, result.plan)
            for name, plan in plans.items():
                gaps[name].append((plan.makespan / optimum - 1) * 100)
            gaps["lower bound"].append((lower_bound(scheme, tasks) / optimum - 1) * 100)
        for name, values in gaps.items():
            times = plan_s.get(name, [])
            rows.append(
                GapRow(workload, name, count, proven, statistics.fmean(values) if values else float("nan"),
                       max(values, default=float("nan")), statistics.fmean(times) if times else 0.0,
                       max(times, default=0.0))
            )  # fmt: skip
        stats.append(
            ExactStats(
                workload, count, proven, statistics.fmean(solve_s) if solve_s else 0.0, max(solve_s, default=0.0)
            )
        )
    return rows, stats
