"""A batch over several GPUs: split the tasks, one timeline per GPU, for the live controller.

Split: tasks longest first (by their least area, size x time) each go to the GPU whose MIG-DRL lower
bound grows the least. Improvement, judged with the fast planners (the best of FAR, FIXBEST and
MISO, milliseconds each): move one task off the GPU that ends last to the GPU where the pair's
replanned maximum drops the most; repeat while that helps (at most ``moves`` times). Then every GPU
is planned by the chosen planner; the result is never worse than the whole batch on the first GPU
that can run it all. GPUs may be of different models; a task's times are per instance size and
apply on every GPU that has that size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mig_batch.planner.baselines import plan_fixbest, plan_miso
from mig_batch.planner.bounds import lower_bound
from mig_batch.planner.far import plan_far
from mig_batch.planner.plan import Plan, PlanError, check_plan
from mig_batch.planner.problem import GpuScheme, Task, check_tasks

PlanFn = Callable[[GpuScheme, Sequence[Task]], Plan]


@dataclass(frozen=True)
class MultiPlan:
    assignment: tuple[tuple[int, ...], ...]  # per GPU: indices into the batch's task list
    plans: tuple[Plan, ...]  # per GPU, over that GPU's tasks in assignment order

    @property
    def makespan(self) -> float:
        return max((p.makespan for p in self.plans), default=0.0)


def _runnable(scheme: GpuScheme, task: Task) -> Task | None:
    """The task restricted to the sizes this GPU has, or None if it cannot run there."""
    times = {s: t for s, t in task.times.items() if s in scheme.profiles}
    return Task(task.name, times) if any(math.isfinite(t) for t in times.values()) else None


def _least_area(task: Task) -> float:
    return min(s * t for s, t in task.times.items() if math.isfinite(t))


def best_fast_plan(scheme: GpuScheme, tasks: Sequence[Task]) -> Plan:
    return min((plan(scheme, tasks) for plan in (plan_far, plan_fixbest, plan_miso)), key=lambda p: p.makespan)


def plan_multi(
    schemes: Sequence[GpuScheme],
    tasks: Sequence[Task],
    plan_one: PlanFn,
    estimate: PlanFn | None = None,
    moves: int = 8,
) -> MultiPlan:
    if not schemes:
        raise ValueError("a multi-GPU batch needs at least one GPU")
    local = [[_runnable(scheme, t) for t in tasks] for scheme in schemes]
    for i, task in enumerate(tasks):
        if all(per_gpu[i] is None for per_gpu in local):
            raise ValueError(f"task {task.name} cannot run on any of the GPUs")
    groups: list[list[int]] = [[] for _ in schemes]
    for i in sorted(range(len(tasks)), key=lambda i: -_least_area(tasks[i])):
        options = [g for g in range(len(schemes)) if local[g][i] is not None]
        g = min(options, key=lambda g: (lower_bound(schemes[g], [local[g][j] for j in [*groups[g], i]]), g))
        groups[g].append(i)

    def plan_group(g: int, members: Sequence[int], planner: PlanFn = estimate or best_fast_plan) -> Plan:
        subset = [local[g][i] for i in members]
        check_tasks(subset, schemes[g])
        return planner(schemes[g], subset) if subset else Plan(schemes[g].model.name, ())

    plans = [plan_group(g, members) for g, members in enumerate(groups)]
    for _ in range(moves):
        worst = max(range(len(schemes)), key=lambda g: plans[g].makespan)
        best: tuple[float, int, int, Plan, Plan] | None = None
        for i in groups[worst]:
            left = plan_group(worst, [j for j in groups[worst] if j != i])
            for g in range(len(schemes)):
                if g == worst or local[g][i] is None:
                    continue
                right = plan_group(g, [*groups[g], i])
                pair = max(left.makespan, right.makespan)
                if pair < plans[worst].makespan - 1e-9 and (best is None or pair < best[0]):
                    best = (pair, i, g, left, right)
        if best is None:
            break
        _, i, g, left, right = best
        groups[worst].remove(i)
        groups[g].append(i)
        plans[worst], plans[g] = left, right
    final = MultiPlan(tuple(tuple(m) for m in groups),
                      tuple(plan_group(g, members, plan_one) for g, members in enumerate(groups)))  # fmt: skip
    # never worse than the whole batch on one GPU (a split can lose to reconfiguration savings)
    for g in range(len(schemes)):
        if all(t is not None for t in local[g]):
            alone = plan_group(g, range(len(tasks)), plan_one)
            if alone.makespan < final.makespan:
                groups = [list(range(len(tasks))) if h == g else [] for h in range(len(schemes))]
                empty = [Plan(s.model.name, ()) for s in schemes]
                final = MultiPlan(
                    tuple(tuple(m) for m in groups), tuple(alone if h == g else empty[h] for h in range(len(schemes)))
                )
            break
    return final


def check_multi(schemes: Sequence[GpuScheme], tasks: Sequence[Task], multi: MultiPlan) -> float:
    """Every task on exactly one GPU, every GPU's plan valid; returns the batch makespan."""
    if len(multi.plans) != len(schemes) or len(multi.assignment) != len(schemes):
        raise PlanError(f"the plan covers {len(multi.plans)} GPUs, the batch has {len(schemes)}")
    placed = sorted(i for members in multi.assignment for i in members)
    if placed != list(range(len(tasks))):
        raise PlanError("every task must be assigned to exactly one GPU")
    for scheme, members, plan in zip(schemes, multi.assignment, multi.plans, strict=True):
        subset = [_runnable(scheme, tasks[i]) for i in members]
        if any(t is None for t in subset):
            raise PlanError(f"a task assigned to {scheme.model.name} cannot run there")
        check_plan(scheme, subset, plan)
    return multi.makespan
