"""The controller loop: place held managed jobs, pin and release them, follow them to the end.

It speaks to the batch system only through the seam (:mod:`mig_batch.batch.system`), and the nodes
answer through it too: the node agent appends its report to the job's operator-only tag (instance
made, made elsewhere on the node, or nothing fits), and publishes its own state on the node.

A pass is a sequence of phases over one snapshot of the batch system (:class:`PassSnapshot`), each in a
room of its own under controller/:
  read    the jobs and nodes, once, with ``now`` from the injected clock             (snapshot.py)
  watch   nodes down and back, MIG mode off, agents' problems                         (fences.py)
  adopt   jobs job_submit.lua bound to a prompt slot                                  (slots.py)
  follow  every decision's life cycle: running, ended, requeued, pinned again        (follow.py)
  fence   each node's room; GPUs no placement may take now                            (fences.py)
  place   rigid and multi-instance jobs (place.py), moldable jobs (moldable.py) and subjob chains in
          gaps (chain_jobs.py, chains.py) on the timelines (timelines.py); each decision is recorded in
          the store before the batch system hears of it
  act     pin and release (act.py); prompt slots refilled and published (slots.py); an array's next
          tasks split off its record, to be placed next pass (arrays.py)

Crash-safe by construction: a decision is recorded before it is acted on, and every step is idempotent,
so after a crash (or SIGKILL) a restart resumes from the store. The in-memory view (a placement
``Cluster``, :mod:`.ledger`) is rebuilt from the store.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mig_batch.atomize.defrag import Steer
from mig_batch.atomize.gaps import with_hold
from mig_batch.batch.states import DECIDABLE
from mig_batch.batch.system import BatchError, BatchJob, BatchSystem
from mig_batch.batch.tags import JobTag, parse_tag
from mig_batch.config import SiteConfig
from mig_batch.controller.act import Pinning
from mig_batch.controller.arrays import ArrayTasks
from mig_batch.controller.chain_jobs import ChainJobs
from mig_batch.controller.chains import ChainDriver
from mig_batch.controller.fences import Fences, PinRefusals
from mig_batch.controller.follow import Follower
from mig_batch.controller.health import Health
from mig_batch.controller.ledger import ViewLedger
from mig_batch.controller.metrics import ControllerMetrics
from mig_batch.controller.moldable import MoldablePlacer
from mig_batch.controller.outcomes import PassOutcomes
from mig_batch.controller.place import Placer
from mig_batch.controller.slots import PromptSlots
from mig_batch.controller.snapshot import PassSnapshot
from mig_batch.controller.timelines import Timelines
from mig_batch.controller.translations import Translations
from mig_batch.controller.waits import WaitNotes, why_not_yet
from mig_batch.placement.multi import MultiPolicy
from mig_batch.placement.policies import make_policy
from mig_batch.placement.timelines import GpuTimeline, Hold
from mig_batch.state import Decision, Store

log = logging.getLogger("mig-batchd")
PRUNE_EVERY_S = 3600.0  # how often mig-batchd forgets what ended longer ago than retention_days
PRUNE_BUDGET_S = 0.2  # of a pass, past its first transaction (each pass makes progress)


@dataclass
class PassStats:
    seconds: float = 0.0
    placed: int = 0
    waiting: int = 0
    ended: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class Queue:
    """This pass's waiting jobs by how they are placed, after the rigid ones were tried."""

    chains: list[tuple[BatchJob, JobTag]] = field(default_factory=list)
    moldable: list[tuple[BatchJob, JobTag]] = field(default_factory=list)
    blocked: list[dict[str, str]] = field(default_factory=list)  # every rigid job that fits nowhere, in order


class Controller:
    def __init__(self, config: SiteConfig, store: Store, batch: BatchSystem,
                 clock: Callable[[], float] = time.time, metrics: ControllerMetrics | None = None):  # fmt: skip
        if not config.nodes:
            raise ValueError(f"{config.path}: no nodes in the inventory; the controller has nothing to place on")
        self.config, self.store, self.batch, self.clock = config, store, batch, clock
        inventory = frozenset(config.nodes)
        self.policy = make_policy(config.policy)
        self.ledger = ViewLedger(config.nodes, store)
        self.view, self.gid = self.ledger.view, self.ledger.gid
        self.translations = Translations({g.model for g in self.view.gpus})
        self.chains = ChainDriver(config, store, self.view)
        self.refusals = PinRefusals()
        self.fences = Fences(config.nodes, store, self.ledger, self.refusals)
        self.waits = WaitNotes(store)
        self.chain_jobs = ChainJobs(store, batch, self.chains, self.fences, self.translations, self.waits, inventory)
        self.follower = Follower(store, batch, self.ledger, self.fences, self.chains, self.chain_jobs, inventory)
        self.placer = Placer(store, self.ledger, self.fences, self.policy, MultiPolicy(config.multi_policy),
                             self.translations, self.waits, config.policy)  # fmt: skip
        self.moldable = MoldablePlacer(store, self.ledger, self.fences, self.placer, self.policy, self.translations,
                                       config.moldable, config.policy)  # fmt: skip
        self.planned = Timelines(self.ledger, store, config.atomize)
        self.pinning = Pinning(store, batch, self.ledger, self.chains, self.refusals)
        self.arrays = ArrayTasks(store, batch)
        self._pruned = -math.inf  # when the store was last pruned to the end
        self._jobs: Mapping[str, BatchJob] = {}  # the last pass's listing (pruning keeps their records)
        self.snapshot: PassSnapshot | None = None  # the last pass's (what the metrics count)
        self.health = Health(config.poll_interval_s)
        self.outcomes = PassOutcomes(store, self.health, clock, metrics)
        for d in store.decisions():
            self.ledger.occupy(d)
        self.slots = PromptSlots(config, store, self.ledger, self.fences, self.policy, self.translations,
                                 self.follower, clock)  # fmt: skip

    def profiles_for(self, tag: JobTag) -> dict[str, str] | str:
        return self.translations.profiles(tag)

    def timelines(self, jobs: Mapping[str, BatchJob], now: float,
                  blocked: Mapping[str, str] | None) -> list[GpuTimeline]:  # fmt: skip
        return self.planned.of(jobs, now, blocked)

    def step(self) -> PassStats:
        t0 = time.perf_counter()
        stats = PassStats()
        snapshot = self._read()
        self.fences.watch(snapshot.nodes, snapshot.now)
        if self.slots.in_use(snapshot.now):
            stats.placed += self.slots.adopt(snapshot)  # (else no job can be bound to a slot)
            self.slots.free_withdrawn(snapshot.listed_at)
        pins, stats.ended = self.follower.follow(snapshot, stats.errors)
        self.fences.measure(snapshot)
        decided, queue = self._place_rigid(snapshot, stats)
        decided += self._place_planned(snapshot, queue, stats)
        stats.placed += self.pinning.pin_and_release([*pins, *decided], snapshot.now, stats.errors)
        self.waits.publish(self.batch, snapshot.jobs, [d.job for d in decided])
        self.arrays.split(snapshot, stats.errors)  # the next pass places the tasks split off
        self.slots.refill(snapshot, crowded=stats.waiting > 0 or bool(queue.chains))
        stats.seconds = time.perf_counter() - t0
        return stats

    def _read(self) -> PassSnapshot:
        """The read phase: the jobs and nodes, once; what the rooms keep per job is kept for listed jobs."""
        listed_at = self.clock()
        jobs = {j.job_id: j for j in self.batch.jobs()}
        nodes = tuple(self.batch.nodes())
        self._jobs = jobs
        self.refusals.forget_gone(jobs)
        self.waits.keep_only(jobs)
        self.snapshot = PassSnapshot(listed_at, self.clock(), jobs, nodes, frozenset(self.config.nodes))
        return self.snapshot

    def _place_rigid(self, snapshot: PassSnapshot, stats: PassStats) -> tuple[list[Decision], Queue]:
        """The rigid jobs placed in queue order; the chains and moldable jobs sorted out for the planners."""
        back = self.arrays.held_back(snapshot)
        waiting = sorted((j for j in snapshot.jobs.values()
                          if j.managed and j.held and not j.held_by_user and j.job_id not in back
                          and self._needs_decision(j.job_id)), key=lambda j: j.order)  # fmt: skip
        decided: list[Decision] = []
        queue = Queue()
        with self.fences.confinement(snapshot.now) as confine:
            for job in waiting:
                try:
                    d = self._sort_or_place(job, snapshot, queue, confine)
                except BatchError as exc:  # one job's failed call must not stop the pass
                    stats.errors.append(f"job {job.job_id}: {exc}")
                    log.warning("job %s: %s", job.job_id, exc)
                    continue
                if isinstance(d, Decision):
                    decided.append(d)
                elif d is _WAITS:
                    stats.waiting += 1
        return decided, queue

    def _sort_or_place(self, job: BatchJob, snapshot: PassSnapshot, queue: Queue,
                       confine: Callable[[BatchJob], frozenset[str]]) -> Decision | object | None:  # fmt: skip
        """A rigid job's decision (or ``_WAITS`` where it fits nowhere now); chains and moldable jobs go
        to ``queue``; None for a job that is not placed this pass for a reason recorded."""
        try:
            tag = parse_tag(job.admin_tag)
        except ValueError as exc:
            self.store.event(job.job_id, "bad-tag", error=str(exc))
            return None
        # a subjob's pin starts it at once (Slurm's begin time after a requeue would cost it its gap)
        if (why := why_not_yet(job, snapshot.awaited, snapshot.now, begin=tag.atomize is None)) is not None:
            self.waits.note(job.job_id, why)  # a spot decided now would idle
            return None
        if tag.instances > 1 and (tag.atomize is not None or tag.moldable is not None):
            self.waits.note(job.job_id, "a job over several instances cannot be a subjob chain or moldable")
            return None  # never placeable: no reservation either
        if tag.atomize is not None:
            if not self.chain_jobs.unlinked(job, tag):  # a chain's next job waits until the previous subjob ended
                queue.chains.append((job, tag))
            return None
        if tag.moldable is not None:
            queue.moldable.append((job, tag))
            return None
        if (why := self.fences.partition_problem(job)) is not None:
            self.waits.note(job.job_id, why)
            return None  # never placeable here: no reservation either
        self.slots.asked(tag, snapshot.now)
        confine(job)
        d = self.placer.place_multi(job, tag) if tag.instances > 1 else self.placer.place(job, tag, snapshot.now)
        if d is not None:
            return d
        profiles = self.profiles_for(tag)
        # the EASY reservation and live defrag hold one instance: a job over several instances would get a
        # reservation that cannot start it, so it waits without one
        if isinstance(profiles, dict) and tag.instances == 1:
            queue.blocked.append(profiles)
        return _WAITS

    def _place_planned(self, snapshot: PassSnapshot, queue: Queue, stats: PassStats) -> list[Decision]:
        """Moldable jobs, then subjob chains in the gaps left, on the GPUs' timelines."""
        if not (queue.moldable or queue.chains):
            return []
        self.fences.open_every_node_with_room()  # their planners weigh GPU time on every node
        jobs, now = snapshot.jobs, snapshot.now
        blocked = queue.blocked[0] if queue.blocked else None  # the first job that fits nowhere: gaps must not delay it
        timelines = self.timelines(jobs, now, blocked)
        decided: list[Decision] = []
        kept_for_moldable: list[tuple[int, Hold]] = []
        if queue.moldable:
            started, reserved, waiting = self.moldable.place(queue.moldable, timelines, now)
            stats.waiting += waiting
            if started and queue.chains:
                timelines = self.timelines(jobs, now, blocked)  # with the moldable starts
            kept_for_moldable = reserved if queue.chains else []
            for gid, hold in kept_for_moldable:  # subjobs must not delay a waiting moldable job
                timelines = with_hold(timelines, gid, hold)
            decided += started
        if queue.chains:
            steers: list[Steer] = []
            if self.config.atomize.live_defrag and queue.blocked:
                timelines, steers = self.planned.steer(jobs, now, queue.blocked, kept_for_moldable, timelines)
            decided += self.chain_jobs.offer(queue.chains, timelines, now, steers)
        return decided

    def _needs_decision(self, job: str) -> bool:
        d = self.store.decision(job)
        return d is None or d.state in DECIDABLE

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

    def run(self, stop_after: float | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        """Passes until ``stop_after`` seconds (None: for ever); a failing pass backs off to a cap, with one log
        line and one event when the passes fail and when they succeed again (``PassOutcomes``)."""
        deadline = None if stop_after is None else time.monotonic() + stop_after
        while deadline is None or time.monotonic() < deadline:
            try:
                stats = self.step()
                if stats.placed or stats.ended:
                    log.info("pass %.1f ms: placed %d, ended %d, waiting %d", stats.seconds * 1e3, stats.placed,
                             stats.ended, stats.waiting)  # fmt: skip
                self.outcomes.good(stats.seconds, stats.placed, stats.ended, self.snapshot, self.view,
                                   self.waits._why)  # fmt: skip
                self.prune(time.time())  # with the jobs this pass listed; the store stamps ends with the machine's time
            except BatchError as exc:
                self.outcomes.failed(str(exc), batch=True)
            except Exception as exc:  # a bug in one pass must not stop placement for everyone: log it, go on
                self.outcomes.failed(f"{type(exc).__name__}: {exc}", batch=False)
            sleep(self.outcomes.delay())


_WAITS = object()  # a rigid job that fits nowhere now
