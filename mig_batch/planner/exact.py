"""Exact planner: the one-GPU problem as an OR-Tools CP-SAT model, time-limited.

Each task picks one slot (size and start) and occupies it over a *life* [a, b): from the start of
its create (or from the end of the previous task's life when it reuses that task's instance) to the
end of its destroy (or to the next task's life when that one reuses the instance, or for ever when
it is never destroyed). Lives on slots that share a memory slice never overlap; creates and destroys
never overlap one another (the GPU's reconfiguration lock); a run sits inside its life after the
create. This is exactly the rule set of :func:`mig_batch.planner.plan.check_plan` starting from an
empty GPU, so the solver's optimum is the problem's optimum.

Time is integral in the model: task times are rounded *down* to ``resolution`` seconds, so the
solver's proven bound is a valid lower bound of the real optimum; the solution is re-timed in real
seconds by :func:`schedule` (which only left-shifts), giving the upper side. Reconfiguration times
are exact at millisecond resolution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from mig_batch.planner.bounds import lower_bound
from mig_batch.planner.plan import Action, Create, Destroy, Plan, Run, schedule
from mig_batch.planner.problem import GpuScheme, Task


@dataclass(frozen=True)
class ExactResult:
    plan: Plan | None  # the best plan found, re-timed in real seconds
    lower_bound: float  # proven: no plan is shorter (seconds)
    optimal: bool  # the solver closed the gap on the rounded model
    wall_s: float

    @property
    def makespan(self) -> float:
        return self.plan.makespan if self.plan else math.inf


def solve_exact(
    scheme: GpuScheme,
    tasks: Sequence[Task],
    time_limit_s: float = 60.0,
    incumbent: Plan | None = None,
    resolution: float = 1e-3,
    workers: int = 8,
) -> ExactResult:
    def ticks(seconds: float) -> int:
        return _ticks(seconds, resolution)

    n = len(tasks)
    slots = [slot for size in scheme.sizes for slot in scheme.slots[size]]
    fits = {
        (i, k): ticks(tasks[i].time(slot.size))
        for i in range(n)
        for k, slot in enumerate(slots)
        if math.isfinite(tasks[i].time(slot.size))
    }
    create = [ticks(scheme.create_s[s.size]) for s in slots]
    destroy = [ticks(scheme.destroy_s[s.size]) for s in slots]
    if incumbent is not None:
        horizon = math.ceil(incumbent.makespan / resolution) + 1
    else:
        horizon = sum(max(create) + max(destroy) + max(d for (j, _), d in fits.items() if j == i) for i in range(n))
    forever = horizon + max(destroy) + 1

    model = cp_model.CpModel()
    makespan = model.new_int_var(0, horizon, "makespan")
    on = {(i, k): model.new_bool_var(f"on_{i}_{k}") for (i, k) in fits}
    begin = [model.new_int_var(0, horizon, f"s_{i}") for i in range(n)]
    end = [model.new_int_var(0, horizon, f"e_{i}") for i in range(n)]
    life_begin = [model.new_int_var(0, horizon, f"a_{i}") for i in range(n)]
    life_end = [model.new_int_var(0, forever, f"b_{i}") for i in range(n)]
    creates = [model.new_bool_var(f"creates_{i}") for i in range(n)]
    destroys = [model.new_bool_var(f"destroys_{i}") for i in range(n)]
    lives_by_memory: dict[int, list] = {}
    reconfigs = []
    runs = []  # (interval, compute slices, memory slices): redundant energy constraints below
    runs_by_memory: dict[int, list] = {}  # redundant too: runs lie inside lives
    for i in range(n):
        mine = [k for (j, k) in fits if j == i]
        model.add_exactly_one(on[i, k] for k in mine)
        model.add(makespan >= end[i])
        length = model.new_int_var(1, forever, f"len_{i}")
        model.add(life_end[i] == life_begin[i] + length)
        create_len = sum(create[k] * on[i, k] for k in mine)
        destroy_len = sum(destroy[k] * on[i, k] for k in mine)
        created_at = model.new_int_var(0, horizon, f"c_{i}")
        model.add(created_at == life_begin[i] + create_len)
        # left-shifted: a run starts as soon as its instance exists or its predecessor ends
        model.add(begin[i] == created_at).only_enforce_if(creates[i])
        model.add(begin[i] == life_begin[i]).only_enforce_if(~creates[i])
        model.add(end[i] <= life_end[i])
        for k in mine:
            run = model.new_optional_interval_var(begin[i], fits[i, k], end[i], on[i, k], f"run_{i}_{k}")
            runs.append((run, slots[k].size, slots[k].window.bit_count()))
            for m in range(8 * 8):
                if slots[k].window >> m & 1:
                    runs_by_memory.setdefault(m, []).append(run)
            life = model.new_optional_interval_var(life_begin[i], length, life_end[i], on[i, k], f"life_{i}_{k}")
            for m in range(8 * 8):
                if slots[k].window >> m & 1:
                    lives_by_memory.setdefault(m, []).append(life)
        create_size = model.new_int_var(0, max(create), f"cl_{i}")
        model.add(create_size == create_len)
        reconfigs.append(model.new_optional_interval_var(life_begin[i], create_size, created_at, creates[i], f"cr_{i}"))
        destroy_size = model.new_int_var(0, max(destroy), f"dl_{i}")
        model.add(destroy_size == destroy_len)
        destroy_begin = model.new_int_var(0, forever, f"d_{i}")
        model.add(destroy_begin >= end[i])
        model.add(life_end[i] == destroy_begin + destroy_size).only_enforce_if(destroys[i])
        reconfigs.append(
            model.new_optional_interval_var(destroy_begin, destroy_size, life_end[i], destroys[i], f"de_{i}")
        )

    # reuse: task j runs on task i's instance right after it, with no destroy/create between them.
    # Runs on one instance life can be reordered freely, so only i < j chains are needed.
    follows = {}
    for i in range(n):
        for j in range(i + 1, n):
            shared = [k for (a, k) in fits if a == i and (j, k) in fits]
            if not shared:
                continue
            r = follows[i, j] = model.new_bool_var(f"r_{i}_{j}")
            model.add(life_begin[j] == life_end[i]).only_enforce_if(r)
            model.add(life_end[i] == end[i]).only_enforce_if(r)
            for k in [k for (a, k) in fits if a == i]:
                if (j, k) in fits:
                    model.add(on[i, k] == on[j, k]).only_enforce_if(r)
                else:
                    model.add(on[i, k] == 0).only_enforce_if(r)
    for i in range(n):
        successors = [follows[i, j] for j in range(n) if (i, j) in follows]
        predecessors = [follows[j, i] for j in range(n) if (j, i) in follows]
        model.add(sum(predecessors) + creates[i] == 1)
        model.add(sum(successors) + destroys[i] <= 1)
        kept = model.new_bool_var(f"kept_{i}")  # neither destroyed nor reused: alive to the end
        model.add(sum(successors) + destroys[i] + kept == 1)
        model.add(life_end[i] == makespan).only_enforce_if(kept)
    model.add_no_overlap(reconfigs)
    # redundant: concurrent runs never use more compute or memory slices than the GPU has
    model.add_cumulative([r for r, _, _ in runs], [c for _, c, _ in runs], scheme.slices)
    memory = max(s.window for s in slots).bit_length()
    model.add_cumulative([r for r, _, _ in runs], [m for _, _, m in runs], memory)
    floored = [Task(t.name, {s: ticks(v) * resolution for s, v in t.times.items() if math.isfinite(v)}) for t in tasks]
    model.add(makespan >= ticks(lower_bound(scheme, floored)))
    for group in (*lives_by_memory.values(), *runs_by_memory.values()):
        if len(group) > 1:
            model.add_no_overlap(group)
    # interchangeable tasks (same times) start in index order
    for i in range(n):
        for j in range(i + 1, n):
            if dict(tasks[i].times) == dict(tasks[j].times):
                model.add(begin[i] <= begin[j])
                break
    model.minimize(makespan)
    if incumbent is not None:
        _hint(model, incumbent, slots, on, begin, end, resolution)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    status = solver.solve(model)
    wall = solver.wall_time
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        plan = incumbent
        bound = solver.best_objective_bound * resolution if status != cp_model.UNKNOWN else 0.0
        return ExactResult(plan, bound, False, wall)

    events = []  # (time, order, action) in the lock order the solver chose
    for i in range(n):
        k = next(k for (j, k) in fits if j == i and solver.boolean_value(on[i, k]))
        slot = slots[k]
        if solver.boolean_value(creates[i]):
            events.append((solver.value(life_begin[i]), 0, Create(slot.size, slot.start)))
        events.append((solver.value(begin[i]), 1, Run(i, slot.size, slot.start)))
        if solver.boolean_value(destroys[i]):
            events.append((solver.value(life_end[i]) - destroy[k], 2, Destroy(slot.size, slot.start)))
    actions: list[Action] = [a for _, _, a in sorted(events, key=lambda e: (e[0], e[1]))]
    plan = schedule(scheme, tasks, actions, "exact")
    if incumbent is not None and incumbent.makespan < plan.makespan:
        plan = incumbent  # rounding can make the re-timed solution a hair longer than the seed
    bound = solver.best_objective_bound * resolution
    return ExactResult(plan, bound, status == cp_model.OPTIMAL, wall)


def _ticks(seconds: float, resolution: float) -> int:
    return math.floor(seconds / resolution + 1e-9)


def _hint(model, incumbent: Plan, slots, on, begin, end, resolution: float) -> None:
    index = {(s.size, s.start): k for k, s in enumerate(slots)}
    for e in incumbent.events:
        if e.kind != "run" or e.task is None:
            continue
        k = index[(e.size, e.start)]
        for (i, kk), var in on.items():
            if i == e.task:
                model.add_hint(var, kk == k)
        model.add_hint(begin[e.task], _ticks(e.begin, resolution))
        model.add_hint(end[e.task], _ticks(e.end, resolution))
