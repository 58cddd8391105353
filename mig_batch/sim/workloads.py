"""Synthetic rigid workloads for the placement experiments (MFI §VI)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from mig_batch.mig.models import GpuModel

# MFI Table II, for the A100-80GB profile names; other 8-slice models map by geometry (same order).
MFI_DISTRIBUTIONS: dict[str, dict[str, float]] = {
    "uniform": {
        "7g.80gb": 1 / 6,
        "4g.40gb": 1 / 6,
        "3g.40gb": 1 / 6,
        "2g.20gb": 1 / 6,
        "1g.20gb": 1 / 6,
        "1g.10gb": 1 / 6,
    },
    "skew-small": {
        "7g.80gb": 0.05,
        "4g.40gb": 0.10,
        "3g.40gb": 0.10,
        "2g.20gb": 0.20,
        "1g.20gb": 0.25,
        "1g.10gb": 0.30,
    },
    "skew-big": {"7g.80gb": 0.30, "4g.40gb": 0.25, "3g.40gb": 0.20, "2g.20gb": 0.10, "1g.20gb": 0.10, "1g.10gb": 0.05},
    "bimodal": {"7g.80gb": 0.30, "4g.40gb": 0.15, "3g.40gb": 0.05, "2g.20gb": 0.05, "1g.20gb": 0.15, "1g.10gb": 0.30},
}


@dataclass(frozen=True)
class Arrival:
    job: str
    slot: int
    profile: str
    duration: int  # slots; the instance is freed at slot + duration
    slices: int  # memory slices requested (the demand measure)


def expected_slices(model: GpuModel, distribution: Mapping[str, float]) -> float:
    return sum(p * model.profile(name).memory_slices for name, p in distribution.items())


def saturation_slots(model: GpuModel, n_gpus: int, distribution: Mapping[str, float]) -> int:
    """T of MFI §VI: slots (one arrival each) until the requested slices equal the cluster's."""
    return math.ceil(n_gpus * model.memory_slices / expected_slices(model, distribution))


NEVER = 10**12  # duration of workloads that never leave (fill protocol)


def mfi_arrivals(
    model: GpuModel,
    n_gpus: int,
    distribution: Mapping[str, float],
    seed: int,
    demand: float = 1.0,
    departures: bool = True,
) -> list[Arrival]:
    """One arrival per slot until the cumulative request reaches ``demand`` x capacity; durations U[1, T].

    With ``departures=False`` nothing ever leaves (the FGD protocol: fill the cluster past capacity).
    """
    rng = random.Random(seed)
    names, weights = list(distribution), list(distribution.values())
    horizon = saturation_slots(model, n_gpus, distribution)
    capacity = n_gpus * model.memory_slices
    arrivals, requested, slot = [], 0, 0
    while requested < demand * capacity:
        name = rng.choices(names, weights)[0]
        slices = model.profile(name).memory_slices
        duration = rng.randint(1, horizon)  # drawn either way, so both protocols see the same profiles
        arrivals.append(Arrival(f"j{slot}", slot, name, duration if departures else NEVER, slices))
        requested += slices
        slot += 1
    return arrivals
