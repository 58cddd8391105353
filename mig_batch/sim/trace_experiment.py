"""GRMU's experiment (GRMU §8): the Alibaba 2023 trace replayed in time on A100 GPUs.

Every policy sees the same arrivals; the cluster is the trace's GPU hosts in file order, cut to the
first hosts holding ``gpus`` GPUs (None: all 6,212). GRMU's text omits its host count, and on all
6,212 GPUs the trace never asks for more than about 41 GPUs at once, so nothing is ever rejected;
smaller cuts create the contention the paper's figures show. Metrics, as GRMU §8.3: acceptance overall
and per profile, active hardware sampled hourly and its area under the curve, migrations; and, as
issue 20 asks, served demand (accepted slice-hours) and starved profiles (mig_batch.sim.verdict).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mig_batch.mig.models import get_model
from mig_batch.placement.cluster import Cluster, Gpu
from mig_batch.placement.policies import make_policy
from mig_batch.sim.engine import Timeline, run_timeline
from mig_batch.sim.traces import TraceNode, read_nodes, read_pods, trace_arrivals
from mig_batch.sim.verdict import REFERENCE_POLICY, acceptance_by_profile, mark_starvation
from mig_batch.sim.workloads import Arrival

TRACE_POLICIES = ("nvidia", "bf-cc", "mcc", "mecc", "grmu", "mfi", "emfi", "mix")
POD_FILE = "openb_pod_list_default.csv"
NODE_FILE = "openb_node_list_gpu_node.csv"
HOUR = 3600
DAY = 24 * HOUR


@dataclass(frozen=True)
class TraceSetup:
    trace_dir: Path
    model: str = "A100-40GB"
    gpu_counts: tuple[int | None, ...] = (8, 16, 32, None)  # None: every GPU of the trace
    policies: tuple[str, ...] = TRACE_POLICIES
    pod_file: str = POD_FILE
    node_file: str = NODE_FILE
    period: int = HOUR
    policy_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def trace_cluster(nodes: Sequence[TraceNode], model: str, gpus: int | None) -> Cluster:
    """The first hosts (file order) until ``gpus`` GPUs; the last host may be cut short."""
    name = get_model(model).name
    out: list[Gpu] = []
    for node in nodes:
        for index in range(node.gpus):
            if gpus is not None and len(out) >= gpus:
                return Cluster(out)
            out.append(Gpu(len(out), node.name, index, name))
    return Cluster(out)


def default_policy_options(arrivals: Sequence[Arrival]) -> dict[str, dict[str, Any]]:
    """GRMU's trace settings: consolidation off; MECC looks back 24 h (here: the trace's mean
    number of arrivals per 24 h, as our MECC's window counts requests)."""
    span = max(arrivals[-1].slot - arrivals[0].slot, 1) if arrivals else 1
    per_day = max(1, round(len(arrivals) * DAY / span))
    return {"grmu": {"consolidation_interval": None}, "mecc": {"window": per_day}}


def _summarise(timeline: Timeline, n_gpus: int, period: int) -> dict[str, Any]:
    hours = period / HOUR
    active = [s.active_gpus for s in timeline.samples]
    return {
        "gpus": n_gpus,
        "arrived": timeline.arrived,
        "accepted": timeline.accepted,
        "acceptance_rate": timeline.accepted / timeline.arrived if timeline.arrived else 1.0,
        "acceptance_by_profile": acceptance_by_profile(timeline.arrived_by_profile, timeline.accepted_by_profile),
        "arrived_by_profile": dict(sorted(timeline.arrived_by_profile.items())),
        # served demand: slices x lifetime of every accepted pod, in slice-hours (the ranking metric)
        "served": timeline.accepted_slice_time / HOUR,
        "active_gpu_hours": sum(active) * hours,  # area under the active-hardware curve
        "mean_active_rate": sum(active) / len(active) / n_gpus if active else 0.0,
        # memory-slice hours held, sampled hourly up to the last arrival (GRMU-style area under curve)
        "allocated_slice_hours": sum(s.allocated_slices for s in timeline.samples) * hours,
        "migrations": timeline.migrations,
        "series": {
            "hours": [round(s.time / HOUR, 3) for s in timeline.samples],
            "acceptance_rate": [round(s.accepted / s.arrived, 4) if s.arrived else 1.0 for s in timeline.samples],
            "active_gpus": active,
        },
    }


def replay_trace(
    arrivals: Sequence[Arrival],
    nodes: Sequence[TraceNode],
    model: str,
    gpus: int | None,
    policy: str,
    options: dict[str, Any],
    period: int = HOUR,
) -> dict[str, Any]:
    """One policy on one cluster cut: the summary of its timeline."""
    cluster = trace_cluster(nodes, model, gpus)
    timeline = run_timeline(cluster, make_policy(policy, **options), get_model(model).name, arrivals, period)
    return _summarise(timeline, len(cluster.gpus), period)


def _task(args: tuple[TraceSetup, list[Arrival], list[TraceNode], int | None, str, dict[str, Any]]) -> dict[str, Any]:
    setup, arrivals, nodes, gpus, policy, options = args
    return replay_trace(arrivals, nodes, setup.model, gpus, policy, options, setup.period)


def run_trace_experiment(
    setup: TraceSetup, workers: int = 1, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    model = get_model(setup.model)
    arrivals = trace_arrivals(read_pods(setup.trace_dir / setup.pod_file), model)
    nodes = read_nodes(setup.trace_dir / setup.node_file)
    options = {**default_policy_options(arrivals), **setup.policy_options}
    for name in setup.policies:
        make_policy(name, **options.get(name, {}))  # unknown names or options fail before any work
    policies = list(dict.fromkeys([*setup.policies, REFERENCE_POLICY]))  # starvation needs the reference
    keys = [(gpus, policy) for gpus in setup.gpu_counts for policy in policies]
    tasks = [(setup, arrivals, nodes, gpus, policy, options.get(policy, {})) for gpus, policy in keys]
    results: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        if workers <= 1:
            outputs = map(_task, tasks)
        else:
            outputs = stack.enter_context(ProcessPoolExecutor(workers)).map(_task, tasks)
        for done, ((_gpus, policy), summary) in enumerate(zip(keys, outputs, strict=True), 1):
            results.setdefault(str(summary["gpus"]), {})[policy] = summary
            if progress:
                progress(done, len(tasks))
    for per_policy in results.values():
        mark_starvation(per_policy)
        top = max(s["active_gpu_hours"] for s in per_policy.values()) or 1.0
        for summary in per_policy.values():
            summary["active_gpu_hours_normalized"] = summary["active_gpu_hours"] / top  # GRMU Table 6 style
    return {
        "experiment": "grmu",
        "setup": {
            "trace_dir": str(setup.trace_dir),
            "pod_file": setup.pod_file,
            "node_file": setup.node_file,
            "model": model.name,
            "gpu_counts": [s for s in results],
            "policies": policies,
            "starvation_reference": REFERENCE_POLICY,
            "policy_options": options,
            "requests": len(arrivals),
            "period_s": setup.period,
        },
        "results": results,
    }
