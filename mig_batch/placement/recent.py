"""What the learning policies learn from: the requests of the recent jobs, each job once.

mig-batchd decides a waiting job again at every pass, and may try it on every node: counted at each
try, a learned mix would lean towards the backlog. The simulators decide each job once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from mig_batch.placement.base import PlacementRequest
    from mig_batch.placement.cluster import Cluster

T = TypeVar("T")


def profile_indexes(cluster: Cluster, request: PlacementRequest) -> tuple[tuple[str, int], ...]:
    """(model, base profile index) for each model of ``cluster`` that ``request`` names: one job's share of
    the learned profile mix."""
    return tuple((model, cluster.tables[model].index(profile))
                 for model, profile in request.profiles.items() if model in cluster.tables)  # fmt: skip


class RecentJobs(Generic[T]):
    """The values of the last ``window`` new jobs (``None``: none kept, the caller keeps running totals).

    A job is new when it is not among the last ``remember`` jobs tried (at least ``window``); each try
    moves a job to the newest end, so a job that keeps coming back is counted once however long it waits,
    unless more than ``remember`` other jobs are tried between two of its tries.
    """

    REMEMBER = 4096  # jobs remembered: bounds a long-lived daemon's memory

    def __init__(self, window: int | None, remember: int = REMEMBER) -> None:
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise ValueError(f"window must be a whole number of jobs, at least 1 (or None: every job); got {window!r}")
        if remember < 1:
            raise ValueError(f"remember must be at least 1; got {remember}")
        self.window = window
        self.values: deque[T] = deque(maxlen=window if window is not None else 0)
        self.new_jobs = 0
        self._tried: dict[str, None] = {}  # insertion-ordered, the latest try last: the oldest leaves first
        self._remember = max(remember, window or 0)

    def add(self, job: str, value: Callable[[], T]) -> tuple[T, T | None] | None:
        """None when ``job`` was tried before (now remembered longer); else its value (``value()``) and
        the value that left the window to make room for it (None when none did)."""
        if job in self._tried:
            self._tried[job] = self._tried.pop(job)
            return None
        new = value()  # first: a value that cannot be made leaves the job untried
        self._tried[job] = None
        if len(self._tried) > self._remember:
            del self._tried[next(iter(self._tried))]
        left = None
        if self.window is not None:
            if len(self.values) == self.window:
                left = self.values[0]
            self.values.append(new)
        self.new_jobs += 1
        return new, left
