"""Functional memory profiles (SJA §3.3, §3.8-3.9): what a subjob's GPU memory does over its life.

A job's past subjobs each leave a trajectory: GPU memory (MiB) sampled against seconds since the
subjob started (every subjob restarts its process, so warm-up and checkpoint loading recur at the
start of each). From those trajectories:

* :meth:`MemoryProfile.peak_bound` answers SJA's admission question, ``Pr(max_{t<=T} M(t) <= C) >=
  1 - eps``, without assuming a distribution: the window peaks of n exchangeable past subjobs bound
  a new one's peak by their k-th smallest, with ``k = ceil((n + 1)(1 - eps))``, which holds with
  probability >= k / (n + 1) >= 1 - eps. With fewer than ``ceil(1/eps) - 1`` trajectories no such k
  exists, and the caller falls back to the job's declared peak.
* :meth:`MemoryProfile.envelope` is U(t) on a grid, for display and segmentation: ``pointwise``
  is Q_{1-eps}[M(t)] at each t (the paper's formula; it does not bound the peak over a window), and
  ``functional`` is the pointwise maximum over the central (1 - eps) share of trajectories ranked by
  their peak (a functional-boxplot band whose maximum is the admission bound).

Smoothing is a rolling maximum over a short horizon, not a mean: it removes short dips between
spikes (which would otherwise invite tiny segments) and never lowers the envelope below a spike.
Pure code: no I/O (reading sample files is :mod:`mig_batch.atomize.samples`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mig_batch.errors import MigBatchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import numpy as np  # imported where used: the site config reads GRANT_POLICIES through this module on
    # every node, where numpy (the controller extra) is not installed

ENVELOPE_MODES = ("functional", "pointwise")


class ProfileError(MigBatchError, ValueError):
    pass


@dataclass(frozen=True)
class Trajectory:
    times: tuple[float, ...]  # seconds since the subjob started, increasing
    mib: tuple[float, ...]  # GPU memory in use at those times

    def __post_init__(self) -> None:
        if len(self.times) != len(self.mib) or not self.times:
            raise ProfileError("a trajectory needs as many memory samples as times, and at least one")
        if any(b < a for a, b in zip(self.times, self.times[1:], strict=False)):
            raise ProfileError("trajectory times must not decrease")

    @property
    def duration(self) -> float:
        return self.times[-1]

    def peak(self, until: float | None = None) -> float:
        """The largest sample at or before ``until`` (all samples when None)."""
        if until is None:
            return max(self.mib)
        values = [m for t, m in zip(self.times, self.mib, strict=True) if t <= until]
        return max(values) if values else self.mib[0]


def min_history(eps: float) -> int:
    """Fewest trajectories for which the order-statistic bound exists at risk ``eps``."""
    _check_eps(eps)
    return max(1, math.ceil(1 / eps) - 1)


def _check_eps(eps: float) -> None:
    if not 0 < eps < 1:
        raise ProfileError(f"risk eps must lie strictly between 0 and 1 (got {eps})")


def order_statistic_bound(samples: Sequence[float], eps: float) -> float | None:
    """The k-th smallest of ``samples`` with k = ceil((n+1)(1-eps)), or None when k > n."""
    _check_eps(eps)
    n = len(samples)
    k = math.ceil((n + 1) * (1 - eps) - 1e-9)
    if k > n or n == 0:
        return None
    return sorted(samples)[k - 1]


@dataclass(frozen=True)
class MemoryProfile:
    trajectories: tuple[Trajectory, ...]

    def usable(self, duration: float) -> list[Trajectory]:
        """Past subjobs that ran at least ``duration`` seconds; when none did that long, all of them
        (the memory after a trajectory's end is taken as its steady state, which the peak covers)."""
        long_enough = [t for t in self.trajectories if t.duration >= duration]
        return long_enough if long_enough else list(self.trajectories)

    def peak_bound(self, duration: float, eps: float) -> float | None:
        """MiB that a new subjob of ``duration`` seconds stays under with probability >= 1 - eps,
        or None without enough history."""
        peaks = [t.peak(duration) for t in self.usable(duration)]
        return order_statistic_bound(peaks, eps)

    def envelope(self, eps: float, step: float = 1.0, mode: str = "functional",
                 smooth: float = 0.0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(grid, U(t)) over the longest trajectory, sampled every ``step`` seconds."""
        import numpy as np

        _check_eps(eps)
        if mode not in ENVELOPE_MODES:
            raise ProfileError(f"envelope mode {mode!r} is not one of {', '.join(ENVELOPE_MODES)}")
        if not self.trajectories:
            raise ProfileError("no trajectories: the job has no past subjobs yet")
        end = max(t.duration for t in self.trajectories)
        grid = np.arange(0.0, end + step, step)
        curves = np.array([resample(t, grid) for t in self.trajectories])
        if mode == "pointwise":
            values = np.quantile(curves, 1 - eps, axis=0, method="higher")
        else:
            n = len(curves)
            k = min(n, math.ceil((n + 1) * (1 - eps) - 1e-9))
            central = np.argsort(curves.max(axis=1), kind="stable")[:k]
            values = curves[central].max(axis=0)
        return grid, rolling_max(values, max(0, round(smooth / step)))


def resample(trajectory: Trajectory, grid: np.ndarray) -> np.ndarray:
    """The trajectory's peak within each grid cell [g_i, g_{i+1}); held after its last sample."""
    import numpy as np

    times, mib = np.asarray(trajectory.times), np.asarray(trajectory.mib, dtype=float)
    # the value in force at each grid point (previous sample), then the max of the samples in between
    idx = np.searchsorted(times, grid, side="right") - 1
    out = mib[np.clip(idx, 0, None)]
    cell = np.searchsorted(grid, times, side="right") - 1
    np.maximum.at(out, np.clip(cell, 0, len(grid) - 1), mib)
    return out


def rolling_max(values: np.ndarray, half_width: int) -> np.ndarray:
    if half_width <= 0:
        return values
    import numpy as np

    padded = np.pad(values, half_width, mode="edge")
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half_width + 1)
    return windows.max(axis=1)
