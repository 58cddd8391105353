"""``mig-batch node probe``: the local GPUs' MIG profiles as the driver states them, against etc/gpus."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from mig_batch.cli.output import Table, console, emit, fail
from mig_batch.gpu.base import GpuBackendError
from mig_batch.mig.models import ModelError, UnknownModelError, get_model, load_model_file
from mig_batch.mig.probe import DriverGpu, compare, model_document


def register(sub: argparse._SubParsersAction) -> None:
    node = sub.add_parser("node", help="this node's GPUs as the driver sees them")
    kinds = node.add_subparsers(dest="node_command", metavar="SUBCOMMAND", required=True)
    p = kinds.add_parser(
        "probe",
        help="read the local GPUs' MIG profiles through NVML (MIG mode may be off) and compare them with etc/gpus",
        description="Compares every profile (id, instances, slices, memory, SMs, placements) with the GPU's model; "
        "exit status 1 when a field differs or a GPU has no model.",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--write-model",
        type=Path,
        metavar="DIR",
        help="for a GPU no model knows, write a model file built from the driver's answers into DIR",
    )
    p.set_defaults(handler=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    target = args.write_model
    if target is not None and not (target.is_dir() and os.access(target, os.W_OK)):
        return fail(f"--write-model {target}: not a writable directory; give an existing directory "
                    "(e.g. /etc/mig-batch/gpus)")  # fmt: skip
    from mig_batch.gpu.nvml import read_driver_gpus

    try:
        gpus = read_driver_gpus()
    except GpuBackendError as exc:
        return fail(f"cannot read the GPUs through NVML ({exc}); this needs the NVIDIA driver's libnvidia-ml.so.1")
    reports = [_report(gpu, target) for gpu in gpus]
    data = {"gpus": reports, "differences": sum(len(r["differences"]) for r in reports)}
    emit(data, args.json, _render)
    unmapped = any(r["model"] is None and r.get("written") is None for r in reports)
    return 1 if data["differences"] or unmapped else 0


def _report(gpu: DriverGpu, target: Path | None) -> dict[str, Any]:
    report: dict[str, Any] = {"index": gpu.index, "name": gpu.name, "mig_enabled": gpu.mig_enabled,
                              "profiles": [asdict(p) for p in gpu.profiles]}  # fmt: skip
    try:
        model = get_model(gpu.name)
    except UnknownModelError:
        report.update(model=None, differences=[])
        if target is not None and gpu.profiles:
            report["written"] = str(_write_model(gpu, target))
        return report
    report.update(model=model.name, model_file=model.path,
                  differences=[asdict(d) | {"text": str(d)} for d in compare(model, gpu)])  # fmt: skip
    return report


def _write_model(gpu: DriverGpu, target: Path) -> Path:
    document = model_document(gpu)
    path = target / f"{document['model'].lower()}.yaml"
    path.write_text(f"# {gpu.name}: written by mig-batch node probe from the driver's answers\n"
                    + yaml.safe_dump(document, sort_keys=False, width=100))  # fmt: skip
    try:
        load_model_file(path)  # what the driver said must make a valid model, or nothing is left behind
    except ModelError:
        path.unlink()
        raise
    return path


def _render(data: dict[str, Any]) -> None:
    for gpu in data["gpus"]:
        mig = "MIG on" if gpu["mig_enabled"] else "MIG off"
        if gpu["model"] is None:
            where = f"written to {gpu['written']}" if gpu.get("written") else "use --write-model DIR to write one"
            console.print(f"GPU {gpu['index']} {gpu['name']} ({mig}): no etc/gpus model; {where}", highlight=False)
            continue
        console.print(f"GPU {gpu['index']} {gpu['name']} ({mig}) -> model {gpu['model']} ({gpu['model_file']})",
                      highlight=False)  # fmt: skip
        if not gpu["differences"]:
            console.print("  every profile matches", highlight=False)
            continue
        table = Table("profile", "field", "model", "driver")
        for d in gpu["differences"]:
            table.add_row(d["profile"], d["field"], str(d["model"]), str(d["driver"]))
        console.print(table)
