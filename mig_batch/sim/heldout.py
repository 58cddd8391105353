"""Held-out variants of the robustness suite (issue 51 point 4): cells the suite never runs.

The default placement policy is chosen by the suite (mig_batch.sim.robust); these cells check the choice
on workloads nobody tuned on. Each family is fixed here, before any of its cells was run:

- ``fill-seeds``: the suite's four MFI mixes, fill protocol on A100-80GB, 8/16/32/64 GPUs, but seeds
  ``101..200`` (the suite uses 1..100);
- ``fill-mixes``: six new request mixes over the six A100-80GB profiles, shares drawn from a flat
  Dirichlet (normalised Exp(1) draws of ``random.Random(51)``), fill protocol on 12 and 40 GPUs,
  seeds 1..100;
- ``fill-a30``: another GPU, A30-24GB (4 memory slices; 1g.6gb, 2g.12gb, 4g.24gb), three mixes
  (uniform, small-heavy 0.6/0.3/0.1, big-heavy 0.1/0.3/0.6), fill protocol on 16 and 64 GPUs, seeds 1..100;
- ``trace-load``: every distinct trace variant with its arrival times divided by the load factor
  (durations kept): x0.75 on 10 and 20 GPUs, x1.5 on 20 and 40 GPUs (the suite: x1 on 8/16/32/64);
- ``trace-window``: every distinct trace variant cut at its median arrival into two halves, each
  replayed alone from an empty cluster (time from the window's first arrival), on 10 and 20 GPUs;
- ``trace-a30``: every distinct trace variant mapped to A30-24GB profiles by GRMU's rule (instead of
  A100-40GB), on the first hosts holding 20 and 30 GPUs;
- ``synth-trace``: generated trace-like workloads (no trace file needed): 1,500 pods on A100-40GB with
  the default trace's profile shares (``TRACE_SHARES``), Poisson arrivals at 6 an hour, log-normal run
  times (sigma 1.2, mean 3 h), replayed in time on 8 and 12 GPUs; served demand averaged over seeds
  101..120 per cell.

Cells are judged as in the suite (``judge_cell``: gap to the best non-starving policy, 0.2 % tie bar,
starvation against ``nvidia``) and summarised per family and over all of them.

``python -m mig_batch.sim.heldout --trace-dir DIR [--workers N] [--out FILE]``: without the trace
folder only the fill families run.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mig_batch.mig.models import get_model
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.policies import make_policy
from mig_batch.sim.engine import run_timeline
from mig_batch.sim.robust import FILL_DEMAND, FILL_MODEL, POD_PREFIX, fill_runs, judge_cell, summarise, trace_variants
from mig_batch.sim.trace_experiment import (
    HOUR,
    NODE_FILE,
    POD_FILE,
    TRACE_POLICIES,
    default_policy_options,
    replay_trace,
)
from mig_batch.sim.traces import TraceNode, read_nodes, read_pods, read_variant_pods, trace_arrivals
from mig_batch.sim.verdict import REFERENCE_POLICY, acceptance_by_profile, mark_starvation
from mig_batch.sim.workloads import MFI_DISTRIBUTIONS, Arrival

FAMILIES = ("fill-seeds", "fill-mixes", "fill-a30", "synth-trace", "trace-load", "trace-window", "trace-a30")
FILL_SEEDS = range(101, 201)  # the suite's fill cells use seeds 1..100
NEW_SEEDS = range(1, 101)  # for workloads the suite has never seen at any seed
MIX_SEED = 51
A30 = "A30-24GB"
A30_MIXES: dict[str, dict[str, float]] = {
    "a30-uniform": {"1g.6gb": 1 / 3, "2g.12gb": 1 / 3, "4g.24gb": 1 / 3},
    "a30-small": {"1g.6gb": 0.6, "2g.12gb": 0.3, "4g.24gb": 0.1},
    "a30-big": {"1g.6gb": 0.1, "2g.12gb": 0.3, "4g.24gb": 0.6},
}
TRACE_LOADS: dict[float, tuple[int, ...]] = {0.75: (10, 20), 1.5: (20, 40)}
WINDOW_GPUS = (10, 20)
A30_TRACE_GPUS = (20, 30)
# the default trace's requests as GRMU maps them to A100-40GB (8,063: docs/placement.md), as shares
TRACE_SHARES = {"7g.40gb": 4979, "1g.5gb": 1193, "3g.20gb": 943, "4g.20gb": 400, "2g.10gb": 346, "1g.10gb": 202}
SYNTH_SEEDS = range(101, 121)
SYNTH_GPUS = (8, 12)


def dirichlet_mixes(count: int = 6, seed: int = MIX_SEED) -> dict[str, dict[str, float]]:
    """``count`` request mixes over the A100-80GB profiles of MFI Table II, flat Dirichlet draws."""
    rng = random.Random(seed)
    profiles = list(MFI_DISTRIBUTIONS["uniform"])
    out = {}
    for i in range(1, count + 1):
        draws = [rng.expovariate(1.0) for _ in profiles]
        total = sum(draws)
        out[f"dir{i}"] = {p: round(d / total, 4) for p, d in zip(profiles, draws, strict=True)}
    return out


def scale_load(arrivals: Sequence[Arrival], load: float) -> list[Arrival]:
    """The same pods arriving ``load`` times as fast (times divided by ``load``), run times kept."""
    return [replace(a, slot=round(a.slot / load)) for a in arrivals]


def halves(arrivals: Sequence[Arrival]) -> tuple[list[Arrival], list[Arrival]]:
    """The arrivals cut at the median one; each half starts at time 0 (nothing carries over)."""
    cut = len(arrivals) // 2
    out = []
    for part in (arrivals[:cut], arrivals[cut:]):
        origin = part[0].slot if part else 0
        out.append([replace(a, slot=a.slot - origin) for a in part])
    return out[0], out[1]


def synthetic_trace(
    seed: int,
    pods: int = 1500,
    per_hour: float = 6.0,
    mean_hours: float = 3.0,
    sigma: float = 1.2,
    model_name: str = "A100-40GB",
    shares: Mapping[str, float] = TRACE_SHARES,
) -> list[Arrival]:
    """A trace-like workload: Poisson arrivals (seconds), log-normal run times with the given mean."""
    rng = random.Random(seed)
    model = get_model(model_name)
    names, weights = list(shares), list(shares.values())
    mu = math.log(mean_hours * HOUR) - sigma**2 / 2  # E[lognormal(mu, sigma)] = mean
    time, out = 0.0, []
    for i in range(pods):
        time += rng.expovariate(per_hour / HOUR)
        profile = rng.choices(names, weights)[0]
        duration = max(1, int(rng.lognormvariate(mu, sigma)))
        out.append(Arrival(f"s{seed}-{i}", int(time), profile, duration, model.profile(profile).memory_slices))
    return out


def synth_cell(gpus: int, policy: str, seeds: Sequence[int]) -> dict[str, Any]:
    """One policy on ``synthetic_trace`` of each seed, on ``gpus`` A100-40GB: mean served slice-hours."""
    model = get_model("A100-40GB")
    served, accepted = [], []
    arrived_by: dict[str, int] = {}
    accepted_by: dict[str, int] = {}
    for seed in seeds:
        timeline = run_timeline(
            Cluster.homogeneous(model.name, gpus), make_policy(policy), model.name, synthetic_trace(seed), HOUR
        )
        served.append(timeline.accepted_slice_time / HOUR)
        accepted.append(timeline.accepted)
        for profile, n in timeline.arrived_by_profile.items():
            arrived_by[profile] = arrived_by.get(profile, 0) + n
        for profile, n in timeline.accepted_by_profile.items():
            accepted_by[profile] = accepted_by.get(profile, 0) + n
    return {
        "gpus": gpus,
        "served": statistics.fmean(served),
        "accepted": statistics.fmean(accepted),
        "acceptance_by_profile": acceptance_by_profile(arrived_by, accepted_by),
    }


def _synth_task(args: tuple[int, str, list[int]]) -> dict[str, Any]:
    return synth_cell(*args)


@dataclass(frozen=True)
class HeldoutSetup:
    trace_dir: Path | None  # None or missing: the fill families only
    policies: tuple[str, ...] = TRACE_POLICIES
    families: tuple[str, ...] = FAMILIES
    fill_seeds: int = 100  # seeds per fill cell (the first this many of each family's range)


def fill_cell(
    model_name: str, mix: Mapping[str, float], gpus: int, policy: str, seeds: Sequence[int]
) -> dict[str, Any]:
    """One policy on one fill cell: means over ``seeds``, per-profile acceptance pooled (the suite's own run)."""
    cell = fill_runs(model_name, mix, gpus, policy, seeds)
    cell.pop("migrations")  # the held-out results never listed them
    return cell


def _fill_task(args: tuple[str, dict[str, float], int, str, list[int]]) -> dict[str, Any]:
    return fill_cell(*args)


def _trace_task(args: tuple[list[Arrival], list[TraceNode], str, int, str, dict[str, Any]]) -> dict[str, Any]:
    arrivals, nodes, model, gpus, policy, options = args
    summary = replay_trace(arrivals, nodes, model, gpus, policy, options)
    summary.pop("series")
    return summary


Job = tuple[str, str, str, Callable[[Any], dict[str, Any]], tuple[Any, ...]]  # family, cell, policy, function, argument


def _distinct_variants(trace_dir: Path, model_name: str) -> dict[str, list[Arrival]]:
    """Arrivals per trace variant mapped to ``model_name``; variants equal to an earlier one dropped."""
    model = get_model(model_name)
    default_pods = read_pods(trace_dir / POD_FILE)
    out: dict[str, list[Arrival]] = {}
    for variant in trace_variants(trace_dir):
        mapped = trace_arrivals(read_variant_pods(trace_dir / f"{POD_PREFIX}{variant}.csv", default_pods), model)
        if all(mapped != earlier for earlier in out.values()):
            out[variant] = mapped
    return out


def _jobs(setup: HeldoutSetup, policies: Sequence[str]) -> tuple[list[Job], dict[str, Any]]:
    jobs: list[Job] = []
    workloads: dict[str, Any] = {}
    seeds = list(FILL_SEEDS)[: setup.fill_seeds]
    new_seeds = list(NEW_SEEDS)[: setup.fill_seeds]

    def fill(
        family: str, model: str, mixes: Mapping[str, dict[str, float]], sizes: Sequence[int], seed_list: list[int]
    ) -> None:
        workloads[family] = {
            "model": model,
            "mixes": dict(mixes),
            "gpus": list(sizes),
            "seeds": [seed_list[0], seed_list[-1]],
        }
        for mix, shares in mixes.items():
            for gpus in sizes:
                for policy in policies:
                    jobs.append(
                        (
                            family,
                            f"{family} {mix} / {gpus}",
                            policy,
                            _fill_task,
                            (model, shares, gpus, policy, seed_list),
                        )
                    )

    if "fill-seeds" in setup.families:
        fill("fill-seeds", FILL_MODEL, MFI_DISTRIBUTIONS, (8, 16, 32, 64), seeds)
    if "fill-mixes" in setup.families:
        fill("fill-mixes", FILL_MODEL, dirichlet_mixes(), (12, 40), new_seeds)
    if "fill-a30" in setup.families:
        fill("fill-a30", A30, A30_MIXES, (16, 64), new_seeds)
    if "synth-trace" in setup.families:
        synth_seeds = list(SYNTH_SEEDS)[: setup.fill_seeds]
        workloads["synth-trace"] = {
            "model": "A100-40GB",
            "gpus": list(SYNTH_GPUS),
            "seeds": [synth_seeds[0], synth_seeds[-1]],
        }
        for gpus in SYNTH_GPUS:
            for policy in policies:
                jobs.append(("synth-trace", f"synth-trace / {gpus}", policy, _synth_task, (gpus, policy, synth_seeds)))
    trace_families = [f for f in setup.families if f.startswith("trace-")]
    if not trace_families or setup.trace_dir is None or not (setup.trace_dir / POD_FILE).is_file():
        return jobs, workloads
    nodes = read_nodes(setup.trace_dir / NODE_FILE)

    def trace(family: str, cell: str, model: str, arrivals: list[Arrival], sizes: Sequence[int]) -> None:
        options = default_policy_options(arrivals)
        for gpus in sizes:
            for policy in policies:
                jobs.append(
                    (
                        family,
                        f"{cell} / {gpus}",
                        policy,
                        _trace_task,
                        (arrivals, nodes, model, gpus, policy, options.get(policy, {})),
                    )
                )

    if "trace-load" in setup.families or "trace-window" in setup.families:
        variants = _distinct_variants(setup.trace_dir, "A100-40GB")
        if "trace-load" in setup.families:
            workloads["trace-load"] = {
                "model": "A100-40GB",
                "variants": list(variants),
                "loads": {str(k): list(v) for k, v in TRACE_LOADS.items()},
            }
            for load, sizes in TRACE_LOADS.items():
                for variant, arrivals in variants.items():
                    trace("trace-load", f"trace-load {variant} x{load}", "A100-40GB", scale_load(arrivals, load), sizes)
        if "trace-window" in setup.families:
            workloads["trace-window"] = {"model": "A100-40GB", "variants": list(variants), "gpus": list(WINDOW_GPUS)}
            for variant, arrivals in variants.items():
                for half, part in zip(("h1", "h2"), halves(arrivals), strict=True):
                    trace("trace-window", f"trace-window {variant} {half}", "A100-40GB", part, WINDOW_GPUS)
    if "trace-a30" in setup.families:
        variants = _distinct_variants(setup.trace_dir, A30)
        workloads["trace-a30"] = {"model": A30, "variants": list(variants), "gpus": list(A30_TRACE_GPUS)}
        for variant, arrivals in variants.items():
            trace("trace-a30", f"trace-a30 {variant}", A30, arrivals, A30_TRACE_GPUS)
    return jobs, workloads


def run_heldout(
    setup: HeldoutSetup, workers: int = 1, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Every held-out (cell, policy) simulated, each cell judged; the matrix per family and overall."""
    unknown = set(setup.families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown held-out famil(ies) {', '.join(sorted(unknown))}; known: {', '.join(FAMILIES)}")
    policies = list(dict.fromkeys([*setup.policies, REFERENCE_POLICY]))
    for name in policies:
        make_policy(name)
    jobs, workloads = _jobs(setup, policies)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    family_of: dict[str, str] = {}
    with ExitStack() as stack:
        if workers <= 1:
            outputs = (fn(arg) for _, _, _, fn, arg in jobs)
        else:
            pool = stack.enter_context(ProcessPoolExecutor(workers))
            outputs = (f.result() for f in [pool.submit(fn, arg) for _, _, _, fn, arg in jobs])
        for done, ((family, cell, policy, _, _), summary) in enumerate(zip(jobs, outputs, strict=True), 1):
            results.setdefault(cell, {})[policy] = summary
            family_of[cell] = family
            if progress:
                progress(done, len(jobs))
    cells = []
    for name, per_policy in results.items():
        mark_starvation(per_policy)
        cells.append(
            {"name": name, "family": family_of[name], "results": per_policy, "verdict": judge_cell(per_policy)}
        )
    families = [f for f in FAMILIES if any(c["family"] == f for c in cells)]
    return {
        "experiment": "heldout",
        "setup": {
            "policies": policies,
            "families": families,
            "workloads": workloads,
            "fill_demand": FILL_DEMAND,
            "starvation_reference": REFERENCE_POLICY,
        },
        "cells": cells,
        "summary": summarise(cells, policies) if cells else {},
        "by_family": {f: summarise([c for c in cells if c["family"] == f], policies) for f in families},
    }


def table(summary: Mapping[str, Mapping[str, Any]], cells: int) -> str:
    """Plain rows: policy, W/T/L, starving cells, worst gap (cell), mean gap, mean served / best."""
    rows = sorted(summary.items(), key=lambda kv: (-kv[1]["mean_served_vs_best"], kv[0]))
    lines = [f"{cells} cells | policy | W/T/L | starving | worst gap | worst cell | mean gap | mean served/best"]
    for policy, s in rows:
        lines.append(
            f"  {policy:8} {s['wins']}/{s['ties']}/{s['losses']}  {s['starved_cells']}  "
            f"{s['worst_gap_pct']:.2f}%  {s['worst_cell']}  {s['mean_gap_pct']:.2f}%  "
            f"{s['mean_served_vs_best']:.4f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(prog="python -m mig_batch.sim.heldout", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trace-dir", type=Path, default=Path(os.environ.get("MIG_BATCH_TRACE_DIR", "../shared/data/alibaba-gpu-2023"))
    )
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--policies", default=",".join(TRACE_POLICIES))
    parser.add_argument("--fill-seeds", type=int, default=100)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write every number as JSON here")
    ns = parser.parse_args()
    result = run_heldout(
        HeldoutSetup(ns.trace_dir, tuple(ns.policies.split(",")), tuple(ns.families.split(",")), ns.fill_seeds),
        workers=ns.workers,
    )
    if ns.out:
        ns.out.write_text(json.dumps(result, indent=1))
    for family, summary in result["by_family"].items():
        print(f"[{family}]")
        print(table(summary, sum(c["family"] == family for c in result["cells"])))
    print("[all held-out]")
    print(table(result["summary"], len(result["cells"])))
