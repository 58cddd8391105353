"""Rigid jobs placed now: one instance by the site's policy, or several on one node (Flex-MIG's
one-to-many). A placement is taken in the view and recorded in the store before the batch system hears of it."""

from __future__ import annotations

import math

from mig_batch.batch.states import DecisionState
from mig_batch.batch.system import BatchJob
from mig_batch.batch.tags import JobTag
from mig_batch.controller.fences import Fences
from mig_batch.controller.ledger import ViewLedger
from mig_batch.controller.translations import Translations
from mig_batch.controller.waits import WaitNotes
from mig_batch.placement.base import Placement, PlacementRequest, Policy
from mig_batch.placement.multi import MultiPlacement, MultiPolicy
from mig_batch.placement.waiting import why_no_room
from mig_batch.state import Decision, Store


class Placer:
    def __init__(self, store: Store, ledger: ViewLedger, fences: Fences, policy: Policy, multi: MultiPolicy,
                 translations: Translations, waits: WaitNotes, policy_name: str):  # fmt: skip
        self.store, self.ledger, self.fences = store, ledger, fences
        self.policy, self.multi, self.translations, self.waits = policy, multi, translations, waits
        self.policy_name = policy_name

    def place(self, job: BatchJob, tag: JobTag, now: float) -> Decision | None:
        profiles = self.translations.profiles(tag)
        if isinstance(profiles, str):
            self.store.event(job.job_id, "unplaceable", error=profiles)
            return None
        limit = job.time_limit_s
        end = now + limit if 0 < limit < math.inf else None  # the time limit bounds the end (end-aware policies)
        request = PlacementRequest(job.job_id, profiles, now, end)
        view = self.ledger.view
        fit = (frozenset(profiles.items()), 1, self.fences.outside)
        decision = self.fences.where_it_fits(lambda: self.policy.decide(view, request), Placement, fit)
        if not isinstance(decision, Placement):
            self.waits.note(job.job_id, self.waits.cause(fit, lambda: why_no_room(view, profiles)))
            return None
        self.fences.use_room(decision.host, job.cpus)
        return self.decide(job, tag, decision, self.policy_name)

    def place_multi(self, job: BatchJob, tag: JobTag) -> Decision | None:
        """A job over several instances: the node and every rank's spot in one decision, or it stays held
        with the reason (recorded once per change of reason)."""
        profiles = self.translations.profiles(tag)
        if isinstance(profiles, str):
            self.store.event(job.job_id, "unplaceable", error=profiles)
            return None
        view = self.ledger.view
        decision = self.fences.where_it_fits(
            lambda: self.multi.decide(view, profiles, tag.instances),
            MultiPlacement,
            (frozenset(profiles.items()), tag.instances, self.fences.outside),
        )
        if not isinstance(decision, MultiPlacement):
            self.waits.note(job.job_id, decision.reason)
            return None
        self.waits.placed(job.job_id)
        self.fences.use_room(decision.host, job.cpus)
        return self._decide_multi(job, tag, decision, f"multi-{self.multi.name}")

    def _decide_multi(self, job: BatchJob, tag: JobTag, p: MultiPlacement, policy: str) -> Decision:
        """Take every spot in the view and record them in one transaction, before Slurm hears of it."""
        self.ledger.take(job.job_id, [(s.gid, s.profile, s.start) for s in p.spots])
        first = p.spots[0]
        d = Decision(job.job_id, tag.text(), p.host, first.gpu_index, p.model, first.profile, first.start,
                     DecisionState.DECIDED, policy)  # fmt: skip
        self.store.record_decision(d, spots=tuple((s.gpu_index, s.profile, s.start) for s in p.spots))
        return d

    def decide(self, job: BatchJob, tag: JobTag, p: Placement, policy: str) -> Decision:
        """Take the placement in the view and record it, before Slurm hears of it."""
        self.ledger.view.allocate(p.gid, job.job_id, p.profile, p.start)
        d = Decision(job.job_id, tag.text(), p.host, p.gpu_index, p.model, p.profile, p.start, DecisionState.DECIDED,
                     policy)  # fmt: skip
        self.store.record_decision(d)
        return d
