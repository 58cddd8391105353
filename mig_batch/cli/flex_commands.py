"""``mig-batch simulate flex``: Flex-MIG §5 reproduced (FM, DM, SM) and our two policies, on 2 x A100-40GB;
``mig-batch simulate multi``: our multi-instance placement against Flex-MIG's round robin on a shared cluster."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

from mig_batch.cli.output import Table, console, make_out_dir
from mig_batch.entry import needs_extra
from mig_batch.errors import MigBatchError
from mig_batch.sim.data import PHILLY_SAMPLE  # shipped (CC-BY-4.0): mig_batch/sim/data/README.md

PHILLY_FILE = Path("philly") / "philly_runtime.csv"
SHOWN_PAIRS = ("fm/dm", "fm/sm", "mbdyn/dm", "hybrid/fm", "hybrid/dm", "hybrid/sm")


class RuntimeSampleError(MigBatchError):
    """The Philly run-time sample is missing or malformed."""


def register_flex(kinds: argparse._SubParsersAction) -> None:
    f = kinds.add_parser("flex", help="Flex-MIG §5: one-to-many vs Dynamic-/Static-MIG, and ours (2 x A100-40GB)")
    f.add_argument("--traces-per-category", type=int, default=10, help="traces per category (default 10, as §5.1)")
    f.add_argument("--seed", type=int, default=1, help="seed of the trace generator (default 1)")
    f.add_argument("--out", type=Path, default=Path("out/flex"), help="folder for flex.json, flex.csv and the PNGs")
    f.add_argument("--quick", action="store_true", help="2 traces per category, short durations only (tests)")
    f.add_argument("--window", type=int, default=1,
                   help="all-categories group: queued jobs examined per pass; 1 = FIFO (default), 14 = the "
                   "paper's aggressive backfilling (Fig. 8)")  # fmt: skip
    f.add_argument("--contention", type=float, default=1.06, help="run-time factor of Flex-MIG §5.2 (default 1.06)")
    f.add_argument("--contention-fm-only", action="store_true",
                   help="only one-to-many runs pay the contention factor (default: every run, as §5.2 applies it)")
    f.add_argument("--slowdown", default="1.05",
                   help="one-to-many run time over one-to-one: one factor, or per size as 2=1.03,4=1.05,8=1.08 "
                   "(sizes not named: 1.05; default 1.05)")  # fmt: skip
    f.add_argument("--larger-exponent", type=float, default=0.5,
                   help="Static-MIG on a larger instance: time x (asked/given compute) ** this (default 0.5)")
    f.add_argument("--drain-penalty", type=float, default=60.0,
                   help="Dynamic-MIG: seconds a drained job loses to stop, repartition and restart (default 60)")
    f.add_argument("--fig7-sizes", choices=("cap", "drop"), default="cap",
                   help="Fig. 7 group (sizes <= 4): sizes 6 and 8 capped to 4 (default) or dropped")
    f.add_argument("--data-dir", type=Path, default=None,
                   help=f"a folder holding {PHILLY_FILE}, another copy of the job run-time sample (default "
                   "$MIG_BATCH_DATA_DIR, else the Philly sample shipped with mig_batch, CC-BY-4.0)")  # fmt: skip
    f.add_argument("--json", action="store_true", help="print the overall ratios as JSON")
    f.set_defaults(handler=cmd_simulate_flex)
    m = kinds.add_parser("multi", help="jobs over several instances on a shared cluster: our MFI placement vs "
                         "Flex-MIG's round robin")  # fmt: skip
    m.add_argument("--seeds", type=int, default=5, help="workloads, each replayed under both rules (default 5)")
    m.add_argument("--jobs", type=int, default=400, help="jobs per workload (default 400)")
    m.add_argument("--per-slot", type=float, default=1.0, help="arrivals per slot, the load (default 1.0)")
    m.add_argument("--nodes", type=int, default=4, help="nodes (default 4)")
    m.add_argument("--gpus-per-node", type=int, default=2, help="A100-80GB per node (default 2)")
    m.add_argument("--json", action="store_true", help="print every seed's outcome as JSON")
    m.set_defaults(handler=cmd_simulate_multi)


@needs_extra("sim", "mig-batch simulate multi")
def cmd_simulate_multi(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from mig_batch.sim.flex_place import compare

    for name in ("seeds", "jobs", "nodes", "gpus_per_node"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.per_slot > 0:
        raise ValueError(f"--per-slot (arrivals per slot) must be positive, got {args.per_slot}")
    outcomes = compare(args.seeds, args.jobs, args.per_slot, args.nodes, args.gpus_per_node)
    if args.json:
        json.dump([asdict(o) for o in outcomes], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = Table(title=f"{args.jobs} jobs on {args.nodes} x {args.gpus_per_node} A100-80GB, {args.per_slot:g} "
                  f"arrivals per slot (FIFO)")  # fmt: skip
    for col in ("seed", "policy", "makespan", "mean wait", "wait (large)", "GPUs per multi-instance job"):
        table.add_column(col, justify="right")
    for o in outcomes:
        table.add_row(str(o.seed), o.policy, str(o.makespan), f"{o.mean_wait:.2f}", f"{o.mean_wait_large:.2f}",
                      f"{o.gpus_per_multi_job:.2f}")  # fmt: skip
    console.print(table)
    return 0


def parse_slowdown(text: str) -> tuple[float, dict[int, float]]:
    """``1.05`` or ``2=1.03,4=1.05``: the default factor and the per-size ones."""
    default, by_size = 1.05, {}
    try:
        if "=" not in text:
            return float(text), {}
        for item in text.split(","):
            size, _, factor = item.partition("=")
            by_size[int(size)] = float(factor)
    except ValueError:
        raise ValueError(
            f"--slowdown takes a factor (1.05) or SIZE=FACTOR pairs (2=1.03,4=1.05), got {text!r}"
        ) from None
    return default, by_size


def runtime_sample(data_dir: Path | None) -> Path:
    """The run-time sample ``simulate flex`` reads: ``--data-dir``'s, $MIG_BATCH_DATA_DIR's, else the shipped one."""
    if data_dir is None and os.environ.get("MIG_BATCH_DATA_DIR"):
        data_dir = Path(os.environ["MIG_BATCH_DATA_DIR"])
    return PHILLY_SAMPLE if data_dir is None else data_dir / PHILLY_FILE


def read_runtimes(path: Path) -> list[float]:
    import gzip

    try:
        with (gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")) as fh:
            reader = csv.DictReader(fh)
            if "runtime" not in (reader.fieldnames or []):
                raise RuntimeSampleError(f"{path}: no 'runtime' column; expected Philly's philly_runtime.csv")
            values = []
            for line, row in enumerate(reader, 2):
                try:
                    values.append(float(row["runtime"]))
                except ValueError:
                    raise RuntimeSampleError(f"{path}:{line}: runtime {row['runtime']!r} is not a number") from None
    except OSError as exc:
        raise RuntimeSampleError(f"cannot read the Philly run-time sample {path}: {exc.strerror or exc}; give "
                                 f"--data-dir (or $MIG_BATCH_DATA_DIR) a folder holding {PHILLY_FILE}, or leave "
                                 "both unset for the sample shipped with mig_batch") from exc  # fmt: skip
    except (UnicodeDecodeError, csv.Error) as exc:
        raise RuntimeSampleError(f"{path}: not a CSV text file ({exc}); expected Philly's philly_runtime.csv") from exc
    return values


@needs_extra("sim", "mig-batch simulate flex")
def cmd_simulate_flex(args: argparse.Namespace) -> int:
    from mig_batch.sim.flex import FlexParams
    from mig_batch.sim.flex_experiment import FlexSetup, csv_rows, run_flex_experiment

    if args.traces_per_category < 1:
        raise ValueError(f"--traces-per-category must be at least 1, got {args.traces_per_category}")
    if args.window < 1:
        raise ValueError(f"--window must be at least 1 (1 = FIFO), got {args.window}")
    default, by_size = parse_slowdown(args.slowdown)
    params = FlexParams(contention=args.contention, contention_everywhere=not args.contention_fm_only,
                        multi_slowdown=default, slowdown_by_size=by_size, larger_exponent=args.larger_exponent,
                        drain_penalty_s=args.drain_penalty, window=args.window)  # fmt: skip
    traces = 2 if args.quick else args.traces_per_category
    durations = ("short",) if args.quick else ("short", "medium", "long")
    setup = FlexSetup(traces_per_category=traces, seed=args.seed, params=params, fig7_over_max=args.fig7_sizes,
                      durations=durations)  # fmt: skip
    make_out_dir(args.out)
    sample = runtime_sample(args.data_dir)
    runtimes = read_runtimes(sample)
    with console.status("simulating FM, DM, SM, mbdyn and hybrid ..."):
        result = run_flex_experiment(runtimes, setup)
    result["setup"]["runtime_sample"] = {"file": str(sample), "jobs": len(runtimes)}
    (args.out / "flex.json").write_text(json.dumps(result, indent=1))
    rows = csv_rows(result)
    with (args.out / "flex.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    from mig_batch.sim.flex_plots import plot_fig7, plot_fig8

    plots = [plot_fig7(result, args.out / "flex_fig7.png"), plot_fig8(result, args.out / "flex_fig8.png")]
    if args.json:
        json.dump({g: data["overall"] for g, data in result["groups"].items()}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for group in result["groups"].values():
        render_group(group, traces)
    console.print(f"numbers: {args.out / 'flex.json'}, {args.out / 'flex.csv'}; plots: "
                  f"{', '.join(map(str, plots))}", highlight=False)  # fmt: skip
    return 0


def render_group(group: dict[str, Any], traces: int) -> None:
    title = {"fig7": "Fig. 7 group: training only, sizes <= 4, FIFO",
             "all": "all categories, native sizes"}[group["name"]]  # fmt: skip
    table = Table(title=f"{title}: mean makespan ratio over {traces} traces (below 1: numerator shorter)")
    table.add_column("category")
    pairs = [p for p in SHOWN_PAIRS if p in group["overall"]]
    for pair in pairs:
        table.add_column(pair, justify="right")
    for name, cell in group["categories"].items():
        table.add_row(name, *(f"{cell['ratios'][p]['makespan_s']['mean']:.3f}" if p in cell["ratios"] else "-"
                              for p in pairs))  # fmt: skip
    table.add_row("all (min..max)", *(f"{group['overall'][p]['mean']:.3f} ({group['overall'][p]['min']:.2f}.."
                                      f"{group['overall'][p]['max']:.2f})" for p in pairs))  # fmt: skip
    console.print(table)
