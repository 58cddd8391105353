"""``mig-batch``: the command-line entry point."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from mig_batch.entry import CommandParser, add_debug_option, run_guarded

# command -> (the module that registers it, its one-line help). Only the module of the command being run
# is imported: the others (OR-Tools, matplotlib, the simulator...) stay unloaded, so --help and light
# commands start fast. tests/test_startup.py checks that these lines match what the modules register.
COMMANDS: dict[str, tuple[str, str]] = {
    "gpus": ("mig_commands", "list the known GPU models"),
    "profiles": ("mig_commands", "list a GPU model's MIG profiles and their placements"),
    "translate": ("mig_commands", "translate a request into the smallest fitting MIG profile"),
    "configs": ("mig_commands", "count reachable and maximal MIG configurations and list the maximal ones"),
    "frag": ("mig_commands", "fragmentation score F and Configuration Capability CC of an occupancy"),
    "simulate": ("sim_commands", "run simulation experiments"),
    "plan": ("plan_commands", "plan a queue of moldable tasks on one MIG GPU"),
    "bench": ("bench_commands", "benchmarks that print numbers"),
    "slurm": ("cluster_commands", "Slurm integration: generate job_submit.lua, install the hooks"),
    "htcondor": ("cluster_commands", "HTCondor integration: write the schedd and execute-node policy, the job wrapper"),
    "status": ("cluster_commands", "every GPU's MIG slices and the jobs on them"),
    "node": ("node_commands", "this node's GPUs as the driver sees them"),
    "offers": ("cluster_commands", "subjob chains (SJA): recent gap offers, every chain's reply, the grants"),
    "events": ("ops_commands", "the controller's event log: placements, requeues, node problems..."),
    "doctor": ("ops_commands", "check a controller or node set-up and say what to fix"),
}


class _VersionAction(argparse.Action):
    """``--version``: read from the installed metadata only when asked (importlib.metadata is not free)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from mig_batch import version

        print(f"{parser.prog} {version()}")
        parser.exit()


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (the first one that is not an option), if it names a command."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``only``, that command's module registered and the others as names and help."""
    parser = CommandParser(
        prog="mig-batch",
        description="Dynamic NVIDIA MIG for batch clusters: geometry, request translation, placement, planning.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    every = {module for module, _ in COMMANDS.values()}
    # only="": no command given (--help, a typo): the names and help lines are enough
    wanted = every if only is None else {COMMANDS[only][0]} if only else set()
    for name, (module, help_text) in COMMANDS.items():
        if name in sub.choices:
            continue
        if module in wanted:
            importlib.import_module(f"mig_batch.cli.{module}").register(sub)
        else:
            sub.add_parser(name, help=help_text, description=help_text)
    add_debug_option(parser)
    return parser


def _run(argv: list[str]) -> int:
    args = build_parser(chosen_command(argv) or "").parse_args(argv)
    return int(args.handler(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    return run_guarded(_run, argv, "mig-batch")


if __name__ == "__main__":
    sys.exit(main())
