"""Makespan lower bound (MIG-DRL §5.2) and p_opt.

l = min over non-empty size subsets S of (L_tasks(S) + L_reconfig(S)) / K, where each task adds its
least area over sizes in S counting the slices that must idle beside it (Idle(s, S): the fewest
slices of sizes outside S in any maximal partition holding an s instance), and every size in S is
created at least once. Deviation: the paper also adds each size's destroy time; a plan's last
instances need not be destroyed before the makespan, so with it the bound exceeds the optimum (one
task alone on the whole GPU). We count creates only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

from mig_batch.planner.problem import GpuScheme, Task


def idle_slices(scheme: GpuScheme, size: int, used: frozenset[int]) -> int:
    best = math.inf
    for partition in scheme.partitions:
        if any(slot.size == size for slot in partition):
            best = min(best, sum(slot.size for slot in partition if slot.size not in used))
    return int(best) if math.isfinite(best) else scheme.slices


def lower_bound(scheme: GpuScheme, tasks: Sequence[Task]) -> float:
    if not tasks:
        return 0.0
    best = math.inf
    sizes = scheme.sizes
    for r in range(1, len(sizes) + 1):
        for subset in combinations(sizes, r):
            used = frozenset(subset)
            idle = {s: idle_slices(scheme, s, used) for s in subset}
            area = sum(s * scheme.create_s[s] for s in subset)
            for task in tasks:
                area += min((s + idle[s]) * task.time(s) for s in subset)
            best = min(best, area / scheme.slices)
    return best


def p_opt(makespan: float, bound: float) -> float:
    """(makespan / lower bound - 1) x 100: at most this far from the optimum, in percent."""
    return (makespan / bound - 1) * 100
