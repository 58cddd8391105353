"""``mig-batch``: the command-line entry point."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mig_batch.cli import bench_commands, cluster_commands, mig_commands, plan_commands, sim_commands
from mig_batch.cli.guard import add_debug_option, run_guarded

COMMAND_MODULES = (mig_commands, sim_commands, plan_commands, bench_commands, cluster_commands)


class _VersionAction(argparse.Action):
    """``--version``: read from the installed metadata only when asked (importlib.metadata is not free)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from mig_batch import version

        print(f"{parser.prog} {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mig-batch",
        description="Dynamic NVIDIA MIG for batch clusters: geometry, request translation, placement, planning.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    add_debug_option(parser)
    return parser


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    return run_guarded(_run, argv, "mig-batch")


if __name__ == "__main__":
    sys.exit(main())
