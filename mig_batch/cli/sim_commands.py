"""``mig-batch simulate placement``: the placement experiments with tables, plots and JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from mig_batch.cli.output import Table, console, make_out_dir
from mig_batch.entry import needs_extra
from mig_batch.mig.models import get_model
from mig_batch.sim.data import TRACE_DIR, missing_trace
from mig_batch.sim.experiments import (
    PAPER_POLICIES,
    SNAPSHOT_DEMAND,
    MfiSetup,
    at_demand,
    demand_checkpoints,
    run_mfi_experiment,
)
from mig_batch.sim.trace_experiment import POD_FILE, TRACE_POLICIES, TraceSetup, run_trace_experiment
from mig_batch.sim.traces import read_pods
from mig_batch.sim.verdict import ranked
from mig_batch.sim.workloads import MFI_DISTRIBUTIONS

DEFAULT_TRACE_DIR = TRACE_DIR


def register(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("simulate", help="run simulation experiments", description="Run simulation experiments.")
    kinds = sim.add_subparsers(dest="kind", metavar="KIND", required=True)
    p = kinds.add_parser("placement", help="online placement policies (MFI and GRMU protocols)")
    p.add_argument(
        "--experiment",
        choices=["mfi", "fill", "grmu", "robust"],
        default="mfi",
        help="mfi: MFI §VI (durations U[1,T]); fill: nothing leaves, as in FGD's protocol; "
        "grmu: GRMU §8, the Alibaba 2023 trace replayed in time; robust: every trace variant and fill mix "
        "x 8/16/32/64 GPUs, a win/tie/loss matrix by served demand (default mfi)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help="runs per distribution (mfi/fill: default 500, as MFI; robust: fill seeds per cell, default 100)",
    )
    p.add_argument("--quick", action="store_true", help="robust: 8 and 16 GPUs, three trace variants, 2 seeds")
    p.add_argument(
        "--gpus",
        default=None,
        help="mfi/fill: GPUs in the cluster (default 100); grmu: comma-separated cluster sizes cut from the "
        "trace's hosts, 'all' for all 6,212 (default 8,16,32,all); robust: comma-separated (default 8,16,32,64)",
    )
    p.add_argument("--gpu", default=None, help="GPU model (default A100-80GB; grmu: A100-40GB as in GRMU)")
    p.add_argument(
        "--trace-dir",
        type=Path,
        default=Path(os.environ.get("MIG_BATCH_TRACE_DIR", DEFAULT_TRACE_DIR)),
        help="grmu, robust: folder with openb_pod_list_default.csv and openb_node_list_gpu_node.csv, the Alibaba "
        f"GPU cluster trace 2023 (not shipped; default $MIG_BATCH_TRACE_DIR or {TRACE_DIR})",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the first run; run r uses seed + r")
    p.add_argument(
        "--policies",
        default=None,
        help=f"comma-separated policy names (default mfi/fill: {','.join(PAPER_POLICIES)}; "
        f"grmu: {','.join(TRACE_POLICIES)})",
    )
    p.add_argument("--distributions", default=",".join(MFI_DISTRIBUTIONS), help="comma-separated distributions")
    p.add_argument("--max-demand", type=float, default=1.0, help="sweep demand up to this share of capacity")
    p.add_argument("--out", type=Path, default=Path("out/placement"), help="directory for PNG plots and JSON")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--json", action="store_true", help="print all numbers as JSON instead of tables")
    p.set_defaults(handler=cmd_simulate_placement)
    a = kinds.add_parser("atomize", help="subjob chains (SJA) against FIFO+backfill and moldable placement")
    a.add_argument("--gpus", type=int, default=8, help="A100-80GB GPUs in the cluster (default 8)")
    a.add_argument("--workload", choices=("synthetic", "alibaba"), default="synthetic",
                   help="synthetic arrivals, or windows of the Alibaba 2023 trace (default synthetic)")  # fmt: skip
    a.add_argument("--hours", type=float, default=24.0, help="synthetic: hours of arrivals (default 24)")
    a.add_argument("--trace-dir", type=Path, default=Path(os.environ.get("MIG_BATCH_TRACE_DIR", DEFAULT_TRACE_DIR)),
                   help=f"alibaba: folder with {POD_FILE} (default: $MIG_BATCH_TRACE_DIR, ../shared)")  # fmt: skip
    a.add_argument("--trace-jobs", type=int, default=300, help="alibaba: consecutive pods per seed (default 300)")
    a.add_argument("--load", type=float, default=1.0,
                   help="alibaba: arrivals rescaled to this offered load of the cluster (default 1.0)")  # fmt: skip
    a.add_argument("--seeds", type=int, default=3, help="workloads (seeds 1..N, default 3)")
    a.add_argument("--grant-policy", default="efficiency", help="SJA grant policy: efficiency, fairness, deadline")
    a.add_argument("--eps", type=float, default=0.05, help="admission risk (default 0.05)")
    a.add_argument("--live-defrag", default="off",
                   help="SJA with live defragmentation at checkpoint boundaries: off (default), on (instead of "
                        "plain SJA), both (side by side)")  # fmt: skip
    a.add_argument("--out", type=Path, default=Path("out/atomize"), help="folder for atomize.json and the plot")
    a.add_argument("--json", action="store_true", help="print the numbers as JSON")
    a.set_defaults(handler=cmd_simulate_atomize)
    m = kinds.add_parser("moldable", help="live batch planners (EFT, FAR-live, auto-live) on arriving moldable jobs")
    m.add_argument("--workloads", default="migdrl-mixscalinguniform,rodinia,alibaba-mix",
                   help="comma-separated: migdrl-<MIG-DRL type>, rodinia (needs --rodinia-dir), alibaba-mix (needs "
                        "--trace-dir) (default migdrl-mixscalinguniform,rodinia,alibaba-mix)")  # fmt: skip
    m.add_argument("--loads", default="0.8,1.2", help="offered loads of the cluster's slices (default 0.8,1.2)")
    m.add_argument("--seeds", type=int, default=3, help="arrival sequences per cell (default 3)")
    m.add_argument("--first-seed", type=int, default=1,
                   help="the first arrival sequence: seeds first..first+N-1 (default 1; held-out checks start past "
                        "the seeds a claim was made on)")  # fmt: skip
    m.add_argument("--baseline", default="eft", help="the planner the others are measured against (default eft)")
    m.add_argument("--gpus", type=int, default=8, help="A100-80GB GPUs (default 8)")
    m.add_argument("--jobs", type=int, default=150, help="arrivals per run (default 150)")
    m.add_argument("--planners", default="eft,far,auto",
                   help="comma-separated: eft, far, auto (the live planners), eft-today (mig-batchd's rule itself, "
                        "placement/moldable.py) (default eft,far,auto)")  # fmt: skip
    m.add_argument("--max-hold-s", type=float, default=0.0,
                   help="how long a plan may keep a waiting rigid job's reserved slices past its start (default 0)")
    m.add_argument("--evaluations", type=int, default=24, help="decodings per planning pass (far, auto; default 24)")
    m.add_argument("--window", type=int, default=24, help="queued moldable jobs planned per pass (default 24)")
    m.add_argument("--rigid-share", type=float, default=0.25,
                   help="migdrl/rodinia: share of rigid jobs, one size each (default 0.25)")  # fmt: skip
    m.add_argument("--noise", type=float, default=0.1, help="sigma of the lognormal run-time noise (default 0.1)")
    m.add_argument("--rodinia-dir", type=Path,
                   default=Path(os.environ.get("MIG_BATCH_RODINIA_DIR", "../shared/data/mig-tasks/rodinia_A100")),
                   help="rodinia: folder with <size>g_A100.csv (default $MIG_BATCH_RODINIA_DIR or "
                        "../shared/data/mig-tasks/rodinia_A100)")  # fmt: skip
    m.add_argument("--trace-dir", type=Path, default=Path(os.environ.get("MIG_BATCH_TRACE_DIR", DEFAULT_TRACE_DIR)),
                   help=f"alibaba-mix: folder with {POD_FILE} (default: $MIG_BATCH_TRACE_DIR, ../shared)")  # fmt: skip
    m.add_argument("--out", type=Path, default=Path("out/moldable"), help="folder for moldable.json")
    m.add_argument("--json", action="store_true", help="print the means as JSON")
    m.set_defaults(handler=cmd_simulate_moldable)
    from mig_batch.cli.flex_commands import register_flex

    register_flex(kinds)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _positive(text: str, option: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{option} takes positive whole numbers, got {text!r}")
    return value


def _progress(disable: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("simulating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console.rich,
        transient=True,
        disable=disable,
    )


def _check_common(args: argparse.Namespace, default_model: str) -> None:
    get_model(args.gpu or default_model)  # UnknownModelError lists the known ones
    if args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    make_out_dir(args.out)


@needs_extra("sim", "mig-batch simulate placement")
def cmd_simulate_placement(args: argparse.Namespace) -> int:
    if args.experiment == "grmu":
        return _simulate_trace(args)
    if args.experiment == "robust":
        return _simulate_robust(args)
    gpus = _positive(args.gpus or "100", "--gpus")
    args.runs = 500 if args.runs is None else args.runs
    if args.runs < 1:
        raise ValueError("--runs must be at least 1")
    if not SNAPSHOT_DEMAND <= args.max_demand <= 3:
        raise ValueError(f"--max-demand must be between {SNAPSHOT_DEMAND} and 3, got {args.max_demand}")
    _check_common(args, "A100-80GB")
    setup = MfiSetup(
        model=args.gpu or "A100-80GB",
        gpus=gpus,
        runs=args.runs,
        seed=args.seed,
        policies=_csv(args.policies or ",".join(PAPER_POLICIES)),
        distributions=_csv(args.distributions),
        checkpoints=demand_checkpoints(args.max_demand),
        departures=args.experiment == "mfi",
    )
    with _progress(args.json) as progress:
        task = progress.add_task("runs", total=setup.runs * len(setup.distributions))
        result = run_mfi_experiment(
            setup, workers=args.workers, progress=lambda done, total: progress.update(task, completed=done)
        )
    from mig_batch.sim.plots import plot_load_sweep, plot_snapshot  # matplotlib: only when plotting

    snapshot = at_demand(result, SNAPSHOT_DEMAND)
    result["at_85_percent_demand"] = snapshot

    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.experiment
    files = [str(plot_snapshot(snapshot, SNAPSHOT_DEMAND, args.out / f"{stem}_at_85.png"))]
    for distribution in setup.distributions:
        files.append(str(plot_load_sweep(result, distribution, args.out / f"{stem}_load_{distribution}.png")))
    json_path = args.out / f"{stem}.json"
    result["files"] = [*files, str(json_path)]
    json_path.write_text(json.dumps(result, indent=1))

    if args.json:
        print(json.dumps(result, indent=1))
    else:
        render_snapshot(snapshot, setup)
        console.print("plots and numbers: " + ", ".join(result["files"]), highlight=False, soft_wrap=True)
    return 0


def render_snapshot(snapshot: dict[str, dict[str, dict[str, Any]]], setup: MfiSetup) -> None:
    protocol = "MFI" if setup.departures else "fill (no departures)"
    served = "accepted slice-slots" if setup.departures else "accepted slices"
    console.print(
        f"[bold]{protocol} experiment[/]: {setup.gpus} x {setup.model}, {setup.runs} runs per distribution, "
        f"seeds {setup.seed}..{setup.seed + setup.runs - 1}; numbers at {SNAPSHOT_DEMAND:.0%} demand (means); "
        f"ranked by served demand ({served}), policies that starve a profile last"
    )
    for distribution, per_policy in snapshot.items():
        table = Table(title=distribution, title_justify="left")
        columns = ("policy", "served", "acceptance", "allocated workloads", "allocated slices", "active GPUs")
        for col in (*columns, "mean F", "starved"):
            table.add_column(col, justify="left" if col in ("policy", "starved") else "right")
        for rank, policy in enumerate(ranked(per_policy)):
            m = per_policy[policy]
            table.add_row(
                policy,
                f"{m['served']:.1f}",
                f"{m['acceptance_rate']:.3f}",
                f"{m['accepted']:.1f}",
                f"{m['allocated_slices']:.1f}",
                f"{m['active_gpus']:.1f}",
                f"{m['mean_frag']:.2f}",
                ", ".join(m["starved"]),
                style="bold green" if rank == 0 and not m["starved"] else "red" if m["starved"] else "",
            )
        console.print(table)
    console.print(_summary(snapshot), highlight=False)


def _summary(snapshot: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = []
    for distribution, per_policy in snapshot.items():
        order = ranked(per_policy)
        top, second = order[0], order[1] if len(order) > 1 else order[0]
        m1, m2 = per_policy[top], per_policy[second]
        ahead = (m1["served"] / m2["served"] - 1) * 100 if m2["served"] else 0.0
        caveat = " (every policy starves a profile)" if m1["starved"] else ""
        if ahead < 0.05:
            lines.append(f"{distribution}: {top} and {second} tie on served demand ({m1['served']:.1f}){caveat}")
        else:
            lines.append(
                f"{distribution}: {top} serves most ({m1['served']:.1f}); "
                f"next {second} ({m2['served']:.1f}, {ahead:+.1f}%){caveat}"
            )
    return "\n".join(lines)


def _simulate_trace(args: argparse.Namespace) -> int:
    sizes = tuple(
        None if part.lower() == "all" else _positive(part, "--gpus") for part in _csv(args.gpus or "8,16,32,all")
    )
    _check_common(args, "A100-40GB")
    setup = TraceSetup(
        trace_dir=args.trace_dir,
        model=args.gpu or "A100-40GB",
        gpu_counts=sizes,
        policies=_csv(args.policies or ",".join(TRACE_POLICIES)),
    )
    missing = [name for name in (setup.pod_file, setup.node_file) if not (setup.trace_dir / name).is_file()]
    if missing:
        raise missing_trace("`mig-batch simulate placement --experiment grmu`", " and ".join(missing), setup.trace_dir)
    with _progress(args.json) as progress:
        task = progress.add_task("runs", total=len(sizes) * len(setup.policies))
        result = run_trace_experiment(
            setup, workers=args.workers, progress=lambda done, total: progress.update(task, completed=done)
        )
    from mig_batch.sim.plots import plot_trace  # matplotlib: only when plotting

    args.out.mkdir(parents=True, exist_ok=True)
    files = [str(plot_trace(result, gpus, args.out / f"grmu_{gpus}_gpus.png")) for gpus in result["results"]]
    json_path = args.out / "grmu.json"
    result["files"] = [*files, str(json_path)]
    json_path.write_text(json.dumps(result, separators=(",", ":")))  # hourly series: keep the file small
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        render_trace(result)
        console.print("plots and numbers: " + ", ".join(result["files"]), highlight=False, soft_wrap=True)
    return 0


def render_trace(result: dict) -> None:
    setup = result["setup"]
    console.print(
        f"[bold]GRMU experiment[/]: Alibaba 2023 trace, {setup['requests']} requests as {setup['model']} "
        "profiles (GRMU §8.1), replayed in time; ranked by served slice-hours, policies that starve a "
        f"profile (accepted at < half {setup['starvation_reference']}'s rate) last"
    )
    for gpus, per_policy in result["results"].items():
        profiles = list(next(iter(per_policy.values()))["arrived_by_profile"])
        table = Table(title=f"{gpus} GPUs", title_justify="left")
        columns = ("policy", "served slice-h", "accepted", "acceptance", *profiles, "active GPU-h", "norm.", "migr.")
        for col in (*columns, "starved"):
            table.add_column(col, justify="left" if col in ("policy", "starved") else "right")
        order = ranked(per_policy)
        for rank, policy in enumerate(order):
            s = per_policy[policy]
            table.add_row(
                policy,
                f"{s['served']:.0f}",
                str(s["accepted"]),
                f"{s['acceptance_rate']:.3f}",
                *(f"{s['acceptance_by_profile'].get(p, 0):.2f}" for p in profiles),
                f"{s['active_gpu_hours']:.0f}",
                f"{s['active_gpu_hours_normalized']:.3f}",
                str(s["migrations"]),
                ", ".join(s["starved"]),
                style="bold green" if rank == 0 and not s["starved"] else "red" if s["starved"] else "",
            )
        console.print(table)


def _simulate_robust(args: argparse.Namespace) -> int:
    from mig_batch.sim.plots import plot_robust
    from mig_batch.sim.robust import RobustSetup, quick_setup, run_robust

    if not (args.trace_dir / POD_FILE).is_file():
        raise missing_trace("`mig-batch simulate placement --experiment robust`",
                            f"{POD_FILE} and the other openb_pod_list_*.csv", args.trace_dir)  # fmt: skip
    policies = _csv(args.policies or ",".join(TRACE_POLICIES))
    setup = quick_setup(args.trace_dir, policies) if args.quick else RobustSetup(args.trace_dir, policies=policies)
    if args.gpus:
        setup = replace(setup, gpu_counts=tuple(_positive(part, "--gpus") for part in _csv(args.gpus)))
    if args.runs is not None:
        setup = replace(setup, fill_runs=_positive(str(args.runs), "--runs"))
    if args.distributions != ",".join(MFI_DISTRIBUTIONS):
        setup = replace(setup, mixes=_csv(args.distributions))
    with _progress(args.json) as progress:
        task = progress.add_task("runs", total=None)
        result = run_robust(
            setup, workers=args.workers, progress=lambda done, total: progress.update(task, completed=done, total=total)
        )
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "robust.json"
    result["files"] = [str(plot_robust(result, args.out / "robust_heatmap.png")), str(json_path)]
    json_path.write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        render_robust(result)
        console.print("heat-map and numbers: " + ", ".join(result["files"]), highlight=False, soft_wrap=True)
    return 0


def render_robust(result: dict) -> None:
    setup = result["setup"]
    aliases = ", ".join(f"{a} = {b}" for a, b in setup["aliases"].items()) or "none"
    console.print(
        f"[bold]Robustness suite[/]: {len(result['cells'])} cells (trace variants {', '.join(setup['variants'])}; "
        f"fill mixes {', '.join(setup['mixes'])}, {setup['fill_runs']} seeds) x {setup['gpu_counts']} GPUs. "
        f"Identical after dropping multi-GPU pods, counted once: {aliases}. Judged by served demand; a tie is "
        f"within {setup['tie_pct']} % of the best policy that starves no profile; starving is a loss.",
        highlight=False,
    )
    table = Table(title="win / tie / loss per policy", title_justify="left")
    for col in ("policy", "wins", "ties", "losses", "starved cells", "worst gap %", "worst cell", "mean gap %",
                "mean served / best"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("policy", "worst cell") else "right")
    summary = result["summary"]
    for policy in sorted(summary, key=lambda p: (summary[p]["worst_gap_pct"], -summary[p]["mean_served_vs_best"])):
        s = summary[policy]
        table.add_row(policy, str(s["wins"]), str(s["ties"]), str(s["losses"]), str(s["starved_cells"]),
                      f"{s['worst_gap_pct']:.2f}", s["worst_cell"], f"{s['mean_gap_pct']:.2f}",
                      f"{s['mean_served_vs_best']:.4f}")  # fmt: skip
    console.print(table)
    cells = Table(title="gap to the best served demand, % (S: starves a profile)", title_justify="left")
    cells.add_column("cell")
    for policy in setup["policies"]:
        cells.add_column(policy, justify="right")
    for cell in result["cells"]:
        row = []
        for policy in setup["policies"]:
            v = cell["verdict"][policy]
            row.append("best" if v["outcome"] == "win" else f"{v['gap_pct']:.2f}{' S' if v['starved'] else ''}")
        cells.add_row(cell["name"], *row)
    console.print(cells)


ATOMIZE_COLUMNS = (
    ("mean_wait_h", "mean wait (h)"), ("p95_wait_h", "p95 wait (h)"), ("training_mean_jct_h", "training JCT (h)"),
    ("memory_util", "GPU memory used"), ("allocated_util", "GPU memory allocated"), ("rejected", "rejected"),
    ("unfinished", "unfinished"), ("interruptions", "interruptions"), ("wasted_h", "wasted work (h)"),
    ("overhead_h", "checkpoint overhead (h)"), ("subjobs", "subjobs"), ("makespan_h", "makespan (h)"),
    ("whole_gpu_wait_h", "whole-GPU jobs' wait (h)"), ("frag_delay_h", "fragmentation delay / job (h)"),
    ("frag_blocked", "jobs blocked by fragmentation"),
)  # fmt: skip


@needs_extra("sim", "mig-batch simulate atomize")
def cmd_simulate_atomize(args: argparse.Namespace) -> int:
    from mig_batch.atomize.protocol import GRANT_POLICIES
    from mig_batch.sim.atomize import DEFAULT_SCHEDULERS, AtomizeSetup, run_atomize
    from mig_batch.sim.plots import plot_atomize

    if args.grant_policy not in GRANT_POLICIES:
        raise ValueError(f"--grant-policy {args.grant_policy!r} is not one of {', '.join(GRANT_POLICIES)}")
    if args.live_defrag not in ("off", "on", "both"):
        raise ValueError(f"--live-defrag {args.live_defrag!r} is not one of off, on, both")
    if min(args.gpus, args.hours, args.seeds, args.trace_jobs, args.load) <= 0:
        raise ValueError("--gpus, --hours, --seeds, --trace-jobs and --load must be positive")
    make_out_dir(args.out)
    setup = AtomizeSetup(gpus=args.gpus, hours=args.hours, grant_policy=args.grant_policy, eps=args.eps,
                         trace_jobs=args.trace_jobs, load=args.load)  # fmt: skip
    pods = None
    if args.workload == "alibaba":
        if not (args.trace_dir / POD_FILE).is_file():
            raise missing_trace("`mig-batch simulate atomize --workload alibaba`", POD_FILE, args.trace_dir)
        pods = read_pods(args.trace_dir / POD_FILE)  # TraceError names the file and what is wrong
    with console.status("simulating FIFO+backfill, moldable and SJA ..."):
        schedulers = {"off": DEFAULT_SCHEDULERS, "both": (*DEFAULT_SCHEDULERS, "sja-defrag"),
                      "on": (*DEFAULT_SCHEDULERS[:-1], "sja-defrag")}[args.live_defrag]  # fmt: skip
        result = run_atomize(setup, list(range(1, args.seeds + 1)), schedulers, pods=pods)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "atomize.json").write_text(json.dumps(result, indent=2))
    plot = plot_atomize(result, args.out / "atomize.png")
    if args.json:
        json.dump(result["mean"], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    loads = ", ".join(f"{w['offered_load']:.2f}" for w in result["workloads"])
    arrivals = f"{setup.hours:g} h of arrivals" if pods is None else f"Alibaba 2023 windows of {setup.trace_jobs} pods"
    table = Table(title=f"SJA vs baselines: {setup.gpus} x {setup.model}, {arrivals}, {args.seeds} seeds (means; "
                        f"offered load {loads}), grant policy {setup.grant_policy}")  # fmt: skip
    table.add_column("metric")
    for scheduler in result["mean"]:
        table.add_column(scheduler, justify="right")
    for key, label in ATOMIZE_COLUMNS:
        table.add_row(label, *(f"{m[key]:.3f}" if isinstance(m[key], float) and m[key] % 1 else f"{m[key]:g}"
                               for m in result["mean"].values()))  # fmt: skip
    console.print(table)
    console.print(f"numbers: {args.out / 'atomize.json'}; plot: {plot}", highlight=False)
    return 0


def _floats(text: str, option: str) -> list[float]:
    try:
        values = [float(x) for x in _csv(text)]
    except ValueError:
        values = []
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"{option} takes comma-separated positive numbers like 0.8,1.2; got {text!r}")
    return values


@needs_extra("controller", "mig-batch simulate moldable")  # numpy and rich
def cmd_simulate_moldable(args: argparse.Namespace) -> int:
    from mig_batch.planner.live import LIVE_PLANNERS
    from mig_batch.sim.data import RODINIA_FILES, RODINIA_SOURCE, MissingDataError
    from mig_batch.sim.moldable_experiment import METRICS, run_live_matrix, verdict
    from mig_batch.sim.moldable_live import TODAY, LiveSimSetup
    from mig_batch.sim.moldable_workloads import WORKLOADS

    workloads, planners = list(_csv(args.workloads)), list(_csv(args.planners))
    loads = _floats(args.loads, "--loads")
    if not workloads or any(w not in WORKLOADS for w in workloads):
        raise ValueError(f"--workloads takes some of {', '.join(WORKLOADS)}; got {args.workloads!r}")
    known = (*LIVE_PLANNERS, TODAY)
    if not planners or any(p not in known for p in planners):
        raise ValueError(f"--planners takes some of {', '.join(known)}; got {args.planners!r}")
    if args.baseline not in planners:
        raise ValueError(f"--baseline must be one of --planners ({', '.join(planners)}); got {args.baseline!r}")
    if min(args.seeds, args.gpus, args.jobs, args.evaluations, args.window) < 1 or args.first_seed < 0:
        raise ValueError("--seeds, --gpus, --jobs, --evaluations and --window must be at least 1, --first-seed >= 0")
    if args.max_hold_s < 0 or not 0 <= args.rigid_share <= 1 or args.noise < 0:
        raise ValueError("--max-hold-s and --noise must be >= 0, --rigid-share in [0, 1]")
    make_out_dir(args.out)
    rodinia = pods = None
    if "rodinia" in workloads:
        from mig_batch.planner.workloads import read_rodinia

        if not args.rodinia_dir.is_dir() or not any(args.rodinia_dir.glob("*g_A100.csv")):
            raise MissingDataError(
                f"the rodinia workload needs the Rodinia task times {RODINIA_FILES} in {args.rodinia_dir}, which "
                f"holds none; they were {RODINIA_SOURCE}; point --rodinia-dir (or $MIG_BATCH_RODINIA_DIR) at a copy "
                "of that folder, or leave rodinia out of --workloads")  # fmt: skip
        rodinia = read_rodinia(args.rodinia_dir, "A100")
    if "alibaba-mix" in workloads:
        if not (args.trace_dir / POD_FILE).is_file():
            raise missing_trace("`mig-batch simulate moldable --workloads alibaba-mix`", POD_FILE, args.trace_dir)
        pods = read_pods(args.trace_dir / POD_FILE)
    setup = LiveSimSetup(gpus=args.gpus, window=args.window, evaluations=args.evaluations, max_hold_s=args.max_hold_s)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    with _progress(args.json) as progress:
        task = progress.add_task("runs", total=len(workloads) * len(loads) * len(seeds) * len(planners))
        result = run_live_matrix(workloads, loads, seeds, setup, args.jobs, rodinia, pods, planners, args.rigid_share,
                                 args.noise, lambda: progress.advance(task), args.baseline)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moldable.json").write_text(json.dumps(result, indent=2))
    if args.json:
        json.dump({"mean": result["mean"], "baseline": args.baseline, "vs_baseline": result["vs_baseline"]}, sys.stdout,
                  indent=2)  # fmt: skip
        sys.stdout.write("\n")
        return 0
    table = Table(title=f"live planners: {args.gpus} x A100-80GB, {args.jobs} arrivals, seeds {seeds[0]}-{seeds[-1]} "
                        "(means)")  # fmt: skip
    for col in ("workload", "load", "planner", *METRICS):
        table.add_column(col, justify="left" if col in ("workload", "planner") else "right")
    for workload, per_load in result["mean"].items():
        for load, per in per_load.items():
            for planner, m in per.items():
                table.add_row(workload, load, planner, *(f"{m[k]:.3f}" if k == "idle" else f"{m[k]:.1f}"
                                                          for k in METRICS))  # fmt: skip
    console.print(table)
    for line in verdict(result):
        console.print(line, highlight=False)
    console.print(f"numbers: {args.out / 'moldable.json'}", highlight=False)
    return 0
