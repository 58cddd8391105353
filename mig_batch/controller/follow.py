"""Each decision's life cycle, followed from what the batch system shows of its job each pass.

  decided  + job still held    -> pin and release again (same node, same tag)
  released/running + job ended -> free its spot
  node report "requeue"        -> requeue-hold the job, decide again
  running job pending again    -> the batch system requeued it (its node failed): hold it, decide again;
                                  a chain's subjob ends there, and its chain goes on (the runner's next job)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from mig_batch.batch.states import DecisionState
from mig_batch.batch.system import BatchError, BatchJob, BatchSystem
from mig_batch.batch.tags import NodeReport, parse_report, rank_key
from mig_batch.controller.chain_jobs import ChainJobs
from mig_batch.controller.chains import ChainDriver
from mig_batch.controller.fences import Fences
from mig_batch.controller.ledger import ViewLedger
from mig_batch.controller.snapshot import PassSnapshot
from mig_batch.controller.waits import why_not_yet
from mig_batch.placement.cluster import PlacementConflict
from mig_batch.state import NODE_PROBLEM, Decision, InstanceRecord, Store

log = logging.getLogger("mig-batchd")
# A placed job is taken back for its begin time only when that is further away than this: a spot idle that
# long costs less than a hold and a new decision.
TAKE_BACK_AFTER_S = 60.0
# a released subjob waiting for a begin time this far ahead was requeued by the batch system (Slurm moves it
# cred_expire + 1 s ahead, and cred_expire is at least 5 s); its pin had set it to its release
REQUEUE_BEGIN_MARGIN_S = 5.0
# a job that ran without its instance (its prolog could not make it) and ended unseen goes back to the queue
# until it has been decided this many times: a prolog failing wherever it lands must not rerun it for ever
RUNS_WITHOUT_INSTANCE = 3


class Follower:
    def __init__(self, store: Store, batch: BatchSystem, ledger: ViewLedger, fences: Fences, chains: ChainDriver,
                 chain_jobs: ChainJobs, inventory: frozenset[str]):  # fmt: skip
        self.store, self.batch, self.ledger, self.fences = store, batch, ledger, fences
        self.chains, self.chain_jobs, self.inventory = chains, chain_jobs, inventory
        self.reported: set[str] = {r.job for r in store.instances()}  # jobs whose node report is recorded

    def follow(self, snapshot: PassSnapshot, errors: list[str]) -> tuple[list[Decision], int]:
        """Carry every active decision forward from what the batch system shows: the decisions whose pin must
        be applied again (still held: a crash or a refused pin), and how many jobs ended. A batch-system call
        that fails is logged with its job (in ``errors`` too), and the others go on."""
        again: list[Decision] = []
        ended = 0
        for d in self.store.decisions():
            job = snapshot.jobs.get(d.job)
            try:
                if job is None or job.finished:
                    self.ended(d, job, snapshot.jobs)
                    ended += 1
                else:
                    self._follow_listed(d, job, snapshot, again)
            except BatchError as exc:
                errors.append(str(exc))
                log.warning("job %s: %s", d.job, exc)
        return again, ended

    def _follow_listed(self, d: Decision, job: BatchJob, snapshot: PassSnapshot, again: list[Decision]) -> None:
        now = snapshot.now
        placed_or_released = d.state in (DecisionState.DECIDED, DecisionState.RELEASED)
        if job.running:
            self.running(d, job, now)
        elif (d.state == DecisionState.DECIDED or (d.state == DecisionState.RELEASED and not job.held)) \
                and not job.held_by_user and (why := self._too_early(d, job, snapshot)):  # fmt: skip
            # its begin time or a dependency moved since the decision (its owner's update, an array's
            # tasks failing, a requeue by the batch system): its spot would idle until then, or for ever.
            # Held again after its release (by its owner, an operator or Slurm), it is theirs to release.
            self.requeue(d, job, f"placed, it waits for {why}")
        elif job.held and d.state == DecisionState.DECIDED and not job.held_by_user:
            again.append(d)
        elif self._subjob_taken_back(d, job, now):
            self._subjob_interrupted(d, job, snapshot.jobs)
        elif d.state == DecisionState.RUNNING or d.node in self.fences.down_since or \
                (job.held_by_user and placed_or_released):  # fmt: skip
            self.requeue(d, job, "held by its owner" if job.held_by_user
                         else "the batch system requeued it" if d.state == DecisionState.RUNNING
                         else f"its node {d.node} is down")  # fmt: skip

    def _too_early(self, d: Decision, job: BatchJob, snapshot: PassSnapshot) -> str | None:
        """What a placed job still waits for, over TAKE_BACK_AFTER_S, before the batch system may start it."""
        if job.not_before <= snapshot.now + TAKE_BACK_AFTER_S and not job.after:
            return None  # the common case, without reading the tag
        return why_not_yet(job, snapshot.awaited, snapshot.now + TAKE_BACK_AFTER_S,
                           begin=d.tag.atomize is None)  # fmt: skip

    def running(self, d: Decision, job: BatchJob, now: float) -> None:
        """A running job: its node's report (once), and the subjob's start."""
        if d.state in (DecisionState.DECIDED, DecisionState.RELEASED):
            self.store.set_state(d.job, DecisionState.RUNNING, node=job.node)
            if d.tag.atomize is not None:
                self.store.start_subjob(d.job, job.start_time or now)
        if d.job in self.reported:
            return
        try:
            report = parse_report(job.admin_tag)
        except ValueError as exc:
            self.store.event(d.job, "bad-report", error=str(exc))
            self.reported.add(d.job)
            return
        if report is None:
            return
        self.reported.add(d.job)
        if report.kind == "requeue":
            self._prolog_problem(d, report)
            if d.tag.atomize is not None:  # its runner exits at once: its chain goes on
                self.chains.interrupted(d, "not-started")
            self.requeue(d, job, report.reason)
            return
        # the node it runs on: the decided one, unless an operator moved it after the release (job_submit.lua
        # refuses its owner that); that node's agent then placed it on itself and reported "replaced"
        node = job.node if job.node in self.inventory else d.node
        if report.kind == "replaced":
            self._moved(d, report, node)
        records = [InstanceRecord(d.job, node, r.gpu, r.profile, r.start, r.gi_id, r.uuid) for r in report.ranks()]
        if len(records) > 1:
            self.store.record_instances(records)
        else:
            self.store.record_instance(records[0])

    def _moved(self, d: Decision, report: NodeReport, node: str) -> None:
        """The job's ``node`` made its instance elsewhere than decided (the decided spot was taken, or the job
        was moved to that node after its release): follow it."""
        self.store.event(d.job, "node-replaced", node=node, decided=f"{d.node}/{d.gpu}/{d.profile}@{d.start}",
                         placed=f"{node}/{report.gpu}/{report.profile}@{report.start}")  # fmt: skip
        self.ledger.free(d.job)
        ranks = report.ranks()
        if len(ranks) > 1:
            self.ledger.ranks[d.job] = len(ranks)
        for rank, r in enumerate(ranks):
            gid = self.ledger.gid.get((node, r.gpu))
            try:
                if gid is not None:
                    self.ledger.view.allocate(gid, rank_key(d.job, rank), r.profile, r.start)
            except PlacementConflict as exc:  # the view disagrees with the node: the node is right, report it
                self.store.event(d.job, "view-conflict", error=str(exc))
        model = self.ledger.model_at(node, report.gpu, d.model)  # the node may use another model's GPU
        moved = Decision(d.job, d.request, node, report.gpu, model, report.profile, report.start,
                         DecisionState.RUNNING, d.policy)  # fmt: skip
        spots = tuple((r.gpu, r.profile, r.start) for r in ranks) if len(ranks) > 1 else ()
        self.store.record_decision(moved, event="replaced", spots=spots)

    def requeue(self, d: Decision, job: BatchJob, reason: str) -> None:
        """Back to the queue, held, to be decided again."""
        if not job.finished:
            if job.running or job.held_by_user:  # unpinned too: released later, it must wait for a new decision
                self._unplace(d)  # first: Slurm's requeue-hold is one its owner may release, unplaced it starts nothing
                self.batch.requeue_hold(d.job, reason)
            else:
                self.batch.hold(d.job)
                self._unplace(d)  # after: unplaced while it may start, it would start with no instance
        self._decide_again(d, reason)

    def _requeue_ended(self, d: Decision, job: BatchJob, reason: str) -> bool:
        """A job whose prolog could not make its instance ran without one (CUDA saw no GPU) and ended before a
        pass saw it run (the controller was down, or the job was short): back to the queue, held, to run on an
        instance; not a chain's subjob (its runner went on) nor a job its owner cancelled. Whether it went
        back (the batch system may have forgotten it, or refuse: it stays ended, with the event)."""
        if d.tag.atomize is not None or job.cancelled:
            return False
        if self.store.count_decisions(d.job) >= RUNS_WITHOUT_INSTANCE:  # its prolog fails wherever it goes
            self.store.event(d.job, "ran-without-instance", node=d.node,
                             error=f"not requeued again: decided {RUNS_WITHOUT_INSTANCE} times")  # fmt: skip
            return False
        try:
            self.batch.requeue_hold(d.job, reason)
        except BatchError as exc:
            self.store.event(d.job, "ran-without-instance", node=d.node, error=str(exc))
            log.warning("job %s ran without its instance and could not be requeued: %s", d.job, exc)
            return False
        self._unplace(d)  # held now (Slurm refuses to update a finished job's tag)
        self._decide_again(d, f"ran without its instance: {reason}")
        return True

    def _decide_again(self, d: Decision, reason: str) -> None:
        self.ledger.free(d.job)
        self.reported.discard(d.job)
        if self.store.instance(d.job) is not None:
            self.store.forget_instance(d.job, reason=reason)
        self.store.set_state(d.job, DecisionState.REQUEUED, reason=reason, node=d.node)

    def _unplace(self, d: Decision) -> None:
        """Its old placement and report out of a requeued job's tag: released by its owner, it must not start on
        the freed spot (job_submit.lua lets a placed job go), nor its old report be read again."""
        try:
            self.batch.set_job_tag(d.job, d.request)
        except BatchError as exc:  # the requeue stands; only that release stays possible
            log.warning("job %s: its placement could not be taken out of its tag: %s", d.job, exc)

    def _prolog_problem(self, d: Decision, report: NodeReport) -> None:
        self.store.event(d.job, NODE_PROBLEM, node=d.node, hook="prolog", reason=report.reason)
        log.warning("job %s: the prolog on %s could not place it: %s", d.job, d.node, report.reason)

    def ended(self, d: Decision, job: BatchJob | None, jobs: Mapping[str, BatchJob]) -> None:
        if job is not None and d.job not in self.reported:  # it ended before a pass saw it run
            try:
                report = parse_report(job.admin_tag)
            except ValueError:
                report = None
            if report is not None and report.kind == "requeue":
                self._prolog_problem(d, report)
                if self._requeue_ended(d, job, report.reason):
                    return
        self.ledger.free(d.job)
        self.reported.discard(d.job)
        if self.store.instance(d.job) is not None:  # the Epilog destroyed it (the node reconciles a leak)
            self.store.forget_instance(d.job, node=d.node)
        if d.tag.atomize is not None:
            self._subjob_ended(d, job, jobs)
        else:
            self.store.set_state(d.job, DecisionState.ENDED, outcome=job.outcome if job else "gone")

    def _subjob_ended(self, d: Decision, job: BatchJob | None, jobs: Mapping[str, BatchJob]) -> None:
        """A chain's subjob ended. The runner has submitted the chain's next job (one batch job per
        subjob, held): link it when the chain goes on, cancel it when not. Without one (the runner
        could not submit it), the ended job itself is requeued held, as a fallback."""
        goes_on = self.chains.ended(d, job)
        record = self.store.chain(d.job)
        later = self.chain_jobs.later_jobs(record, job, jobs) if record is not None else []
        outcome = job.outcome if job else "gone"
        linked = goes_on and bool(later)
        if linked and record is not None:
            self.store.link_job(later[0].job_id, record.job)
            later = later[1:]  # more than one: cancelled below
        if goes_on and not linked:
            self.batch.requeue_hold(d.job, "the chain's next subjob")
            self._unplace(d)
            self.store.set_state(d.job, DecisionState.REQUEUED, outcome=outcome)
        else:
            self.store.set_state(d.job, DecisionState.ENDED, outcome=outcome)
        if record is not None:
            self.chain_jobs.cancel(record, later)

    @staticmethod
    def _subjob_taken_back(d: Decision, job: BatchJob, now: float) -> bool:
        """A subjob the batch system requeued after its start (the job waits again): seen running, or released
        and waiting, not held, for a begin time well ahead, where its pin had set it to its release (a pass
        may not have seen it run)."""
        started = d.state == DecisionState.RUNNING or (
            d.state == DecisionState.RELEASED and not job.held and job.not_before > now + REQUEUE_BEGIN_MARGIN_S)
        return started and d.tag.atomize is not None

    def _subjob_interrupted(self, d: Decision, job: BatchJob, jobs: Mapping[str, BatchJob]) -> None:
        """A running subjob the batch system took back (an operator's requeue, its node's failure): it ended
        without its checkpoint, and its chain goes on from the last one. Stopped, the runner submitted the
        chain's next job: the chain goes on there, linked first, and this job is cancelled (a requeued job id
        may start without its Prolog). Without one (the runner died with its node), or held by its owner, the
        chain goes on in this job, decided again. Either way the job is held and unplaced first, as any
        requeued job."""
        record = self.chains.interrupted(d)
        later = self.chain_jobs.later_jobs(record, job, jobs) if record is not None else []
        if record is not None and later and not job.held_by_user:
            self.store.link_job(later[0].job_id, record.job)
            later = [job, *later[1:]]
        self.requeue(d, job, "the batch system requeued it")
        if record is not None:
            self.chain_jobs.cancel(record, later)
