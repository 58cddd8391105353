"""``mig-batch plan``: plan a queue of moldable tasks on one MIG GPU, or spread over several."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mig_batch.cli.output import Table, console
from mig_batch.entry import needs_extra
from mig_batch.planner.bounds import lower_bound, p_opt
from mig_batch.planner.multi import check_multi
from mig_batch.planner.plan import check_plan
from mig_batch.planner.planners import PLANNERS, make_multi_plan, make_plan
from mig_batch.planner.problem import GpuScheme, Task, gpu_scheme
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
    p.add_argument(
        "--gpus", type=int, default=1, help="GPUs of that model to spread the batch over (one timeline each)"
    )
    p.add_argument("--out", type=Path, default=Path("out/plan"), help="directory for the Gantt PNG and plan JSON")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(handler=cmd_plan)


@needs_extra("sim", "mig-batch plan")
def cmd_plan(args: argparse.Namespace) -> int:
    file_gpu, tasks = read_queue(args.queue)
    scheme = gpu_scheme(args.gpu or file_gpu or "A100-40GB")
    if args.gpus < 1:
        raise ValueError(f"--gpus must be at least 1, got {args.gpus}")
    if args.gpus > 1:
        return _plan_multi(args, scheme, tasks)
    plan = make_plan(args.planner, scheme, tasks)
    makespan = check_plan(scheme, tasks, plan)
    from mig_batch.planner.gantt import plot_plan  # matplotlib: only when plotting
    bound = lower_bound(scheme, tasks)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.queue.stem}_{args.planner}"
    png = plot_plan(scheme, tasks, plan, args.out / f"{stem}.png", bound)
    result = {**plan.as_dict(tasks), "lower_bound": bound, "p_opt": p_opt(makespan, bound)}
    json_path = _save(args, stem, result)
    if args.json:
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


def _plan_multi(args: argparse.Namespace, scheme: GpuScheme, tasks: list[Task]) -> int:
    schemes = [scheme] * args.gpus
    multi = make_multi_plan(args.planner, schemes, tasks)
    makespan = check_multi(schemes, tasks, multi)
    from mig_batch.planner.gantt import plot_plan  # matplotlib: only when plotting
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.queue.stem}_{args.planner}_{args.gpus}gpus"
    per_gpu = []
    for g, (members, plan) in enumerate(zip(multi.assignment, multi.plans, strict=True)):
        subset = [tasks[i] for i in members]
        plot_plan(scheme, subset, plan, args.out / f"{stem}_gpu{g}.png", lower_bound(scheme, subset))
        per_gpu.append({"gpu_index": g, **plan.as_dict(subset)})
    result = {"gpu": scheme.model.name, "planner": args.planner, "makespan": makespan, "gpus": per_gpu}
    json_path = _save(args, stem, result)
    if args.json:
        return 0
    table = Table(title=f"{args.planner} plan for {len(tasks)} tasks on {args.gpus} x {scheme.model.name}")
    for col in ("GPU", "begin s", "end s", "action", "instance", "task"):
        table.add_column(col, justify="right" if col.endswith(" s") else "left")
    for gpu in per_gpu:
        for e in gpu["events"]:
            profile = scheme.profiles[e["size"]].name
            table.add_row(str(gpu["gpu_index"]), f"{e['begin']:.3f}", f"{e['end']:.3f}", e["kind"],
                          f"{profile} @ {e['start']}", e.get("task", ""))  # fmt: skip
    console.print(table)
    ends = ", ".join(f"GPU {g['gpu_index']} {g['makespan']:.3f} s" for g in per_gpu)
    console.print(f"makespan {makespan:.3f} s ({ends}); Gantt {args.out}/{stem}_gpu*.png; plan {json_path}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    return 0


def _save(args: argparse.Namespace, stem: str, result: dict) -> Path:
    """Write the plan JSON beside the Gantt charts (and print it with --json); returns its path."""
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result, indent=1))
    return path
