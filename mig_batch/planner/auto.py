"""``auto``: joint molding and ordering search, seeded with FAR, within a budget.

A candidate is (size per task, priority order). A serial decoder turns it into a plan: tasks in
priority order each take, among the slots of their size, the one where they can start first, reusing
a live instance or destroying the idle instances in the way (on the reconfiguration clock) and
creating one. Because the decoder may put a 3-slice task beside 4-slice ones, or a 3 beside two 2s,
it reaches the 4-3 and 2-2-3 co-execution patterns FAR's partition tree misses (MIG-DRL §6.7).

Search: seeds are FAR's allotment family, every uniform size and the min-time/min-area allotments,
each ordered longest first; then a seeded local search (change one task's size, swap two tasks,
move a task) keeps every move that does not lengthen the plan, for ``evaluations`` decodings. FAR's
plan, FIXBEST's and MISO's are incumbents and starting points too, so ``auto`` is never worse than
any of them. Deterministic for a seed when the time budget is not hit.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence

from mig_batch.planner.baselines import plan_fixbest, plan_miso
from mig_batch.planner.far import allotment_family, plan_far
from mig_batch.planner.plan import Action, Create, Destroy, Plan, Run, schedule
from mig_batch.planner.problem import GpuScheme, Slot, Task

Candidate = tuple[list[int], list[int]]  # (size per task, priority order of task indices)


def decode(
    scheme: GpuScheme, tasks: Sequence[Task], sizes: Sequence[int], order: Sequence[int]
) -> tuple[float, list[Action]]:
    clock = 0.0
    free: dict[Slot, float] = {}  # live instance -> time its last task ends
    actions: list[Action] = []
    makespan = 0.0
    for index in order:
        size = sizes[index]
        duration = tasks[index].time(size)
        best: tuple[float, int, int, Slot, list[Slot], float] | None = None
        for slot in scheme.slots[size]:
            if slot in free:
                option = (free[slot], 0, slot.start, slot, [], clock)
            else:
                blockers = sorted((s for s in free if s.overlaps(slot)), key=lambda s: free[s])
                c = clock
                for b in blockers:
                    c = max(c, free[b]) + scheme.destroy_s[b.size]
                c += scheme.create_s[size]
                option = (c, len(blockers) + 1, slot.start, slot, blockers, c)
            if best is None or option[:3] < best[:3]:
                best = option
        assert best is not None
        start, _, _, slot, blockers, new_clock = best
        for b in blockers:
            actions.append(Destroy(b.size, b.start))
            del free[b]
        if slot not in free:
            actions.append(Create(slot.size, slot.start))
            clock = new_clock
        actions.append(Run(index, size, slot.start))
        free[slot] = start + duration
        makespan = max(makespan, start + duration)
    return makespan, actions


def longest_first(tasks: Sequence[Task], sizes: Sequence[int]) -> list[int]:
    return sorted(range(len(tasks)), key=lambda i: (-tasks[i].time(sizes[i]), i))


def seeds(scheme: GpuScheme, tasks: Sequence[Task]) -> list[list[int]]:
    out = [list(a) for a in allotment_family(tasks, max(scheme.sizes))]
    for size in scheme.sizes:
        if all(math.isfinite(t.time(size)) for t in tasks):
            out.append([size] * len(tasks))
    out.append([min(t.feasible_sizes(), key=t.time) for t in tasks])
    return out


def _as_candidate(plan: Plan, n: int) -> Candidate:
    """A plan's sizes, and its tasks in start order, as a starting point for the search."""
    runs = plan.runs()
    sizes = [0] * n
    for run in runs:
        sizes[run.task] = run.size
    return sizes, [run.task for run in runs]


def plan_auto(
    scheme: GpuScheme,
    tasks: Sequence[Task],
    evaluations: int = 3000,
    seed: int = 0,
    time_budget_s: float = 0.8,
) -> Plan:
    if not tasks:
        return Plan(scheme.model.name, (), "auto")
    deadline = time.perf_counter() + time_budget_s
    incumbents = [plan_far(scheme, tasks), plan_fixbest(scheme, tasks), plan_miso(scheme, tasks)]
    incumbent = min(incumbents, key=lambda p: p.makespan)
    starts = [(sizes, longest_first(tasks, sizes)) for sizes in seeds(scheme, tasks)]
    starts += [_as_candidate(plan, len(tasks)) for plan in incumbents]
    best_span, best_candidate = math.inf, None
    for sizes, order in starts:
        span, _ = decode(scheme, tasks, sizes, order)
        if span < best_span:
            best_span, best_candidate = span, (sizes, order)
    assert best_candidate is not None
    rng = random.Random(seed)
    sizes, order = list(best_candidate[0]), list(best_candidate[1])
    current = best_span
    feasible = [t.feasible_sizes() for t in tasks]
    n = len(tasks)
    for step in range(evaluations):
        if step % 64 == 0 and time.perf_counter() > deadline:
            break
        new_sizes, new_order = sizes, order
        move = rng.random()
        if move < 0.5 or n < 2:
            i = rng.randrange(n)
            choices = [s for s in feasible[i] if s != sizes[i]]
            if not choices:
                continue
            new_sizes = sizes.copy()
            new_sizes[i] = rng.choice(choices)
        elif move < 0.75:
            a, b = rng.sample(range(n), 2)
            new_order = order.copy()
            new_order[a], new_order[b] = new_order[b], new_order[a]
        else:
            a, b = rng.sample(range(n), 2)
            new_order = order.copy()
            new_order.insert(b, new_order.pop(a))
        span, _ = decode(scheme, tasks, new_sizes, new_order)
        if span <= current:
            sizes, order, current = new_sizes, new_order, span
            if span < best_span:
                best_span, best_candidate = span, (sizes, order)
    _, actions = decode(scheme, tasks, *best_candidate)
    plan = schedule(scheme, tasks, actions, "auto")
    if plan.makespan < incumbent.makespan:
        return plan
    return Plan(incumbent.gpu, incumbent.events, "auto")
