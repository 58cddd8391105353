"""``mig-batch plan``: plan a queue of moldable tasks on one MIG GPU."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from mig_batch.cli.output import console
from mig_batch.planner.bounds import lower_bound, p_opt
from mig_batch.planner.gantt import plot_plan
from mig_batch.planner.plan import check_plan
from mig_batch.planner.planners import PLANNERS, make_plan
from mig_batch.planner.problem import gpu_scheme
from mig_batch.planner.queue_file import read_queue


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="plan a queue of moldable tasks on one MIG GPU",
        description="Plan reconfigurations, instance sizes and order for a queue of moldable tasks (YAML).",
    )
    p.add_argument("queue", type=Path, help="YAML: gpu (optional) and tasks with times per size")
    p.add_argument("--gpu", default=None, help="GPU model (default: the queue file's, else A100-40GB)")
    p.add_argument("--planner", default="auto", choices=sorted(PLANNERS), help="planner (default auto)")
    p.add_argument("--out", type=Path, default=Path("out/plan"), help="directory for the Gantt PNG and plan JSON")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(handler=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    file_gpu, tasks = read_queue(args.queue)
    scheme = gpu_scheme(args.gpu or file_gpu or "A100-40GB")
    plan = make_plan(args.planner, scheme, tasks)
    makespan = check_plan(scheme, tasks, plan)
    bound = lower_bound(scheme, tasks)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.queue.stem}_{args.planner}"
    png = plot_plan(scheme, tasks, plan, args.out / f"{stem}.png", bound)
    result = {**plan.as_dict(tasks), "lower_bound": bound, "p_opt": p_opt(makespan, bound)}
    json_path = args.out / f"{stem}.json"
    json_path.write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    table = Table(title=f"{args.planner} plan for {len(tasks)} tasks on {scheme.model.name}")
    for col in ("begin s", "end s", "action", "instance", "task"):
        table.add_column(col, justify="right" if col.endswith(" s") else "left")
    for e in result["events"]:
        profile = scheme.profiles[e["size"]].name
        table.add_row(f"{e['begin']:.3f}", f"{e['end']:.3f}", e["kind"], f"{profile} @ {e['start']}", e.get("task", ""))
    console.print(table)
    console.print(
        f"makespan {makespan:.3f} s; lower bound {bound:.3f} s (p_opt {result['p_opt']:.1f}%); "
        f"Gantt {png}; plan {json_path}",
        highlight=False,
        soft_wrap=True,
    )
    return 0
