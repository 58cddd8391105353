"""The controller loop: place held managed jobs, pin and release them, follow them to the end.

It speaks to the batch system only through the seam (:mod:`mig_batch.batch.system`), and the nodes
answer through it too: the node agent appends its report to the job's operator-only tag (instance
made, made elsewhere on the node, or nothing fits), and publishes its own state on the node.

Crash-safe by construction: a decision is recorded in the store before the batch system hears of
it, and every step is idempotent, so after a crash (or SIGKILL) a restart resumes from the store:
  decided  + job still held    -> pin and release again (same node, same tag)
  released/running + job ended -> free the slot
  node report "requeue"        -> requeue-hold the job, decide again
  running job pending again    -> the batch system requeued it (its node failed): hold it, decide again;
                                  a chain's subjob ends there, and its chain goes on (the runner's next job)
  job bound to a prompt slot   -> its decision recorded from its tag (the slot's spot; controller/slots.py)
A node the batch system reports down is fenced (nothing is placed there) until its agent has
reconciled its GPUs since. The in-memory view (a placement ``Cluster``) is rebuilt from the store.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from mig_batch.atomize.defrag import Steer, keep_windows
from mig_batch.atomize.gaps import GpuTimeline, Hold, cluster_timelines, reservation, with_hold
from mig_batch.batch.states import CHAIN_OVER, DECIDABLE, DecisionState
from mig_batch.batch.system import (
    After,
    Awaits,
    BatchError,
    BatchJob,
    BatchSystem,
    JobState,
    NodeStatus,
    Pin,
    Unanswered,
)
from mig_batch.batch.tags import (
    AgentTag,
    JobTag,
    NodeReport,
    Placed,
    job_of,
    moldable_times,
    parse_agent_tag,
    parse_place,
    parse_report,
    parse_slot,
    parse_tag,
    placed_tag,
    profiles_by_model,
    rank_key,
)
from mig_batch.config import SiteConfig
from mig_batch.controller.chains import ChainDriver
from mig_batch.controller.slots import (
    REQUEST_KEPT_S,
    REWRITE_EVERY_S,
    SLOT_LIFETIME_S,
    WITHDRAWN_GRACE_S,
    slot_key,
    slots_text,
    takes_slots,
    write_slots_file,
)
from mig_batch.mig.models import GpuModel, get_model
from mig_batch.placement.base import Placement, PlacementRequest
from mig_batch.placement.cluster import Cluster, Gpu, PlacementConflict
from mig_batch.placement.moldable import MoldableJob, MoldablePlanner, expected_end
from mig_batch.placement.multi import MultiPlacement, MultiPolicy
from mig_batch.placement.policies import make_policy
from mig_batch.state import MIG_OFF, NODE_PROBLEM, ChainRecord, Decision, InstanceRecord, SlotRecord, Store

Decided = TypeVar("Decided")
log = logging.getLogger("mig-batchd")
PIN_TRIES = 3  # refused pins in a row on one node before its job is decided again elsewhere
REFUSED_FOR_S = 600.0  # ... and how long that node is not tried again for it
# A placed job is taken back for its begin time only when that is further away than this: a slot idle that
# long costs less than a hold and a new decision.
TAKE_BACK_AFTER_S = 60.0
# a released subjob waiting for a begin time this far ahead was requeued by the batch system (Slurm moves it
# cred_expire + 1 s ahead, and cred_expire is at least 5 s); its pin had set it to its release
REQUEUE_BEGIN_MARGIN_S = 5.0
PRUNE_EVERY_S = 3600.0  # how often mig-batchd forgets what ended longer ago than retention_days
PRUNE_BUDGET_S = 0.2  # of a pass, past its first transaction (each pass makes progress)


@dataclass
class PassStats:
    seconds: float = 0.0
    placed: int = 0
    waiting: int = 0
    ended: int = 0
    errors: list[str] = field(default_factory=list)


def build_view(nodes: dict[str, tuple[str, ...]]) -> Cluster:
    gpus, gid = [], 0
    for node in sorted(nodes):
        for index, model in enumerate(nodes[node]):
            gpus.append(Gpu(gid, node, index, model))
            gid += 1
    return Cluster(gpus)


class Controller:
    def __init__(self, config: SiteConfig, store: Store, batch: BatchSystem):
        if not config.nodes:
            raise ValueError(f"{config.path}: no nodes in the inventory; the controller has nothing to place on")
        self.config, self.store, self.batch = config, store, batch
        self.policy = make_policy(config.policy)
        self.multi = MultiPolicy(config.multi_policy)  # jobs over several instances (Flex-MIG's one-to-many)
        self._ranks: dict[str, int] = {}  # multi-instance job -> its instances in the view (job, job#1, ...)
        self._why_waiting: dict[str, str] = {}  # multi-instance job -> the reason last recorded
        self._jobs: Mapping[str, BatchJob] = {}  # this pass's
        self._arrays: dict[str, list[BatchJob]] | None = None  # this pass's records by job array, once asked
        self.view = build_view(config.nodes)
        self.gid = {(g.host, g.index): g.gid for g in self.view.gpus}
        self._profiles: dict[str, dict[str, str] | str] = {}  # tag text -> model -> profile, or the error
        self._moldable: dict[str, dict[str, dict[str, float]] | str] = {}  # tag text -> model -> options
        self._predicted: dict[str, float | None] = {}  # job -> predicted seconds of its moldable instance
        self.chains = ChainDriver(config, store, self.view)
        self._down_since: dict[str, float] = {}  # fenced nodes: when the batch system reported them down
        self._room: dict[str, int] = {}  # node -> CPUs idle and not promised to a released job (when known)
        self._cpus: dict[str, int] = {}  # node -> its CPUs (when known)
        self._gids_of: dict[str, list[int]] = {}  # node -> its GPUs in the view
        for g in self.view.gpus:
            self._gids_of.setdefault(g.host, []).append(g.gid)
        # what the view's fences hold now (node down or without a CPU to give; MIG mode off), by its reason
        self._fenced_hosts: set[str] = set()  # nodes whose GPUs are fenced now (down, or no CPU to give)
        self._fenced_off: set[int] = set()  # GPUs fenced now for their MIG mode off
        self._overflow = False  # every node is full: jobs go where the fewest wait for CPUs (see _apply_fences)
        self._balanced_out = False  # ... and that fences some node that has GPU room
        # when every node is full, nodes with less room than this are fenced; None: less than the most
        self._floor: float | None = None
        self._fits_nowhere: set[tuple] = set()  # this pass's requests MIG fits on no up node (the view only fills)
        self._partitions: dict[str, frozenset[str]] = {}  # node -> its partitions (none listed: any job's)
        self._outside: frozenset[str] = frozenset()  # nodes outside the partitions of the job being decided
        self._outside_of: dict[tuple[str, ...], frozenset[str]] = {}  # this pass's, per partition list
        # job -> node -> [refused pins in a row, when the node is tried again]: see _count_refusals
        self._refused: dict[str, dict[str, list[float]]] = {}
        self._mig_off: dict[str, tuple[int, ...]] = {}  # per node, the GPUs its agent found with MIG mode off
        self._reported: set[str] = {r.job for r in store.instances()}  # jobs whose node report is recorded
        self._problems_seen: dict[str, str] | None = None  # node -> the key of its agent's last problem recorded
        self._pruned = -math.inf  # when the store was last pruned to the end
        self._slots: dict[int, SlotRecord] = {}  # prompt slots, open or withdrawn, each held in the view
        self._asked: dict[str, float] = {}  # request text that may take slots -> when a job last asked for it
        self._bound: set[str] = set()  # jobs bound to a slot at submission whose binding is recorded
        self._slots_written = -math.inf  # when the slots file was last written
        for d in store.decisions():
            self._occupy(d)
        for slot in store.slots():
            self._hold_slot(slot)

    def _hold_slot(self, slot: SlotRecord) -> None:
        gid = self.gid.get((slot.node, slot.gpu))
        try:
            if gid is None:
                raise PlacementConflict(f"{slot.node} GPU {slot.gpu} is not in the inventory")
            self.view.allocate(gid, slot_key(slot.id), slot.profile, slot.start)
        except PlacementConflict:  # its spot went to a job already: the slot is gone
            self.store.drop_slots([slot.id])
            return
        self._slots[slot.id] = slot

    def _occupy(self, d: Decision) -> None:
        spots = self.store.spots(d.job) or [(d.gpu, d.profile, d.start)]
        if len(spots) > 1:
            self._ranks[d.job] = len(spots)
        for rank, (gpu, profile, start) in enumerate(spots):
            gid = self.gid.get((d.node, gpu))
            if gid is None:
                self.store.event(d.job, "inventory-mismatch", node=d.node, gpu=gpu)
                continue
            key = rank_key(d.job, rank)
            if key in self.view.job_gpu:
                continue
            try:
                self.view.allocate(gid, key, profile, start)
            except PlacementConflict as exc:  # two records claim one slot: report, keep the first
                self.store.event(d.job, "view-conflict", error=str(exc))

    def _free(self, job: str) -> None:
        self._predicted.pop(job, None)  # a requeued job may get another size next time
        for rank in range(self._ranks.pop(job, 1)):
            if rank_key(job, rank) in self.view.job_gpu:
                self.view.release(rank_key(job, rank))

    def profiles_for(self, tag: JobTag) -> dict[str, str] | str:
        key = tag.text()
        if key not in self._profiles:  # the same request text recurs: translate it once
            self._profiles[key] = profiles_by_model(tag, {g.model for g in self.view.gpus})
        return self._profiles[key]

    def step(self) -> PassStats:
        t0 = time.perf_counter()
        stats = PassStats()
        listed_at = time.time()
        jobs = {j.job_id: j for j in self.batch.jobs()}
        self._jobs, self._arrays = jobs, None
        nodes = self.batch.nodes()
        for gone in [j for j in self._refused if j not in jobs]:
            del self._refused[gone]
        for gone in [j for j in self._why_waiting if j not in jobs]:
            del self._why_waiting[gone]
        self._watch_nodes(nodes)
        now = time.time()
        if self.config.prompt_slots or self._slots or now - self._slots_written < REQUEST_KEPT_S:
            stats.placed += self._adopt(jobs)  # (else no job can be bound to a slot: every one listed was adopted)
            self._free_withdrawn_slots(listed_at)
        pins = self._follow(jobs, stats, now)
        self._measure_room(nodes, jobs)
        waiting = sorted((j for j in jobs.values()
                          if j.managed and j.held and not j.held_by_user and self._needs_decision(j.job_id)),
                         key=lambda j: j.order)  # fmt: skip
        decided: list[Decision] = []
        chains: list[tuple[BatchJob, JobTag]] = []
        moldable: list[tuple[BatchJob, JobTag]] = []
        blocked: dict[str, str] | None = None  # the first job that fits nowhere: gaps must not delay it
        blocked_all: list[dict[str, str]] = []  # every rigid job that fits nowhere, in queue order
        for job in waiting:
            try:
                tag = parse_tag(job.admin_tag)
            except ValueError as exc:
                self.store.event(job.job_id, "bad-tag", error=str(exc))
                continue
            # a subjob's pin starts it at once (Slurm's begin time after a requeue would cost it its gap)
            if self._not_yet(job, now, begin=tag.atomize is None):
                continue
            if tag.instances > 1 and (tag.atomize is not None or tag.moldable is not None):
                self._waiting(job.job_id, "a job over several instances cannot be a subjob chain or moldable")
                continue  # never placeable: no reservation either
            if tag.atomize is not None:
                if self._unlinked(job, tag):
                    continue  # a chain's next job: it waits until the previous subjob has ended
                chains.append((job, tag))
                continue
            if tag.moldable is not None:
                moldable.append((job, tag))
                continue
            if not self._in_some_partition(job):
                continue  # never placeable here: no reservation either
            if self.config.prompt_slots and takes_slots(tag):
                self._asked[tag.text()] = now
            self._confine(job)
            d = self._place_multi(job, tag) if tag.instances > 1 else self._place(job, tag)
            if d is not None:
                decided.append(d)
            else:
                stats.waiting += 1
                profiles = self.profiles_for(tag)
                # the EASY reservation and live defrag hold one instance: a job over several instances
                # would get a reservation that cannot start it, so it waits without one
                if isinstance(profiles, dict) and tag.instances == 1:
                    blocked = blocked or profiles
                    blocked_all.append(profiles)
        self._confine(None)
        if moldable or chains:
            if self._balanced_out:  # their planners weigh GPU time on every node, as before
                self._floor = -math.inf
                self._apply_fences()
            timelines = self.timelines(jobs, now, blocked)
            kept_for_moldable: list[tuple[int, Hold]] = []
            if moldable:
                started, reserved = self._place_moldable(moldable, timelines, now, stats)
                if started and chains:
                    timelines = self.timelines(jobs, now, blocked)  # with the moldable starts
                kept_for_moldable = reserved if chains else []
                for gid, hold in kept_for_moldable:  # subjobs must not delay a waiting moldable job
                    timelines = with_hold(timelines, gid, hold)
                decided += started
            if chains:
                steers: list[Steer] = []
                if self.config.atomize.live_defrag and blocked_all:
                    timelines, steers = self._steer(jobs, now, blocked_all, kept_for_moldable, timelines)
                decided += self._offer(chains, timelines, now, steers)
        self._pin_and_release([*pins, *decided], stats)
        self._refill_slots(listed_at, crowded=stats.waiting > 0 or bool(chains))
        stats.seconds = time.perf_counter() - t0
        return stats

    def _make_slots(self, wanted: set[str], opened: list[SlotRecord], now: float) -> list[int]:
        """Up to ``prompt_slots`` open slots for each of ``wanted``, where the policy would place such a job now,
        at most an equal share of them on each node that may take a placement (a node's jobs wait for its
        CPUs: slots spread them); the new slots' ids."""
        if not wanted:
            return []
        up = {node for node, gids in self._gids_of.items() if any(g not in self.view.fenced for g in gids)}
        share = math.ceil(self.config.prompt_slots / max(len(up), 1))
        made: list[int] = []
        for request in sorted(wanted):
            profiles = self.profiles_for(parse_tag(request))
            mine = [s.node for s in opened if s.request == request]
            shut: list[int] = []  # GPUs fenced while this request's slots are made: their node has its share
            new: list[Placement] = []
            try:
                for node in up:
                    if mine.count(node) >= share:
                        shut += self._fence_node(node)
                while isinstance(profiles, dict) and len(mine) < self.config.prompt_slots:
                    p = self.policy.decide(self.view, PlacementRequest(slot_key(0), profiles, now, None))
                    if not isinstance(p, Placement):
                        break
                    self.view.allocate(p.gid, f"{slot_key(0)}.{len(new)}", p.profile, p.start)  # the next one sees it
                    new.append(p)
                    mine.append(p.host)
                    if mine.count(p.host) >= share:
                        shut += self._fence_node(p.host)
            finally:
                for gid in shut:
                    self.view.unfence(gid)
                for k in range(len(new)):
                    self.view.release(f"{slot_key(0)}.{k}")
            if not new:
                continue
            for slot in self.store.add_slots([(request, p.host, p.gpu_index, p.model, p.profile, p.start)
                                              for p in new]):  # fmt: skip
                self.view.allocate(self.gid[(slot.node, slot.gpu)], slot_key(slot.id), slot.profile, slot.start)
                self._slots[slot.id] = slot
                made.append(slot.id)
        return made

    def _fence_node(self, node: str) -> list[int]:
        """Fence the node's GPUs that are not fenced; those GPUs."""
        gids = [gid for gid in self._gids_of[node] if gid not in self.view.fenced]
        for gid in gids:
            self.view.fence(gid)
        return gids

    def _adopt(self, jobs: Mapping[str, BatchJob]) -> int:
        """Record the jobs job_submit.lua bound to a slot since the last pass (how many): the slot's spot becomes
        the job's. A slot this controller no longer holds (withdrawn and freed, or from a lost store) is taken
        when its spot is free; when it is not, a job not yet started is held and decided again."""
        self._bound &= jobs.keys()
        found: list[tuple[BatchJob, int, Placed, JobTag]] = []
        for job in jobs.values():  # a bound job held since (by its owner, say) too: placed, its holds are Slurm's
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
        if not found:
            return 0
        decided = []
        for job, slot, place, tag in found:
            held = self._slots.pop(slot, None)
            if held is not None:
                self.view.release(slot_key(slot))
            if takes_slots(tag):
                self._asked[tag.text()] = time.time()
            gid = self.gid.get((place.node, place.gpu))
            model = self.view.gpus[gid].model if gid is not None else held.model if held else ""
            decided.append((Decision(job.job_id, tag.text(), place.node, place.gpu, model, place.profile, place.start,
                                     DecisionState.RELEASED, f"slot-{self.config.policy}"), slot))  # fmt: skip
        self.store.record_bindings(decided)
        conflicts = []
        for (job, slot, place, _), (d, _) in zip(found, decided, strict=True):
            self._bound.add(job.job_id)
            if job.finished:
                continue
            gid = self.gid.get((place.node, place.gpu))
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
                self._requeue(d, job, why)
            except BatchError as exc:  # it started since: its node's agent makes no instance over another's
                log.warning("job %s: %s; holding it failed: %s", job.job_id, why, exc)
        return len(found)

    def _free_withdrawn_slots(self, listed_at: float) -> None:
        """Free the spots of the slots withdrawn long enough before this pass's listing that a job bound to one
        would be in it (and was adopted first): this pass's placements may take them."""
        gone = [s.id for s in self._slots.values()
                if s.withdrawn_at is not None and listed_at > s.withdrawn_at + WITHDRAWN_GRACE_S]  # fmt: skip
        if not gone:
            return  # most passes: no empty transaction
        for slot in gone:
            self.view.release(slot_key(slot))
            del self._slots[slot]
        self.store.drop_slots(gone)

    def _refill_slots(self, listed_at: float, crowded: bool) -> None:
        """Keep ``prompt_slots`` open slots for each request asked for lately, decided by the policy on what
        is left after this pass's placements, and publish them; none while a job waits for a spot (a slot's
        spot is one it could have) or a chain for a gap. A slot is withdrawn when its node may take no
        placement now (down, MIG off, or no CPU to give while another node has some)."""
        if not self._slots and not self.config.prompt_slots:
            return
        now = time.time()
        self._asked = {r: t for r, t in self._asked.items() if now - t < REQUEST_KEPT_S}
        wanted = set() if crowded or not self.config.prompt_slots else set(self._asked)
        opened = [s for s in self._slots.values() if s.withdrawn_at is None]
        withdrawn = [s.id for s in opened if s.request not in wanted or now - s.made_at > SLOT_LIFETIME_S
                     or self.gid[(s.node, s.gpu)] in self.view.fenced]  # fmt: skip
        made = self._make_slots(wanted, [s for s in opened if s.id not in withdrawn], now)
        if not (made or withdrawn) and now - self._slots_written < REWRITE_EVERY_S:
            return
        published = [s for s in self._slots.values() if s.withdrawn_at is None and s.id not in withdrawn]
        try:
            write_slots_file(self.config.slots_file, slots_text(published, listed_at, self._cpus, self._partitions))
        except OSError as exc:
            log.warning("cannot write the prompt slots to %s: %s", self.config.slots_file, exc)
            return
        written = time.time()
        self._slots_written = written
        if withdrawn:
            self.store.withdraw_slots(withdrawn, written)
            for slot in withdrawn:
                self._slots[slot] = replace(self._slots[slot], withdrawn_at=written)

    def _pin_and_release(self, decided: list[Decision], stats: PassStats) -> None:
        """Every decision is recorded already: a pin the batch system refuses is applied again next pass."""
        if not decided:
            return
        pins, unpinnable = [], {}
        for d in decided:  # one unreadable decision must not keep every other job from its pin
            try:
                pins.append(self._pin(d))
            except (KeyError, ValueError) as exc:
                unpinnable[d.job] = f"job {d.job}: its decision cannot be pinned: {exc}"
        try:
            failed = self.batch.pin_and_release(pins) if pins else {}
        except BatchError as exc:  # the batch system did not answer: no pin was refused
            failed = {p.job_id: str(exc) for p in pins}
        else:
            self._count_refusals(decided, failed)
        failed = {**failed, **unpinnable}
        for job, why in failed.items():
            stats.errors.append(why)
            log.warning("job %s: %s", job, why)
        released = [d.job for d in decided if d.job not in failed]
        self.store.set_states(released, DecisionState.RELEASED)
        stats.placed += len(released)

    def _count_refusals(self, decided: list[Decision], failed: Mapping[str, str]) -> None:
        """A pin the batch system refuses PIN_TRIES times in a row on one node (the job's own limits: an
        excluded node, a reservation) frees the job's slot, and the job is decided again elsewhere; that
        node is tried again for it after REFUSED_FOR_S. Without this the job was pinned there every pass
        and its slot stayed taken. Partitions are known beforehand and never tried (``_confine``)."""
        now = time.time()
        for d in decided:
            if d.job not in failed:
                self._refused.pop(d.job, None)
                continue
            if isinstance(failed[d.job], Unanswered):  # no answer: its fate is unknown, not a refusal
                continue
            tries = self._refused.setdefault(d.job, {}).setdefault(d.node, [0, 0.0])
            tries[0] += 1
            if tries[0] >= PIN_TRIES and self._still_unpinned(d):
                tries[:] = [0, now + REFUSED_FOR_S]
                self.store.event(d.job, "pin-refused", node=d.node, reason=failed[d.job], tries=PIN_TRIES)
                log.warning("job %s: %s refused its pin %d times (%s); it is decided again elsewhere", d.job,
                            d.node, PIN_TRIES, failed[d.job])  # fmt: skip
                self._free(d.job)
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

    def _refused_nodes(self, job: str) -> frozenset[str]:
        now = time.time()
        return frozenset(n for n, (_, until) in self._refused.get(job, {}).items() if until > now)

    def _watch_nodes(self, nodes: list[NodeStatus]) -> None:
        """Mark the nodes the batch system reports down; unmark one once its agent has reconciled since
        (its stray instances are gone, its slices known again). ``_measure_room`` applies the fences."""
        now = time.time()
        for node in nodes:
            if node.node not in self.config.nodes:
                continue
            agent = parse_agent_tag(node.agent_tag)
            if agent is not None and agent.problem is not None:
                self._record_node_problem(node.node, agent)
            if agent is not None and agent.mig_off != self._mig_off.get(node.node, ()):
                self._mig_off[node.node] = agent.mig_off
                self.store.event(None, MIG_OFF, node=node.node, gpus=list(agent.mig_off))
                if agent.mig_off:
                    log.warning("node %s: MIG mode is off on GPU(s) %s; nothing is placed there", node.node,
                                ", ".join(map(str, agent.mig_off)))  # fmt: skip
            if not node.up:
                if node.node not in self._down_since:
                    self._down_since[node.node] = now
                    self.store.event(None, "node-down", node=node.node)
            elif node.node in self._down_since and agent is not None \
                    and agent.reconciled >= self._down_since[node.node]:  # fmt: skip
                del self._down_since[node.node]
                self.store.event(None, "node-back", node=node.node, strays=agent.strays)

    def _record_node_problem(self, node: str, agent: AgentTag) -> None:
        """The agent's last problem as a ``node-problem`` event, once: keyed by the agent's start and
        problem count (a restart of the controller finds the key in the store)."""
        key = f"{agent.started:.3f}/{agent.problems}"
        if self._problems_seen is None:  # every node's, in one query, when the first problem is seen
            self._problems_seen = {n: e.get("key", "") for n, e in self.store.newest_node_events(NODE_PROBLEM).items()}
        if self._problems_seen.get(node) == key:
            return
        self._problems_seen[node] = key
        problem = agent.problem
        self.store.event(problem.job or None, NODE_PROBLEM, node=node, hook=problem.hook, reason=problem.reason,
                         key=key)  # fmt: skip
        log.warning("node %s %s%s: %s", node, problem.hook, f" job {problem.job}" if problem.job else "",
                    problem.reason)  # fmt: skip

    def _measure_room(self, nodes: list[NodeStatus], jobs: dict[str, BatchJob]) -> None:
        """CPUs each node can still give a job now: idle, less those of jobs released to it and not yet
        started. A job pinned to a node without them waits there while another node idles, so such
        nodes take no placement this pass (unless every node is full: see ``_apply_fences``)."""
        self._room = {n.node: n.cpus_idle for n in nodes if n.cpus_idle is not None and n.node in self.config.nodes}
        self._cpus = {n.node: n.cpus_total for n in nodes if n.cpus_total is not None}
        self._partitions = {n.node: frozenset(n.partitions) for n in nodes if n.partitions}
        self._outside_of, self._outside = {}, frozenset()
        for job in jobs.values():
            if job.state is JobState.PENDING and job.managed and job.job_id in self.view.job_gpu:
                node = self.view.gpus[self.view.job_gpu[job.job_id]].host
                if node in self._room:
                    self._room[node] -= job.cpus
        self._floor = None
        self._fits_nowhere = set()
        self._apply_fences()

    def _use_room(self, node: str, cpus: int) -> None:
        if node in self._room:
            self._room[node] -= cpus
            if self._room[node] <= 0 or self._overflow:  # overflowing, the nodes with the most room change
                self._apply_fences()

    def _outside_partitions(self, partitions: tuple[str, ...]) -> frozenset[str]:
        """The inventory's nodes in none of ``partitions`` (none for a job that names none, or where the
        batch system lists no partitions): Slurm refuses a pin there."""
        outside = self._outside_of.get(partitions)
        if outside is None:
            named = set(partitions)
            outside = frozenset(n for n, parts in self._partitions.items()
                                if partitions and n in self.config.nodes and not parts & named)  # fmt: skip
            self._outside_of[partitions] = outside
        return outside

    def _outside_of_job(self, job: BatchJob) -> frozenset[str]:
        """The nodes ``job`` may not go to now: outside its partitions, or refusing its pins lately."""
        outside = self._outside_partitions(job.partitions)
        return outside | self._refused_nodes(job.job_id) if job.job_id in self._refused else outside

    def _barred(self, outside: frozenset[str]) -> frozenset[int]:
        """The GPUs a job may not have later either, for its reservation: on the nodes ``outside`` its reach
        (``_outside_of_job``) or down, and those with MIG mode off (a node's lack of CPUs passes)."""
        hosts = outside | set(self._down_since)
        return frozenset(gid for host in hosts for gid in self._gids_of.get(host, ())) | self._fenced_off

    def _confine(self, job: BatchJob | None) -> None:
        """Fence the nodes outside ``job``'s partitions, and those that refused its pins lately, while it is
        decided (None: lift that fence)."""
        outside = self._outside_of_job(job) if job is not None else frozenset()
        if outside != self._outside:
            self._outside = outside
            self._apply_fences()

    def _apply_fences(self) -> None:
        """Fence the GPUs of nodes that are down or have no CPU to give, and of GPUs with MIG mode off.
        When every node is full, a job pinned now waits for a CPU on its node: it goes to the nodes with
        the most room (the fewest CPUs already promised beyond their idle ones), so that no node piles up
        jobs while another's CPUs free; ``_place`` tries nodes with less room when MIG fits on none of those."""
        up = set(self._room) - set(self._down_since) - self._outside
        full = {n for n in up if self._room[n] <= 0}
        self._overflow = bool(up) and full == up
        self._balanced_out = False
        if self._overflow:
            floor = max(self._room[n] for n in up) if self._floor is None else self._floor
            full = {n for n in up if self._room[n] < floor}
            self._balanced_out = bool(full)
        hosts = set(self._down_since) | full | self._outside
        off = {self.gid[(host, index)] for host, indexes in self._mig_off.items() for index in indexes
               if (host, index) in self.gid}  # fmt: skip
        changed = {gid for host in hosts ^ self._fenced_hosts for gid in self._gids_of.get(host, ())}
        for gid in changed | (off ^ self._fenced_off):  # only what changed: this runs for each placement
            fenced = gid in off or self.view.gpus[gid].host in hosts
            (self.view.fence if fenced else self.view.unfence)(gid)  # both idempotent
        self._fenced_hosts, self._fenced_off = hosts, off

    def _on_the_least_loaded_nodes_where_it_fits(self, decide: Callable[[], Decided], placed: type,
                                                  request: tuple) -> Decided:  # fmt: skip
        """``decide()`` on the view; when every node is full and MIG fits on none of the nodes with the most
        room, ``decide()`` on the nodes with the most room where MIG fits (the job then waits for a CPU
        there): a binary search over the up nodes' room, as a node's fit does not change with the floor and
        a lower floor only adds nodes. A ``request`` (profiles, instances) that fits on no up node is not
        tried there again this pass: a saturated cluster's long queue would otherwise open and close every
        GPU's fence for each job."""
        decision = decide()
        if not self._balanced_out or isinstance(decision, placed) or request in self._fits_nowhere:
            return decision
        up = set(self._room) - set(self._down_since) - self._outside
        most = max(self._room[n] for n in up)
        floors = sorted({self._room[n] for n in up if self._room[n] < most}, reverse=True)

        def at(floor: float) -> Decided:
            self._floor = floor
            self._apply_fences()
            return decide()

        try:
            decision = at(floors[-1])  # every node that is up
            if not isinstance(decision, placed):
                self._fits_nowhere.add(request)
                return decision
            low, high = 0, len(floors) - 1  # MIG fits at floors[high]; find the highest floor where it does
            while low < high:
                middle = (low + high) // 2
                tried = at(floors[middle])
                if isinstance(tried, placed):
                    high, decision = middle, tried
                else:
                    low = middle + 1
            return decision
        finally:
            self._floor = None
            self._apply_fences()

    def _unlinked(self, job: BatchJob, tag: JobTag) -> bool:
        """A job naming a known chain it is not (yet) linked to. One naming an unknown chain (a lost
        state store) starts a chain of its own; it resumes from the same checkpoints."""
        chain = tag.atomize.chain if tag.atomize else None
        if chain is None or chain == job.job_id or self.store.chain(job.job_id) is not None:
            return False
        known = self.store.chain(chain)
        if known is not None and known.state in CHAIN_OVER:
            self.store.event(job.job_id, "chain-job-cancelled", chain=chain, why=f"the chain is {known.state}")
            self.batch.cancel(job.job_id)
        return known is not None

    def _not_yet(self, job: BatchJob, now: float, begin: bool) -> bool:
        """Whether the batch system would not start it yet, so that a slot decided now would idle (said once, as
        a ``waiting`` event); its begin time only where ``begin``."""
        why = _why_not_yet(job, self._awaited, now, begin)
        if why is not None:
            self._waiting(job.job_id, why)
        return why is not None

    def _too_early(self, d: Decision, job: BatchJob, now: float) -> str | None:
        """What a placed job still waits for, over TAKE_BACK_AFTER_S, before the batch system may start it."""
        if job.not_before <= now + TAKE_BACK_AFTER_S and not job.after:
            return None  # the common case, without reading the tag
        return _why_not_yet(job, self._awaited, now + TAKE_BACK_AFTER_S, begin=parse_tag(d.request).atomize is None)

    def _awaited(self, after: After) -> list[BatchJob]:
        """This pass's records of what ``after`` names: the job, the array's task or every task of the array."""
        if not after.array:
            job = self._jobs.get(after.job_id)
            return [job] if job is not None else []
        if self._arrays is None:
            self._arrays = {}
            for j in self._jobs.values():
                if j.array:
                    self._arrays.setdefault(j.array, []).append(j)
        records = self._arrays.get(after.array, [])
        task = after.task
        if task is None:
            return records
        own = [r for r in records if r.array_tasks == (range(task, task + 1),)]  # Slurm looks there first
        return own or [r for r in records if any(task in tasks for tasks in r.array_tasks)]

    def _needs_decision(self, job: str) -> bool:
        d = self.store.decision(job)
        return d is None or d.state in DECIDABLE

    def _follow(self, jobs: dict[str, BatchJob], stats: PassStats, now: float) -> list[Decision]:
        """Carry every active decision forward from what the batch system shows; the decisions whose
        pin must be applied again (still held: a crash or a refused pin)."""
        again = []
        for d in self.store.decisions():
            job = jobs.get(d.job)
            try:
                if job is None or job.finished:
                    self._ended(d, job, jobs)
                    stats.ended += 1
                elif job.running:
                    self._running(d, job)
                elif (d.state == DecisionState.DECIDED or (d.state == DecisionState.RELEASED and not job.held)) \
                        and not job.held_by_user and (why := self._too_early(d, job, now)):  # fmt: skip
                    # its begin time or a dependency moved since the decision (its owner's update, an array's
                    # tasks failing, a requeue by the batch system): its slot would idle until then, or for ever.
                    # Held again after its release (by its owner, an operator or Slurm), it is theirs to release.
                    self._requeue(d, job, f"placed, it waits for {why}")
                elif job.held and d.state == DecisionState.DECIDED and not job.held_by_user:
                    again.append(d)
                elif self._subjob_taken_back(d, job, now):
                    self._subjob_interrupted(d, job, jobs)
                elif d.state == DecisionState.RUNNING or d.node in self._down_since or \
                        (job.held_by_user and d.state in (DecisionState.DECIDED, DecisionState.RELEASED)):
                    self._requeue(d, job, "held by its owner" if job.held_by_user
                                  else "the batch system requeued it" if d.state == DecisionState.RUNNING
                                  else f"its node {d.node} is down")  # fmt: skip
            except BatchError as exc:
                stats.errors.append(str(exc))
                log.warning("job %s: %s", d.job, exc)
        return again

    def _running(self, d: Decision, job: BatchJob) -> None:
        """A running job: its node's report (once), and the subjob's start."""
        if d.state in (DecisionState.DECIDED, DecisionState.RELEASED):
            self.store.set_state(d.job, DecisionState.RUNNING, node=job.node)
            if parse_tag(d.request).atomize is not None:
                self.store.start_subjob(d.job, job.start_time or time.time())
        if d.job in self._reported:
            return
        try:
            report = parse_report(job.admin_tag)
        except ValueError as exc:
            self.store.event(d.job, "bad-report", error=str(exc))
            self._reported.add(d.job)
            return
        if report is None:
            return
        self._reported.add(d.job)
        if report.kind == "requeue":
            self._prolog_problem(d, report)
            if parse_tag(d.request).atomize is not None:  # its runner exits at once: its chain goes on
                self.chains.interrupted(d, "not-started")
            self._requeue(d, job, report.reason)
            return
        # the node it runs on: the decided one, unless an operator moved it after the release (job_submit.lua
        # refuses its owner that); that node's agent then placed it on itself and reported "replaced"
        node = job.node if job.node in self.config.nodes else d.node
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
        self._free(d.job)
        ranks = report.ranks()
        if len(ranks) > 1:
            self._ranks[d.job] = len(ranks)
        for rank, r in enumerate(ranks):
            gid = self.gid.get((node, r.gpu))
            try:
                if gid is not None:
                    self.view.allocate(gid, rank_key(d.job, rank), r.profile, r.start)
            except PlacementConflict as exc:  # the view disagrees with the node: the node is right, report it
                self.store.event(d.job, "view-conflict", error=str(exc))
        gid = self.gid.get((node, report.gpu))
        model = self.view.gpus[gid].model if gid is not None else d.model  # the node may use another model's GPU
        moved = Decision(d.job, d.request, node, report.gpu, model, report.profile, report.start,
                         DecisionState.RUNNING, d.policy)  # fmt: skip
        spots = tuple((r.gpu, r.profile, r.start) for r in ranks) if len(ranks) > 1 else ()
        self.store.record_decision(moved, event="replaced", spots=spots)

    def _requeue(self, d: Decision, job: BatchJob, reason: str) -> None:
        """Back to the queue, held, to be decided again."""
        if not job.finished:
            if job.running or job.held_by_user:  # unpinned too: released later, it must wait for a new decision
                self._unplace(d)  # first: Slurm's requeue-hold is one its owner may release, unplaced it starts nothing
                self.batch.requeue_hold(d.job, reason)
            else:
                self.batch.hold(d.job)
                self._unplace(d)  # after: unplaced while it may start, it would start with no instance
        self._free(d.job)
        self._reported.discard(d.job)
        if self.store.instance(d.job) is not None:
            self.store.forget_instance(d.job, reason=reason)
        self.store.set_state(d.job, DecisionState.REQUEUED, reason=reason, node=d.node)

    def _unplace(self, d: Decision) -> None:
        """Its old placement and report out of a requeued job's tag: released by its owner, it must not start on
        the freed slot (job_submit.lua lets a placed job go), nor its old report be read again."""
        try:
            self.batch.set_job_tag(d.job, d.request)
        except BatchError as exc:  # the requeue stands; only that release stays possible
            log.warning("job %s: its placement could not be taken out of its tag: %s", d.job, exc)

    def _prolog_problem(self, d: Decision, report: NodeReport) -> None:
        self.store.event(d.job, NODE_PROBLEM, node=d.node, hook="prolog", reason=report.reason)
        log.warning("job %s: the prolog on %s could not place it: %s", d.job, d.node, report.reason)

    def _ended(self, d: Decision, job: BatchJob | None, jobs: Mapping[str, BatchJob]) -> None:
        if job is not None and d.job not in self._reported:  # it ended before a pass saw it run
            try:
                report = parse_report(job.admin_tag)
            except ValueError:
                report = None
            if report is not None and report.kind == "requeue":
                self._prolog_problem(d, report)
        self._free(d.job)
        self._reported.discard(d.job)
        if self.store.instance(d.job) is not None:  # the Epilog destroyed it (the node reconciles a leak)
            self.store.forget_instance(d.job, node=d.node)
        if parse_tag(d.request).atomize is not None:
            self._subjob_ended(d, job, jobs)
        else:
            self.store.set_state(d.job, DecisionState.ENDED, outcome=job.outcome if job else "gone")

    def _subjob_ended(self, d: Decision, job: BatchJob | None, jobs: Mapping[str, BatchJob]) -> None:
        """A chain's subjob ended. The runner has submitted the chain's next job (one batch job per
        subjob, held): link it when the chain goes on, cancel it when not. Without one (the runner
        could not submit it), the ended job itself is requeued held, as a fallback."""
        goes_on = self.chains.ended(d, job)
        record = self.store.chain(d.job)
        later = self._later_jobs(record, job, jobs) if record is not None else []
        outcome = job.outcome if job else "gone"
        linked = goes_on and bool(later)
        if linked:
            self.store.link_job(later[0].job_id, record.job)
            later = later[1:]  # more than one: cancelled below
        if goes_on and not linked:
            self.batch.requeue_hold(d.job, "the chain's next subjob")
            self._unplace(d)
            self.store.set_state(d.job, DecisionState.REQUEUED, outcome=outcome)
        else:
            self.store.set_state(d.job, DecisionState.ENDED, outcome=outcome)
        self._cancel_chain_jobs(record, later)

    @staticmethod
    def _subjob_taken_back(d: Decision, job: BatchJob, now: float) -> bool:
        """A subjob the batch system requeued after its start (the job waits again): seen running, or released
        and waiting, not held, for a begin time well ahead, where its pin had set it to its release (a pass
        may not have seen it run)."""
        started = d.state == DecisionState.RUNNING or (
            d.state == DecisionState.RELEASED and not job.held and job.not_before > now + REQUEUE_BEGIN_MARGIN_S)
        return started and parse_tag(d.request).atomize is not None

    def _subjob_interrupted(self, d: Decision, job: BatchJob, jobs: Mapping[str, BatchJob]) -> None:
        """A running subjob the batch system took back (an operator's requeue, its node's failure): it ended
        without its checkpoint, and its chain goes on from the last one. Stopped, the runner submitted the
        chain's next job: the chain goes on there, linked first, and this job is cancelled (a requeued job id
        may start without its Prolog). Without one (the runner died with its node), or held by its owner, the
        chain goes on in this job, decided again. Either way the job is held and unplaced first, as any
        requeued job."""
        record = self.chains.interrupted(d)
        later = self._later_jobs(record, job, jobs) if record is not None else []
        if later and not job.held_by_user:
            self.store.link_job(later[0].job_id, record.job)
            later = [job, *later[1:]]
        self._requeue(d, job, "the batch system requeued it")
        if record is not None:
            self._cancel_chain_jobs(record, later)

    def _cancel_chain_jobs(self, record: ChainRecord, jobs: list[BatchJob]) -> None:
        for job in jobs:
            self.store.event(job.job_id, "chain-job-cancelled", chain=record.job)
            self.batch.cancel(job.job_id)

    def _later_jobs(self, record: ChainRecord, ended: BatchJob | None,
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

    def _until(self, jobs: Mapping[str, BatchJob], now: float) -> Callable[[str], float]:
        """When each placed job is expected to free its instance: a chain subjob's window end (the
        runner checkpoints before it; Slurm's limit adds grace and USR1 margins, minutes at short
        windows), a moldable job's predicted end (less credit once overdue), else the end of
        Slurm's time limit (from now, before it starts)."""

        def until(key: str) -> float:
            job_id = job_of(key)  # every rank of a multi-instance job ends with the job
            job, seconds = jobs.get(job_id), self._predicted_s(job_id)
            running = job is not None and job.state is JobState.RUNNING
            if running and job.end_time > 0:
                limit = max(float(job.end_time), now)
            else:
                limit = now + job.time_limit_s if job is not None else math.inf
            started = float(job.start_time) if running and job.start_time > 0 else now
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
        if job_id not in self._predicted:
            d = self.store.decision(job_id)
            tag = parse_tag(d.request) if d is not None else None
            request = tag.moldable_request() if tag is not None else None
            self._predicted[job_id] = request.candidates(get_model(d.model)).get(d.profile) if request else None
        return self._predicted[job_id]

    def timelines(self, jobs: Mapping[str, BatchJob], now: float,
                  blocked: Mapping[str, str] | None) -> list[GpuTimeline]:  # fmt: skip
        """Every GPU's holds: instances until their job's expected end, and a reservation for the
        first queued job that fits nowhere now (``blocked``: model -> profile); fenced GPUs have none."""
        out = cluster_timelines(self.view, self._until(jobs, now))
        reserved = reservation(out, blocked, now, self.config.atomize.offer_horizon_s) if blocked else None
        return with_hold(out, *reserved) if reserved else out

    def _chain_masks(self) -> dict[int, int]:
        """The slices chain subjobs hold now (decided or running), per GPU."""
        out: dict[int, int] = {}
        for gpu in self.view.gpus:
            model = get_model(gpu.model)
            for key, (profile, start) in gpu.instances.items():
                if self.store.chain(job_of(key)) is not None:
                    out[gpu.gid] = out.get(gpu.gid, 0) | model.profile(profile).window(start)
        return out

    def _steer(self, jobs: Mapping[str, BatchJob], now: float, blocked: list[dict[str, str]],
               moldable: list[tuple[int, Hold]],
               timelines: list[GpuTimeline]) -> tuple[list[GpuTimeline], list[Steer]]:  # fmt: skip
        """Live defragmentation: the windows kept from chain grants for rigid jobs blocked by
        fragmentation (:func:`~mig_batch.atomize.defrag.keep_windows`). When the first blocked job
        gets one, it replaces that job's EASY reservation in the timelines."""
        cfg = self.config.atomize
        plain = self.timelines(jobs, now, None)
        for gid, hold in moldable:
            plain = with_hold(plain, gid, hold)
        kept = keep_windows(plain, self._chain_masks(), blocked, now, cfg.defrag_max_steered, cfg.offer_horizon_s)
        steers = [k for k in kept if k is not None]
        for s in steers:
            log.debug("live defrag: GPU %d window %#x kept from chain grants from %.0f", s.gid, s.window, s.opens)
        return (plain if kept[0] is not None else timelines), steers

    def _place_moldable(self, waiting: list[tuple[BatchJob, JobTag]], timelines: list[GpuTimeline], now: float,
                        stats: PassStats) -> tuple[list[Decision], list[tuple[int, Hold]]]:  # fmt: skip
        """The size with the earliest predicted finish for each waiting moldable job, in queue order;
        the ones whose best start is now are decided (the caller pins and releases them) and take their
        CPUs from their node's room, the others may hold a reservation (returned with the decisions)."""
        cfg = self.config.moldable
        planner = MoldablePlanner(self.view, timelines, now, self.policy, cfg.min_gain, cfg.max_reservations)
        decided = []
        barred_of: dict[frozenset[str], frozenset[int]] = {}  # by the nodes outside a job's reach: most share them
        for job, tag in waiting:
            times = self._moldable_times(tag)
            if isinstance(times, str):
                self.store.event(job.job_id, "unplaceable", error=times)
                continue
            if not self._in_some_partition(job):
                continue
            self._confine(job)  # self._outside: the nodes outside its reach
            barred = barred_of.get(self._outside)
            if barred is None:
                barred = barred_of[self._outside] = self._barred(self._outside)
            choice = planner.decide(MoldableJob(job.job_id, times), barred)
            log.debug("moldable job %s: %s", job.job_id, choice)
            if choice.placement is None:
                stats.waiting += 1
                continue
            self._predicted[job.job_id] = choice.seconds
            decided.append(self._decide(job, tag, choice.placement, f"moldable-{self.config.policy}"))
            self._use_room(choice.placement.host, job.cpus)  # a node it fills takes no more of this pass's starts
        self._confine(None)
        return decided, planner.reserved

    def _moldable_times(self, tag: JobTag) -> dict[str, dict[str, float]] | str:
        key = tag.text()
        if key not in self._moldable:  # the same request text recurs: translate it once
            self._moldable[key] = moldable_times(tag, {g.model for g in self.view.gpus})
        return self._moldable[key]

    def _offer(self, waiting: list[tuple[BatchJob, JobTag]], timelines: list[GpuTimeline], now: float,
               steers: list[Steer]) -> list[Decision]:  # fmt: skip
        """Offer gaps to the waiting chains; the granted subjobs, recorded (the caller pins and releases)."""
        candidates = []
        for job, tag in waiting:
            if not self._in_some_partition(job):
                continue
            record = self.store.chain(job.job_id)
            if record is None:
                record = self.chains.register(job, tag, self._declared_mib(tag))
            if self.store.latest_chain_job(record.job) not in (None, job.job_id):
                self._cancel_left_behind(record, job)  # only a chain's latest job runs its subjobs
            elif record.state in ("waiting", "granted"):
                candidates.append((job, tag, record))
        hosts = {job.job_id: frozenset(self.config.nodes) - outside for job, _, _ in candidates
                 if (outside := self._outside_of_job(job) | self._skips_prolog(job, now))}  # fmt: skip
        return [d for d, _ in self.chains.offer(candidates, timelines, now, steers, self._take_room, hosts)]

    def _cancel_left_behind(self, record: ChainRecord, job: BatchJob) -> None:
        """An earlier job of a chain still waiting (its cancel was refused when the chain went on in a later
        one): cancelled again, each pass until the batch system takes it."""
        try:
            self._cancel_chain_jobs(record, [job])
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

    def _take_room(self, job: BatchJob, node: str) -> bool:
        """Whether ``node`` may take ``job`` in this pass, its CPUs then taken: one of its partitions, and not
        a node this pass has filled unless every node is full (the job then waits for a CPU wherever it goes)."""
        if node in self._outside_of_job(job):
            return False
        if not self._overflow and self._room.get(node, 1) <= 0:
            return False
        self._use_room(node, job.cpus)
        return True

    def _declared_mib(self, tag: JobTag) -> float:
        """The chain's own peak estimate: its memory request, or the smallest profile it asked for."""
        request = tag.request()
        if request.memory_mib:
            return float(request.memory_mib)
        profiles = self.profiles_for(tag)
        if isinstance(profiles, str):
            return math.inf
        return float(min(get_model(m).profile(p).memory_mib for m, p in profiles.items()))

    def _place(self, job: BatchJob, tag: JobTag) -> Decision | None:
        profiles = self.profiles_for(tag)
        if isinstance(profiles, str):
            self.store.event(job.job_id, "unplaceable", error=profiles)
            return None
        now, limit = time.time(), job.time_limit_s
        end = now + limit if 0 < limit < math.inf else None  # the time limit bounds the end (end-aware policies)
        request = PlacementRequest(job.job_id, profiles, now, end)
        decision = self._on_the_least_loaded_nodes_where_it_fits(lambda: self.policy.decide(self.view, request),
                                                                 Placement, (frozenset(profiles.items()), 1,
                                                                             self._outside))
        if not isinstance(decision, Placement):
            return None
        self._use_room(decision.host, job.cpus)
        return self._decide(job, tag, decision, self.config.policy)

    def _place_multi(self, job: BatchJob, tag: JobTag) -> Decision | None:
        """A job over several instances: the node and every rank's spot in one decision, or it stays held
        with the reason (recorded once per change of reason)."""
        profiles = self.profiles_for(tag)
        if isinstance(profiles, str):
            self.store.event(job.job_id, "unplaceable", error=profiles)
            return None
        decision = self._on_the_least_loaded_nodes_where_it_fits(
            lambda: self.multi.decide(self.view, profiles, tag.instances),
            MultiPlacement,
            (frozenset(profiles.items()), tag.instances, self._outside),
        )
        if not isinstance(decision, MultiPlacement):
            self._waiting(job.job_id, decision.reason)
            return None
        self._why_waiting.pop(job.job_id, None)
        self._use_room(decision.host, job.cpus)
        return self._decide_multi(job, tag, decision, f"multi-{self.multi.name}")

    def _in_some_partition(self, job: BatchJob) -> bool:
        """Whether a node of the inventory is in one of the job's partitions; if not, it waits, said once."""
        if not job.partitions or len(self._outside_partitions(job.partitions)) < len(self.config.nodes):
            return True
        self._waiting(job.job_id, f"none of mig_batch's nodes is in its partition(s) {','.join(job.partitions)}")
        return False

    def _waiting(self, job: str, reason: str) -> None:
        if self._why_waiting.get(job) != reason:
            self._why_waiting[job] = reason
            self.store.event(job, "waiting", reason=reason)
            log.info("job %s waits: %s", job, reason)

    def _decide_multi(self, job: BatchJob, tag: JobTag, p: MultiPlacement, policy: str) -> Decision:
        """Take every spot in the view and record them in one transaction, before Slurm hears of it."""
        taken = []
        try:
            for rank, spot in enumerate(p.spots):
                self.view.allocate(spot.gid, rank_key(job.job_id, rank), spot.profile, spot.start)
                taken.append(rank_key(job.job_id, rank))
        except PlacementConflict:
            for key in taken:  # all or none, in the view too
                self.view.release(key)
            raise
        self._ranks[job.job_id] = len(p.spots)
        first = p.spots[0]
        d = Decision(job.job_id, tag.text(), p.host, first.gpu_index, p.model, first.profile, first.start, "decided",
                     policy)  # fmt: skip
        self.store.record_decision(d, spots=tuple((s.gpu_index, s.profile, s.start) for s in p.spots))
        return d

    def _decide(self, job: BatchJob, tag: JobTag, p: Placement, policy: str) -> Decision:
        """Take the placement in the view and record it, before Slurm hears of it."""
        self.view.allocate(p.gid, job.job_id, p.profile, p.start)
        d = Decision(job.job_id, tag.text(), p.host, p.gpu_index, p.model, p.profile, p.start, "decided", policy)
        self.store.record_decision(d)
        return d

    def _pin(self, d: Decision) -> Pin:
        tag = parse_tag(d.request)
        limit = window = run = None
        if tag.atomize is not None:  # a subjob: its window, and Slurm's limit as the runner's backstop
            subjobs = self.store.subjobs(d.job)
            if subjobs:
                window, run = subjobs[-1].window_s, subjobs[-1].run
                limit = self.chains.time_limit_min(window)
        spots = tuple(self.store.spots(d.job)) if tag.instances > 1 else ()
        slices = sum(self._spot_model(d, g).profile(p).memory_slices for g, p, _ in spots) if spots else \
            get_model(d.model).profile(d.profile).memory_slices  # fmt: skip
        return Pin(
            d.job, d.node, placed_tag(tag, Placed(d.node, d.gpu, d.profile, d.start, window, run, spots)), limit, slices
        )

    def _spot_model(self, d: Decision, gpu: int) -> GpuModel:
        """The model of a rank's GPU (a decision recorded before jobs kept to one model may mix them)."""
        gid = self.gid.get((d.node, gpu))
        return get_model(self.view.gpus[gid].model if gid is not None else d.model)

    def prune(self, now: float) -> None:
        """Forget the ended jobs older than the configured retention: after the first pass that listed the
        jobs (abandoned chains are judged by it), then every ``PRUNE_EVERY_S``. About ``PRUNE_BUDGET_S`` of a
        pass goes to it until it is done (an old store's first prune takes several). A failure is logged and
        tried again ``PRUNE_EVERY_S`` later: upkeep must not hold up placement."""
        days = self.config.retention_days
        if not days or now - self._pruned < PRUNE_EVERY_S:
            return
        try:
            gone, done = self.store.prune(now - days * 86400, live=self._jobs.keys(), budget_s=PRUNE_BUDGET_S)
        except Exception:
            log.exception("pruning the store failed; tried again in %.0f s", PRUNE_EVERY_S)
            self._pruned = now
            return
        if done:
            self._pruned = now
        if any(gone.values()):
            log.info("forgot what ended over %g days ago: %s", days, ", ".join(f"{n} {t}" for t, n in gone.items()))

    def run(self, stop_after: float | None = None) -> None:
        deadline = None if stop_after is None else time.monotonic() + stop_after
        while deadline is None or time.monotonic() < deadline:
            try:
                stats = self.step()
                if stats.placed or stats.ended:
                    log.info("pass %.1f ms: placed %d, ended %d, waiting %d", stats.seconds * 1e3, stats.placed,
                             stats.ended, stats.waiting)  # fmt: skip
                self.prune(time.time())  # with the jobs this pass listed
            except BatchError as exc:
                log.warning("pass failed: %s", exc)
            except Exception:  # a bug in one pass must not stop placement for everyone: log it, go on
                log.exception("pass failed")
            time.sleep(self.config.poll_interval_s)


def _why_not_yet(job: BatchJob, awaited: Callable[[After], list[BatchJob]], now: float,
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
            if not after.array:
                ended = f"that job ended {records[0].outcome}"
            elif after.awaits is Awaits.SUCCESS:
                failed = next(r for r in records if not r.succeeded)
                ended = f"its task {failed.job_id} ended {failed.outcome}"
            else:
                ended = f"every task of it ended {records[0].outcome}"
            return f"its dependency on job {after.job_id}, which can never be met: {ended}"
    return None
