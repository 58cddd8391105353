"""The baselines of MIG-DRL §5.3: NOMIG, FIXBEST and MISO, as action lists timed by ``schedule``."""

from __future__ import annotations

import math
from collections.abc import Sequence

from mig_batch.planner.plan import Action, Create, Destroy, Plan, PlanError, Run, schedule
from mig_batch.planner.problem import GpuScheme, Slot, Task


def plan_nomig(scheme: GpuScheme, tasks: Sequence[Task]) -> Plan:
    """The whole GPU as one instance, tasks one after another in queue order."""
    whole = scheme.slots[max(scheme.sizes)][0]
    for task in tasks:
        if not math.isfinite(task.time(whole.size)):
            raise PlanError(f"task {task.name} cannot run on the whole GPU")
    actions: list[Action] = [Create(whole.size, whole.start)]
    actions += [Run(i, whole.size, whole.start) for i in range(len(tasks))]
    return schedule(scheme, tasks, actions, "nomig")


def fifo_on_partition(scheme: GpuScheme, tasks: Sequence[Task], partition: Sequence[Slot]) -> list[Action] | None:
    """Create the partition, then each task in queue order on the instance that frees first and can
    run it (ties: partition order). None if some task fits no instance of the partition."""
    free = dict.fromkeys(partition, 0.0)
    clock = 0.0
    for slot in partition:
        clock += scheme.create_s[slot.size]
        free[slot] = clock
    actions: list[Action] = [Create(s.size, s.start) for s in partition]
    for index, task in enumerate(tasks):
        options = [s for s in partition if math.isfinite(task.time(s.size))]
        if not options:
            return None
        slot = min(options, key=lambda s: free[s])
        free[slot] += task.time(slot.size)
        actions.append(Run(index, slot.size, slot.start))
    return actions


def plan_fixbest(scheme: GpuScheme, tasks: Sequence[Task]) -> Plan:
    """The best single partition for the batch (every maximal partition tried), FIFO on it."""
    best: Plan | None = None
    for partition in scheme.partitions:
        actions = fifo_on_partition(scheme, tasks, partition)
        if actions is None:
            continue
        plan = schedule(scheme, tasks, actions, "fixbest")
        if best is None or plan.makespan < best.makespan:
            best = plan
    if best is None:
        raise PlanError("no single partition can run every task")
    return best


def speedup(task: Task, size: int) -> float:
    """Speed relative to the task's smallest feasible size; 0 where it cannot run."""
    base = task.feasible_sizes()[0]
    time = task.time(size)
    return task.time(base) / time if math.isfinite(time) else 0.0


def plan_miso(scheme: GpuScheme, tasks: Sequence[Task]) -> Plan:
    """MISO (Li et al., SoCC'22) as MIG-DRL §5.3 describes it: whenever an instance frees, among the
    configurations that keep every busy instance, take the one whose free instances, given the next
    queued tasks in FIFO order, add the most speedup (ties: fewest instances to create). Idle
    instances in the way are destroyed; kept ones are reused."""
    actions: list[Action] = []
    free: dict[Slot, float] = {}  # live instance -> time its last task ends
    clock, now = 0.0, 0.0
    queue = list(range(len(tasks)))
    while queue:
        busy = {s for s, t in free.items() if t > now}
        best: tuple[tuple[float, int], list[Slot]] | None = None
        for partition in scheme.partitions:
            if not busy <= set(partition):
                continue
            open_slots = [s for s in partition if s not in busy][: len(queue)]
            head = queue[: len(open_slots)]
            if not open_slots or any(speedup(tasks[i], s.size) == 0 for i, s in zip(head, open_slots, strict=True)):
                continue
            gain = sum(speedup(tasks[i], s.size) for i, s in zip(head, open_slots, strict=True))
            key = (gain, -sum(1 for s in open_slots if s not in free))
            if best is None or key > best[0]:
                best = (key, open_slots)
        if best is None:
            if not busy:
                raise PlanError(f"task {tasks[queue[0]].name} fits no configuration")
            now = min(free[s] for s in busy)
            continue
        for slot in best[1]:
            index = queue.pop(0)
            if slot not in free:
                for old in sorted((s for s in free if s.overlaps(slot)), key=lambda s: s.start):
                    clock = max(clock, free.pop(old)) + scheme.destroy_s[old.size]
                    actions.append(Destroy(old.size, old.start))
                clock += scheme.create_s[slot.size]
                free[slot] = clock
                actions.append(Create(slot.size, slot.start))
            free[slot] += tasks[index].time(slot.size)
            actions.append(Run(index, slot.size, slot.start))
        later = [t for t in free.values() if t > now]
        now = min(later) if later else now
    return schedule(scheme, tasks, actions, "miso")
