"""FAR (Villarrubia et al., JPDC 2025; MIG-DRL §2.3): a 3-phase batch planner, written from the
authors' public Python reference (artecs-group/RL_MIG_scheduler @ b5c1b9c,
visual_scheduler/FAR_scheduler/algorithm.py, MIT) read for its semantics, not copied.

1. Allotment family: every task on its minimum-area size; then, repeatedly, the longest task moves to
   its minimum-area larger size, until the longest task already has the whole GPU.
2. For each allotment, a greedy on the partition tree (root = whole GPU; a node's children split it
   into the next smaller instances): instances are visited by earliest end; an instance whose size
   still has tasks runs the longest one (created first if new); otherwise it is destroyed and its
   children inherit its end. One GPU-wide reconfiguration clock serialises creates and destroys.
   The allotment with the smallest makespan wins (first on ties).
3. Refinement: leaves whose slice ends at the makespan are critical; a task of a critical instance
   moves (or swaps with one of similar time) to the same-size instance that frees earliest, walking
   up to the parent when neither is possible; at most 100 rounds; then times are recomputed.

Deliberate deviations (docs/planner.md): the refined plan is kept only if it is shorter (the
reference keeps it even when the slice-end bookkeeping misjudged it); tasks never grow to a size
where they cannot run; the partition tree is derived from the GPU model's placements (identical
to the reference's hand-written trees for A100/H100 and A30). ``far_phases`` exposes the unguarded
phase-2 and phase-3 makespans for the golden tests against the reference.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from mig_batch.planner.plan import Event, Plan
from mig_batch.planner.problem import GpuScheme, Slot, Task

Allotment = list[int]  # task index -> size


def allotment_family(tasks: Sequence[Task], full_size: int) -> list[Allotment]:
    def area(task: Task, size: int) -> float:
        return size * task.time(size)

    def min_area(task: Task, above: int) -> int | None:
        sizes = [s for s in task.feasible_sizes() if s > above]
        return min(sizes, key=lambda s: area(task, s)) if sizes else None  # first (smallest) on ties

    first = [min_area(t, 0) for t in tasks]
    family: list[Allotment] = [[s for s in first if s is not None]]
    while True:
        current = family[-1]
        longest = max(range(len(tasks)), key=lambda i: tasks[i].time(current[i]))  # first on ties
        if current[longest] == full_size:
            break
        grown = min_area(tasks[longest], current[longest])
        if grown is None:  # deviation: the reference would grow it onto a size it cannot run on
            break
        family.append([*current[:longest], grown, *current[longest + 1 :]])
    return family


@dataclass(eq=False)
class _Node:
    slot: Slot
    slices: list[int]  # compute slices (the reference's view: 3 slices at 0 do not include slice 3)
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)
    tasks: list[list[float]] = field(default_factory=list)  # [time, task index, start]
    end: float = 0.0

    def __lt__(self, other: _Node) -> bool:  # the heap orders by end only, like the reference
        return self.end < other.end

    @property
    def size(self) -> int:
        return self.slot.size


def partition_tree(scheme: GpuScheme) -> _Node:
    """Root = the whole GPU; children cover a node with the largest smaller slots inside it."""
    top = max(scheme.sizes)
    root_slot = scheme.slots[top][0]

    def build(slot: Slot, parent: _Node | None) -> _Node:
        node = _Node(slot, list(range(slot.start, slot.start + slot.size)), parent)
        remaining = slot.window
        for size in sorted((s for s in scheme.sizes if s < slot.size), reverse=True):
            for child in scheme.slots[size]:
                if child.window & ~remaining == 0:
                    node.children.append(build(child, node))
                    remaining &= ~child.window
        return node

    return build(root_slot, None)


def _nodes(node: _Node) -> list[_Node]:
    out = [node]
    for child in node.children:
        out += _nodes(child)
    return out


def _leaves(node: _Node) -> list[_Node]:
    return [n for n in _nodes(node) if not n.children]


def _reconfigure(scheme: GpuScheme, kind: str, node: _Node, clock: float, events: list[Event]) -> float:
    """Create or destroy ``node``'s instance once the clock and the instance allow; the new clock."""
    begin = max(clock, node.end)
    end = begin + (scheme.create_s if kind == "create" else scheme.destroy_s)[node.size]
    events.append(Event(kind, node.size, node.slot.start, begin, end))
    return end


def _greedy_tree(scheme: GpuScheme, tasks: Sequence[Task], allotment: Allotment) -> tuple[_Node, list[Event]]:
    groups: dict[int, list[tuple[float, int]]] = {}
    for index, size in enumerate(allotment):
        groups.setdefault(size, []).append((tasks[index].time(size), index))
    for size in groups:
        groups[size].sort(reverse=True)  # longest first; equal times: higher index first
    tree = partition_tree(scheme)
    events: list[Event] = []
    clock = 0.0
    heap = [tree]
    while heap:
        node = heapq.heappop(heap)
        if node.size in groups:
            if not node.tasks:
                clock = node.end = _reconfigure(scheme, "create", node, clock, events)
            time, index = groups[node.size].pop(0)
            if not groups[node.size]:
                del groups[node.size]
            node.tasks.append([time, index, node.end])
            events.append(Event("run", node.size, node.slot.start, node.end, node.end + time, index))
            node.end += time
            heapq.heappush(heap, node)
        elif groups:
            if node.tasks:
                clock = _reconfigure(scheme, "destroy", node, clock, events)
            for child in node.children:
                child.end = node.end
                heapq.heappush(heap, child)
    return tree, events


def _makespan(events: list[Event]) -> float:
    return max((e.end for e in events if e.kind == "run"), default=0.0)


def _retime(scheme: GpuScheme, tree: _Node) -> list[Event]:
    """Recompute start times of a tree whose task lists were changed (the reference's final pass)."""
    events: list[Event] = []
    done = {id(n): 0 for n in _nodes(tree)}
    tree.end = 0.0
    clock = 0.0
    heap = [tree]
    while heap:
        node = heapq.heappop(heap)
        if not node.tasks:
            for child in node.children:
                child.end = node.end
                heapq.heappush(heap, child)
            continue
        if done[id(node)] == 0:
            clock = node.end = _reconfigure(scheme, "create", node, clock, events)
        if done[id(node)] < len(node.tasks):
            task = node.tasks[done[id(node)]]
            done[id(node)] += 1
            task[2] = node.end
            events.append(Event("run", node.size, node.slot.start, node.end, node.end + task[0], int(task[1])))
            node.end += task[0]
            heapq.heappush(heap, node)
        else:
            clock = _reconfigure(scheme, "destroy", node, clock, events)
            for child in node.children:
                child.end = node.end
                heapq.heappush(heap, child)
    return events


def _closest_below(tasks: list[list[float]], upper: float, target: float) -> int | None:
    """The reference's binary probe over a decreasing list: a task shorter than ``upper`` whose time
    is close to ``target`` (only the probed positions are candidates; position 0 can be replaced)."""
    pos = None
    left, right = 0, len(tasks) - 1
    while left <= right:
        mid = (left + right) // 2
        if tasks[mid][0] >= target:
            left = mid + 1
        else:
            right = mid - 1
        if tasks[mid][0] < upper - 1e-5 and (not pos or tasks[mid][0] - target < abs(tasks[pos][0] - target)):
            pos = mid
    return pos


def _insert_decreasing(tasks: list[list[float]], task: list[float]) -> None:
    left, right = 0, len(tasks) - 1
    while left <= right:
        mid = (left + right) // 2
        if tasks[mid][0] < task[0]:
            right = mid - 1
        else:
            left = mid + 1
    tasks.insert(left, task)


def _swap_pair(mine: list[list[float]], theirs: list[list[float]], margin: float) -> tuple[int, int] | None:
    """Two decreasing lists: the pair whose time difference lies in (0, margin), closest to margin/2."""
    best, pair = float("inf"), None
    i = j = 0
    while i < len(mine) and j < len(theirs):
        diff = mine[i][0] - theirs[j][0]
        if diff <= 0:
            j += 1
        elif diff >= margin:
            i += 1
        else:
            if abs(diff - margin / 2) < best:
                best, pair = abs(diff - margin / 2), (i, j)
            if diff < margin / 2:
                j += 1
            else:
                i += 1
    return pair


def _refine(scheme: GpuScheme, tree: _Node, makespan: float) -> list[Event]:
    nodes = _nodes(tree)
    leaves = _leaves(tree)
    same_size: dict[int, list[_Node]] = {}
    for node in nodes:
        same_size.setdefault(node.size, []).append(node)
    slice_end = [0.0] * len(tree.slices)
    for node in nodes:
        if node.tasks:
            last = node.tasks[-1]
            for s in node.slices:
                slice_end[s] = max(slice_end[s], last[2] + last[0])
    # a 3-slice instance at 0 also holds slice 3's memory: the reference shifts slice 3 with it
    shadow = len(leaves) > 3

    def shift(node: _Node, delta: float) -> None:
        for s in node.slices:
            slice_end[s] += delta
        if shadow and len(node.slices) == 3 and node.slices[0] == 0:
            slice_end[3] += delta

    queue: list[_Node] = []
    stop, rounds = False, 0
    while not stop and rounds < 100:
        rounds += 1
        queue += [leaf for leaf in leaves if slice_end[leaf.slices[0]] == makespan]
        while queue:
            node = queue.pop(0)
            if node.parent is None:
                stop = True
                break
            alt, free_at = None, float("inf")
            for candidate in same_size[node.size]:
                last = max(slice_end[s] for s in candidate.slices)
                if last < free_at:
                    alt, free_at = candidate, last
            if alt is not node and alt is not None:
                gap = makespan - free_at
                index = _closest_below(node.tasks, gap, gap / 2)
                if index is not None:
                    task = node.tasks.pop(index)
                    _insert_decreasing(alt.tasks, task)
                    shift(node, -task[0])
                    shift(alt, task[0])
                    continue
                pair = _swap_pair(node.tasks, alt.tasks, gap)
                if pair is not None:
                    mine, theirs = node.tasks.pop(pair[0]), alt.tasks.pop(pair[1])
                    _insert_decreasing(alt.tasks, mine)
                    _insert_decreasing(node.tasks, theirs)
                    shift(node, -mine[0])
                    shift(alt, mine[0])
                    shift(alt, -theirs[0])
                    shift(node, theirs[0])
                    continue
            if not queue or queue[-1] is not node.parent:
                queue.append(node.parent)
        makespan = max(slice_end)
    return _retime(scheme, tree)


@dataclass(frozen=True)
class FarPhases:
    phase2: Plan  # best allotment's greedy tree
    phase3: Plan  # after refinement, kept as the reference keeps it
    allotments: int


def far_phases(scheme: GpuScheme, tasks: Sequence[Task]) -> FarPhases:
    family = allotment_family(tasks, max(scheme.sizes))
    best: tuple[float, _Node, list[Event]] | None = None
    for allotment in family:
        tree, events = _greedy_tree(scheme, tasks, allotment)
        span = _makespan(events)
        if best is None or span < best[0]:
            best = (span, tree, events)
    assert best is not None
    span, tree, events = best
    refined = _refine(scheme, tree, span)
    name = scheme.model.name
    return FarPhases(Plan(name, tuple(events), "far"), Plan(name, tuple(refined), "far"), len(family))


def plan_far(scheme: GpuScheme, tasks: Sequence[Task]) -> Plan:
    phases = far_phases(scheme, tasks)
    return phases.phase3 if phases.phase3.makespan < phases.phase2.makespan else phases.phase2
