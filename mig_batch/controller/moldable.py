"""Moldable jobs: each gets the size that finishes first, now or held by a reservation, or (``moldable.planner:
far|auto``) the waiting ones are planned together first (controller/live_moldable.py; docs/moldable.md)."""

from __future__ import annotations

import logging

from mig_batch.atomize.gaps import with_hold
from mig_batch.batch.system import BatchJob
from mig_batch.batch.tags import JobTag
from mig_batch.config import MoldableConfig
from mig_batch.controller.fences import Fences
from mig_batch.controller.ledger import ViewLedger
from mig_batch.controller.live_moldable import LiveMoldable
from mig_batch.controller.place import Placer
from mig_batch.controller.translations import Translations
from mig_batch.placement.base import Policy
from mig_batch.placement.moldable import MoldableJob, MoldablePlanner
from mig_batch.placement.timelines import GpuTimeline, Hold
from mig_batch.state import Decision, Store

log = logging.getLogger("mig-batchd")


class MoldablePlacer:
    def __init__(self, store: Store, ledger: ViewLedger, fences: Fences, placer: Placer, policy: Policy,
                 translations: Translations, config: MoldableConfig, policy_name: str):  # fmt: skip
        self.store, self.ledger, self.fences, self.placer = store, ledger, fences, placer
        self.policy, self.translations, self.config, self.policy_name = policy, translations, config, policy_name
        self.live = LiveMoldable(ledger, fences, placer, translations, config)

    def place(self, waiting: list[tuple[BatchJob, JobTag]], timelines: list[GpuTimeline],
              now: float) -> tuple[list[Decision], list[tuple[int, Hold]], int]:  # fmt: skip
        """The size with the earliest predicted finish for each waiting moldable job, in queue order:
        the ones whose best start is now are decided (the caller pins and releases them) and take their
        CPUs from their node's room; the others may hold a reservation (returned with the decisions, and
        how many wait). With a live planner, the jobs it plans go first; the rule decides the rest."""
        decided: list[Decision] = []
        reserved: list[tuple[int, Hold]] = []
        waiting_count = 0
        if self.config.planner != "eft" and waiting:
            live = self.live.plan(waiting, timelines, now)
            decided, reserved, waiting_count, waiting = live.decided, live.reserved, live.waiting, live.left
            for gid, hold in [*live.holds, *live.reserved]:
                timelines = with_hold(timelines, gid, hold)
            if not waiting:
                return decided, reserved, waiting_count
        planner = MoldablePlanner(self.ledger.view, timelines, now, self.policy, self.config.min_gain,
                                  max(0, self.config.max_reservations - len(reserved)))  # one cap for both  # fmt: skip
        barred_of: dict[frozenset[str], frozenset[int]] = {}  # by the nodes outside a job's reach: most share them
        with self.fences.confinement(now) as confine:
            for job, tag in waiting:
                times = self.translations.moldable(tag)
                if isinstance(times, str):
                    self.store.event(job.job_id, "unplaceable", error=times)
                    continue
                if (why := self.fences.partition_problem(job)) is not None:
                    self.placer.waits.note(job.job_id, why)
                    continue
                outside = confine(job)
                barred = barred_of.get(outside)
                if barred is None:
                    barred = barred_of[outside] = self.fences.barred(outside)
                choice = planner.decide(MoldableJob(job.job_id, times), barred)
                log.debug("moldable job %s: %s", job.job_id, choice)
                if choice.placement is None:
                    waiting_count += 1
                    continue
                self.ledger.predicted[job.job_id] = choice.seconds
                decided.append(self.placer.decide(job, tag, choice.placement, f"moldable-{self.policy_name}"))
                self.fences.use_room(choice.placement.host, job.cpus)  # a node it fills takes no more starts
        return decided, reserved + planner.reserved, waiting_count
