"""``mig-batch simulate placement``: the placement experiments with tables, plots and JSON."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mig_batch.cli.output import console
from mig_batch.sim.experiments import (
    PAPER_POLICIES,
    SNAPSHOT_DEMAND,
    MfiSetup,
    at_demand,
    demand_checkpoints,
    run_mfi_experiment,
)
from mig_batch.sim.plots import plot_load_sweep, plot_snapshot
from mig_batch.sim.workloads import MFI_DISTRIBUTIONS


def register(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("simulate", help="run simulation experiments", description="Run simulation experiments.")
    kinds = sim.add_subparsers(dest="kind", metavar="KIND", required=True)
    p = kinds.add_parser("placement", help="online placement policies (MFI protocol)")
    p.add_argument(
        "--experiment",
        choices=["mfi", "fill"],
        default="mfi",
        help="mfi: MFI §VI (durations U[1,T]); fill: nothing leaves, as in FGD's protocol (default mfi)",
    )
    p.add_argument("--runs", type=int, default=500, help="runs per distribution (MFI used 500)")
    p.add_argument("--gpus", type=int, default=100, help="GPUs in the cluster (default 100)")
    p.add_argument("--gpu", default="A100-80GB", help="GPU model (default A100-80GB)")
    p.add_argument("--seed", type=int, default=1, help="seed of the first run; run r uses seed + r")
    p.add_argument("--policies", default=",".join(PAPER_POLICIES), help="comma-separated policy names")
    p.add_argument("--distributions", default=",".join(MFI_DISTRIBUTIONS), help="comma-separated distributions")
    p.add_argument("--max-demand", type=float, default=1.0, help="sweep demand up to this share of capacity")
    p.add_argument("--out", type=Path, default=Path("out/placement"), help="directory for PNG plots and JSON")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--json", action="store_true", help="print all numbers as JSON instead of tables")
    p.set_defaults(handler=cmd_simulate_placement)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def cmd_simulate_placement(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.gpus < 1:
        raise ValueError("--runs and --gpus must be at least 1")
    if not SNAPSHOT_DEMAND <= args.max_demand <= 3:
        raise ValueError(f"--max-demand must be between {SNAPSHOT_DEMAND} and 3, got {args.max_demand}")
    setup = MfiSetup(
        model=args.gpu,
        gpus=args.gpus,
        runs=args.runs,
        seed=args.seed,
        policies=_csv(args.policies),
        distributions=_csv(args.distributions),
        checkpoints=demand_checkpoints(args.max_demand),
        departures=args.experiment == "mfi",
    )
    with Progress(
        TextColumn("simulating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=args.json,
    ) as progress:
        task = progress.add_task("runs", total=setup.runs * len(setup.distributions))
        result = run_mfi_experiment(
            setup, workers=args.workers, progress=lambda done, total: progress.update(task, completed=done)
        )
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


def render_snapshot(snapshot: dict[str, dict[str, dict[str, float]]], setup: MfiSetup) -> None:
    protocol = "MFI" if setup.departures else "fill (no departures)"
    console.print(
        f"[bold]{protocol} experiment[/]: {setup.gpus} x {setup.model}, {setup.runs} runs per distribution, "
        f"seeds {setup.seed}..{setup.seed + setup.runs - 1}; numbers at {SNAPSHOT_DEMAND:.0%} demand (means)"
    )
    for distribution, per_policy in snapshot.items():
        table = Table(title=distribution, title_justify="left")
        for col in ("policy", "acceptance", "allocated workloads", "allocated slices", "active GPUs", "mean F"):
            table.add_column(col, justify="right" if col != "policy" else "left")
        ranked = sorted(per_policy.items(), key=lambda kv: (-kv[1]["accepted"], kv[1]["active_gpus"]))
        best = ranked[0][1]["accepted"]
        for policy, m in ranked:
            style = "bold green" if m["accepted"] >= best - 1e-9 else ""
            table.add_row(
                policy,
                f"{m['acceptance_rate']:.3f}",
                f"{m['accepted']:.1f}",
                f"{m['allocated_slices']:.1f}",
                f"{m['active_gpus']:.1f}",
                f"{m['mean_frag']:.2f}",
                style=style,
            )
        console.print(table)
    winners = _summary(snapshot)
    console.print(winners, highlight=False)


def _summary(snapshot: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = []
    for distribution, per_policy in snapshot.items():
        ranked = sorted(per_policy.items(), key=lambda kv: -kv[1]["accepted"])
        (top, m1), (second, m2) = ranked[0], ranked[1] if len(ranked) > 1 else ranked[0]
        ahead = (m1["accepted"] / m2["accepted"] - 1) * 100 if m2["accepted"] else 0.0
        if ahead < 0.05:
            lines.append(f"{distribution}: {top} and {second} tie on accepted workloads ({m1['accepted']:.1f})")
        else:
            lines.append(
                f"{distribution}: {top} accepts most ({m1['accepted']:.1f}); "
                f"next {second} ({m2['accepted']:.1f}, {ahead:+.1f}%)"
            )
    return "\n".join(lines)
