"""Why a waiting job is not placed: recorded once per change of reason, as a ``waiting`` event."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Container, Hashable, Mapping

from mig_batch.batch.system import After, Awaits, BatchError, BatchJob, BatchSystem
from mig_batch.batch.tags import PLACE_FIELD, with_wait_note
from mig_batch.state import Store

log = logging.getLogger("mig-batchd")
# notes written in one pass at most (one batch-system call each): a burst of waiting jobs gets them over a few
# passes instead of slowing the pass that places the burst
NOTES_PER_PASS = 50
NOTES_BUDGET_S = 1.0  # and no more time than this on them (a note is one call: a process where Slurm has no helper)


class WaitNotes:
    """Each waiting job's reason: an event per change, and (:meth:`publish`) a note in its tag its owner reads."""

    def __init__(self, store: Store):
        self.store = store
        self._why: dict[str, str] = {}  # job -> the reason last recorded
        self._causes: dict[Hashable, str] = {}  # this pass's reasons by request (one computed per kind of job)

    def note(self, job: str, reason: str) -> None:
        if self._why.get(job) != reason:
            self._why[job] = reason
            self.store.event(job, "waiting", reason=reason)
            log.info("job %s waits: %s", job, reason)

    def cause(self, key: Hashable, find: Callable[[], str]) -> str:
        """The reason for requests like ``key``, found once a pass."""
        if key not in self._causes:
            self._causes[key] = find()
        return self._causes[key]

    def placed(self, job: str) -> None:
        self._why.pop(job, None)

    def keep_only(self, jobs: Container[str]) -> None:
        """Forget the jobs the batch system no longer lists (each pass, as it begins)."""
        self._causes.clear()
        for gone in [j for j in self._why if j not in jobs]:
            del self._why[gone]

    def publish(self, batch: BatchSystem, jobs: Mapping[str, BatchJob], decided: Collection[str]) -> None:
        """Show each waiting job's reason in its tag, where its owner reads it (Slurm: AdminComment in squeue
        and scontrol; HTCondor: MigBatchTag), when the tag does not show it yet (``NOTES_PER_PASS`` at most,
        the longest noted first, within ``NOTES_BUDGET_S``, and none after a call that failed); the jobs decided
        this pass have theirs written again without a note by their pin."""
        for job in decided:
            self._why.pop(job, None)
        written, deadline = 0, time.monotonic() + NOTES_BUDGET_S
        for job, reason in self._why.items():
            listed = jobs.get(job)
            if listed is None or not listed.held or PLACE_FIELD in listed.admin_tag:
                continue
            tag = with_wait_note(listed.admin_tag, reason)
            if tag == listed.admin_tag:
                continue
            if written == NOTES_PER_PASS or time.monotonic() > deadline:
                return
            written += 1
            try:
                batch.set_job_tag(job, tag)
            except BatchError as exc:  # the batch system is slow or refusing: the others wait for a later pass
                log.info("job %s: its wait note was not written (%s); the notes wait for the next pass", job, exc)
                return


def why_not_yet(job: BatchJob, awaited: Callable[[After], list[BatchJob]], now: float,
                begin: bool = True) -> str | None:  # fmt: skip
    """What the job waits for before the batch system may start it: its begin time (where ``begin``), or the
    jobs it depends on, as ``awaited`` finds their records (None: nothing). An array's tasks count together,
    as Slurm counts them: started when none waits, ended when all have, succeeded when all have."""
    if begin and job.not_before > now:
        return f"its begin time, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(job.not_before))}"
    for after in job.after:
        if after.awaits is Awaits.NEVER:
            return f"its dependency on job {after.job_id}, which the batch system says can never be met"
        records = awaited(after)
        if not records:  # gone from the batch system: it ended long ago
            continue
        if after.awaits is Awaits.FAILURE and (not after.array or after.task is not None) and len(records) == 1 \
                and records[0].exited_special:  # fmt: skip
            continue  # Slurm counts it as failed (an array as a whole: by a record it picks, so wait)
        if after.awaits is Awaits.START:
            if not all(r.running or r.finished for r in records):
                return f"job {after.job_id} to start"
            if max(r.start_time for r in records) + after.delay_s > now:  # ended too: Slurm still counts from its start
                return f"job {after.job_id} to have run {after.delay_s / 60:g} min"
        elif not all(r.finished for r in records):
            return f"job {after.job_id} to end"
        elif after.awaits is not Awaits.END and (after.awaits is Awaits.SUCCESS) != all(r.succeeded for r in records):
            return f"its dependency on job {after.job_id}, which can never be met: {_how_it_ended(after, records)}"
    return None


def _how_it_ended(after: After, records: list[BatchJob]) -> str:
    if not after.array:
        return f"that job ended {records[0].outcome}"
    if after.awaits is Awaits.SUCCESS:
        failed = next(r for r in records if not r.succeeded)
        return f"its task {failed.job_id} ended {failed.outcome}"
    return f"every task of it ended {records[0].outcome}"
