"""``simulate atomize``: SJA against monolithic FIFO+backfill and moldable placement (SJA §5.1).

One cluster of MIG GPUs, one seeded workload (:mod:`mig_batch.sim.atomize_workloads`: synthetic, or
a window of the Alibaba 2023 trace) of two kinds of jobs:
* **rigid** jobs (inference, batch): a profile, a run time, a time limit (the run time x U[1, 2]);
* **training** jobs: checkpointable work (seconds), a *declared* peak memory (what a user asks for,
  usually far above the real use) and a true memory behaviour (a base level, noise and an early spike
  with probability 0.3), shared by the jobs of one application so that history is pooled per
  application (as a site would key it).

Schedulers (all place with MFI, all queue rigid jobs FIFO with EASY backfill on time limits):
* ``fifo-backfill``: a training job is one monolithic block on the smallest profile covering its
  declared memory;
* ``moldable``: a training job may take any profile covering its declared memory, faster on more
  compute slices (time ~ work x (3 / slices)^0.6), and takes the one that finishes first among those
  free when its turn comes;
* ``moldable-eft``: the same sizes, chosen by :mod:`mig_batch.placement.moldable` (the controller's
  code): the earliest predicted finish, waiting with a reservation for a faster slot when that pays;
* ``sja``: training jobs are chains: at every event the free gaps are offered
  (:mod:`mig_batch.atomize`, the controller's code), chains answer with the smallest profile covering
  the risk-bounded bound of their application's history (the declared memory until it has
  ``min_history`` subjobs), and the grant policy picks. Each subjob pays ``checkpoint_s`` of
  save/restore; a subjob whose true peak exceeds its instance is killed at that moment (an
  interruption: its work since the last checkpoint is wasted).
* ``sja-defrag``: ``sja`` with live defragmentation at checkpoint boundaries
  (:mod:`mig_batch.atomize.defrag`): each grant goes to the spot that keeps the most useful capacity
  free, and windows that only chain subjobs keep from a waiting rigid job are steered clear of.

Besides waits, each run measures the **external-fragmentation delay** (Flex-MIG §5: the waiting time
of jobs that could not be scheduled although the cluster had enough free capacity in total): the
time each queued rigid job spends fitting on no GPU while the free memory slices of all GPUs add up
to its profile's. Flex-MIG does not say whether a job held back by queue order counts; here only
jobs that fit nowhere count, so queue order alone is not fragmentation.

Pure code (no I/O): the CLI prints, plots and writes JSON.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mig_batch.atomize.defrag import Steer, choose_spot, keep_windows, offer_groups, with_steering
from mig_batch.atomize.gaps import (
    Gap,
    GpuTimeline,
    Hold,
    cluster_gaps,
    cluster_timelines,
    reservation,
    start_in_gap,
    with_hold,
)
from mig_batch.atomize.profiles import MemoryProfile, Trajectory, min_history
from mig_batch.atomize.protocol import Chain, Reply, negotiate
from mig_batch.mig.models import get_model
from mig_batch.placement.base import Placement, PlacementRequest
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.moldable import MoldableJob, MoldablePlanner
from mig_batch.placement.policies import make_policy
from mig_batch.sim.atomize_workloads import (
    AtomizeSetup,
    Job,
    from_trace,
    generate,
    moldable_time,
    offered_load,
    subjob_memory,
)
from mig_batch.sim.traces import TracePod

SCHEDULERS = ("fifo-backfill", "moldable", "moldable-eft", "sja", "sja-defrag")
DEFAULT_SCHEDULERS = SCHEDULERS[:-1]


@dataclass
class Metrics:
    scheduler: str
    finished: int = 0
    rejected: int = 0
    unfinished: int = 0
    waits: list[float] = field(default_factory=list)
    training_jct: list[float] = field(default_factory=list)
    used_mib_s: float = 0.0  # true GPU memory in use x seconds
    allocated_mib_s: float = 0.0
    interruptions: int = 0
    wasted_s: float = 0.0  # work lost to interruptions
    overhead_s: float = 0.0  # checkpoint save/restore
    subjobs: int = 0
    makespan: float = 0.0
    frag_delay_s: float = 0.0  # external-fragmentation delay, summed over rigid jobs
    frag_blocked: int = 0  # rigid jobs that were ever blocked by fragmentation
    rigid_jobs: int = 0
    whole_gpu_waits: list[float] = field(default_factory=list)  # rigid jobs asking for a whole GPU
    blocked_waits: list[float] = field(default_factory=list)  # rigid jobs ever blocked by fragmentation
    steered: int = 0  # windows kept clear of chain grants (sja-defrag)
    moved: int = 0  # grants placed elsewhere than the offered gap (sja-defrag)

    def summary(self, capacity_mib: float) -> dict[str, float]:
        waits = np.array(self.waits) if self.waits else np.zeros(1)
        span = max(self.makespan, 1.0)
        return {
            "finished": self.finished, "rejected": self.rejected, "unfinished": self.unfinished,
            "mean_wait_h": float(waits.mean() / 3600), "p95_wait_h": float(np.percentile(waits, 95) / 3600),
            "training_mean_jct_h": float(np.mean(self.training_jct) / 3600) if self.training_jct else 0.0,
            "memory_util": self.used_mib_s / (capacity_mib * span),
            "allocated_util": self.allocated_mib_s / (capacity_mib * span),
            "interruptions": self.interruptions, "wasted_h": self.wasted_s / 3600,
            "overhead_h": self.overhead_s / 3600, "subjobs": self.subjobs, "makespan_h": span / 3600,
            "frag_delay_h": self.frag_delay_s / 3600 / max(self.rigid_jobs, 1),
            "frag_delay_total_h": self.frag_delay_s / 3600, "frag_blocked": self.frag_blocked,
            "whole_gpu_wait_h": float(np.mean(self.whole_gpu_waits) / 3600) if self.whole_gpu_waits else 0.0,
            "blocked_wait_h": float(np.mean(self.blocked_waits) / 3600) if self.blocked_waits else 0.0,
            "steered": self.steered, "moved": self.moved,
        }  # fmt: skip


class Simulation:
    def __init__(self, setup: AtomizeSetup, scheduler: str, seed: int, pods: Sequence[TracePod] | None = None):
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")
        self.setup, self.scheduler = setup, scheduler
        self.model = get_model(setup.model)
        self.jobs, self.apps = from_trace(pods, setup, seed) if pods is not None else generate(setup, seed)
        self.rng = np.random.default_rng(seed + 1000)
        self.cluster = Cluster.homogeneous(self.model.name, setup.gpus)
        self.policy = make_policy("mfi")
        self.metrics = Metrics(scheduler)
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.queue: list[Job] = []  # FIFO: rigid jobs (and training jobs unless sja)
        self.chains: dict[str, Job] = {}  # sja: waiting chains
        self.history: list[list[Trajectory]] = [[] for _ in self.apps]
        self.ends: dict[str, float] = {}  # running instance -> expected end (time limit)
        self.running: dict[str, tuple[Job, float, float, float]] = {}  # instance -> (job, start, mem, alloc)
        self.last_mib: dict[str, float] = {}
        self.attained: dict[str, float] = {}
        self.now = 0.0
        self.sja = scheduler.startswith("sja")
        self.defrag = scheduler == "sja-defrag"
        self.waiting_since: dict[str, float] = {}  # chain -> when it last began waiting for a grant
        self.frag_now: list[Job] = []  # rigid jobs blocked by fragmentation since the last schedule
        self.ever_blocked: set[str] = set()

    def push(self, t: float, kind: str, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def run(self) -> Metrics:
        for job in self.jobs:
            self.push(job.submit, "arrive", job)
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            self._account(t)
            self.now = t
            if kind == "arrive":
                self._arrive(payload)
            else:
                self._finish(*payload)
            if not self.events or self.events[0][0] > t:  # schedule once per instant
                self._schedule()
        m = self.metrics
        m.makespan = self.now
        m.unfinished = len(self.queue) + len(self.chains)
        return m

    def _account(self, t: float) -> None:
        dt = t - self.now
        self.metrics.frag_delay_s += dt * len(self.frag_now)
        for _, _, used, alloc in self.running.values():
            self.metrics.used_mib_s += used * dt
            self.metrics.allocated_mib_s += alloc * dt

    def _arrive(self, job: Job) -> None:
        if job.kind == "training" and self.sja:
            self.chains[job.name] = job
            self.waiting_since[job.name] = self.now
        else:
            self.metrics.rigid_jobs += job.kind == "rigid"
            self.queue.append(job)

    def _start(self, job: Job, name: str, gid: int, profile: str, start: int, run_s: float, limit_s: float,
               used_mib: float, outcome: object) -> None:  # fmt: skip
        self.cluster.allocate(gid, name, profile, start)
        if job.first_start is None:
            job.first_start = self.now
            self.metrics.waits.append(self.now - job.submit)
            if job.kind == "rigid" and job.profile == self.model.largest_profile.name:
                self.metrics.whole_gpu_waits.append(self.now - job.submit)
            if job.name in self.ever_blocked:
                self.metrics.blocked_waits.append(self.now - job.submit)
        self.ends[name] = self.now + limit_s
        self.running[name] = (job, self.now, used_mib, float(self.model.profile(profile).memory_mib))
        self.push(self.now + run_s, "finish", (name, outcome))

    def _finish(self, name: str, outcome: object) -> None:
        job, started, _, alloc = self.running.pop(name)
        self.cluster.release(name)
        del self.ends[name]
        if job.kind == "rigid" or not self.sja:
            job.end = self.now
            self.metrics.finished += 1
            if job.kind == "training":
                self.metrics.training_jct.append(self.now - job.submit)
            return
        useful, trajectory, failed = outcome
        self.metrics.subjobs += 1
        self.metrics.overhead_s += min(self.setup.checkpoint_s, self.now - started)
        self.history[job.app].append(trajectory)
        self.last_mib[job.name] = alloc
        self.attained[job.name] = self.attained.get(job.name, 0.0) + (self.now - started) * alloc
        if failed:
            self.metrics.interruptions += 1
            self.metrics.wasted_s += max(0.0, self.now - started - self.setup.checkpoint_s)
        else:
            job.done_s += useful
        if job.done_s >= job.work_s - 1e-6:
            job.end = self.now
            self.metrics.finished += 1
            self.metrics.training_jct.append(self.now - job.submit)
        else:
            self.chains[job.name] = job
            self.waiting_since[job.name] = self.now

    # FIFO with EASY backfill over time limits, MFI placement
    def _timelines(self, reserve: tuple[int, Hold] | None = None) -> list[GpuTimeline]:
        out = cluster_timelines(self.cluster, self.ends.__getitem__)
        return with_hold(out, *reserve) if reserve else out

    def _options(self, job: Job) -> list[tuple[str, float]]:
        if job.kind == "training" and self.scheduler.startswith("moldable"):
            covering = [p for p in self.model.base_profiles if p.memory_mib >= job.declared_mib]
            return sorted(((p.name, moldable_time(job.work_s, p.compute_slices)) for p in covering),
                          key=lambda o: o[1])  # fmt: skip
        return [(job.profile, job.work_s)]

    def _schedule(self) -> None:
        reserve: tuple[int, Hold] | None = None
        steers: list[Steer] = []  # sja-defrag: windows kept from chain grants for jobs blocked by fragmentation
        planner: MoldablePlanner | None = None  # moldable-eft: one pass over the queue
        for job in list(self.queue):
            if job.kind == "training" and self.scheduler == "moldable-eft":
                planner = planner or MoldablePlanner(self.cluster, self._timelines(reserve), self.now, self.policy,
                                                     self.setup.moldable_min_gain)
                choice = planner.decide(MoldableJob(job.name, {self.model.name: dict(self._options(job))}))
                if choice.placement is not None:
                    p = choice.placement
                    self._start(job, job.name, p.gid, p.profile, p.start, choice.seconds, job.limit_s / job.work_s
                                * choice.seconds, self._true_use(job, p.profile), None)  # fmt: skip
                    self.queue.remove(job)
                elif choice.reserved is not None and reserve is None:  # rigid jobs must not delay it either
                    gid, start = choice.reserved
                    reserve = gid, Hold(self.model.profile(choice.profile).window(start), since=choice.starts)
                continue
            placed = False
            for profile, run_s in self._options(job):
                decision = self.policy.decide(self.cluster, PlacementRequest.single(job.name, self.model.name, profile))
                if not isinstance(decision, Placement):
                    continue
                limit = run_s * (job.limit_s / job.work_s)
                window = self.model.profile(profile).window(decision.start)
                if reserve and reserve[0] == decision.gid and window & reserve[1].window and \
                        self.now + limit > reserve[1].since:
                    continue  # would delay the reserved head job
                if any(st.gid == decision.gid and st.window & window and self.now + limit > st.opens for st in steers):
                    continue  # would take a window kept for a job blocked by fragmentation
                if planner is not None and not planner.clear(decision.gid, window, self.now, self.now + limit):
                    continue  # would delay a moldable job's reservation
                used = self._true_use(job, profile)
                self._start(job, job.name, decision.gid, profile, decision.start, run_s, limit, used, None)
                if planner is not None:
                    planner.hold(decision.gid, Hold(window, until=self.now + limit))
                self.queue.remove(job)
                placed = True
                break
            if not placed and self.defrag and job.kind == "rigid" and len(steers) < self.setup.defrag_max_steered:
                views = with_steering(self._timelines(reserve), steers)
                kept = [k for k in keep_windows(views, self._chain_masks(), [{self.model.name: job.profile}],
                                                self.now, 1, 10 * self.setup.horizon_s) if k is not None]  # fmt: skip
                steers += kept
                self.metrics.steered += len(kept)
                if kept:
                    continue  # its window is kept: no EASY reservation needed for it
            if not placed and reserve is None:
                profile = self._options(job)[-1][0] if job.kind == "training" else job.profile
                needs = {self.model.name: profile}
                reserve = reservation(self._timelines(), needs, self.now, 10 * self.setup.horizon_s)
                if reserve is not None and planner is not None:
                    planner.hold(*reserve)
        if self.sja:
            self._offer(reserve, steers)
        self._measure_fragmentation()

    def _chain_masks(self) -> dict[int, int]:
        """The slices chain subjobs hold now, per GPU: the capacity a checkpoint boundary frees."""
        out: dict[int, int] = {}
        for name, (job, *_) in self.running.items():
            if job.kind == "training":
                gid = self.cluster.job_gpu[name]
                profile, start = self.cluster.gpus[gid].instances[name]
                out[gid] = out.get(gid, 0) | self.model.profile(profile).window(start)
        return out

    def _measure_fragmentation(self) -> None:
        """The queued rigid jobs that fit on no GPU although the free slices of all GPUs would hold
        them (Flex-MIG's external fragmentation); they accrue delay until the next event."""
        masks = [g.mask for g in self.cluster.gpus]
        free = sum(self.model.memory_slices - m.bit_count() for m in masks)
        fits: dict[str, bool] = {}
        self.frag_now = []
        for job in self.queue:
            if job.kind != "rigid":
                continue
            profile = self.model.profile(job.profile)
            if free < profile.memory_slices:
                continue
            if job.profile not in fits:
                fits[job.profile] = any(profile.window(s) & m == 0 for m in masks for s in profile.starts)
            if not fits[job.profile]:
                self.frag_now.append(job)
                if job.name not in self.ever_blocked:
                    self.ever_blocked.add(job.name)
                    self.metrics.frag_blocked += 1

    def _true_use(self, job: Job, profile: str) -> float:
        if job.kind == "rigid":
            return float(self.model.profile(profile).memory_mib)
        return self.apps[job.app].base_mib

    def _offer(self, reserve: tuple[int, Hold] | None, steers: list[Steer]) -> None:
        s = self.setup
        for _ in range(4 * s.gpus):
            if not self.chains:
                return
            chains = [Chain(j.name, j.declared_mib, MemoryProfile(tuple(self.history[j.app][-200:])),
                            s.min_subjob_s, s.max_subjob_s, j.submit, j.work_s - j.done_s + s.checkpoint_s,
                            self.last_mib.get(j.name), self.attained.get(j.name, 0.0))
                      for j in self.chains.values()]  # fmt: skip
            grants = self._grants(chains, self._timelines(reserve), steers)
            if not grants:
                return
            for gap, reply in grants:
                job = self.chains.pop(reply.job)
                self.waiting_since.pop(job.name, None)
                gpu = self.cluster.gpus[gap.gid]
                start = start_in_gap(gap, reply.profile, gpu.mask)
                if start is None:
                    self.chains[job.name] = job
                    continue
                capacity = self.model.profile(reply.profile).memory_mib
                trajectory = subjob_memory(self.apps[job.app], reply.duration, self.rng)
                over = [t for t, m in zip(trajectory.times, trajectory.mib, strict=True) if m > capacity]
                run_s = over[0] if over else reply.duration
                seen = Trajectory(tuple(t for t in trajectory.times if t <= run_s),
                                  tuple(m for t, m in zip(trajectory.times, trajectory.mib, strict=True) if t <= run_s))
                useful = max(0.0, run_s - s.checkpoint_s)
                self._start(job, job.name, gap.gid, reply.profile, start, max(run_s, 1e-3), reply.duration,
                            self.apps[job.app].base_mib, (useful, seen, bool(over)))  # fmt: skip

    def _grants(self, chains: list[Chain], timelines: list[GpuTimeline],
                steers: list[Steer]) -> list[tuple[Gap, Reply]]:  # fmt: skip
        """One negotiation round. sja-defrag: chains that have waited longer than
        ``defrag_max_hold_s`` are served first, without the steering holds (steering delays a chain a
        bounded time); the others see the gaps with them, and every grant goes to the best spot."""
        s = self.setup
        if not self.defrag:
            gaps = [g for g in cluster_gaps(timelines, self.now, s.horizon_s) if g.opens <= self.now]
            return negotiate(gaps, chains, self.now, s.eps, s.grant_policy, s.hysteresis).grants()
        waited = {c.job: self.now - self.waiting_since.get(c.job, self.now) for c in chains}
        for group, views in offer_groups(chains, timelines, steers, waited, s.defrag_max_hold_s):
            if not group:
                continue
            gaps = [g for g in cluster_gaps(views, self.now, s.horizon_s) if g.opens <= self.now]

            def place(chain: Chain, reply: Reply, offered: Gap, all_gaps: Sequence[Gap],
                      taken: Mapping[int, int], views: list[GpuTimeline] = views) -> tuple[Gap, Reply]:  # fmt: skip
                return choose_spot(chain, reply, offered, all_gaps, views, taken, self.now, s.eps, s.hysteresis)

            round_ = negotiate(gaps, group, self.now, s.eps, s.grant_policy, s.hysteresis,
                               place if s.defrag_consolidate else None)
            if round_.grants():
                self.metrics.moved += sum(spot.gid != offered.gid for offered, _, c in round_.offers
                                          if c is not None and (spot := round_.spots.get(c.job, (offered,))[0]))
                return round_.grants()
        return []


def run_atomize(setup: AtomizeSetup, seeds: list[int], schedulers: tuple[str, ...] = DEFAULT_SCHEDULERS,
                pods: Sequence[TracePod] | None = None) -> dict:  # fmt: skip
    """Every scheduler on every seed's workload (``pods``: a trace window per seed, else synthetic)."""
    capacity = setup.gpus * get_model(setup.model).largest_profile.memory_mib
    results: dict[str, list[dict[str, float]]] = {s: [] for s in schedulers}
    workloads = []
    for seed in seeds:
        jobs = from_trace(pods, setup, seed)[0] if pods is not None else generate(setup, seed)[0]
        workloads.append({"seed": seed, "jobs": len(jobs), "training": sum(j.kind == "training" for j in jobs),
                          "offered_load": offered_load(jobs, setup), "span_h": jobs[-1].submit / 3600 if jobs else 0})
        for scheduler in schedulers:
            results[scheduler].append(Simulation(setup, scheduler, seed, pods).run().summary(capacity))
    mean = {s: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} for s, rs in results.items()}
    return {"setup": vars(setup) | {"min_history": min_history(setup.eps)}, "seeds": seeds,
            "workload": "alibaba-2023" if pods is not None else "synthetic", "workloads": workloads,
            "runs": results, "mean": mean}  # fmt: skip
