"""What a pass's decisions do to the batch system: each job pinned to its node and spot, and released.

Every decision is recorded before this, so a pin the batch system refuses, or a call it does not answer,
is applied again next pass. A pin refused ``PIN_TRIES`` times in a row on one node frees the job's spot,
and the job is decided again elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from mig_batch.batch.states import DecisionState
from mig_batch.batch.system import BatchError, BatchSystem, Pin, Unanswered
from mig_batch.batch.tags import SEEN_MAX, Placed, Seen, parse_place, placed_tag, with_seen
from mig_batch.controller.chains import ChainDriver
from mig_batch.controller.fences import PinRefusals
from mig_batch.controller.ledger import ViewLedger
from mig_batch.mig.models import get_model
from mig_batch.state import Decision, Store

log = logging.getLogger("mig-batchd")
PIN_TRIES = 3  # refused pins in a row on one node before its job is decided again elsewhere
# what happened to a job before its placement that its owner may read in its tag (migsub status)
SEEN_KINDS = frozenset({"requeued", "pin-refused", "ran-without-instance", "replaced", "node-replaced", "defrag-moved"})
REFUSED_FOR_S = 600.0  # ... and how long that node is not tried again for it


class Pinning:
    def __init__(self, store: Store, batch: BatchSystem, ledger: ViewLedger, chains: ChainDriver,
                 refusals: PinRefusals):  # fmt: skip
        self.store, self.batch, self.ledger, self.chains, self.refusals = store, batch, ledger, chains, refusals

    def pin_and_release(self, decided: list[Decision], now: float, errors: list[str]) -> int:
        """Pin and release every decision; how many were released (the others' reasons go to ``errors``)."""
        if not decided:
            return 0
        pins, unpinnable = [], {}
        for d in decided:  # one unreadable decision must not keep every other job from its pin
            try:
                pins.append(self.pin(d))
            except (KeyError, ValueError) as exc:
                unpinnable[d.job] = f"job {d.job}: its decision cannot be pinned: {exc}"
        try:
            failed = self.batch.pin_and_release(pins) if pins else {}
        except BatchError as exc:  # the batch system did not answer: no pin was refused
            failed = {p.job_id: str(exc) for p in pins}
        else:
            self._count_refusals(decided, failed, now)
        failed = {**failed, **unpinnable}
        for job, why in failed.items():
            errors.append(why)
            log.warning("job %s: %s", job, why)
        released = [d.job for d in decided if d.job not in failed]
        self.store.set_states(released, DecisionState.RELEASED)
        return len(released)

    def pin(self, d: Decision) -> Pin:
        tag = d.tag
        limit = window = run = None
        if tag.atomize is not None:  # a subjob: its window, and Slurm's limit as the runner's backstop
            subjobs = self.store.subjobs(d.job)
            if subjobs:
                window, run = subjobs[-1].window_s, subjobs[-1].run
                limit = self.chains.time_limit_min(window)
        spots = tuple(self.store.spots(d.job)) if tag.instances > 1 else ()
        if spots:  # each rank's GPU model (a decision recorded before jobs kept to one model may mix them)
            slices = sum(get_model(self.ledger.model_at(d.node, g, d.model)).profile(p).memory_slices
                         for g, p, _ in spots)  # fmt: skip
        else:
            slices = get_model(d.model).profile(d.profile).memory_slices
        text = placed_tag(tag, Placed(d.node, d.gpu, d.profile, d.start, window, run, spots))
        return Pin(d.job, d.node, with_seen(text, self.seen(d.job)), limit, slices)

    def seen(self, job: str) -> list[Seen]:
        """The job's past events its owner may read (see SEEN_KINDS), oldest first."""
        # only the rows shown are read: this runs at every pin
        events = self.store.events(job=job, kind=SEEN_KINDS, last=SEEN_MAX)
        return [Seen(e["kind"], e["time"], _detail(e)) for e in events]

    def _count_refusals(self, decided: list[Decision], failed: Mapping[str, str], now: float) -> None:
        """A pin the batch system refuses PIN_TRIES times in a row on one node (the job's own limits: an
        excluded node, a reservation) frees the job's spot, and the job is decided again elsewhere; that
        node is tried again for it after REFUSED_FOR_S. Without this the job was pinned there every pass
        and its spot stayed taken. Partitions are known beforehand and never tried (``Fences.confinement``)."""
        by_job = self.refusals.by_job
        for d in decided:
            if d.job not in failed:
                by_job.pop(d.job, None)
                continue
            if isinstance(failed[d.job], Unanswered):  # no answer: its fate is unknown, not a refusal
                continue
            tries = by_job.setdefault(d.job, {}).setdefault(d.node, [0, 0.0])
            tries[0] += 1
            if tries[0] >= PIN_TRIES and self._still_unpinned(d):
                tries[:] = [0, now + REFUSED_FOR_S]
                self.store.event(d.job, "pin-refused", node=d.node, reason=failed[d.job], tries=PIN_TRIES)
                log.warning("job %s: %s refused its pin %d times (%s); it is decided again elsewhere", d.job,
                            d.node, PIN_TRIES, failed[d.job])  # fmt: skip
                self.ledger.free(d.job)
                self.store.set_state(d.job, DecisionState.REQUEUED, reason=f"pin refused on {d.node}: {failed[d.job]}",
                                     node=d.node)  # fmt: skip

    def _still_unpinned(self, d: Decision) -> bool:
        """Whether the batch system holds ``d``'s job without its pin applied (read again: a refusal it
        answered may still have come after the pin took effect)."""
        try:
            job = self.batch.job(d.job)
        except BatchError:
            return False
        if job is None or not job.held:
            return False
        place = parse_place(job.admin_tag)  # an earlier decision's placement may still be there
        decided = (d.node, d.gpu, d.profile, d.start)
        return place is None or (place.node, place.gpu, place.profile, place.start) != decided


def _detail(event: dict[str, object]) -> str:
    """An event's detail in a few words: its reason (and node) where it has one, else its values."""
    reason, node = event.get("reason"), event.get("node")
    if reason:
        return f"{reason} (on {node})" if node and str(node) not in str(reason) else str(reason)
    return " ".join(f"{k} {v}" for k, v in event.items() if k not in ("time", "job", "kind"))
