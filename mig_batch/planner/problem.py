"""The moldable batch scheduling problem on one MIG GPU (MIG-DRL §3).

A task has a predicted run time per instance size (compute slices); ``inf`` where it cannot run
(memory). Instances are the GPU model's profiles, one per size (the one with the fewest memory
slices), placed at the model's allowed starts: placement validity is the geometry of
``mig_batch.mig``, so A100/H100/H200/B200 give the 7-slice scheme's 19 partitions and the A30 its 5.
Creating and destroying an instance takes a per-size time (MIG-DRL Table 1); reconfigurations run
one at a time on the GPU, only on idle instances, and tasks are never preempted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mig_batch.mig.models import GpuModel, Profile, get_model

# Mean seconds to create / destroy one GPU instance per size (MIG-DRL Table 1; the same constants as
# the FAR reference code). H200 and B200 were not measured: they use the H100 row.
RECONFIG_TIMES: dict[str, dict[int, tuple[float, float]]] = {
    "A30": {1: (0.11, 0.10), 2: (0.12, 0.10), 4: (0.13, 0.10)},
    "A100": {1: (0.16, 0.20), 2: (0.17, 0.20), 3: (0.20, 0.21), 4: (0.21, 0.21), 7: (0.24, 0.22)},
    "H100": {1: (0.16, 0.21), 2: (0.21, 0.23), 3: (0.33, 0.25), 4: (0.38, 0.26), 7: (0.42, 0.26)},
}

INF = math.inf


def reconfig_family(model: GpuModel) -> str:
    for family in ("A30", "A100"):
        if model.name.upper().startswith(family):
            return family
    return "H100"


@dataclass(frozen=True)
class Task:
    name: str
    times: Mapping[int, float]  # instance size (compute slices) -> seconds; missing or inf: cannot run

    def time(self, size: int) -> float:
        return self.times.get(size, INF)

    def feasible_sizes(self) -> list[int]:
        return sorted(s for s, t in self.times.items() if math.isfinite(t))


@dataclass(frozen=True)
class Slot:
    """Where an instance of one size can live: its profile, start and memory-slice window."""

    size: int
    start: int
    window: int

    def overlaps(self, other: Slot) -> bool:
        return bool(self.window & other.window)


@dataclass(frozen=True)
class GpuScheme:
    model: GpuModel
    profiles: dict[int, Profile]  # size -> the profile used for it
    slots: dict[int, tuple[Slot, ...]]  # size -> slots in start order
    create_s: dict[int, float]
    destroy_s: dict[int, float]
    partitions: tuple[tuple[Slot, ...], ...] = field(default=())  # maximal valid slot sets

    @property
    def sizes(self) -> list[int]:
        return sorted(self.profiles)

    @property
    def slices(self) -> int:
        return self.model.compute_slices

    def slot(self, size: int, start: int) -> Slot:
        for slot in self.slots.get(size, ()):
            if slot.start == start:
                return slot
        starts = [s.start for s in self.slots.get(size, ())]
        raise ValueError(f"no instance of size {size} starts at {start} on {self.model.name}; starts: {starts}")


def _maximal_partitions(slots: Sequence[Slot]) -> tuple[tuple[Slot, ...], ...]:
    """Every set of pairwise disjoint slots that no further slot fits into."""
    ordered = sorted(slots, key=lambda s: (-s.size, s.start))
    out: list[tuple[Slot, ...]] = []

    def extend(chosen: list[Slot], used: int, index: int) -> None:
        extended = False
        for i in range(index, len(ordered)):
            slot = ordered[i]
            if not slot.window & used:
                extended = True
                extend([*chosen, slot], used | slot.window, i + 1)
        if not extended and all(s.window & used for s in ordered):
            out.append(tuple(sorted(chosen, key=lambda s: s.start)))

    extend([], 0, 0)
    return tuple(out)


def gpu_scheme(model_name: str) -> GpuScheme:
    model = get_model(model_name)
    by_size: dict[int, Profile] = {}
    for profile in model.base_profiles:
        best = by_size.get(profile.compute_slices)
        if best is None or profile.memory_slices < best.memory_slices:
            by_size[profile.compute_slices] = profile
    slots = {
        size: tuple(Slot(size, start, profile.window(start)) for start in profile.starts)
        for size, profile in sorted(by_size.items())
    }
    family = RECONFIG_TIMES[reconfig_family(model)]
    missing = [s for s in by_size if s not in family]
    if missing:
        raise ValueError(f"no reconfiguration times for sizes {missing} of {model.name}")
    return GpuScheme(
        model=model,
        profiles=by_size,
        slots=slots,
        create_s={s: family[s][0] for s in by_size},
        destroy_s={s: family[s][1] for s in by_size},
        partitions=_maximal_partitions([s for group in slots.values() for s in group]),
    )


def check_tasks(tasks: Sequence[Task], scheme: GpuScheme) -> None:
    """Every task must run on at least one of the GPU's sizes; times must be positive."""
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError("task names must be unique")
    for task in tasks:
        for size, time in task.times.items():
            if size not in scheme.profiles:
                raise ValueError(
                    f"task {task.name}: size {size} is not an instance size of {scheme.model.name} "
                    f"(sizes: {scheme.sizes})"
                )
            if not time > 0:
                raise ValueError(f"task {task.name}: time on size {size} must be positive, got {time}")
        if not task.feasible_sizes():
            raise ValueError(f"task {task.name} cannot run on any instance size of {scheme.model.name}")
