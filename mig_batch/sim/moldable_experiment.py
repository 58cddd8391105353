"""``mig-batch simulate moldable``: live planners (EFT, FAR-live, auto-live) on arriving workloads.

Every (workload, load, seed) cell builds one arrival sequence and runs it under each planner; the
means over seeds, and per cell the live planners against EFT (relative change of makespan, mean
completion and rigid jobs' mean wait), are what the command prints. Pure code (the caller reads
the data files).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from mig_batch.planner.problem import Task
from mig_batch.sim.moldable_live import LIVE_SIM_PLANNERS, LiveSimSetup, simulate_live
from mig_batch.sim.moldable_workloads import build_workload
from mig_batch.sim.traces import TracePod

METRICS = ("makespan", "mean_completion", "rigid_wait", "idle", "reconfigs")


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.fmean(kept) if kept else math.nan


def _change(new: float, base: float) -> float:
    return (new - base) / base * 100 if base and not math.isnan(base) and not math.isnan(new) else math.nan


def run_live_matrix(workloads: Sequence[str], loads: Sequence[float], seeds: Sequence[int], setup: LiveSimSetup,
                    jobs: int, rodinia: Sequence[Task] | None = None, pods: Sequence[TracePod] | None = None,
                    planners: Sequence[str] = LIVE_SIM_PLANNERS, rigid_share: float = 0.25, noise: float = 0.1,
                    progress: Callable[[], None] | None = None, baseline: str = "eft") -> dict[str, Any]:  # fmt: skip
    """{"cells": [...one per workload x load x seed x planner...], "mean": {workload: {load: {planner:
    metrics}}}, "baseline": baseline, "vs_baseline": {workload: {load: {planner: % change of the means}}}}"""
    cells: list[dict[str, Any]] = []
    for workload in workloads:
        for load in loads:
            for seed in seeds:
                arrivals = build_workload(workload, jobs, setup.gpus, load, seed, rigid_share, noise, rodinia, pods)
                for planner in planners:
                    result = simulate_live(arrivals, setup, planner)
                    cells.append({"workload": workload, "load": load, "seed": seed, **result.as_dict()})
                    if progress is not None:
                        progress()
    mean: dict[str, Any] = {}
    vs: dict[str, Any] = {}
    for workload in workloads:
        for load in loads:
            here = [c for c in cells if (c["workload"], c["load"]) == (workload, load)]
            per = {p: {m: _mean([c[m] for c in here if c["planner"] == p]) for m in METRICS} for p in planners}
            mean.setdefault(workload, {})[str(load)] = per
            if baseline in per:
                vs.setdefault(workload, {})[str(load)] = {
                    p: {m: _change(per[p][m], per[baseline][m]) for m in ("makespan", "mean_completion", "rigid_wait")}
                    for p in planners
                    if p != baseline
                }
    return {"setup": {**setup.__dict__, "jobs": jobs, "rigid_share": rigid_share, "noise": noise,
                      "seeds": list(seeds), "loads": list(loads), "workloads": list(workloads)},
            "cells": cells, "mean": mean, "baseline": baseline, "vs_baseline": vs}  # fmt: skip


def verdict(result: dict[str, Any]) -> list[str]:
    """Per cell and planner: ahead of the baseline on makespan or mean completion without rigid waits
    rising by more than 5 %? (the issue's acceptance)."""
    out = []
    for workload, loads in result["vs_baseline"].items():
        for load, per in loads.items():
            for planner, d in per.items():
                ahead = d["makespan"] < 0 or d["mean_completion"] < 0
                rigid_ok = math.isnan(d["rigid_wait"]) or d["rigid_wait"] <= 5.0
                out.append(
                    f"{workload} load {load} {planner} vs {result['baseline']}: "
                    f"{'meets' if ahead and rigid_ok else 'misses'} "
                    f"(makespan {d['makespan']:+.1f} %, mean completion {d['mean_completion']:+.1f} %, "
                    f"rigid wait {d['rigid_wait']:+.1f} %)"
                )
    return out
