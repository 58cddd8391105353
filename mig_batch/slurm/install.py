"""What a site installs for Slurm: job_submit.lua with the profile table, and the hook shims filled in
(the Prolog and Epilog ask the node agent through the standard-library hook client)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mig_batch.mig.models import GpuModel
from mig_batch.node import hook_client
from mig_batch.resources import resource_path

SHIMS = ("mig-batch-prolog", "mig-batch-epilog", "mig-batch-taskprolog", "mig-batch-subjob")


def profile_table(models: Iterable[GpuModel]) -> str:
    lines = ["MIG_MODELS = {"]
    for model in sorted(models, key=lambda m: m.name):
        lines.append(f'\t["{model.name}"] = {{ compute_slices = {model.compute_slices}, profiles = {{')
        for p in model.base_profiles:
            lines.append(f'\t\t{{ name = "{p.name}", memory_mib = {p.memory_mib}, compute = {p.compute_slices} }},')
        lines.append("\t} },")
    lines.append("}")
    return "\n".join(lines)


def job_submit_lua(models: Iterable[GpuModel]) -> str:
    template = resource_path("plugins", "slurm", "job_submit.lua.in").read_text()
    return template.replace("--@PROFILES@", profile_table(models))


def install(dest: Path, python: str, config: str, job_dir: str, agent_socket: str,
            models: Iterable[GpuModel]) -> list[Path]:  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    values = {"@PYTHON@": python, "@CONFIG@": config, "@JOB_DIR@": job_dir, "@SOCKET@": agent_socket,
              "@HOOK_CLIENT@": str(Path(hook_client.__file__).resolve())}  # fmt: skip
    for name in SHIMS:
        text = resource_path("wrappers", f"{name}.in").read_text()
        for key, value in values.items():
            text = text.replace(key, value)
        path = dest / name
        path.write_text(text)
        path.chmod(0o755)
        written.append(path)
    path = dest / "job_submit.lua"
    path.write_text(job_submit_lua(models))
    written.append(path)
    return written
