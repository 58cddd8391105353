"""The batch jobs of subjob chains: which waiting job runs a chain's next subjob, which are left behind,
and the gaps offered to the waiting chains (the chain protocol itself is :mod:`.chains`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from mig_batch.atomize.defrag import Steer
from mig_batch.batch.states import CHAIN_OVER, DecisionState
from mig_batch.batch.system import BatchError, BatchJob, BatchSystem
from mig_batch.batch.tags import JobTag, parse_tag
from mig_batch.controller.chains import ChainDriver
from mig_batch.controller.fences import Fences
from mig_batch.controller.translations import Translations
from mig_batch.controller.waits import WaitNotes
from mig_batch.mig.models import get_model
from mig_batch.placement.timelines import GpuTimeline
from mig_batch.state import ChainRecord, Decision, Store

log = logging.getLogger("mig-batchd")


class ChainJobs:
    def __init__(self, store: Store, batch: BatchSystem, chains: ChainDriver, fences: Fences,
                 translations: Translations, waits: WaitNotes, inventory: frozenset[str]):  # fmt: skip
        self.store, self.batch, self.chains, self.fences = store, batch, chains, fences
        self.translations, self.waits, self.inventory = translations, waits, inventory

    def unlinked(self, job: BatchJob, tag: JobTag) -> bool:
        """A job naming a known chain it is not (yet) linked to. One naming an unknown chain (a lost
        state store) starts a chain of its own; it resumes from the same checkpoints. One naming a chain
        that is over is cancelled (a BatchError where the batch system refuses: the caller logs it with the job,
        and the cancel is tried again next pass)."""
        chain = tag.atomize.chain if tag.atomize else None
        if chain is None or chain == job.job_id or self.store.chain(job.job_id) is not None:
            return False
        known = self.store.chain(chain)
        if known is not None and known.state in CHAIN_OVER:
            self.store.event(job.job_id, "chain-job-cancelled", chain=chain, why=f"the chain is {known.state}")
            self.batch.cancel(job.job_id)
        return known is not None

    def offer(self, waiting: list[tuple[BatchJob, JobTag]], timelines: list[GpuTimeline], now: float,
              steers: list[Steer]) -> list[Decision]:
        """Offer gaps to the waiting chains; the granted subjobs, recorded (the caller pins and releases)."""
        candidates = []
        for job, tag in waiting:
            if (why := self.fences.partition_problem(job)) is not None:
                self.waits.note(job.job_id, why)
                continue
            record = self.store.chain(job.job_id)
            if record is None:
                record = self.chains.register(job, tag, self.declared_mib(tag))
            if self.store.latest_chain_job(record.job) not in (None, job.job_id):
                self._cancel_left_behind(record, job)  # only a chain's latest job runs its subjobs
            elif record.state in ("waiting", "granted"):
                candidates.append((job, tag, record))
        hosts = {job.job_id: self.inventory - outside for job, _, _ in candidates
                 if (outside := self.fences.outside_of_job(job, now) | self._skips_prolog(job, now))}  # fmt: skip

        def take_room(job: BatchJob, node: str) -> bool:
            return self.fences.take_room(job, node, now)

        return [d for d, _ in self.chains.offer(candidates, timelines, now, steers, take_room, hosts)]

    def declared_mib(self, tag: JobTag) -> float:
        """The chain's own peak estimate: its memory request, or the smallest profile it asked for."""
        request = tag.request()
        if request.memory_mib:
            return float(request.memory_mib)
        profiles = self.translations.profiles(tag)
        if isinstance(profiles, str):
            return math.inf
        return float(min(get_model(m).profile(p).memory_mib for m, p in profiles.items()))

    def later_jobs(self, record: ChainRecord, ended: BatchJob | None,
                   jobs: Mapping[str, BatchJob]) -> list[BatchJob]:  # fmt: skip
        """Waiting jobs that name ``record``'s chain, from the same user and checkpoint directory."""
        out = []
        for j in jobs.values():
            if not (j.managed and j.held and f";chain={record.job}" in j.admin_tag):
                continue  # cheap text filter first: most held jobs belong to no chain
            try:
                a = parse_tag(j.admin_tag).atomize
            except ValueError:
                continue
            same_user = ended is None or ended.user_id == j.user_id
            if a is not None and a.chain == record.job and a.checkpoint_dir == record.checkpoint_dir and same_user \
                    and self.store.decision(j.job_id) is None:  # fmt: skip
                out.append(j)
        return sorted(out, key=lambda j: j.order)

    def cancel(self, record: ChainRecord, jobs: list[BatchJob]) -> None:
        for job in jobs:
            self.store.event(job.job_id, "chain-job-cancelled", chain=record.job)
            self.batch.cancel(job.job_id)

    def _cancel_left_behind(self, record: ChainRecord, job: BatchJob) -> None:
        """An earlier job of a chain still waiting (its cancel was refused when the chain went on in a later
        one): cancelled again, each pass until the batch system takes it."""
        try:
            self.cancel(record, [job])
        except BatchError as exc:
            log.warning("job %s, left behind by chain %s: %s", job.job_id, record.job, exc)

    def _skips_prolog(self, job: BatchJob, now: float) -> frozenset[str]:
        """The node a requeued job ran on while its begin time, which the batch system moved ahead at the
        requeue, is still to come: its slurmd may still cache the job id and would skip its Prolog (docs/atomize.md).
        A subjob's pin starts it at once, so it is granted elsewhere until then. That node is the one a pass
        last saw the job run on, and the decided one (a job requeued before a pass saw it run ran there;
        pins refused since the requeue leave a decision for another node)."""
        if job.not_before <= now:
            return frozenset()
        d = self.store.decision(job.job_id)
        if d is None or d.state != DecisionState.REQUEUED:
            return frozenset()
        ran = self.store.events(job=job.job_id, kind=DecisionState.RUNNING, last=1)
        return frozenset(n for n in (d.node, ran[0].get("node") if ran else None) if n)
