"""A GPU's slices over time: what holds which slices, from when and until when.

The placement view with a clock: the moldable policy (:mod:`mig_batch.placement.moldable`) judges
start times against these timelines, and the gaps of subjob chains (:mod:`mig_batch.atomize.gaps`) are
the free intervals between their holds. Times are absolute seconds on the caller's clock; ``math.inf``
means "not known to end". Pure code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Hold:
    """Slices (a bit mask of memory slices) held from ``since`` until ``until``."""

    window: int
    until: float = math.inf
    since: float = -math.inf


@dataclass(frozen=True)
class GpuTimeline:
    gid: int
    host: str
    index: int
    model: str
    holds: tuple[Hold, ...] = ()
