"""``simulate atomize``: SJA against monolithic FIFO+backfill and moldable placement (SJA §5.1).

One cluster of MIG GPUs, one seeded workload of two kinds of jobs:
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

Pure code (no I/O): the CLI prints, plots and writes JSON.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from mig_batch.atomize.gaps import (
    GpuTimeline,
    Hold,
    cluster_gaps,
    cluster_timelines,
    reservation,
    start_in_gap,
    with_hold,
)
from mig_batch.atomize.profiles import MemoryProfile, Trajectory, min_history
from mig_batch.atomize.protocol import Chain, negotiate
from mig_batch.mig.models import get_model
from mig_batch.placement.base import Placement, PlacementRequest
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.moldable import MoldableJob, MoldablePlanner
from mig_batch.placement.policies import make_policy

SCHEDULERS = ("fifo-backfill", "moldable", "moldable-eft", "sja")


@dataclass(frozen=True)
class AtomizeSetup:
    gpus: int = 8
    model: str = "A100-80GB"
    hours: float = 24.0
    rigid_per_hour: float = 10.0
    training_per_hour: float = 1.5
    applications: int = 4
    checkpoint_s: float = 60.0
    min_subjob_s: float = 600.0
    max_subjob_s: float = 3 * 3600.0
    eps: float = 0.05
    grant_policy: str = "efficiency"
    hysteresis: float = 0.25
    horizon_s: float = 24 * 3600.0
    moldable_min_gain: float = 0.1


@dataclass(frozen=True)
class App:
    base_mib: float
    sd_mib: float
    spike_mib: float


@dataclass
class Job:
    name: str
    kind: str  # rigid | training
    submit: float
    work_s: float  # run time (rigid) or work left (training)
    profile: str = ""  # rigid: its profile; training: smallest covering the declared memory
    limit_s: float = 0.0
    declared_mib: float = 0.0
    app: int = -1
    first_start: float | None = None
    end: float | None = None
    done_s: float = 0.0  # training: useful work done


def generate(setup: AtomizeSetup, seed: int) -> tuple[list[Job], list[App]]:
    rng = np.random.default_rng(seed)
    model = get_model(setup.model)
    apps = [App(float(rng.uniform(8_000, 30_000)), float(rng.uniform(300, 1500)), float(rng.uniform(1000, 6000)))
            for _ in range(setup.applications)]  # fmt: skip
    rigid_profiles = [p.name for p in model.base_profiles]
    weights = np.array([1.0 / p.memory_slices for p in model.base_profiles])
    jobs: list[Job] = []
    end = setup.hours * 3600
    t = 0.0
    while (t := t + rng.exponential(3600 / setup.rigid_per_hour)) < end:
        run = float(rng.uniform(600, 3 * 3600))
        jobs.append(Job(f"r{len(jobs)}", "rigid", t, run, str(rng.choice(rigid_profiles, p=weights / weights.sum())),
                        run * float(rng.uniform(1, 2))))  # fmt: skip
    t = 0.0
    while (t := t + rng.exponential(3600 / setup.training_per_hour)) < end:
        app = int(rng.integers(setup.applications))
        declared = min(apps[app].base_mib * float(rng.uniform(1.3, 2.5)), model.largest_profile.memory_mib)
        work = float(rng.uniform(2, 10) * 3600)
        profile = min((p for p in model.base_profiles if p.memory_mib >= declared), key=lambda p: p.memory_mib)
        jobs.append(Job(f"t{len(jobs)}", "training", t, work, profile.name, work * 1.2, declared, app))
    jobs.sort(key=lambda j: j.submit)
    return jobs, apps


def subjob_memory(app: App, duration: float, rng: np.random.Generator) -> Trajectory:
    times = np.linspace(0.0, duration, 40)
    mib = app.base_mib + rng.normal(0, app.sd_mib) + rng.normal(0, app.sd_mib / 4, len(times))
    if rng.random() < 0.3:
        mib[int(rng.integers(0, 4))] += rng.exponential(app.spike_mib)
    return Trajectory(tuple(times), tuple(mib))


def moldable_time(work: float, slices: int) -> float:
    return work * (3 / slices) ** 0.6


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
        }  # fmt: skip


class Simulation:
    def __init__(self, setup: AtomizeSetup, scheduler: str, seed: int):
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")
        self.setup, self.scheduler = setup, scheduler
        self.model = get_model(setup.model)
        self.jobs, self.apps = generate(setup, seed)
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
        for _, _, used, alloc in self.running.values():
            self.metrics.used_mib_s += used * dt
            self.metrics.allocated_mib_s += alloc * dt

    def _arrive(self, job: Job) -> None:
        if job.kind == "training" and self.scheduler == "sja":
            self.chains[job.name] = job
        else:
            self.queue.append(job)

    def _start(self, job: Job, name: str, gid: int, profile: str, start: int, run_s: float, limit_s: float,
               used_mib: float, outcome: object) -> None:  # fmt: skip
        self.cluster.allocate(gid, name, profile, start)
        if job.first_start is None:
            job.first_start = self.now
            self.metrics.waits.append(self.now - job.submit)
        self.ends[name] = self.now + limit_s
        self.running[name] = (job, self.now, used_mib, float(self.model.profile(profile).memory_mib))
        self.push(self.now + run_s, "finish", (name, outcome))

    def _finish(self, name: str, outcome: object) -> None:
        job, started, _, alloc = self.running.pop(name)
        self.cluster.release(name)
        del self.ends[name]
        if job.kind == "rigid" or self.scheduler != "sja":
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
                if planner is not None and not planner.clear(decision.gid, window, self.now, self.now + limit):
                    continue  # would delay a moldable job's reservation
                used = self._true_use(job, profile)
                self._start(job, job.name, decision.gid, profile, decision.start, run_s, limit, used, None)
                if planner is not None:
                    planner.hold(decision.gid, Hold(window, until=self.now + limit))
                self.queue.remove(job)
                placed = True
                break
            if not placed and reserve is None:
                profile = self._options(job)[-1][0] if job.kind == "training" else job.profile
                needs = {self.model.name: profile}
                reserve = reservation(self._timelines(), needs, self.now, 10 * self.setup.horizon_s)
                if reserve is not None and planner is not None:
                    planner.hold(*reserve)
        if self.scheduler == "sja":
            self._offer(reserve)

    def _true_use(self, job: Job, profile: str) -> float:
        if job.kind == "rigid":
            return float(self.model.profile(profile).memory_mib)
        return self.apps[job.app].base_mib

    def _offer(self, reserve: tuple[int, Hold] | None) -> None:
        s = self.setup
        for _ in range(4 * s.gpus):
            if not self.chains:
                return
            gaps = [g for g in cluster_gaps(self._timelines(reserve), self.now, s.horizon_s) if g.opens <= self.now]
            chains = [Chain(j.name, j.declared_mib, MemoryProfile(tuple(self.history[j.app][-200:])),
                            s.min_subjob_s, s.max_subjob_s, j.submit, j.work_s - j.done_s + s.checkpoint_s,
                            self.last_mib.get(j.name), self.attained.get(j.name, 0.0))
                      for j in self.chains.values()]  # fmt: skip
            grants = negotiate(gaps, chains, self.now, s.eps, s.grant_policy, s.hysteresis).grants()
            if not grants:
                return
            for gap, reply in grants:
                job = self.chains.pop(reply.job)
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


def run_atomize(setup: AtomizeSetup, seeds: list[int], schedulers: tuple[str, ...] = SCHEDULERS) -> dict:
    capacity = setup.gpus * get_model(setup.model).largest_profile.memory_mib
    results: dict[str, list[dict[str, float]]] = {s: [] for s in schedulers}
    for seed in seeds:
        for scheduler in schedulers:
            results[scheduler].append(Simulation(setup, scheduler, seed).run().summary(capacity))
    mean = {s: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} for s, rs in results.items()}
    return {"setup": vars(setup) | {"min_history": min_history(setup.eps)}, "seeds": seeds, "runs": results,
            "mean": mean}  # fmt: skip

