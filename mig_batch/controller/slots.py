"""Prompt slots: placements mig-batchd decides ahead, per request, for the next jobs that ask for it.

job_submit.lua binds a new MIG job whose request matches an open slot to it at submission (its tag gets
``place=`` and ``slot=``, its node is required, and it is not held), so the job starts as soon as Slurm
schedules it, with no hold, no pin and no release. mig-batchd records the binding at its next pass
(``PromptSlots.adopt``). Here: which requests get slots, the slots kept in the view, and the file
job_submit.lua reads (docs/slurm.md "Prompt slots").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from mig_batch.batch.states import DecisionState
from mig_batch.batch.system import BatchError, BatchJob
from mig_batch.batch.tags import JobTag, Placed, parse_place, parse_slot, parse_tag
from mig_batch.config import SiteConfig
from mig_batch.controller.fences import Fences
from mig_batch.controller.follow import Follower
from mig_batch.controller.ledger import ViewLedger
from mig_batch.controller.snapshot import PassSnapshot
from mig_batch.controller.translations import Translations
from mig_batch.placement.base import Placement, PlacementRequest, Policy
from mig_batch.placement.cluster import PlacementConflict
from mig_batch.safe_files import write_file
from mig_batch.state import Decision, SlotRecord, Store

log = logging.getLogger("mig-batchd")

SLOTS_HEADER = "mig-batch-slots 1"
SLOT_PREFIX = "~slot"  # a slot's key in the view: never a job id
REQUEST_KEPT_S = 600.0  # a request's slots are kept this long after a job last asked for it
# A withdrawn slot's spot is freed only when a listing this much younger than the file without it shows no
# job bound to it: Slurm runs job_submit.lua under a read lock and creates the job after it, under a write
# lock that readers may delay, so a job bound from the old file can appear in a later listing.
WITHDRAWN_GRACE_S = 30.0
# A slot no job took in this long is withdrawn (and made again, with a new id): job_submit.lua may have
# bound a submission that never became a job (sbatch --test-only, a submission Slurm refused after it).
SLOT_LIFETIME_S = 120.0
REWRITE_EVERY_S = 30.0  # the file is written again this often: job_submit.lua trusts none older than its load


def slot_key(slot_id: int) -> str:
    return f"{SLOT_PREFIX}{slot_id}"


def takes_slots(tag: JobTag) -> bool:
    """Whether job_submit.lua may bind a job with this tag to a slot: one instance, neither moldable nor a
    subjob chain (their sizes and windows are decided when they are placed), and no GPU model named (that
    is a constraint on the node, which job_submit.lua leaves to mig-batchd)."""
    return tag.instances == 1 and tag.moldable is None and tag.atomize is None and tag.model is None


def slots_text(slots: Iterable[SlotRecord], listed_at: float, cpus: Mapping[str, int],
               partitions: Mapping[str, Iterable[str]]) -> str:  # fmt: skip
    """The file job_submit.lua reads: a header with the time of the listing the slots were decided after,
    then per open slot ``<id> <request> <node> <gpu> <profile> <start> <cpus> <partitions>``: ``cpus`` the
    node's CPUs, the most a job bound to it may ask for (``-``: unknown), ``partitions`` the node's (``-``:
    any). A job bound to a node whose CPUs are all held waits there for one, as a job mig-batchd places
    when every node is full does."""
    lines = [f"{SLOTS_HEADER} {int(listed_at)}"]
    for s in slots:
        room = cpus.get(s.node)
        parts = ",".join(sorted(partitions.get(s.node, ()))) or "-"
        lines.append(f"{s.id} {s.request} {s.node} {s.gpu} {s.profile} {s.start} "
                     f"{'-' if room is None else room} {parts}")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_slots_file(path: Path, text: str) -> None:
    """Replace the file at once (job_submit.lua reads it at any moment); readable by slurmctld's user, in a
    directory it can enter when this makes it (mig-batchd's unit runs with UMask=0077)."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True)
        path.parent.chmod(0o755)
    write_file(path, text, 0o644)


class PromptSlots:
    """The open and withdrawn slots, each held in the view, and the requests asked for lately."""

    def __init__(self, config: SiteConfig, store: Store, ledger: ViewLedger, fences: Fences, policy: Policy,
                 translations: Translations, follower: Follower, clock: Callable[[], float]):  # fmt: skip
        self.config, self.store, self.ledger, self.fences, self.policy = config, store, ledger, fences, policy
        self.translations, self.follower, self.clock = translations, follower, clock
        self.view = ledger.view
        self.held: dict[int, SlotRecord] = {}  # slots, open or withdrawn, each held in the view
        self._asked: dict[str, float] = {}  # request text that may take slots -> when a job last asked for it
        self._bound: set[str] = set()  # jobs bound to a slot at submission whose binding is recorded
        self._written = -math.inf  # when the slots file was last written
        for slot in store.slots():
            self._hold(slot)

    def in_use(self, now: float) -> bool:
        """Whether a job may be bound to a slot: slots are on, held, or published lately."""
        return bool(self.config.prompt_slots or self.held or now - self._written < REQUEST_KEPT_S)

    def asked(self, tag: JobTag, now: float) -> None:
        """A job asked for ``tag``'s request: keep slots for it (where the site has them)."""
        if self.config.prompt_slots and takes_slots(tag):
            self._asked[tag.text()] = now

    def _hold(self, slot: SlotRecord) -> None:
        gid = self.ledger.gid.get((slot.node, slot.gpu))
        try:
            if gid is None:
                raise PlacementConflict(f"{slot.node} GPU {slot.gpu} is not in the inventory")
            self.view.allocate(gid, slot_key(slot.id), slot.profile, slot.start)
        except PlacementConflict:  # its spot went to a job already: the slot is gone
            self.store.drop_slots([slot.id])
            return
        self.held[slot.id] = slot

    def adopt(self, snapshot: PassSnapshot) -> int:
        """Record the jobs job_submit.lua bound to a slot since the last pass (how many): the slot's spot becomes
        the job's. A slot this controller no longer holds (withdrawn and freed, or from a lost store) is taken
        when its spot is free; when it is not, a job not yet started is held and decided again."""
        self._bound &= snapshot.jobs.keys()
        found = self._newly_bound(snapshot.jobs.values())
        if not found:
            return 0
        decided = []
        for job, slot, place, tag in found:
            held = self.held.pop(slot, None)
            if held is not None:
                self.view.release(slot_key(slot))
            self.asked(tag, snapshot.now)
            model = self.ledger.model_at(place.node, place.gpu, held.model if held else "")
            decided.append((Decision(job.job_id, tag.text(), place.node, place.gpu, model, place.profile, place.start,
                                     DecisionState.RELEASED, f"slot-{self.config.policy}"), slot))  # fmt: skip
        self.store.record_bindings(decided)
        conflicts = []
        for (job, slot, place, _), (d, _) in zip(found, decided, strict=True):
            self._bound.add(job.job_id)
            if job.finished:
                continue
            gid = self.ledger.gid.get((place.node, place.gpu))
            try:
                if gid is None:
                    raise PlacementConflict(f"{place.node} GPU {place.gpu} is not in the inventory")
                self.view.allocate(gid, job.job_id, place.profile, place.start)
            except PlacementConflict as exc:
                self.store.event(job.job_id, "view-conflict", error=str(exc), slot=slot)
                if not job.running:
                    conflicts.append((d, job, f"its slot {slot} was no longer free"))
        for d, job, why in conflicts:  # after every binding is in the view
            try:
                self.follower.requeue(d, job, why)
            except BatchError as exc:  # it started since: its node's agent makes no instance over another's
                log.warning("job %s: %s; holding it failed: %s", job.job_id, why, exc)
        return len(found)

    def _newly_bound(self, jobs: Iterable[BatchJob]) -> list[tuple[BatchJob, int, Placed, JobTag]]:
        """The jobs bound to a slot whose binding is not recorded yet, with the slot, placement and request."""
        found: list[tuple[BatchJob, int, Placed, JobTag]] = []
        for job in jobs:  # a bound job held since (by its owner, say) too: placed, its holds are Slurm's
            if job.job_id in self._bound or not job.managed:
                continue
            try:
                slot = parse_slot(job.admin_tag)  # before anything else: most jobs have none
                if slot is None:
                    continue
                place, tag = parse_place(job.admin_tag), parse_tag(job.admin_tag)
            except ValueError as exc:
                self._bound.add(job.job_id)
                self.store.event(job.job_id, "bad-tag", error=str(exc))
                continue
            if place is None:  # only job_submit.lua writes slot=, always after place=
                self._bound.add(job.job_id)
                self.store.event(job.job_id, "bad-tag", error=f"slot={slot} without place=")
            elif self.store.decision(job.job_id) is None:
                found.append((job, slot, place, tag))
            else:  # recorded by an earlier pass (before a restart)
                self._bound.add(job.job_id)
        return found

    def free_withdrawn(self, listed_at: float) -> None:
        """Free the spots of the slots withdrawn long enough before this pass's listing that a job bound to one
        would be in it (and was adopted first): this pass's placements may take them."""
        gone = [s.id for s in self.held.values()
                if s.withdrawn_at is not None and listed_at > s.withdrawn_at + WITHDRAWN_GRACE_S]  # fmt: skip
        if not gone:
            return  # most passes: no empty transaction
        for slot in gone:
            self.view.release(slot_key(slot))
            del self.held[slot]
        self.store.drop_slots(gone)

    def refill(self, snapshot: PassSnapshot, crowded: bool) -> None:
        """Keep ``prompt_slots`` open slots for each request asked for lately, decided by the policy on what
        is left after this pass's placements, and publish them; none while a job waits for a spot (a slot's
        spot is one it could have) or a chain for a gap. A slot is withdrawn when its node may take no
        placement now (down, MIG off, or no CPU to give while another node has some)."""
        if not self.held and not self.config.prompt_slots:
            return
        now = snapshot.now
        self._asked = {r: t for r, t in self._asked.items() if now - t < REQUEST_KEPT_S}
        wanted = set() if crowded or not self.config.prompt_slots else set(self._asked)
        opened = [s for s in self.held.values() if s.withdrawn_at is None]
        withdrawn = [s.id for s in opened if s.request not in wanted or now - s.made_at > SLOT_LIFETIME_S
                     or self.ledger.gid[(s.node, s.gpu)] in self.view.fenced]  # fmt: skip
        made = self._make(wanted, [s for s in opened if s.id not in withdrawn], now)
        if not (made or withdrawn) and now - self._written < REWRITE_EVERY_S:
            return
        published = [s for s in self.held.values() if s.withdrawn_at is None and s.id not in withdrawn]
        text = slots_text(published, snapshot.listed_at, snapshot.cpus, snapshot.partitions)
        try:
            write_slots_file(self.config.slots_file, text)
        except OSError as exc:
            log.warning("cannot write the prompt slots to %s: %s", self.config.slots_file, exc)
            return
        written = self._written = self.clock()
        if withdrawn:
            self.store.withdraw_slots(withdrawn, written)
            for slot in withdrawn:
                self.held[slot] = replace(self.held[slot], withdrawn_at=written)

    def _make(self, wanted: set[str], opened: list[SlotRecord], now: float) -> list[int]:
        """Up to ``prompt_slots`` open slots for each of ``wanted``, where the policy would place such a job now,
        at most an equal share of them on each node that may take a placement (a node's jobs wait for its
        CPUs: slots spread them); the new slots' ids."""
        if not wanted:
            return []
        up = self.fences.up_nodes()
        share = math.ceil(self.config.prompt_slots / max(len(up), 1))
        made: list[int] = []
        for request in sorted(wanted):
            new = self._decide_slots(request, [s.node for s in opened if s.request == request], up, share, now)
            if not new:
                continue
            for slot in self.store.add_slots([(request, p.host, p.gpu_index, p.model, p.profile, p.start)
                                              for p in new], made_at=now):  # fmt: skip
                self.view.allocate(self.ledger.gid[(slot.node, slot.gpu)], slot_key(slot.id), slot.profile,
                                   slot.start)  # fmt: skip
                self.held[slot.id] = slot
                made.append(slot.id)
        return made

    def _decide_slots(self, request: str, mine: list[str], up: set[str], share: int, now: float) -> list[Placement]:
        """The policy's spots for up to ``prompt_slots`` slots of ``request`` beside those on the nodes ``mine``
        (taken in the view while deciding, then given back: the caller records them)."""
        profiles = self.translations.profiles(parse_tag(request))
        shut: list[int] = []  # GPUs fenced while this request's slots are made: their node has its share
        new: list[Placement] = []
        try:
            for node in up:
                if mine.count(node) >= share:
                    shut += self.ledger.shut_node(node)
            while isinstance(profiles, dict) and len(mine) < self.config.prompt_slots:
                p = self.policy.decide(self.view, PlacementRequest(slot_key(0), profiles, now, None))
                if not isinstance(p, Placement):
                    break
                self.view.allocate(p.gid, f"{slot_key(0)}.{len(new)}", p.profile, p.start)  # the next one sees it
                new.append(p)
                mine.append(p.host)
                if mine.count(p.host) >= share:
                    shut += self.ledger.shut_node(p.host)
        finally:
            for gid in shut:
                self.view.unfence(gid)
            for k in range(len(new)):
                self.view.release(f"{slot_key(0)}.{k}")
        return new
