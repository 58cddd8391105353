"""Placement experiments: the MFI Monte Carlo protocol (MFI §VI), reproducible by seed.

Each run draws one arrival sequence per (distribution, seed) and feeds the *same* sequence to every
policy, so policies are compared on identical inputs. Runs are spread over worker processes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

from mig_batch.mig.models import get_model
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.policies import make_policy
from mig_batch.sim.engine import METRICS, run_online
from mig_batch.sim.verdict import REFERENCE_POLICY, acceptance_by_profile, mark_starvation
from mig_batch.sim.workloads import MFI_DISTRIBUTIONS, mfi_arrivals

PAPER_POLICIES = ("mfi", "ff", "rr", "bf-bi", "wf-bi")
SNAPSHOT_DEMAND = 0.85


def demand_checkpoints(max_demand: float = 1.0) -> tuple[float, ...]:
    """5%, 10%, ... up to ``max_demand`` (MFI sweeps to 100%; past it the cluster is overloaded)."""
    return tuple(round(0.05 * i, 2) for i in range(1, round(max_demand / 0.05) + 1))


@dataclass(frozen=True)
class MfiSetup:
    model: str = "A100-80GB"
    gpus: int = 100
    runs: int = 500
    seed: int = 1
    policies: tuple[str, ...] = PAPER_POLICIES
    distributions: tuple[str, ...] = tuple(MFI_DISTRIBUTIONS)
    checkpoints: tuple[float, ...] = demand_checkpoints(1.0)
    departures: bool = True  # False: the FGD "fill" protocol, nothing leaves

    @property
    def served_metric(self) -> str:
        """Served demand: accepted slices x duration with departures; accepted slices when nothing leaves."""
        return "accepted_slice_time" if self.departures else "accepted_slices"


def _one_run(setup: MfiSetup, distribution: str, run: int) -> dict[str, list[dict[str, float]]]:
    model = get_model(setup.model)
    arrivals = mfi_arrivals(
        model,
        setup.gpus,
        MFI_DISTRIBUTIONS[distribution],
        seed=setup.seed + run,
        demand=max(setup.checkpoints),
        departures=setup.departures,
    )
    out = {}
    for name in setup.policies:
        cluster = Cluster.homogeneous(model.name, setup.gpus)
        snaps = run_online(cluster, make_policy(name), model.name, arrivals, setup.checkpoints)
        out[name] = [s.as_dict() for s in snaps]
    return out


def _task(args: tuple[MfiSetup, str, int]) -> tuple[str, dict[str, list[dict[str, float]]]]:
    setup, distribution, run = args
    return distribution, _one_run(setup, distribution, run)


def run_mfi_experiment(
    setup: MfiSetup, workers: int = 1, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Mean and standard deviation of every metric per distribution, policy and demand checkpoint."""
    for name in setup.policies:
        make_policy(name)  # unknown names fail before any work starts
    if REFERENCE_POLICY not in setup.policies:  # starvation is judged against it
        setup = replace(setup, policies=(*setup.policies, REFERENCE_POLICY))
    for distribution in setup.distributions:
        if distribution not in MFI_DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {distribution!r}; known: {', '.join(MFI_DISTRIBUTIONS)}")
    tasks = [(setup, d, r) for d in setup.distributions for r in range(setup.runs)]
    collected: dict[str, dict[str, list[list[dict[str, float]]]]] = {
        d: {p: [] for p in setup.policies} for d in setup.distributions
    }
    with ExitStack() as stack:
        if workers <= 1:
            results_iter = map(_task, tasks)
        else:
            results_iter = stack.enter_context(ProcessPoolExecutor(workers)).map(_task, tasks, chunksize=8)
        for done, (distribution, per_policy) in enumerate(results_iter, 1):
            for name, snaps in per_policy.items():
                collected[distribution][name].append(snaps)
            if progress:
                progress(done, len(tasks))
    return {
        "experiment": "mfi",
        "setup": {
            "model": setup.model,
            "gpus": setup.gpus,
            "runs": setup.runs,
            "seed": setup.seed,
            "policies": list(setup.policies),
            "distributions": list(setup.distributions),
            "checkpoints": list(setup.checkpoints),
            "departures": setup.departures,
            "served_metric": setup.served_metric,
            "starvation_reference": REFERENCE_POLICY,
        },
        "results": {
            d: {p: _aggregate(runs, setup.checkpoints) for p, runs in per.items()} for d, per in collected.items()
        },
    }


def _aggregate(runs: Sequence[Sequence[dict[str, float]]], checkpoints: Sequence[float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in METRICS:
        means, stds = [], []
        for i in range(len(checkpoints)):
            values = [run[i][metric] for run in runs if i < len(run)]
            means.append(statistics.fmean(values) if values else float("nan"))
            stds.append(statistics.pstdev(values) if len(values) > 1 else 0.0)
        out[metric] = {"mean": means, "std": stds}
    pooled = []  # per checkpoint: acceptance of each profile over all runs' requests together
    for i in range(len(checkpoints)):
        arrived: dict[str, int] = {}
        accepted: dict[str, int] = {}
        for run in runs:
            if i < len(run):
                for profile, n in run[i]["arrived_by_profile"].items():
                    arrived[profile] = arrived.get(profile, 0) + n
                for profile, n in run[i]["accepted_by_profile"].items():
                    accepted[profile] = accepted.get(profile, 0) + n
        pooled.append(acceptance_by_profile(arrived, accepted))
    out["acceptance_by_profile"] = pooled
    return out


def at_demand(result: dict[str, Any], demand: float = SNAPSHOT_DEMAND) -> dict[str, dict[str, dict[str, Any]]]:
    """Metric means per distribution and policy at one demand checkpoint, with ``served`` (the
    protocol's served demand), ``acceptance_by_profile`` and ``starved`` profiles."""
    setup = result["setup"]
    index = setup["checkpoints"].index(demand)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for d, per in result["results"].items():
        out[d] = {}
        for p, metrics in per.items():
            summary: dict[str, Any] = {m: v["mean"][index] for m, v in metrics.items() if m in METRICS}
            summary["served"] = summary[setup.get("served_metric", "accepted_slices")]
            summary["acceptance_by_profile"] = metrics["acceptance_by_profile"][index]
            out[d][p] = summary
        if setup.get("starvation_reference", REFERENCE_POLICY) in out[d]:
            mark_starvation(out[d], setup.get("starvation_reference", REFERENCE_POLICY))
    return out
