"""``mig-batch bench ...``: benchmarks that print numbers."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from rich.table import Table

from mig_batch.bench.placement import bench_placement
from mig_batch.cli.output import console


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print numbers", description="Benchmarks that print numbers.")
    kinds = bench.add_subparsers(dest="kind", metavar="KIND", required=True)
    p = kinds.add_parser("placement", help="placement decision latency against cluster size")
    p.add_argument("--policies", default="mfi,ff,rr,bf-bi,wf-bi,mcc,nvidia,emfi")
    p.add_argument("--sizes", default="100,1000,10000,100000", help="cluster sizes in GPUs")
    p.add_argument("--gpu", default="A100-80GB")
    p.add_argument("--decisions", type=int, default=2000, help="decisions timed per policy and size")
    p.add_argument("--load", type=float, default=0.7, help="share of memory slices preloaded")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_bench_placement)


def cmd_bench_placement(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1 or not 0 <= args.load < 1 or args.decisions < 1:
        raise ValueError("--sizes must be positive integers, --load in [0, 1), --decisions at least 1")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    rows = bench_placement(policies, sizes, model=args.gpu, decisions=args.decisions, load=args.load)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    table = Table(title=f"placement decisions on {args.gpu}, clusters preloaded to {args.load:.0%}")
    for col in ("policy", "GPUs", "decisions/s", "p50 µs", "p99 µs", "placed"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for r in rows:
        table.add_row(
            r.policy,
            f"{r.gpus:,}",
            f"{r.decisions_per_s:,.0f}",
            f"{r.p50_us:.2f}",
            f"{r.p99_us:.2f}",
            f"{r.placed}/{r.decisions}",
        )
    console.print(table)
    return 0
