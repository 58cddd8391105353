"""A test job's handle on its emulated MIG device (the library serves ``$MIG_BATCH_NVML_EMU_DIR``):

    python -m mig_batch.gpu.nvml_emu attach --pid PID [--replay FILE] MIG-UUID

attaches the process (destroying the instance is IN_USE while it lives) and, given a ``seconds,MiB``
file, replays that memory trajectory on the device from now on.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mig_batch.gpu import nvml_emu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mig_batch.gpu.nvml_emu", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    attach = sub.add_parser("attach", help="attach a process to a MIG device, optionally replaying memory")
    attach.add_argument("uuid", help="the MIG device (what CUDA_VISIBLE_DEVICES names)")
    attach.add_argument("--pid", type=int, required=True)
    attach.add_argument("--replay", type=Path, metavar="FILE", help="seconds,MiB lines")
    attach.add_argument("--node-dir", type=Path, default=os.environ.get(nvml_emu.NODE_ENV),
                        help=f"the emulated node (default: ${nvml_emu.NODE_ENV})")  # fmt: skip
    args = parser.parse_args(argv)
    if args.node_dir is None:
        parser.error(f"no emulated node: set {nvml_emu.NODE_ENV} or give --node-dir")
    from mig_batch.atomize.samples import read_trajectory

    trajectory = read_trajectory(args.replay) if args.replay is not None else None
    if args.replay is not None and trajectory is None:
        parser.error(f"{args.replay}: no 'seconds,MiB' lines")
    nvml_emu.attach(args.node_dir, args.uuid, args.pid)
    if trajectory is not None:
        nvml_emu.replay(args.node_dir, args.uuid, list(zip(trajectory.times, trajectory.mib, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
