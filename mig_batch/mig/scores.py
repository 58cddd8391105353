"""Fragmentation score F (MFI Alg. 1) and Configuration Capability CC (GRMU eq. 1), computed directly.

These are the reference computations, written as the papers state them over the slice indicator
x_i. :mod:`mig_batch.mig.tables` precomputes the same quantities for every occupancy mask with bit
operations; tests check that both agree on every mask of every model.

Both scores range over the model's *base* profiles (media-extension variants share a base profile's
geometry and are not counted twice), which is the profile set P of both papers.
"""

from __future__ import annotations

from enum import StrEnum

from mig_batch.mig.models import GpuModel


class FragVariant(StrEnum):
    """Which windows MFI's Alg. 1 counts as infeasible.

    PRINTED: as Alg. 1 is printed, every allowed window holding any allocated slice adds the
    profile's memory slices. PARTIAL: only windows that are blocked while partly free count, the
    reading under which the worked example of MFI §V.B gives F(2) = 16.
    """

    PRINTED = "printed"
    PARTIAL = "partial"


def _indicator(mask: int, slices: int) -> list[int]:
    return [mask >> i & 1 for i in range(slices)]


def fragmentation_score(model: GpuModel, mask: int, variant: FragVariant = FragVariant.PRINTED) -> int:
    """F(m) of MFI Alg. 1 for the occupancy ``mask``; weights are the profiles' memory slices."""
    x = _indicator(mask, model.memory_slices)
    unused = model.memory_slices - sum(x)  # ΔS_m
    score = 0
    for profile in model.base_profiles:
        r = profile.memory_slices
        if r > unused:
            continue
        for start in profile.starts:
            allocated = sum(x[start : start + r])
            blocked = allocated > 0 if variant is FragVariant.PRINTED else 0 < allocated < r
            if blocked:
                score += r
    return score


def configuration_capability(model: GpuModel, mask: int) -> int:
    """CC(c) of GRMU eq. 1: over all profiles, the number of start blocks where the profile fits now."""
    x = _indicator(mask, model.memory_slices)
    return sum(
        1
        for profile in model.base_profiles
        for start in profile.starts
        if not any(x[start : start + profile.memory_slices])
    )


def max_cc_start(model: GpuModel, mask: int, profile_name: str) -> int | None:
    """NVIDIA's default placement (GRMU §5, eq. 2): the free start that leaves the highest CC.

    Ties go to the lowest start (the order in which GRMU's Alg. 1 tries them). None if no start is free.
    """
    profile = model.profile(profile_name)
    best: tuple[int, int] | None = None
    for start in profile.starts:
        window = profile.window(start)
        if window & mask:
            continue
        cc = configuration_capability(model, mask | window)
        if best is None or cc > best[0]:
            best = (cc, start)
    return None if best is None else best[1]
