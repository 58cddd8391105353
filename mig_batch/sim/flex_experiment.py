"""``simulate flex``: Flex-MIG §5's comparison over the synthetic trace categories, plus our two policies.

Two groups, as the paper's two figures:

* ``fig7``: training-only traces, sizes at most 4 (Static-MIG's largest instance), FIFO; FM, DM, SM and
  ours; 3 duration classes x 3 size mixes.
* ``all``: every category (3 x 3 x 3 = 27) with the native sizes (training up to 8); FM, DM and ours,
  SM where every job fits it (inference-only traces); the queue discipline of ``FlexParams.window``.

Per trace and policy the run's metrics, per category the ratios numerator/denominator trace by trace
(the paper's Fig. 7 boxes). Pure code: the run-time sample comes in as numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mig_batch.errors import MigBatchError
from mig_batch.sim.flex import POLICIES, FlexParams, ratio_table, simulate
from mig_batch.sim.flex_workloads import JOB_TYPES, Category, all_categories, generate_trace

RATIO_METRICS = ("makespan_s", "mean_jct_s", "mean_wait_s", "utilisation")
OURS = ("mbdyn", "hybrid")
PAIRS = (("fm", "dm"), ("fm", "sm"), ("mbdyn", "fm"), ("mbdyn", "dm"), ("mbdyn", "sm"),
         ("hybrid", "fm"), ("hybrid", "dm"), ("hybrid", "sm"), ("hybrid", "mbdyn"))  # fmt: skip
FIG7_MAX_SIZE = 4


@dataclass(frozen=True)
class FlexSetup:
    traces_per_category: int = 10
    seed: int = 1
    params: FlexParams = field(default_factory=FlexParams)
    fig7_over_max: str = "cap"  # Fig. 7's "maximum workload size of 4": sizes 6 and 8 capped to 4 or dropped
    durations: tuple[str, ...] = ("short", "medium", "long")

    def __post_init__(self) -> None:
        if self.traces_per_category < 1:
            raise MigBatchError(f"traces per category must be at least 1, got {self.traces_per_category}")


def _trace_seed(setup: FlexSetup, category_index: int, trace: int) -> int:
    return setup.seed * 1_000_003 + category_index * 1_000 + trace


def run_group(
    name: str,
    categories: Sequence[Category],
    runtimes: Sequence[float],
    setup: FlexSetup,
    params: FlexParams,
    max_size: int | None,
) -> dict[str, Any]:
    """Every category of a group: per-trace metrics per policy and the per-category ratios."""
    out: dict[str, Any] = {"categories": {}}
    for ci, category in enumerate(categories):
        per_trace: dict[str, list[dict[str, float]]] = {}
        jobs_per_trace = 0
        for t in range(setup.traces_per_category):
            jobs = generate_trace(category, runtimes, _trace_seed(setup, ci, t), max_size, over_max=setup.fig7_over_max)
            jobs_per_trace = len(jobs)
            for policy in POLICIES:
                if policy == "sm" and max(j.size for j in jobs) > FIG7_MAX_SIZE:
                    continue  # Static-MIG's largest instance is 4g.20gb
                per_trace.setdefault(policy, []).append(simulate(policy, jobs, params).metrics())
        ratios = {
            f"{a}/{b}": {metric: ratio_table(per_trace, a, b, metric) for metric in RATIO_METRICS}
            for a, b in PAIRS
            if a in per_trace and b in per_trace
        }
        means = {
            policy: {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
            for policy, rows in per_trace.items()
        }
        out["categories"][category.name] = {"per_trace": per_trace, "mean": means, "ratios": ratios,
                                            "jobs_per_trace": jobs_per_trace}  # fmt: skip
    out["overall"] = overall_ratios(out["categories"])
    out["name"] = name
    return out


def overall_ratios(categories: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Mean, min and max of the per-trace makespan ratios of each pair over all categories of a group."""
    pooled: dict[str, list[float]] = {}
    for cell in categories.values():
        for pair, by_metric in cell["ratios"].items():
            pooled.setdefault(pair, []).extend(by_metric["makespan_s"]["values"])
    return {pair: {"mean": sum(v) / len(v), "min": min(v), "max": max(v), "traces": len(v)}
            for pair, v in pooled.items() if v}  # fmt: skip


def run_flex_experiment(runtimes: Sequence[float], setup: FlexSetup) -> dict[str, Any]:
    fig7 = [Category(d, m, "train") for d in setup.durations for m in ("small", "balanced", "large")]
    fifo = replace(setup.params, window=1)
    every = [c for c in all_categories(JOB_TYPES) if c.duration in setup.durations]
    params = asdict(setup.params)
    params["slowdown_by_size"] = {str(k): v for k, v in setup.params.slowdown_by_size.items()}
    return {
        "setup": {
            "traces_per_category": setup.traces_per_category,
            "seed": setup.seed,
            "fig7_over_max": setup.fig7_over_max,
            "params": params,
        },
        "groups": {
            "fig7": run_group("fig7", fig7, runtimes, setup, fifo, FIG7_MAX_SIZE),
            "all": run_group("all", every, runtimes, setup, setup.params, None),
        },
    }


def csv_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per group, category, trace and policy."""
    rows = []
    for group, data in result["groups"].items():
        for category, cell in data["categories"].items():
            for policy, traces in cell["per_trace"].items():
                for t, metrics in enumerate(traces):
                    rows.append({"group": group, "category": category, "trace": t, "policy": policy, **metrics})
    return rows
