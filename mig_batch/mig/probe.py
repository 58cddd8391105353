"""What a GPU's driver says about its MIG profiles, against the etc/gpus model it maps to (no I/O).

The NVML adapter (``mig_batch.gpu.nvml.read_driver_gpus``) fills :class:`DriverGpu`; this module
names every difference from a model and, for a GPU no model knows, writes the model the driver
describes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mig_batch.mig.models import GpuModel, Profile


@dataclass(frozen=True)
class DriverProfile:
    """One GPU instance profile as NVML reports it."""

    nvml_profile: str  # the enum's suffix: 1_SLICE, 1_SLICE_REV1, ...
    profile_id: int
    name: str  # NVML's name without its "MIG " prefix, e.g. 1g.18gb
    compute_slices: int  # sliceCount
    instance_count: int
    memory_mib: int  # memorySizeMB
    sms: int  # multiprocessorCount
    placements: tuple[tuple[int, int], ...]  # (start, size), as the driver lists them


@dataclass(frozen=True)
class DriverGpu:
    index: int
    name: str  # nvmlDeviceGetName
    mig_enabled: bool
    profiles: tuple[DriverProfile, ...]


@dataclass(frozen=True)
class Difference:
    profile: str  # the model's profile name (the driver's where the model lacks it)
    field: str  # the model file's field name
    model: Any
    driver: Any

    def __str__(self) -> str:
        return f"{self.profile}: {self.field} is {self.model!r} in the model, {self.driver!r} from the driver"


def _starts(profile: DriverProfile) -> tuple[int, ...]:
    return tuple(sorted(start for start, _size in profile.placements))


def _memory_slices(profile: DriverProfile) -> int | None:
    sizes = {size for _start, size in profile.placements}
    return sizes.pop() if len(sizes) == 1 else None


def compare(model: GpuModel, gpu: DriverGpu) -> list[Difference]:
    """Every field where ``model`` and the driver disagree, profile by profile (matched by NVML enum)."""
    offered = {p.nvml_profile: p for p in gpu.profiles}
    out = []
    for mine in model.profiles:
        theirs = offered.pop(mine.nvml_profile, None)
        if theirs is None:
            out.append(Difference(mine.name, "nvml_profile", mine.nvml_profile, None))
            continue
        out += _profile_differences(mine, theirs)
    out += [Difference(p.name, "nvml_profile", None, p.nvml_profile) for p in offered.values()]
    return out


def _profile_differences(mine: Profile, theirs: DriverProfile) -> list[Difference]:
    pairs = [
        ("name", mine.name, theirs.name),
        ("profile_id", mine.profile_id, theirs.profile_id),
        ("max_instances", mine.max_instances, theirs.instance_count),
        ("compute_slices", mine.compute_slices, theirs.compute_slices),
        ("memory_slices", mine.memory_slices, _memory_slices(theirs)),
        ("memory_mib", mine.memory_mib, theirs.memory_mib),
        ("starts", list(mine.starts), list(_starts(theirs))),
    ]
    if mine.sms is not None:  # optional in model files; compared where a model states it
        pairs.append(("sms", mine.sms, theirs.sms))
    return [Difference(mine.name, field, a, b) for field, a, b in pairs if a != b]


def model_name_for(device_name: str, gpu: DriverGpu) -> str:
    """A model name from the device name and its full-GPU memory, e.g. RTX-PRO-6000-BLACKWELL-96GB."""
    base = re.sub(r"^NVIDIA\s+", "", device_name.strip(), flags=re.IGNORECASE)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", base).strip("-").upper()
    largest = max((p.memory_mib for p in gpu.profiles), default=0)
    size = f"-{round(largest / 1024)}GB" if largest else ""
    return slug if slug.endswith(size.lstrip("-")) else slug + size


def model_document(gpu: DriverGpu) -> dict[str, Any]:
    """A GPU model file's content (etc/gpus schema) built from the driver's answers alone."""
    if not gpu.profiles:
        raise ValueError(f"GPU {gpu.index} ({gpu.name}) reports no MIG profiles: there is no model to write")
    by_name = {p.name: p for p in gpu.profiles}
    profiles = []
    for p in sorted(gpu.profiles, key=lambda p: (p.memory_mib, p.compute_slices, p.name.endswith("+me"))):
        entry: dict[str, Any] = {"name": p.name}
        base = by_name.get(p.name.removesuffix("+me")) if p.name.endswith("+me") else None
        if base is not None and (_memory_slices(base), _starts(base)) == (_memory_slices(p), _starts(p)):
            entry["media_extension_of"] = base.name
        entry.update(
            nvml_profile=p.nvml_profile,
            profile_id=p.profile_id,
            compute_slices=p.compute_slices,
            memory_slices=_memory_slices(p),
            memory_mib=p.memory_mib,
            sms=p.sms,
            starts=list(_starts(p)),
            max_instances=p.instance_count,
        )
        profiles.append(entry)
    return {
        "model": model_name_for(gpu.name, gpu),
        "aliases": [gpu.name],
        "memory_slices": max(start + size for p in gpu.profiles for start, size in p.placements),
        "compute_slices": max(p.compute_slices for p in gpu.profiles),
        "placements_verified": True,
        "memory_source": "nvml",
        "source": f"mig-batch node probe --write-model, from NVML's answers for GPU {gpu.index} ({gpu.name})",
        "profiles": profiles,
    }
