"""Plans: a timeline of instance creations, task runs and destructions on one GPU, and the checker.

A plan is built from an *action list* (what to do, in the order the GPU's reconfiguration lock is
taken) by :func:`schedule`, which gives every action its earliest start: a run waits for its instance
and the previous run on it; a create waits for the reconfiguration clock and for every overlapping
instance to be destroyed; a destroy waits for the last run on the instance. Any planner's timeline is
then validated by :func:`check_plan`, which knows nothing of how it was built.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mig_batch.errors import MigBatchError
from mig_batch.planner.problem import GpuScheme, Slot, Task

EPS = 1e-9


class PlanError(MigBatchError, ValueError):
    """A plan that breaks a rule of the model; the message names the rule and the event."""


@dataclass(frozen=True)
class Create:
    size: int
    start: int


@dataclass(frozen=True)
class Destroy:
    size: int
    start: int


@dataclass(frozen=True)
class Run:
    task: int  # index into the task list
    size: int
    start: int


Action = Create | Destroy | Run


@dataclass(frozen=True)
class Event:
    kind: str  # "create" | "destroy" | "run"
    size: int
    start: int  # instance start (memory slice)
    begin: float
    end: float
    task: int | None = None


@dataclass(frozen=True)
class Plan:
    gpu: str
    events: tuple[Event, ...]
    planner: str = ""

    @property
    def makespan(self) -> float:
        return max((e.end for e in self.events if e.kind == "run"), default=0.0)

    def runs(self) -> list[Event]:
        return sorted((e for e in self.events if e.kind == "run"), key=lambda e: (e.begin, e.start))

    def as_dict(self, tasks: Sequence[Task]) -> dict:
        return {
            "gpu": self.gpu,
            "planner": self.planner,
            "makespan": self.makespan,
            "events": [
                {
                    "kind": e.kind,
                    "size": e.size,
                    "start": e.start,
                    "begin": round(e.begin, 9),
                    "end": round(e.end, 9),
                    **({"task": tasks[e.task].name} if e.task is not None else {}),
                }
                for e in sorted(self.events, key=lambda e: (e.begin, e.end, e.start))
            ],
        }


def schedule(scheme: GpuScheme, tasks: Sequence[Task], actions: Iterable[Action], planner: str = "") -> Plan:
    """Earliest-start timeline of ``actions``; raises PlanError on an action the state does not allow."""
    clock = 0.0  # the reconfiguration lock: one create/destroy at a time
    alive: dict[tuple[int, int], float] = {}  # (size, start) -> time the instance is free
    destroyed_at: dict[tuple[int, int], float] = {}
    events: list[Event] = []
    for action in actions:
        slot = scheme.slot(action.size, action.start)
        key = (slot.size, slot.start)
        if isinstance(action, Create):
            if key in alive:
                raise PlanError(f"create {slot.size}@{slot.start}: the instance already exists")
            blocking = [k for k in alive if scheme.slot(*k).overlaps(slot)]
            if blocking:
                raise PlanError(f"create {slot.size}@{slot.start}: overlaps live instance(s) {blocking}")
            ready = max([clock] + [t for k, t in destroyed_at.items() if scheme.slot(*k).overlaps(slot)])
            end = ready + scheme.create_s[slot.size]
            events.append(Event("create", slot.size, slot.start, ready, end))
            clock = alive[key] = end
        elif isinstance(action, Destroy):
            if key not in alive:
                raise PlanError(f"destroy {slot.size}@{slot.start}: no such instance")
            begin = max(clock, alive.pop(key))
            end = begin + scheme.destroy_s[slot.size]
            events.append(Event("destroy", slot.size, slot.start, begin, end))
            clock = destroyed_at[key] = end
        else:
            if key not in alive:
                raise PlanError(f"run task {action.task} on {slot.size}@{slot.start}: no such instance")
            duration = tasks[action.task].time(slot.size)
            if not math.isfinite(duration):
                raise PlanError(f"task {tasks[action.task].name} cannot run on size {slot.size}")
            begin = alive[key]
            events.append(Event("run", slot.size, slot.start, begin, begin + duration, action.task))
            alive[key] = begin + duration
    return Plan(scheme.model.name, tuple(events), planner)


def check_plan(scheme: GpuScheme, tasks: Sequence[Task], plan: Plan) -> float:
    """Validate a timed plan; return its makespan. Raises PlanError naming the broken rule.

    Rules: every task runs exactly once, for its time on that size; instances sit at allowed starts;
    an instance lives from the start of its create to the end of its destroy (or forever), and live
    instances never overlap, so the GPU holds a valid partition at every instant; runs happen inside
    their instance's life, after its creation and before its destruction, one at a time;
    reconfigurations never overlap each other (one at a time on the GPU) and only touch idle
    instances. The GPU starts empty.
    """
    if plan.gpu != scheme.model.name:
        raise PlanError(f"the plan is for {plan.gpu}, not {scheme.model.name}")
    runs = [e for e in plan.events if e.kind == "run"]
    seen = sorted(e.task for e in runs if e.task is not None)
    if seen != list(range(len(tasks))):
        missing = sorted(set(range(len(tasks))) - set(seen))
        twice = sorted({t for t in seen if seen.count(t) > 1})
        raise PlanError(f"every task must run exactly once (missing {missing}, more than once {twice})")
    for e in plan.events:
        scheme.slot(e.size, e.start)  # allowed start
        if e.begin < -EPS or e.end < e.begin - EPS:
            raise PlanError(f"{e.kind} {e.size}@{e.start} has an impossible interval [{e.begin}, {e.end}]")
        if e.kind == "run":
            expected = tasks[e.task].time(e.size)
            if not math.isfinite(expected) or abs((e.end - e.begin) - expected) > 1e-6 * max(1.0, expected):
                raise PlanError(
                    f"task {tasks[e.task].name} on size {e.size} must take {expected}, plan gives {e.end - e.begin}"
                )
        elif e.kind in ("create", "destroy"):
            expected = (scheme.create_s if e.kind == "create" else scheme.destroy_s)[e.size]
            if e.end - e.begin < expected - 1e-9:
                raise PlanError(
                    f"{e.kind} {e.size}@{e.start} at {e.begin} takes {expected} s, plan gives {e.end - e.begin}"
                )
        else:
            raise PlanError(f"unknown event kind {e.kind!r}")
    reconfigs = sorted((e for e in plan.events if e.kind != "run"), key=lambda e: e.begin)
    for a, b in itertools.pairwise(reconfigs):
        if b.begin < a.end - EPS:
            raise PlanError(f"reconfigurations overlap: {a.kind} {a.size}@{a.start} and {b.kind} {b.size}@{b.start}")
    lives = _lives(scheme, plan)
    for i, (slot_a, born_a, dead_a, *_rest) in enumerate(lives):
        for slot_b, born_b, dead_b, *_ in lives[i + 1 :]:
            if slot_a.overlaps(slot_b) and born_a < dead_b - EPS and born_b < dead_a - EPS:
                raise PlanError(
                    f"instances {slot_a.size}@{slot_a.start} and {slot_b.size}@{slot_b.start} "
                    f"overlap in memory while both alive"
                )
    for slot, _born, dead, created, inside in lives:
        inside.sort(key=lambda e: e.begin)
        for run in inside:
            if run.begin < created - EPS or run.end > dead + EPS:
                raise PlanError(f"task {tasks[run.task].name} runs outside its instance {slot.size}@{slot.start}")
        for a, b in itertools.pairwise(inside):
            if b.begin < a.end - EPS:
                raise PlanError(
                    f"tasks {tasks[a.task].name} and {tasks[b.task].name} share instance "
                    f"{slot.size}@{slot.start} at the same time"
                )
    return plan.makespan


def _lives(scheme: GpuScheme, plan: Plan) -> list[tuple[Slot, float, float, float, list[Event]]]:
    """(slot, born, dead, created-by, runs) per instance life, pairing creates and destroys in time."""
    by_slot: dict[tuple[int, int], list[Event]] = {}
    for e in plan.events:
        by_slot.setdefault((e.size, e.start), []).append(e)
    lives = []
    for (size, start), events in by_slot.items():
        slot = scheme.slot(size, start)
        events.sort(key=lambda e: (e.begin, {"create": 0, "run": 1, "destroy": 2}[e.kind]))
        current: tuple[float, float, list[Event]] | None = None  # (born, created, runs)
        for e in events:
            if e.kind == "create":
                if current is not None:
                    raise PlanError(f"instance {size}@{start} created twice without a destroy")
                current = (e.begin, e.end, [])
            elif e.kind == "run":
                if current is None:
                    raise PlanError(f"task {e.task} runs on {size}@{start}, which does not exist then")
                current[2].append(e)
            else:
                if current is None:
                    raise PlanError(f"destroy of {size}@{start}, which does not exist then")
                lives.append((slot, current[0], e.end, current[1], current[2]))
                if any(r.end > e.begin + EPS for r in current[2]):
                    raise PlanError(f"instance {size}@{start} destroyed while a task runs on it")
                current = None
        if current is not None:
            lives.append((slot, current[0], math.inf, current[1], current[2]))
    return lives
