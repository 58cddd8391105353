"""What a site installs for Slurm: job_submit.lua with the profile table, and the hook shims filled in
(the Prolog and Epilog ask the node agent through the hook client: compiled from C when the host has a
C compiler, else the standard-library Python one)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from mig_batch.mig.models import GpuModel, get_model
from mig_batch.node import hook_client
from mig_batch.resources import resource_path

SHIMS = ("mig-batch-prolog", "mig-batch-epilog", "mig-batch-taskprolog", "mig-batch-subjob")
HOOK_BINARY = "mig-batch-hook"


def build_hook_client(dest: Path, compiler: str | None = None) -> tuple[Path | None, str]:
    """Compile the C hook client into ``dest``: (its path, "") or (None, why not). Every job runs it twice,
    and its start (~1 ms) is a tenth of the Python client's."""
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) on this host"
    source, binary = resource_path("plugins", "slurm", f"{HOOK_BINARY}.c"), dest / HOOK_BINARY
    building = dest / f".{HOOK_BINARY}.new"  # a Prolog starting meanwhile runs the old binary, whole
    try:
        proc = subprocess.run([cc, "-O2", "-std=gnu11", "-o", str(building), str(source)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        building.unlink(missing_ok=True)
        return None, f"{cc} failed: {exc}"
    if proc.returncode != 0:
        building.unlink(missing_ok=True)
        return None, f"{cc} failed: {proc.stderr.strip()[-500:]}"
    building.chmod(0o755)
    os.replace(building, binary)
    return binary, ""


def profile_table(models: Iterable[GpuModel], nodes: Mapping[str, Sequence[str]] | None = None,
                  leaf_requests: bool = False) -> str:  # fmt: skip
    """The Lua tables: each model's profiles (with how many fit one GPU, for jobs over several instances)
    and its Flex-MIG leaves (``leaf_one`` for a job of one, ``leaf`` for more: mig_batch.leaves' rule, read
    by job_submit.lua for the site's finer requests); when the site's inventory is known, each node's GPU
    models; and whether the site allows requests over leaves (``flex.leaf_requests``)."""
    from mig_batch.leaves import leaf_profiles
    from mig_batch.mig.tables import tables_for
    from mig_batch.placement.multi import max_per_gpu

    lines = [f"MIG_LEAF_REQUESTS = {'true' if leaf_requests else 'false'}", "MIG_MODELS = {"]
    for model in sorted(models, key=lambda m: m.name):
        one, many = leaf_profiles(model)
        lines.append(f'\t["{model.name}"] = {{ compute_slices = {model.compute_slices}, leaf_one = "{one.name}", '
                     f'leaf = "{many.name}", profiles = {{')  # fmt: skip
        for p in model.base_profiles:
            per_gpu = max_per_gpu(tables_for(model.name), p.name)
            lines.append(f'\t\t{{ name = "{p.name}", memory_mib = {p.memory_mib}, compute = {p.compute_slices}, '
                         f"slices = {p.memory_slices}, per_gpu = {per_gpu} }},")  # fmt: skip
        lines.append("\t} },")
    lines.append("}")
    lines.append("MIG_NODES = {")
    for node, gpus in sorted((nodes or {}).items()):
        lines.append(f'\t["{node}"] = {{ {", ".join(f"{chr(34)}{get_model(m).name}{chr(34)}" for m in gpus)} }},')
    lines.append("}")
    return "\n".join(lines)


def job_submit_lua(models: Iterable[GpuModel], nodes: Mapping[str, Sequence[str]] | None = None,
                   leaf_requests: bool = False) -> str:  # fmt: skip
    template = resource_path("plugins", "slurm", "job_submit.lua.in").read_text()
    return template.replace("--@PROFILES@", profile_table(models, nodes, leaf_requests))


def node_slices(nodes: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Each node's MIG memory slices (8 per A100/H100, 4 per A30): its count of the slice GRES."""
    return {node: sum(get_model(m).memory_slices for m in models) for node, models in nodes.items()}


def slice_accounting_conf(nodes: Mapping[str, Sequence[str]], gres: str) -> tuple[str, str]:
    """(slurm.conf lines, gres.conf lines) that make Slurm count each MIG job's memory slices as ``gres``."""
    counts = node_slices(nodes)
    slurm = [
        f"# mig_batch slice accounting: mig-batchd sets gres:{gres}:<memory slices> on each MIG job it pins.",
        "# Merge into slurm.conf (GresTypes keeps the site's other types; the Gres= goes on each node's line).",
        f"GresTypes=mig,{gres}",
        f"AccountingStorageTRES=gres/{gres}  # needs slurmdbd; then sacct, fair-share and GrpTRES see it",
        "AccountingStorageEnforce=associations,limits,qos,safe  # so that GrpTRES=gres/... limits hold",
        *(f"# NodeName={node} ... Gres={gres}:{n}" for node, n in sorted(counts.items())),
    ]
    gres_lines = ["# mig_batch slice accounting: append to gres.conf (a count, no device file)"]
    gres_lines += [f"NodeName={node} Name={gres} Count={n}" for node, n in sorted(counts.items())]
    return "\n".join(slurm) + "\n", "\n".join(gres_lines) + "\n"


def install(dest: Path, python: str, config: str, job_dir: str, agent_socket: str, models: Iterable[GpuModel],
            nodes: Mapping[str, Sequence[str]] | None = None, slice_gres: str = "",
            leaf_requests: bool = False, hook_client_kind: str = "auto") -> tuple[list[Path], str]:  # fmt: skip
    """Write the shims and job_submit.lua into ``dest``: (the files written, which hook client the shims run
    and why). ``hook_client_kind``: ``c`` (compile it or fail), ``python``, or ``auto`` (C when it compiles)."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    binary, why = (None, "asked for the Python client") if hook_client_kind == "python" else build_hook_client(dest)
    if binary is None and hook_client_kind == "c":
        raise ValueError(f"cannot build the C hook client: {why}; give --hook-client python or install a C compiler")
    python_hook = f"{python} -I -S {Path(hook_client.__file__).resolve()}"
    if binary is not None:
        written.append(binary)
        hook, which = str(binary), f"hook client: {binary} (C; the Python one where it cannot run)"
    else:
        hook = python_hook
        which = f"hook client: the Python one ({why}); each Prolog and Epilog starts an interpreter (~10 ms)"
    values = {"@PYTHON@": python, "@CONFIG@": config, "@JOB_DIR@": job_dir, "@SOCKET@": agent_socket,
              "@HOOK@": hook, "@PY_HOOK@": python_hook}  # fmt: skip
    for name in SHIMS:
        text = resource_path("wrappers", f"{name}.in").read_text()
        for key, value in values.items():
            text = text.replace(key, value)
        path = dest / name
        path.write_text(text)
        path.chmod(0o755)
        written.append(path)
    path = dest / "job_submit.lua"
    path.write_text(job_submit_lua(models, nodes, leaf_requests))
    written.append(path)
    if slice_gres and nodes:  # lines to merge by hand: they touch the site's own NodeName lines
        for name, text in zip(("slurm.conf.mig-batch", "gres.conf.mig-batch"),
                              slice_accounting_conf(nodes, slice_gres), strict=True):  # fmt: skip
            (dest / name).write_text(text)
            written.append(dest / name)
    return written, which
