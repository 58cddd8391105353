"""Plain-text pictures of MIG geometry (used by the CLI and the docs)."""

from __future__ import annotations

from mig_batch.mig.geometry import Configuration
from mig_batch.mig.models import GpuModel

CELL = 5  # characters per memory slice


def _bar(width_slices: int, label: str = "") -> str:
    inner = CELL * width_slices - 2
    return "[" + label[:inner].center(inner, "=" if not label else " ") + "]"


def placement_chart(model: GpuModel, include_media: bool = False) -> str:
    """Every allowed placement of every profile, one row per profile, over the memory slices."""
    name_width = max(len(p.name) for p in model.profiles) + 2
    header = " " * name_width + "".join(f"{i:^{CELL}}" for i in range(model.memory_slices))
    rows = [header.rstrip()]
    for profile in sorted(model.profiles, key=lambda p: (-p.memory_slices, -p.compute_slices, p.name)):
        if profile.is_media_extension and not include_media:
            continue
        line = [" "] * (CELL * model.memory_slices)
        for start in profile.starts:
            bar = _bar(profile.memory_slices)
            line[CELL * start : CELL * start + len(bar)] = bar
        rows.append(f"{profile.name:<{name_width}}" + "".join(line).rstrip())
    return "\n".join(rows)


def configuration_row(model: GpuModel, config: Configuration) -> str:
    """One row: each instance as a labelled bar at its memory slices, free slices as dots."""
    line = list("  .  " * model.memory_slices)
    for inst in config.instances:
        profile = model.profile(inst.profile)
        bar = _bar(profile.memory_slices, inst.profile)
        line[CELL * inst.start : CELL * inst.start + len(bar)] = bar
    header = "".join(f"{i:^{CELL}}" for i in range(model.memory_slices))
    return header.rstrip() + "\n" + "".join(line).rstrip()
