"""``mig-batch bench ...``: benchmarks that print numbers."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

from mig_batch.bench.install_size import ROLES
from mig_batch.cli.output import Literal, Table, console
from mig_batch.entry import needs_extra
from mig_batch.planner.planners import PLANNERS
from mig_batch.planner.problem import gpu_scheme
from mig_batch.planner.workloads import WORKLOAD_TYPES
from mig_batch.sim.data import RODINIA_DIR, RODINIA_FILES, RODINIA_SOURCE, MissingDataError

# bench planner: the short default run (seconds) and --full (MIG-DRL §5.2's setting: minutes)
PLANNER_QUICK = {"datasets": 1, "tasks": 14, "batch": 14, "gap_batch": 6, "gap_time_limit": 10.0}
PLANNER_FULL = {"datasets": 5, "tasks": 100, "batch": 14, "gap_batch": 8, "gap_time_limit": 60.0}


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
    q = kinds.add_parser("planner", help="every planner on every workload: mean p_opt and planning time; true gap "
                         "to the CP-SAT optimum (a short run by default, --full for the MIG-DRL setting)")  # fmt: skip
    q.add_argument("--full", action="store_true",
                   help="the full run (minutes): " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                               PLANNER_FULL.items()))  # fmt: skip
    q.add_argument("--datasets", type=int, help="datasets per workload (fixed seeds 0..K-1; default 1, --full 5)")
    q.add_argument("--tasks", type=int, help="tasks per synthetic dataset (default 14, --full 100)")
    q.add_argument("--batch", type=int, help="tasks per offline batch (N; default 14)")
    q.add_argument("--planners", default=",".join(PLANNERS), help="comma-separated planners")
    q.add_argument("--workloads", help="comma-separated (default: the synthetic ones, "
                   f"{','.join(WORKLOAD_TYPES)}; --full adds rodinia-a100, which needs --rodinia-dir)")  # fmt: skip
    q.add_argument("--rodinia-dir", type=Path, default=Path(os.environ.get("MIG_BATCH_RODINIA_DIR", RODINIA_DIR)),
                   help=f"rodinia-a100: the folder with the Rodinia task times {RODINIA_FILES} (not shipped: "
                   f"{RODINIA_SOURCE}; default $MIG_BATCH_RODINIA_DIR or {RODINIA_DIR})")  # fmt: skip
    q.add_argument("--gap-batch", type=int,
                   help="also solve the first N tasks of each dataset exactly (CP-SAT) for the true gap; 0: skip "
                        "(default 6, --full 8)")  # fmt: skip
    q.add_argument("--gap-time-limit", type=float, help="seconds per exact solve (default 10, --full 60)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=cmd_bench_planner)
    m = kinds.add_parser("moldable", help="one controller pass over waiting moldable jobs against cluster size")
    m.add_argument("--sizes", default="100,1000,10000", help="cluster sizes in GPUs")
    m.add_argument("--jobs", type=int, default=200, help="waiting moldable jobs in the pass")
    m.add_argument("--load", type=float, default=0.9, help="share of memory slices preloaded")
    m.add_argument("--json", action="store_true")
    m.set_defaults(handler=cmd_bench_moldable)
    lp = kinds.add_parser("live-planner", help="one live batch-planning pass (eft, far, auto) at cluster scale")
    lp.add_argument("--gpus", type=int, default=1000, help="A100-80GB GPUs (default 1000)")
    lp.add_argument("--jobs", type=int, default=500, help="queued moldable jobs (default 500)")
    lp.add_argument("--budget-s", type=float, default=5.0, help="the pass budget in seconds (default 5)")
    lp.add_argument("--planners", default="eft,far,auto", help="comma-separated live planners (default eft,far,auto)")
    lp.add_argument("--json", action="store_true")
    lp.set_defaults(handler=cmd_bench_live_planner)
    r = kinds.add_parser("pass", help="one mig-batchd pass against cluster size and queue length (in-memory "
                         "batch system)")  # fmt: skip
    r.add_argument("--sizes", default="1000,8000", help="cluster sizes in GPUs (A100-80GB)")
    r.add_argument("--jobs-per-gpu", type=float, default=2.5,
                   help="rigid MIG jobs submitted per GPU at once; what does not fit stays queued")  # fmt: skip
    r.add_argument("--gpus-per-node", type=int, default=8)
    r.add_argument("--churn", type=int, default=200, help="jobs ending and jobs arriving between passes")
    r.add_argument("--passes", type=int, default=5, help="steady passes timed per size (median and max)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(handler=cmd_bench_pass)
    c = kinds.add_parser("controller", help="one burst through a local Slurm: bare, no-op hooks, MIG jobs held "
                         "for mig-batchd, MIG jobs with prompt slots (root, slurm-wlm)")  # fmt: skip
    c.add_argument("--jobs", type=int, default=1000)
    c.add_argument("--nodes", type=int, default=3, help="slurmd processes")
    c.add_argument("--gpus-per-node", type=int, default=48, help="emulated A100-80GB per node")
    c.add_argument("--rounds", type=int, default=1,
                   help="run the three bursts this many times, every other round in reverse order (an even "
                        "number balances the order); the ratios' median is printed too")  # fmt: skip
    c.add_argument("--prompt-slots", type=int, help="the slots burst's prompt_slots (default: 64, more than a "
                   "pass's arrivals at the bench's rate)")  # fmt: skip
    c.add_argument("--fence", choices=("on", "off"), default="on",
                   help="the MIG bursts' agents fence each job to its instance (default on, as installed)")  # fmt: skip
    c.add_argument("--array", action="store_true", help="submit the burst as one job array of --jobs tasks "
                   "(bare, no-op hooks and MIG held: an array takes no prompt slot)")  # fmt: skip
    c.add_argument("--checkout", type=Path, metavar="DIR",
                   help="a checkout of the mig-batch repository: the local Slurm comes from its test harness "
                        "(tests/harness, not in the wheel; default: the checkout this package runs from, else "
                        "the working directory)")  # fmt: skip
    c.add_argument("--json", action="store_true")
    c.set_defaults(handler=cmd_bench_controller)
    z = kinds.add_parser("install-size", help="disk taken by a GPU node's venv (mig_batch alone), a controller's "
                         "([controller]) and a simulation host's ([sim]), each made fresh from a wheel")  # fmt: skip
    z.add_argument("--wheel", type=Path, help="the mig_batch wheel (default: the newest dist/mig_batch-*.whl)")
    z.add_argument("--roles", default=",".join(ROLES), help=f"comma-separated, of {', '.join(ROLES)} (default all)")
    z.add_argument("--python", default="python3", help="the Python that makes the venvs (default python3)")
    z.add_argument("--keep", type=Path, metavar="DIR", help="make the venvs in DIR and keep them (default: a "
                   "temporary folder, removed after)")  # fmt: skip
    z.add_argument("--pip-args", default="", help="more pip install options, e.g. '--no-index --find-links DIR'")
    z.add_argument("--json", action="store_true")
    z.set_defaults(handler=cmd_bench_install_size)
    s = kinds.add_parser("startup", help="start-up time of mig-batch and migsub against python -c pass (ratios)")
    s.add_argument("--runs", type=int, default=7, help="fresh processes per command (median; default 7)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(handler=cmd_bench_startup)


def cluster_sizes(text: str) -> list[int]:
    """``--sizes 100,1000``: positive whole numbers of GPUs."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes takes comma-separated positive numbers of GPUs like 100,1000; got {text!r}")
    return sizes


def cmd_bench_placement(args: argparse.Namespace) -> int:
    from mig_batch.bench.placement import bench_placement

    sizes = cluster_sizes(args.sizes)
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


@needs_extra("controller", "mig-batch bench moldable")
def cmd_bench_moldable(args: argparse.Namespace) -> int:
    from mig_batch.bench.moldable import bench_moldable

    sizes = cluster_sizes(args.sizes)
    if not sizes or min(sizes) < 1 or not 0 <= args.load < 1 or args.jobs < 1:
        raise ValueError("--sizes must be positive integers, --load in [0, 1), --jobs at least 1")
    rows = bench_moldable(sizes, args.jobs, load=args.load)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    table = Table(title=f"one pass over {args.jobs} waiting moldable jobs, A100-80GB clusters preloaded to "
                        f"{args.load:.0%}")  # fmt: skip
    for col in ("GPUs", "setup ms", "p50 µs", "p99 µs", "pass ms", "started", "reserved", "waiting"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r.gpus:,}", f"{r.setup_ms:.1f}", f"{r.p50_us:.0f}", f"{r.p99_us:.0f}", f"{r.pass_ms:.0f}",
                      str(r.started), str(r.reserved), str(r.waiting))  # fmt: skip
    console.print(table)
    return 0


@needs_extra("controller", "mig-batch bench live-planner")
def cmd_bench_live_planner(args: argparse.Namespace) -> int:
    from mig_batch.bench.live_planner import bench_live
    from mig_batch.planner.live import LIVE_PLANNERS

    planners = tuple(p.strip() for p in args.planners.split(",") if p.strip())
    if not planners or any(p not in LIVE_PLANNERS for p in planners):
        raise ValueError(f"--planners takes some of {', '.join(LIVE_PLANNERS)}; got {args.planners!r}")
    if args.gpus < 1 or args.jobs < 1 or not args.budget_s > 0:
        raise ValueError("--gpus and --jobs must be at least 1, --budget-s above 0")
    rows = bench_live(args.gpus, args.jobs, args.budget_s, planners)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    table = Table(title=f"one live planning pass: {args.jobs} queued moldable jobs on {args.gpus:,} A100-80GB GPUs, "
                        f"budget {args.budget_s:g} s")  # fmt: skip
    for col in ("planner", "wall s", "decodings", "ms/decoding", "start now", "mean end s", "makespan s", "valid"):
        table.add_column(col, justify="left" if col == "planner" else "right")
    for r in rows:
        table.add_row(r.planner, f"{r.wall_s:.2f}", str(r.evaluations), f"{r.decode_ms:.0f}", str(r.start_now),
                      f"{r.mean_end_s:.0f}", f"{r.makespan_s:.0f}", "yes" if r.valid else "NO")  # fmt: skip
    console.print(table)
    return 0


@needs_extra("controller", "mig-batch bench pass")
def cmd_bench_pass(args: argparse.Namespace) -> int:
    from mig_batch.bench.controller_pass import bench_controller_pass

    sizes = cluster_sizes(args.sizes)
    if args.jobs_per_gpu <= 0 or args.gpus_per_node < 1 or args.churn < 0 or args.passes < 1:
        raise ValueError("--jobs-per-gpu must be above 0, --gpus-per-node and --passes at least 1, --churn at "
                         "least 0")  # fmt: skip
    rows = bench_controller_pass(sizes, args.jobs_per_gpu, args.gpus_per_node, args.churn, args.passes)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    table = Table(title=f"one mig-batchd pass, {args.jobs_per_gpu:g} jobs per GPU submitted, {args.churn} ending "
                        f"and {args.churn} arriving between passes")  # fmt: skip
    for col in ("GPUs", "nodes", "running", "queued", "placed/pass", "pass p50 ms", "pass max ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r.gpus:,}", f"{r.nodes:,}", f"{r.running:,}", f"{r.queued:,}", f"{r.placed_per_pass:.0f}",
                      f"{r.p50_ms:.0f}", f"{r.max_ms:.0f}")  # fmt: skip
    console.print(table)
    return 0


def _print_gaps(gaps: list, stats: list, batch: int) -> None:
    table = Table(title=f"true gap to the optimum (CP-SAT) on the first {batch} tasks of each dataset")
    for col in ("workload", "planner", "proven/batches", "mean gap %", "max gap %"):
        table.add_column(col, justify="left" if col in ("workload", "planner") else "right")
    for r in gaps:
        table.add_row(r.workload, r.planner, f"{r.proven}/{r.batches}", f"{r.mean_gap:.2f}", f"{r.max_gap:.2f}")
    console.print(table)
    solved = Table(title="exact solver")
    for col in ("workload", "proven/batches", "mean solve s", "max solve s"):
        solved.add_column(col, justify="left" if col == "workload" else "right")
    for s in stats:
        solved.add_row(s.workload, f"{s.proven}/{s.batches}", f"{s.mean_solve_s:.2f}", f"{s.max_solve_s:.2f}")
    console.print(solved)


@needs_extra("sim", "mig-batch bench planner")
def cmd_bench_planner(args: argparse.Namespace) -> int:
    # OR-Tools (the exact solver) loads only for this command
    from mig_batch.bench.planner import bench_gaps, bench_planners, subset_workload, synthetic_workloads

    preset = PLANNER_FULL if args.full else PLANNER_QUICK
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.datasets < 1 or args.batch < 1 or args.tasks < 1:
        raise ValueError("--datasets, --tasks and --batch must be at least 1")
    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    unknown = [p for p in planners if p not in PLANNERS]
    if unknown:
        raise ValueError(f"unknown planner(s) {', '.join(unknown)}; known: {', '.join(PLANNERS)}")
    default_workloads = [*WORKLOAD_TYPES, *(["rodinia-a100"] if args.full else [])]
    names = [w.strip() for w in (args.workloads or ",".join(default_workloads)).split(",") if w.strip()]
    workloads = synthetic_workloads([w for w in names if w in WORKLOAD_TYPES], args.tasks)
    if "rodinia-a100" in names:
        workloads["rodinia-a100"] = subset_workload(rodinia_tasks(args.rodinia_dir), args.batch)
    unknown = [w for w in names if w not in workloads]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOAD_TYPES)}, rodinia-a100")
    if args.gap_batch < 0 or args.gap_time_limit <= 0:
        raise ValueError("--gap-batch must be 0 (skip) or more, --gap-time-limit positive")
    scheme = gpu_scheme("A100-40GB")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    steps = len(workloads) * args.datasets
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console.rich, transient=True, disable=args.json) as progress:  # fmt: skip
        task = progress.add_task("planners", total=steps)
        rows = bench_planners(scheme, planners, workloads, args.datasets, args.batch,
                              progress=lambda: progress.advance(task))  # fmt: skip
        gaps, stats = [], []
        if args.gap_batch:
            exact = progress.add_task(f"exact solves ({args.gap_batch} tasks)", total=steps)
            gaps, stats = bench_gaps(scheme, planners, workloads, args.datasets, args.gap_batch, args.gap_time_limit,
                                     progress=lambda: progress.advance(exact))  # fmt: skip
    if args.json:
        print(json.dumps({"p_opt": [asdict(r) for r in rows], "gap": [asdict(r) for r in gaps],
                          "exact": [asdict(s) for s in stats]}, indent=1))  # fmt: skip
        return 0
    short = "" if args.full else " (a short run; --full: the MIG-DRL setting)"
    table = Table(title=f"planners on A100-40GB, batches of {args.batch}, {args.datasets} dataset(s) of {args.tasks} "
                        f"tasks per synthetic workload{short}")
    for col in ("workload", "planner", "batches", "mean p_opt %", "mean plan ms", "max plan ms"):
        table.add_column(col, justify="left" if col in ("workload", "planner") else "right")
    for r in rows:
        table.add_row(
            r.workload, r.planner, str(r.batches), f"{r.mean_p_opt:.2f}", f"{r.mean_plan_s * 1e3:.1f}",
            f"{r.max_plan_s * 1e3:.1f}",
        )  # fmt: skip
    console.print(table)
    if gaps:
        _print_gaps(gaps, stats, args.gap_batch)
    return 0


def rodinia_tasks(folder: Path) -> list:
    """The Rodinia A100 task times in ``folder``; exit 2 naming the files, their source and the option where
    they are missing (read_rodinia names what is wrong in a file that is there)."""
    from mig_batch.planner.workloads import read_rodinia

    if not folder.is_dir() or not any(folder.glob("*g_A100.csv")):
        raise MissingDataError(
            f"the rodinia-a100 workload needs the Rodinia task times {RODINIA_FILES} in {folder}, which holds "
            f"none; they were {RODINIA_SOURCE}; point --rodinia-dir (or $MIG_BATCH_RODINIA_DIR) at a copy of "
            "that folder, or leave rodinia-a100 out of --workloads")  # fmt: skip
    return read_rodinia(folder, "A100")


def cmd_bench_install_size(args: argparse.Namespace) -> int:
    import shlex

    from mig_batch.bench.install_size import NODE_GOAL_MB, default_wheel, measure

    wheel = args.wheel or default_wheel(Path("dist"))
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    sizes = measure(wheel, roles, args.python, args.keep, shlex.split(args.pip_args),
                    progress=lambda what: None if args.json else console.print(Literal(f"making {what} ..."),
                                                                                highlight=False))  # fmt: skip
    if args.json:
        print(json.dumps([asdict(s) for s in sizes], indent=1))
        return 0
    table = Table(title=f"venv sizes, {wheel.name} installed with pip (MB = 10^6 bytes; packages: less an empty venv)")
    for col in ("role", "installs", "venv MB", "packages MB", "largest in site-packages (MB)"):
        table.add_column(col, justify="right" if "MB" in col and "largest" not in col else "left")
    for s in sizes:
        table.add_row(s.role, Literal(f"mig-batch{s.requirement.partition('.whl')[2]}"), f"{s.total_mb:.1f}",
                      f"{s.packages_mb:.1f}", ", ".join(f"{n} {mb:.1f}" for n, mb in s.largest))  # fmt: skip
    console.print(table)
    node = next((s for s in sizes if s.role == "node"), None)
    if node is not None:
        verdict = "under" if node.total_mb < NODE_GOAL_MB else "OVER"
        console.print(f"node venv: {node.total_mb:.1f} MB, {verdict} the {NODE_GOAL_MB:.0f} MB goal", highlight=False)
    return 0


def cmd_bench_startup(args: argparse.Namespace) -> int:
    from mig_batch.bench.startup import bench_startup

    if not 1 <= args.runs <= 100:
        raise ValueError(f"--runs must be 1..100 fresh processes per command, got {args.runs}")
    rows = bench_startup(args.runs)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
        return 0
    table = Table(title=f"start-up, median of {args.runs} fresh processes")
    for col in ("command", "median ms", "min ms", "x python -c pass"):
        table.add_column(col, justify="left" if col == "command" else "right")
    for r in rows:
        table.add_row(r.command, f"{r.median_s * 1e3:.0f}", f"{r.min_s * 1e3:.0f}", f"{r.ratio:.1f}")
    console.print(table)
    return 0


@needs_extra("controller", "mig-batch bench controller")
def cmd_bench_controller(args: argparse.Namespace) -> int:
    from mig_batch.bench.controller import (
        ARRAY_MODES,
        DEFAULT_PROMPT_SLOTS,
        MODES,
        BurstRun,
        bench_controller,
        load_slurm_harness,
        median_ratios,
        ratios,
    )
    from mig_batch.config import MAX_PROMPT_SLOTS

    if args.prompt_slots is None:
        args.prompt_slots = DEFAULT_PROMPT_SLOTS

    if args.array and args.jobs > 1000:
        raise ValueError(f"--array takes at most 1000 tasks (Slurm's default MaxArraySize is 1001; got --jobs "
                         f"{args.jobs})")  # fmt: skip
    if not (1 <= args.jobs <= 100_000 and 1 <= args.nodes <= 64 and 1 <= args.gpus_per_node <= 1024
            and 1 <= args.rounds <= 100 and 1 <= args.prompt_slots <= MAX_PROMPT_SLOTS):  # fmt: skip
        raise ValueError(f"--jobs must be 1..100000, --nodes 1..64, --gpus-per-node 1..1024, --rounds 1..100 and "
                         f"--prompt-slots 1..{MAX_PROMPT_SLOTS} (got {args.jobs}, {args.nodes}, {args.gpus_per_node}, "
                         f"{args.rounds}, {args.prompt_slots})")  # fmt: skip
    harness = load_slurm_harness(args.checkout)  # exits 2 saying what it needs where no checkout is found
    why = harness.LocalCluster.available()
    if why:
        raise ValueError(f"bench controller needs a local Slurm: {why}")
    rounds: list[list[BurstRun]] = []
    for runs in bench_controller(args.jobs, args.gpus_per_node, args.nodes, rounds=args.rounds,
                                 modes=ARRAY_MODES if args.array else MODES, prompt_slots=args.prompt_slots,
                                 fence=args.fence == "on", checkout=args.checkout, array=args.array):  # fmt: skip
        rounds.append(runs)
        if args.json:
            continue
        if args.rounds > 1:  # each round as it ends: a failure later loses nothing printed
            console.print(f"round {len(rounds)}", highlight=False)
        for r in runs:
            console.print(f"{r.mode:5} {r.completed}/{r.jobs} jobs completed in {r.total_s:.1f} s "
                          f"({r.jobs_per_s:.1f} jobs/s; submitting took {r.submit_s:.1f} s; "
                          f"{r.cpu_ms_per_job:.0f} ms of CPU per job)", highlight=False)  # fmt: skip
        console.print("  ".join(f"{k} = {v:.2f}" for k, v in ratios(runs).items()), highlight=False)
    medians = median_ratios(rounds)
    if args.json:
        print(json.dumps({"rounds": [{"runs": [{**asdict(r), "jobs_per_s": r.jobs_per_s,
                                                "cpu_ms_per_job": r.cpu_ms_per_job} for r in runs],
                                      "ratios": ratios(runs)} for runs in rounds],
                          "median_ratios": {k: {"median": m, "rounds": n} for k, (m, n) in medians.items()}},
                         indent=1))  # fmt: skip
    elif args.rounds > 1:
        console.print("median over the rounds: " + "  ".join(f"{k} = {m:.2f} ({n} rounds)" for k, (m, n)
                                                              in medians.items()), highlight=False)  # fmt: skip
    return 0
