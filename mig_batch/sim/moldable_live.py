"""A live cluster of MIG GPUs with moldable and rigid jobs arriving over time (docs/moldable.md).

Event-driven: at each arrival and each job end, a pass (1) starts rigid jobs first come first served,
any that fits now on a slot of its size (an idle instance of the slot reused, else idle instances in
the way destroyed and one created), the first ``rigid_reservations`` that do not fit each holding a
reservation where it starts first (conservative backfilling: a later rigid job may start only if it
keeps clear of them; 1 is EASY backfilling); then
(2) plans the first ``window`` queued moldable jobs with a live planner
(:func:`mig_batch.planner.live.plan_live`: ``eft``, ``far`` or ``auto``) over the GPUs' instances and
their jobs' expected ends, the rigid reservation held with ``max_hold_s``, and starts the plan's
steps whose slices are free now. Reconfigurations take the model's create/destroy times (MIG-DRL
Table 1), one at a time per GPU; a job starts when its instance exists.

Run times: a moldable job runs its predicted time on its size times a noise factor (lognormal,
``noise`` its sigma, fixed per job by the seed), so plans meet jobs ending early and late; a job
past its expected end is expected to run as long again as it has overrun. Rigid jobs run their
duration. Planners are bounded by evaluations (not seconds) so that runs repeat exactly.

Pure code: workloads are built by the caller (:mod:`mig_batch.sim.moldable_workloads`).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mig_batch.mig.models import get_model
from mig_batch.placement.base import Policy
from mig_batch.planner.live import LiveGpu, LiveInstance, LiveJob, LiveState, RigidWait, plan_live
from mig_batch.planner.problem import GpuScheme, Slot, gpu_scheme

LIVE_SIM_PLANNERS = ("eft", "far", "auto")
TODAY = "eft-today"  # mig-batchd's rule itself (placement/moldable.py, the mix policy), not through the live planner


@dataclass(frozen=True)
class SimJob:
    name: str
    arrival: float
    times: Mapping[int, float]  # size -> predicted seconds (a rigid job: its one size)
    rigid: bool = False
    noise: float = 1.0  # actual / predicted


@dataclass(frozen=True)
class LiveSimSetup:
    gpus: int = 8
    model: str = "A100-80GB"
    window: int = 24  # queued moldable jobs planned per pass
    evaluations: int = 24  # decodings per pass (far, auto)
    max_hold_s: float = 0.0
    min_gain: float = 0.1
    rigid_reservations: int = 8  # waiting rigid jobs that hold a reservation (1: EASY backfilling)


@dataclass(frozen=True)
class LiveSimResult:
    planner: str
    makespan: float
    mean_completion: float  # moldable jobs: end - arrival
    rigid_wait: float  # rigid jobs: start - arrival (nan when none)
    idle: float  # share of compute-slice seconds no job ran, first arrival to last end
    reconfigs: int
    passes: int
    jobs: int

    def as_dict(self) -> dict[str, float | int | str]:
        return dict(self.__dict__)


@dataclass
class _Inst:
    job: str | None  # None: idle
    end: float  # when its job really ends
    expected: float  # when its job is expected to end


class _Gpu:
    def __init__(self, gid: int) -> None:
        self.gid = gid
        self.clock = 0.0
        self.inst: dict[tuple[int, int], _Inst] = {}  # slot (size, start) -> the instance there


class _Sim:
    def __init__(self, jobs: Sequence[SimJob], setup: LiveSimSetup, planner: str) -> None:
        if planner not in (*LIVE_SIM_PLANNERS, TODAY):
            raise ValueError(f"unknown live planner {planner!r}; known: {', '.join((*LIVE_SIM_PLANNERS, TODAY))}")
        self.setup, self.planner = setup, planner
        self.scheme: GpuScheme = gpu_scheme(setup.model)
        self.window = {(s.size, s.start): s for size in self.scheme.sizes for s in self.scheme.slots[size]}
        self.gpus = [_Gpu(g) for g in range(setup.gpus)]
        self.jobs = {j.name: j for j in jobs}
        self.events: list[tuple[float, int, str, str]] = []
        for n, j in enumerate(sorted(jobs, key=lambda j: (j.arrival, j.name))):
            heapq.heappush(self.events, (j.arrival, n, "arrive", j.name))
        self.seq = len(jobs)
        self.rigid_q: list[str] = []
        self.moldable_q: list[str] = []
        self.started: dict[str, tuple[float, float, int]] = {}  # job -> (start, end, size)
        self.runs: list[tuple[str, int, int, float, float]] = []  # (job, GPU, memory slices, start, end)
        self.reconfigs = self.passes = 0
        self._policy: Policy | None = None

    # -- mechanics
    def _expected(self, entry: _Inst, now: float) -> float:
        if entry.job is None:
            return now
        expected = entry.expected
        return expected if expected > now else now + (now - expected) + 1e-3

    def _busy(self, gpu: _Gpu, slot: Slot, now: float) -> bool:
        return any(e.job is not None and self.window[k].overlaps(slot) for k, e in gpu.inst.items())

    def _start(self, gpu: _Gpu, slot: Slot, job: SimJob, size: int, now: float) -> None:
        key = (slot.size, slot.start)
        at = now
        if key not in gpu.inst:
            clock = max(gpu.clock, now)
            for k in sorted(k for k in gpu.inst if self.window[k].overlaps(slot)):
                clock += self.scheme.destroy_s[k[0]]
                del gpu.inst[k]
                self.reconfigs += 1
            clock += self.scheme.create_s[slot.size]
            self.reconfigs += 1
            gpu.clock = at = clock
        predicted = job.times[size]
        end = at + predicted * job.noise
        gpu.inst[key] = _Inst(job.name, end, at + predicted)
        self.started[job.name] = (at, end, size)
        self.runs.append((job.name, gpu.gid, slot.window, at, end))
        self.seq += 1
        heapq.heappush(self.events, (end, self.seq, "end", f"{gpu.gid}:{slot.size}:{slot.start}"))

    # -- rigid jobs: first come first served; each that waits holds a reservation (conservative backfilling)
    def _rigid(self, now: float) -> list[RigidWait]:
        reservations: list[RigidWait] = []
        for name in list(self.rigid_q):
            job = self.jobs[name]
            size, seconds = next(iter(job.times.items()))
            best: tuple[tuple[bool, int, int, int], _Gpu, Slot] | None = None
            for gpu in self.gpus:
                used = sum(k[0] for k, e in gpu.inst.items() if e.job is not None)
                for slot in self.scheme.slots[size]:
                    if self._busy(gpu, slot, now) or self._clash(reservations, gpu.gid, slot.window, now, seconds):
                        continue
                    key = ((slot.size, slot.start) not in gpu.inst, -used, gpu.gid, slot.start)
                    if best is None or key < best[0]:
                        best = (key, gpu, slot)
            if best is not None:
                self._start(best[1], best[2], job, size, now)
                self.rigid_q.remove(name)
            elif len(reservations) < self.setup.rigid_reservations:
                options = []
                for gpu in self.gpus:
                    for slot in self.scheme.slots[size]:
                        at = max([now, *(self._expected(e, now) for k, e in gpu.inst.items()
                                         if e.job is not None and self.window[k].overlaps(slot))])  # fmt: skip
                        while (hit := self._clash(reservations, gpu.gid, slot.window, at, seconds)) is not None:
                            at = hit
                        options.append((at, gpu.gid, slot.start, slot.window))
                at, gid, _, window = min(options)
                reservations.append(RigidWait(gid, window, at, seconds))
        return reservations

    @staticmethod
    def _clash(reservations: Sequence[RigidWait], gid: int, window: int, at: float, seconds: float) -> float | None:
        """The end of a reservation that a run of ``seconds`` from ``at`` would meet (None: clear)."""
        for r in reservations:
            if r.gid == gid and r.window & window and r.since < at + seconds and r.since + r.seconds > at:
                return r.since + r.seconds
        return None

    def _state(self, now: float, reservations: Sequence[RigidWait]) -> LiveState:
        gpus = tuple(
            LiveGpu(
                gpu.gid,
                self.setup.model,
                tuple(LiveInstance(k[0], k[1], self._expected(e, now)) for k, e in sorted(gpu.inst.items())),
                reconfig_free_at=gpu.clock,
            )
            for gpu in self.gpus
        )
        jobs = tuple(LiveJob(n, self.jobs[n].times) for n in self.moldable_q[: self.setup.window])
        return LiveState(now, gpus, jobs, tuple(reservations), self.setup.max_hold_s)

    def _pass(self, now: float) -> None:
        reservations = self._rigid(now)
        if not self.moldable_q:
            return
        if all(e.job is not None for g in self.gpus for e in g.inst.values()) and all(
            sum(k[0] for k in g.inst) >= self.scheme.slices for g in self.gpus
        ):  # every slice busy: nothing can start now
            return
        self.passes += 1
        if self.planner == TODAY:
            self._today(now, reservations)
            return
        setup = self.setup
        plan = plan_live(self._state(now, reservations), self.planner, budget_s=math.inf,
                         evaluations=setup.evaluations, min_gain=setup.min_gain, seed=self.passes)  # fmt: skip
        for step in plan.start_now():
            gpu, slot = self.gpus[step.gid], self.scheme.slot(step.size, step.slot)
            if self._busy(gpu, slot, now):  # the plan's start needs these slices now: a bug if reached
                raise AssertionError(f"plan starts {step.job} on busy slices of GPU {step.gid}")
            self._start(gpu, slot, self.jobs[step.job], step.size, now)
            self.moldable_q.remove(step.job)

    def _today(self, now: float, reservations: Sequence[RigidWait]) -> None:
        """mig-batchd's rule as it runs today: MoldablePlanner over the busy instances' expected ends, the
        rigid reservations held, each queued job in order started now, held by a reservation, or left."""
        from mig_batch.atomize.gaps import cluster_timelines
        from mig_batch.placement.cluster import Cluster
        from mig_batch.placement.moldable import MoldableJob, MoldablePlanner
        from mig_batch.placement.policies import make_policy
        from mig_batch.placement.timelines import Hold

        if self._policy is None:
            self._policy = make_policy("mix")
        model = self.setup.model
        cluster = Cluster.homogeneous(model, len(self.gpus))
        ends: dict[str, float] = {}
        for gpu in self.gpus:
            for (size, start), e in gpu.inst.items():
                if e.job is not None:
                    cluster.allocate(gpu.gid, e.job, self.scheme.profiles[size].name, start)
                    ends[e.job] = self._expected(e, now)
        planner = MoldablePlanner(cluster, cluster_timelines(cluster, ends.__getitem__), now, self._policy,
                                  self.setup.min_gain)  # fmt: skip
        for r in reservations:
            planner.hold(r.gid, Hold(r.window, until=r.since + r.seconds, since=r.since))
        for name in list(self.moldable_q[: self.setup.window]):
            job = self.jobs[name]
            times = {model: {self.scheme.profiles[size].name: t for size, t in job.times.items()}}
            choice = planner.decide(MoldableJob(name, times))
            if choice.placement is None or choice.profile is None:
                continue
            size = get_model(model).profile(choice.profile).compute_slices
            gpu, slot = self.gpus[choice.placement.gid], self.scheme.slot(size, choice.placement.start)
            if self._busy(gpu, slot, now):
                raise AssertionError(f"EFT starts {name} on busy slices of GPU {gpu.gid}")
            self._start(gpu, slot, job, size, now)
            cluster.allocate(gpu.gid, name, choice.profile, choice.placement.start)
            self.moldable_q.remove(name)

    def run(self) -> None:
        while self.events:
            now = self.events[0][0]
            while self.events and self.events[0][0] <= now:
                _, _, kind, what = heapq.heappop(self.events)
                if kind == "arrive":
                    (self.rigid_q if self.jobs[what].rigid else self.moldable_q).append(what)
                else:
                    gid, size, start = (int(x) for x in what.split(":"))
                    self.gpus[gid].inst[(size, start)].job = None
            self._pass(now)
        left = self.rigid_q + self.moldable_q
        if left:
            raise AssertionError(f"jobs never started: {left[:5]}")


def simulate_live(jobs: Sequence[SimJob], setup: LiveSimSetup, planner: str,
                  runs: list[tuple[str, int, int, float, float]] | None = None) -> LiveSimResult:  # fmt: skip
    """``runs``, when given, receives every job's (name, GPU, memory slices, start, end)."""
    sim = _Sim(jobs, setup, planner)
    sim.run()
    if runs is not None:
        runs += sim.runs
    first = min(j.arrival for j in jobs)
    last = max(end for _, end, _ in sim.started.values())
    makespan = last - first
    moldable = [sim.started[j.name][1] - j.arrival for j in jobs if not j.rigid]
    waits = [sim.started[j.name][0] - j.arrival for j in jobs if j.rigid]
    busy = sum(size * (end - start) for start, end, size in sim.started.values())
    capacity = setup.gpus * sim.scheme.slices * makespan
    return LiveSimResult(planner, makespan, statistics.fmean(moldable) if moldable else math.nan,
                         statistics.fmean(waits) if waits else math.nan, 1 - busy / capacity if capacity else 0.0,
                         sim.reconfigs, sim.passes, len(jobs))  # fmt: skip
