"""``auto``: joint molding, ordering and placement search, seeded with FAR, within a budget.

A candidate is (size per task, priority order, preferred slot per task). A serial decoder turns it
into a plan: tasks in priority order each take, among the slots of their size, the one where they
can start first, reusing a live instance or destroying the idle instances in the way (on the
reconfiguration clock) and creating one. Ties (equal start and as many reconfigurations) go to the
task's preferred slot when it is among them, else to the slot that closes the fewest open slots
(slots neither live nor overlapping a live instance), else to the lowest start: a 1-slice task goes
to slice 6 before slice 0, keeping the 4-slice slot free. Because the decoder may put a 3-slice task
beside 4-slice ones, or a 3 beside two 2s, it reaches the 4-3 and 2-2-3 co-execution patterns FAR's
partition tree misses (MIG-DRL §6.7); with the preferred slots it can express every plan the exact
solver returned on the 8-task benchmark batches.

Search: starting points are FAR's allotment family, every uniform size and the min-time allotment
(longest first), every maximal partition filled by earliest completion (two priorities), and the
FAR/FIXBEST/MISO plans themselves; then an iterated local search from the best of them (change one
task's size or preferred slot, swap two tasks, move one; non-worsening moves kept). After ``stall``
evaluations without a strict improvement it restarts, alternately from the next distinct starting
point and from the best plan so far with a few random moves. A move re-decodes only the tasks from
its first changed position on (the decoder's state before each position is kept).

Budget: at most ``evaluations`` decodings and ``time_budget_s`` seconds (the anytime bound: the best
plan so far is returned when either ends). FAR's, FIXBEST's and MISO's plans are always computed
first (milliseconds; a few hundred at 100 tasks) so that ``auto`` is never worse than any of them.
Deterministic for a seed when the evaluation limit ends the search before the time budget.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence

from mig_batch.planner.baselines import plan_fixbest, plan_miso
from mig_batch.planner.far import allotment_family, plan_far
from mig_batch.planner.plan import Action, Create, Destroy, Plan, Run, schedule
from mig_batch.planner.problem import GpuScheme, Task

INF = math.inf
Candidate = tuple[list[int], list[int], list[int]]  # (size per task, priority order, preferred slot id or -1)
State = tuple[float, list[float], int, float]  # (reconfiguration clock, free time per slot, live slots mask, makespan)


class Decoder:
    """The serial decoder over slot ids (bit masks for overlap), with resumable state."""

    def __init__(self, scheme: GpuScheme, tasks: Sequence[Task]) -> None:
        self.slots = [slot for size in scheme.sizes for slot in scheme.slots[size]]
        ids = {(s.size, s.start): k for k, s in enumerate(self.slots)}
        self.ids = ids
        self.by_size = {size: [ids[(s.size, s.start)] for s in scheme.slots[size]] for size in scheme.sizes}
        self.overlap = [
            [j for j, other in enumerate(self.slots) if j != k and other.overlaps(slot)]
            for k, slot in enumerate(self.slots)
        ]
        self.omask = [sum(1 << j for j in group) for group in self.overlap]
        self.create = [scheme.create_s[s.size] for s in self.slots]
        self.destroy = [scheme.destroy_s[s.size] for s in self.slots]
        self.times = [{size: t.time(size) for size in scheme.sizes} for t in tasks]
        self.empty: State = (0.0, [0.0] * len(self.slots), 0, 0.0)
        self._blocking: dict[tuple[int, int], list[int]] = {}

    def _blockers(self, k: int, alive: int) -> list[int]:
        """The live slots in slot ``k``'s way (memoised per live set)."""
        blockers = self._blocking.get((k, alive))
        if blockers is None:
            blockers = self._blocking[k, alive] = [j for j in self.overlap[k] if alive >> j & 1]
        return blockers

    def run(
        self,
        cand: Candidate,
        begin: int = 0,
        state: State | None = None,
        cutoff: float = INF,
        snaps: list[State] | None = None,
        actions: list[Action] | None = None,
    ) -> float:
        """Makespan of ``cand`` decoded from position ``begin`` in ``state`` (the state before that
        position); ``INF`` as soon as it exceeds ``cutoff``. ``snaps`` receives the state before
        each decoded position; ``actions`` the action list."""
        sizes, order, prefs = cand
        clock, free, alive, makespan = state if state is not None else self.empty
        free = free.copy()
        nslots = len(self.slots)
        omask, create, destroy, by_size = self.omask, self.create, self.destroy, self.by_size
        for position in range(begin, len(order)):
            if snaps is not None:
                snaps.append((clock, free.copy(), alive, makespan))
            index = order[position]
            size = sizes[index]
            preferred = prefs[index]
            best_start, best_n, best_k, best_damage = INF, 0, -1, -1
            open_mask = -1
            for k in by_size[size]:
                if alive >> k & 1:
                    c, n = free[k], 0
                else:
                    c, n = clock, 1
                    if alive & omask[k]:
                        blockers = self._blockers(k, alive)
                        if len(blockers) > 1:
                            blockers = sorted(blockers, key=free.__getitem__)
                        for j in blockers:
                            f = free[j]
                            c = (c if c > f else f) + destroy[j]
                        n += len(blockers)
                    c += create[k]
                if c < best_start or (c == best_start and n < best_n):
                    best_start, best_n, best_k, best_damage = c, n, k, -1
                elif c == best_start and n == best_n and best_k != preferred:
                    if k == preferred:
                        best_k, best_damage = k, -1
                        continue
                    if open_mask < 0:
                        open_mask = 0
                        for j in range(nslots):
                            if not alive & (omask[j] | 1 << j):
                                open_mask |= 1 << j
                    if best_damage < 0:
                        best_damage = (omask[best_k] & open_mask).bit_count()
                    damage = (omask[k] & open_mask).bit_count()
                    if damage < best_damage:
                        best_k, best_damage = k, damage
            k = best_k
            if best_n:
                if alive & omask[k]:
                    for j in sorted(self._blockers(k, alive), key=free.__getitem__):
                        if actions is not None:
                            actions.append(Destroy(self.slots[j].size, self.slots[j].start))
                        alive &= ~(1 << j)
                if actions is not None:
                    actions.append(Create(self.slots[k].size, self.slots[k].start))
                clock = best_start
                alive |= 1 << k
            if actions is not None:
                actions.append(Run(index, size, self.slots[k].start))
            end = best_start + self.times[index][size]
            free[k] = end
            if end > makespan:
                makespan = end
                if makespan > cutoff:
                    return INF
        return makespan


def decode(
    scheme: GpuScheme,
    tasks: Sequence[Task],
    sizes: Sequence[int],
    order: Sequence[int],
    prefs: Sequence[int] | None = None,
) -> tuple[float, list[Action]]:
    """Makespan and action list of one candidate (``prefs``: preferred slot id per task, -1 none)."""
    actions: list[Action] = []
    cand = (list(sizes), list(order), list(prefs) if prefs is not None else [-1] * len(tasks))
    return Decoder(scheme, tasks).run(cand, actions=actions), actions


def longest_first(tasks: Sequence[Task], sizes: Sequence[int]) -> list[int]:
    return sorted(range(len(tasks)), key=lambda i: (-tasks[i].time(sizes[i]), i))


def seeds(scheme: GpuScheme, tasks: Sequence[Task]) -> list[list[int]]:
    out = [list(a) for a in allotment_family(tasks, max(scheme.sizes))]
    for size in scheme.sizes:
        if all(math.isfinite(t.time(size)) for t in tasks):
            out.append([size] * len(tasks))
    out.append([min(t.feasible_sizes(), key=t.time) for t in tasks])
    return out


def partition_seeds(scheme: GpuScheme, tasks: Sequence[Task], decoder: Decoder) -> list[Candidate]:
    """Every maximal partition, tasks by priority (longest, or largest area, on the partition's
    sizes first) each on the instance where it completes first."""
    out: list[Candidate] = []
    n = len(tasks)
    for partition in scheme.partitions:
        slots = [decoder.ids[(s.size, s.start)] for s in partition]
        sizes_here = {s.size for s in partition}
        if any(all(not math.isfinite(t.time(s)) for s in sizes_here) for t in tasks):
            continue
        for weight in (lambda s: 1, lambda s: s):
            priority = sorted(range(n), key=lambda i: (-min(weight(s) * tasks[i].time(s) for s in sizes_here), i))
            done = {k: decoder.create[k] for k in slots}
            sizes, prefs, order = [0] * n, [-1] * n, []
            for i in priority:
                k = min(slots, key=lambda k: (done[k] + tasks[i].time(decoder.slots[k].size), k))
                done[k] += tasks[i].time(decoder.slots[k].size)
                sizes[i], prefs[i] = decoder.slots[k].size, k
                order.append(i)
            out.append((sizes, order, prefs))
    return out


def _as_candidate(plan: Plan, decoder: Decoder, n: int) -> Candidate:
    """A plan's sizes and slots, and its tasks in start order, as a starting point for the search."""
    runs = plan.runs()
    sizes, prefs = [0] * n, [-1] * n
    for run in runs:
        assert run.task is not None
        sizes[run.task], prefs[run.task] = run.size, decoder.ids[(run.size, run.start)]
    return sizes, [run.task for run in runs if run.task is not None], prefs


def plan_auto(
    scheme: GpuScheme,
    tasks: Sequence[Task],
    evaluations: int = 30000,
    seed: int = 0,
    time_budget_s: float = 2.0,
    stall: int = 300,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> Plan:
    """The best plan found within ``evaluations`` decodings and ``time_budget_s`` seconds (measured
    by ``clock``); never worse than FAR's, FIXBEST's or MISO's."""
    if not tasks:
        return Plan(scheme.model.name, (), "auto")
    deadline = clock() + time_budget_s
    incumbents = [plan_miso(scheme, tasks), plan_fixbest(scheme, tasks), plan_far(scheme, tasks)]
    incumbent = min(incumbents, key=lambda p: p.makespan)
    n = len(tasks)
    decoder = Decoder(scheme, tasks)
    starts: list[Candidate] = [_as_candidate(plan, decoder, n) for plan in incumbents]
    starts += [(sizes, longest_first(tasks, sizes), [-1] * n) for sizes in seeds(scheme, tasks)]
    starts += partition_seeds(scheme, tasks, decoder)
    scored: list[tuple[float, int]] = []
    used = 0
    for j, cand in enumerate(starts):
        if j >= len(incumbents) and (used >= evaluations or (j % 16 == 15 and clock() > deadline)):
            break
        scored.append((decoder.run(cand), j))
        used += 1
    scored.sort()
    pool: list[Candidate] = []  # distinct starting points, best first
    last = -INF
    for span, j in scored:
        if span > last + 1e-9:
            pool.append(starts[j])
            last = span
    best, best_span = pool[0], scored[0][0]
    found: list[tuple[float, Candidate]] = []
    _search(decoder, tasks, pool, evaluations - used, stall, random.Random(seed), deadline, clock, found)
    if found and found[0][0] < best_span:
        best_span, best = found[0]
    actions: list[Action] = []
    decoder.run(best, actions=actions)
    plan = schedule(scheme, tasks, actions, "auto")
    if plan.makespan < incumbent.makespan:
        return plan
    return Plan(incumbent.gpu, incumbent.events, "auto")


def _search(
    decoder: Decoder,
    tasks: Sequence[Task],
    pool: list[Candidate],
    evaluations: int,
    stall: int,
    rng: random.Random,
    deadline: float,
    clock: Callable[[], float],
    out: list[tuple[float, Candidate]],
) -> int:
    """Iterated local search from ``pool[0]``; appends (best makespan, candidate) to ``out``; returns
    the decodings used."""
    n = len(tasks)
    feasible = [t.feasible_sizes() for t in tasks]
    snaps: list[State] = []
    current_cand = pool[0]
    current = decoder.run(current_cand, snaps=snaps)
    best_span, best = current, current_cand
    used = since = restarts = 0
    while used < evaluations:
        if used % 32 == 0 and clock() > deadline:
            break
        sizes, order, prefs = current_cand
        move = rng.random()
        if move < 0.55 or n < 2:
            i = rng.randrange(n)
            if move < 0.35 or n < 2:  # another size (its preferred slot forgotten)
                choices = [s for s in feasible[i] if s != sizes[i]]
                if not choices:
                    used += 1
                    continue
                sizes = sizes.copy()
                prefs = prefs.copy()
                sizes[i], prefs[i] = rng.choice(choices), -1
            else:  # another preferred slot of its size, or none
                choices = [k for k in [-1, *decoder.by_size[sizes[i]]] if k != prefs[i]]
                prefs = prefs.copy()
                prefs[i] = rng.choice(choices)
            position = order.index(i)
        else:
            a, b = rng.sample(range(n), 2)
            order = order.copy()
            if move < 0.75:
                order[a], order[b] = order[b], order[a]
            else:
                order.insert(b, order.pop(a))
            position = min(a, b)
        used += 1
        tail: list[State] = []
        span = decoder.run((sizes, order, prefs), position, snaps[position], current, tail)
        if span <= current:
            if span < current:
                since = 0
            current, current_cand = span, (sizes, order, prefs)
            snaps = snaps[:position] + tail
            if span < best_span:
                best_span, best = span, current_cand
        since += 1
        if since > stall:
            since, restarts = 0, restarts + 1
            if restarts % 2 == 1 and restarts // 2 + 1 < len(pool):
                current_cand = pool[restarts // 2 + 1]
            else:
                sizes, order, prefs = (list(x) for x in best)
                for _ in range(3):
                    i = rng.randrange(n)
                    if rng.random() < 0.5:
                        sizes[i], prefs[i] = rng.choice(feasible[i]), -1
                    else:
                        a, b = rng.sample(range(n), 2) if n > 1 else (0, 0)
                        order.insert(b, order.pop(a))
                current_cand = (sizes, order, prefs)
            snaps = []
            current = decoder.run(current_cand, snaps=snaps)
            used += 1
    out.append((best_span, best))
    return used
