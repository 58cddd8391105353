"""Every GPU's holds over time: what the moldable planner and the chains' gap offers decide on.

An instance holds its slices until its job's expected end; the first queued rigid job that fits nowhere
holds a reservation (EASY backfilling); live defragmentation keeps windows from chain grants.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping

from mig_batch.atomize.defrag import Steer, keep_windows
from mig_batch.atomize.gaps import cluster_timelines, reservation, with_hold
from mig_batch.batch.system import BatchJob, JobState
from mig_batch.batch.tags import job_of
from mig_batch.config import AtomizeConfig
from mig_batch.controller.ledger import ViewLedger
from mig_batch.mig.models import get_model
from mig_batch.placement.moldable import expected_end
from mig_batch.placement.timelines import GpuTimeline, Hold
from mig_batch.state import Store

log = logging.getLogger("mig-batchd")


class Timelines:
    def __init__(self, ledger: ViewLedger, store: Store, config: AtomizeConfig):
        self.ledger, self.store, self.config = ledger, store, config

    def of(self, jobs: Mapping[str, BatchJob], now: float, blocked: Mapping[str, str] | None) -> list[GpuTimeline]:
        """Every GPU's holds: instances until their job's expected end, and a reservation for the
        first queued job that fits nowhere now (``blocked``: model -> profile); fenced GPUs have none."""
        out = cluster_timelines(self.ledger.view, self._until(jobs, now))
        reserved = reservation(out, blocked, now, self.config.offer_horizon_s) if blocked else None
        return with_hold(out, *reserved) if reserved else out

    def steer(self, jobs: Mapping[str, BatchJob], now: float, blocked: list[dict[str, str]],
              moldable: list[tuple[int, Hold]],
              timelines: list[GpuTimeline]) -> tuple[list[GpuTimeline], list[Steer]]:  # fmt: skip
        """Live defragmentation: the windows kept from chain grants for rigid jobs blocked by
        fragmentation (:func:`~mig_batch.atomize.defrag.keep_windows`). When the first blocked job
        gets one, it replaces that job's EASY reservation in the timelines."""
        plain = self.of(jobs, now, None)
        for gid, hold in moldable:
            plain = with_hold(plain, gid, hold)
        kept = keep_windows(plain, self._chain_masks(), blocked, now, self.config.defrag_max_steered,
                            self.config.offer_horizon_s)  # fmt: skip
        steers = [k for k in kept if k is not None]
        for s in steers:
            log.debug("live defrag: GPU %d window %#x kept from chain grants from %.0f", s.gid, s.window, s.opens)
        return (plain if kept[0] is not None else timelines), steers

    def _until(self, jobs: Mapping[str, BatchJob], now: float) -> Callable[[str], float]:
        """When each placed job is expected to free its instance: a chain subjob's window end (the
        runner checkpoints before it; Slurm's limit adds grace and USR1 margins, minutes at short
        windows), a moldable job's predicted end (less credit once overdue), else the end of
        Slurm's time limit (from now, before it starts)."""

        def until(key: str) -> float:
            job_id = job_of(key)  # every rank of a multi-instance job ends with the job
            job, seconds = jobs.get(job_id), self._predicted_s(job_id)
            if job is None:
                limit, started = math.inf, now
            elif job.state is JobState.RUNNING:
                limit = max(float(job.end_time), now) if job.end_time > 0 else now + job.time_limit_s
                started = float(job.start_time) if job.start_time > 0 else now
            else:
                limit, started = now + job.time_limit_s, now
            window = self._window_s(job_id)
            if window is not None:
                return min(limit, max(started + window, now))
            if seconds is None:
                return limit
            return min(limit, expected_end(started + seconds, now))

        return until

    def _window_s(self, job_id: str) -> float | None:
        """A granted chain subjob's window (None for any other job)."""
        sub = self.store.open_subjob(job_id)
        return sub.window_s if sub is not None else None

    def _predicted_s(self, job_id: str) -> float | None:
        predicted = self.ledger.predicted
        if job_id not in predicted:
            d = self.store.decision(job_id)
            request = d.tag.moldable_request() if d is not None else None
            predicted[job_id] = request.candidates(get_model(d.model)).get(d.profile) if d and request else None
        return predicted[job_id]

    def _chain_masks(self) -> dict[int, int]:
        """The slices chain subjobs hold now (decided or running), per GPU."""
        out: dict[int, int] = {}
        for gpu in self.ledger.view.gpus:
            model = get_model(gpu.model)
            for key, (profile, start) in gpu.instances.items():
                if self.store.chain(job_of(key)) is not None:
                    out[gpu.gid] = out.get(gpu.gid, 0) | model.profile(profile).window(start)
        return out
