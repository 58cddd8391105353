"""Planner registry: one name per planner, each (scheme, tasks) -> Plan."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mig_batch.planner.auto import plan_auto
from mig_batch.planner.baselines import plan_fixbest, plan_miso, plan_nomig
from mig_batch.planner.far import plan_far
from mig_batch.planner.multi import MultiPlan, plan_multi
from mig_batch.planner.plan import Plan
from mig_batch.planner.problem import GpuScheme, Task, check_tasks

PLANNERS: dict[str, Callable[[GpuScheme, Sequence[Task]], Plan]] = {
    "auto": plan_auto,
    "far": plan_far,
    "miso": plan_miso,
    "fixbest": plan_fixbest,
    "nomig": plan_nomig,
}


def _planner(name: str) -> Callable[[GpuScheme, Sequence[Task]], Plan]:
    if name not in PLANNERS:
        raise ValueError(f"unknown planner {name!r}; known: {', '.join(PLANNERS)}")
    return PLANNERS[name]


def make_plan(name: str, scheme: GpuScheme, tasks: Sequence[Task]) -> Plan:
    planner = _planner(name)
    check_tasks(tasks, scheme)
    return planner(scheme, tasks)


def make_multi_plan(name: str, schemes: Sequence[GpuScheme], tasks: Sequence[Task]) -> MultiPlan:
    """One batch over several GPUs (one timeline each), every GPU planned by ``name``."""
    return plan_multi(schemes, tasks, _planner(name))
