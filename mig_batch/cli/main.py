"""``mig-batch``: the command-line entry point."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from mig_batch.cli import bench_commands, cluster_commands, mig_commands, node_commands, plan_commands, sim_commands
from mig_batch.cli.output import fail
from mig_batch.mig.geometry import PlacementError
from mig_batch.mig.models import ModelError, UnknownModelError
from mig_batch.request import RequestError

COMMAND_MODULES = (mig_commands, sim_commands, plan_commands, bench_commands, cluster_commands, node_commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mig-batch",
        description="Dynamic NVIDIA MIG for batch clusters: geometry, request translation, placement, planning.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (RequestError, ModelError, PlacementError, ValueError) as exc:
        return fail(str(exc))
    except UnknownModelError as exc:
        return fail(str(exc))
    except KeyError as exc:
        return fail(exc.args[0] if exc.args else str(exc))
    except BrokenPipeError:  # output piped into head & co.: stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
