"""What a site installs for Slurm: job_submit.lua with the profile table, and the hook shims filled in."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mig_batch.mig.models import GpuModel

ROOT = Path(__file__).resolve().parents[2]
LUA_TEMPLATE = ROOT / "plugins" / "slurm" / "job_submit.lua.in"
WRAPPERS = ROOT / "wrappers"
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
    return LUA_TEMPLATE.read_text().replace("--@PROFILES@", profile_table(models))


def install(dest: Path, python: str, config: str, job_dir: str, models: Iterable[GpuModel]) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SHIMS:
        text = (WRAPPERS / f"{name}.in").read_text()
        path = dest / name
        path.write_text(text.replace("@PYTHON@", python).replace("@CONFIG@", config).replace("@JOB_DIR@", job_dir))
        path.chmod(0o755)
        written.append(path)
    path = dest / "job_submit.lua"
    path.write_text(job_submit_lua(models))
    written.append(path)
    return written
