"""Synthetic traces of Flex-MIG §5.1: execution time x workload size x workload type.

Three orthogonal dimensions, every combination a category (3 x 3 x 3 = 27):

* duration class: short (600-1,800 s), medium (1,800-3,600 s), long (3,600-7,200 s); a job's
  one-to-one run time is drawn from an empirical run-time sample restricted to the class window
  (the CLI passes the Philly runtimes, see docs/flex.md for why not Helios);
* size mix: Flex-MIG Table 2 (training sizes 1/2/4/6/8, inference sizes 1/2/4), doubled as §5.1 says;
* type: training only, inference only, or 50:50 (Table 2's training row plus its inference row, not
  doubled, so a mixed trace holds about as many jobs as the others).

Pure code: the run-time sample comes in as numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mig_batch.errors import MigBatchError


class FlexWorkloadError(MigBatchError, ValueError):
    """A workload parameter or run-time sample the generator cannot use."""


DURATION_WINDOWS: dict[str, tuple[float, float]] = {
    "short": (600.0, 1800.0),
    "medium": (1800.0, 3600.0),
    "long": (3600.0, 7200.0),
}
# Flex-MIG Table 2: jobs per workload size, before doubling
TRAIN_MIX: dict[str, dict[int, int]] = {
    "small": {1: 16, 2: 8, 4: 4, 6: 2, 8: 1},
    "balanced": {1: 8, 2: 8, 4: 8, 6: 4, 8: 4},
    "large": {1: 4, 2: 4, 4: 12, 6: 8, 8: 4},
}
INFER_MIX: dict[str, dict[int, int]] = {
    "small": {1: 16, 2: 8, 4: 4},
    "balanced": {1: 10, 2: 10, 4: 10},
    "large": {1: 8, 2: 8, 4: 16},
}
SIZE_MIXES = tuple(TRAIN_MIX)
JOB_TYPES = ("train", "infer", "mixed")
DURATIONS = tuple(DURATION_WINDOWS)


@dataclass(frozen=True)
class FlexJob:
    """One job: ``size`` ranks (Flex-MIG's workload size: leaves, or 5-GB units one-to-one)."""

    job_id: int
    size: int
    kind: str  # "train" | "infer"
    work_s: float  # run time one-to-one on its own-size instance, before any contention factor
    submit_s: float = 0.0


@dataclass(frozen=True)
class Category:
    duration: str
    mix: str
    job_type: str

    @property
    def name(self) -> str:
        return f"{self.duration}/{self.mix}/{self.job_type}"


def all_categories(job_types: Sequence[str] = JOB_TYPES) -> list[Category]:
    return [Category(d, m, t) for d in DURATIONS for m in SIZE_MIXES for t in job_types]


def window_sample(runtimes: Sequence[float], duration: str) -> np.ndarray:
    """The run times of ``runtimes`` inside the class window [lo, hi)."""
    lo, hi = DURATION_WINDOWS[duration]
    values = np.asarray(runtimes, dtype=float)
    inside = values[(values >= lo) & (values < hi)]
    if inside.size == 0:
        raise FlexWorkloadError(f"the run-time sample has no job between {lo:g} s and {hi:g} s ({duration})")
    return inside


def size_counts(
    mix: str, job_type: str, max_size: int | None = None, over_max: str = "cap"
) -> list[tuple[int, str, int]]:
    """(size, kind, jobs) for one category; sizes above ``max_size`` are capped to it or dropped (Fig. 7)."""
    if mix not in TRAIN_MIX:
        raise FlexWorkloadError(f"unknown size mix {mix!r}; known: {', '.join(SIZE_MIXES)}")
    if job_type not in JOB_TYPES:
        raise FlexWorkloadError(f"unknown job type {job_type!r}; known: {', '.join(JOB_TYPES)}")
    factor = 1 if job_type == "mixed" else 2
    rows: list[tuple[int, str, int]] = []
    if job_type in ("train", "mixed"):
        rows += [(size, "train", n * factor) for size, n in TRAIN_MIX[mix].items()]
    if job_type in ("infer", "mixed"):
        rows += [(size, "infer", n * factor) for size, n in INFER_MIX[mix].items()]
    if over_max not in ("cap", "drop"):
        raise FlexWorkloadError(f"sizes over the maximum are 'cap'ped or 'drop'ped, not {over_max!r}")
    if max_size is not None:
        kept = rows if over_max == "cap" else [row for row in rows if row[0] <= max_size]
        rows = [(min(size, max_size), kind, n) for size, kind, n in kept]
    return rows


def generate_trace(
    category: Category,
    runtimes: Sequence[float],
    seed: int,
    max_size: int | None = None,
    mean_interarrival_s: float = 0.0,
    over_max: str = "cap",
) -> list[FlexJob]:
    """One trace of ``category``: jobs in a random order, submitted at 0 (or Poisson arrivals)."""
    if mean_interarrival_s < 0:
        raise FlexWorkloadError(f"mean inter-arrival must be >= 0 s, got {mean_interarrival_s}")
    rng = np.random.default_rng(seed)
    pool = window_sample(runtimes, category.duration)
    shapes = [(size, kind) for size, kind, n in size_counts(category.mix, category.job_type, max_size, over_max)
              for _ in range(n)]  # fmt: skip
    order = rng.permutation(len(shapes))
    works = rng.choice(pool, size=len(shapes), replace=True)
    gaps = rng.exponential(mean_interarrival_s, size=len(shapes)) if mean_interarrival_s > 0 else np.zeros(len(shapes))
    submits = np.cumsum(gaps) - gaps[0]
    return [
        FlexJob(i, shapes[k][0], shapes[k][1], float(works[i]), float(submits[i]))
        for i, k in enumerate(order)
    ]
