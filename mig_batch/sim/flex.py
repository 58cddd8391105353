"""Event-driven simulator of Flex-MIG §5: one host of MIG GPUs, a FIFO queue, five operation modes.

Modes (policies):

* ``fm`` Flex-MIG: every GPU fixed as 6 x 1g.5gb + 1 x 1g.10gb leaves; a size-n job takes n leaves
  (1g.10gb first for n = 1, 1g.5gb first for n >= 2), round-robin over the GPUs; n >= 2 runs
  one-to-many and pays the per-size multi-instance slowdown.
* ``dm`` Dynamic-MIG: one instance per job, sized to the job; an idle instance of that profile is
  reused, else one is created where busy instances allow (idle ones are destroyed to make room), else
  a GPU that has the room but not the layout (tree constraint) is drained: its training jobs stop,
  the GPU is re-partitioned with them and the new job, and they resume after ``drain_penalty_s``.
  A GPU running an inference job is never drained.
* ``sm`` Static-MIG: every GPU fixed as [1g.10gb, 2g.10gb, 4g.20gb]; a job takes an idle instance of
  its profile, or else the smallest larger idle one (and runs faster there). Sizes up to 4 only.
* ``mbdyn`` mig_batch's dynamic MIG: one instance per job, created at the job's start at the spot of
  Minimum Fragmentation Increment (MFI Alg. 2) over all GPUs and destroyed at its end; never drains.
* ``hybrid``: one-to-one as ``mbdyn`` where a fitting instance can be created, otherwise n 1g.5gb
  instances created one by one at MFI spots, run one-to-many; never drains.

Times: a job's one-to-one run time (``work_s``) is scaled by the contention factor (Flex-MIG §5.2,
1.06), by the multi-instance slowdown when it runs one-to-many, and by (c_asked / c_given) ** exponent
when Static-MIG hands it a larger instance. Creating and destroying instances costs MIG-DRL Table 1's
A100 times. Pure code: no I/O.
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mig_batch.errors import MigBatchError
from mig_batch.mig.geometry import Instance
from mig_batch.mig.models import GpuModel, Profile, get_model
from mig_batch.mig.scores import FragVariant
from mig_batch.mig.tables import ModelTables, tables_for
from mig_batch.sim.flex_workloads import FlexJob


class FlexSimError(MigBatchError, ValueError):
    """A simulation parameter or trace the simulator cannot run."""


# MIG-DRL Table 1 (also shared/data/mig-tasks/reconfig_times.csv): A100 seconds by compute slices
A100_CREATE_S = {1: 0.16, 2: 0.17, 3: 0.20, 4: 0.21, 7: 0.24}
A100_DESTROY_S = {1: 0.20, 2: 0.20, 3: 0.21, 4: 0.21, 7: 0.22}

FM_LAYOUT = (*((s, "1g.5gb") for s in range(6)), (6, "1g.10gb"))  # Flex-MIG §3: six 1g.5gb + one 1g.10gb
SM_LAYOUT = ((0, "4g.20gb"), (4, "2g.10gb"), (6, "1g.10gb"))  # Flex-MIG §5.1: [1g.10gb, 2g.10gb, 4g.20gb]
LEAF = "1g.5gb"
SIZE_UNIT_MIB = 4800  # one size unit is "5 GB"; NVIDIA's 1g.5gb has 4,864 MiB, so a little below it
POLICIES = ("fm", "dm", "sm", "mbdyn", "hybrid")
PAPER_POLICIES = ("fm", "dm", "sm")


@dataclass(frozen=True)
class FlexParams:
    gpus: int = 2
    model: str = "A100-40GB"
    contention: float = 1.06  # Flex-MIG §5.2 calibration factor
    contention_everywhere: bool = True  # False: only one-to-many runs pay it
    multi_slowdown: float = 1.05  # one-to-many run time / one-to-one run time, any size >= 2 ...
    slowdown_by_size: Mapping[int, float] = field(default_factory=dict)  # ... unless given per size here
    larger_exponent: float = 0.5  # Static-MIG on a larger instance: time x (c_asked / c_given) ** this
    drain_penalty_s: float = 60.0  # Dynamic-MIG: stop, repartition, restart from checkpoint
    window: int = 1  # queued jobs examined per pass: 1 = FIFO, 14 = the paper's aggressive backfilling

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise FlexSimError(f"gpus must be at least 1, got {self.gpus}")
        if self.window < 1:
            raise FlexSimError(f"window must be at least 1 (1 = FIFO), got {self.window}")
        slowdowns = [self.multi_slowdown, *self.slowdown_by_size.values()]
        if not (self.contention >= 1 and all(s >= 1 for s in slowdowns)):
            raise FlexSimError("the contention factor and multi-instance slowdowns must be >= 1 (1 = none)")
        if not 0 <= self.larger_exponent <= 1:
            raise FlexSimError(f"larger-instance exponent must be in [0, 1], got {self.larger_exponent}")
        if self.drain_penalty_s < 0:
            raise FlexSimError(f"drain penalty must be >= 0 s, got {self.drain_penalty_s}")

    def slowdown(self, size: int) -> float:
        return 1.0 if size <= 1 else self.slowdown_by_size.get(size, self.multi_slowdown)


@dataclass(frozen=True)
class Segment:
    """A job held memory slices ``mask`` of GPU ``gpu`` over [start, end)."""

    job_id: int
    gpu: int
    mask: int
    start: float
    end: float


@dataclass(frozen=True)
class JobRecord:
    job_id: int
    size: int
    kind: str
    submit: float
    start: float
    end: float
    exec_s: float  # computing time (no set-up, no drain penalty)
    compute_slices: int
    mode: str  # one-to-one | one-to-many
    frag_delay_s: float


@dataclass
class RunResult:
    policy: str
    jobs: list[JobRecord]
    segments: list[Segment]
    capacity_slices: int
    reconfigurations: int = 0  # placements that changed a GPU's partition (created instances)
    drains: int = 0
    created: int = 0
    destroyed: int = 0

    def metrics(self) -> dict[str, float]:
        first = min(j.start for j in self.jobs)
        last = max(j.end for j in self.jobs)
        makespan = last - min(j.submit for j in self.jobs)
        busy = sum(j.compute_slices * j.exec_s for j in self.jobs)
        frag = sum(j.frag_delay_s for j in self.jobs)
        n = len(self.jobs)
        return {
            "makespan_s": makespan,
            "mean_jct_s": sum(j.end - j.start for j in self.jobs) / n,
            "mean_wait_s": sum(j.start - j.submit for j in self.jobs) / n,
            "mean_frag_delay_s": frag / n,
            "frag_share": frag / makespan if makespan else 0.0,
            "utilisation": busy / (self.capacity_slices * (last - first)) if last > first else 0.0,
            "reconfigurations": float(self.reconfigurations),
            "drains": float(self.drains),
            "one_to_many_share": sum(j.mode == "one-to-many" for j in self.jobs) / n,
        }


# --- cluster state -------------------------------------------------------------------------------


@dataclass
class _Running:
    job: FlexJob
    allocation: list[tuple[int, Instance]]
    start: float
    end: float
    exec_s: float
    compute: int
    mode: str
    version: int = 0
    seg_start: float = 0.0


class HostState:
    """The instances of each GPU, each idle (None) or held by a job id."""

    def __init__(self, model: GpuModel, gpus: int) -> None:
        self.model = model
        self.gpus: list[dict[Instance, int | None]] = [{} for _ in range(gpus)]
        self.running: dict[int, _Running] = {}

    def profile(self, inst: Instance) -> Profile:
        return self.model.profile(inst.profile)

    def mask(self, g: int, busy_only: bool = False) -> int:
        m = 0
        for inst, holder in self.gpus[g].items():
            if holder is not None or not busy_only:
                m |= self.profile(inst).window(inst.start)
        return m

    def idle(self, g: int, profile: str | None = None) -> list[Instance]:
        return sorted(i for i, h in self.gpus[g].items() if h is None and (profile is None or i.profile == profile))

    def busy_compute(self, g: int) -> int:
        return sum(self.profile(i).compute_slices for i, h in self.gpus[g].items() if h is not None)

    def runs_inference(self, g: int) -> bool:
        return any(h is not None and self.running[h].job.kind == "infer" for h in self.gpus[g].values())

    def free_room(self) -> tuple[int, int]:
        """Compute and memory slices not held by a running job, summed over the GPUs."""
        compute = sum(self.model.compute_slices - self.busy_compute(g) for g in range(len(self.gpus)))
        memory = sum(self.model.memory_slices - self.mask(g, busy_only=True).bit_count() for g in range(len(self.gpus)))
        return compute, memory


@dataclass
class Plan:
    """A policy's decision for one job."""

    allocation: list[tuple[int, Instance]]
    time_factor: float  # run time = work_s x this (contention excluded)
    mode: str
    destroy: list[tuple[int, Instance]] = field(default_factory=list)
    drain_gpu: int | None = None
    moves: dict[Instance, Instance] = field(default_factory=dict)  # drained: old instance -> new


def one_to_one_profile(model: GpuModel, size: int) -> Profile:
    """Flex-MIG §5.1: size 1 -> 1g.5gb, 2 -> 2g.10gb, 4 -> 4g.20gb, 6-8 -> 7g.40gb (5 GB per size unit)."""
    fitting = [p for p in model.base_profiles
               if p.compute_slices >= min(size, model.compute_slices)
               and p.memory_mib >= min(size, 8) * SIZE_UNIT_MIB]
    if not fitting:  # fmt: skip
        raise FlexSimError(f"no {model.name} profile holds a size-{size} job")
    return min(fitting, key=lambda p: (p.compute_slices, p.memory_slices))


def _mfi_spots(tables: ModelTables, state: HostState, profile: str, masks: list[int]) -> list[tuple[int, int, int]]:
    """(ΔF, gpu, start) of every free spot of ``profile`` (MFI Alg. 2's candidates, printed F)."""
    k = tables.index(profile)
    frag = tables.frag[FragVariant.PRINTED]
    cap = state.model.profile(profile).max_instances
    spots = []
    for g, mask in enumerate(masks):
        if sum(i.profile == profile for i in state.gpus[g]) >= cap:
            continue
        spots += [(after - frag[mask], g, s) for s, after in tables.frag_after[FragVariant.PRINTED][k][mask]]
    return sorted(spots)


# --- policies --------------------------------------------------------------------------------------


class FlexPolicy(ABC):
    name = ""
    keeps_idle = True  # False: an instance is destroyed when its job ends
    layout: tuple[tuple[int, str], ...] = ()

    def __init__(self, params: FlexParams, model: GpuModel) -> None:
        self.params = params
        self.model = model

    def max_size(self) -> int:
        return self.model.compute_slices + 1  # 7g.40gb holds sizes 6-8

    @abstractmethod
    def plan(self, job: FlexJob, state: HostState) -> Plan | None:
        """Where ``job`` runs now (its instances, made or reused), or None: it waits."""

    def room_suffices(self, job: FlexJob, state: HostState) -> bool:
        """Enough free resources in total (ignoring which GPU they sit on): Flex-MIG's test for fragmentation."""
        profile = one_to_one_profile(self.model, job.size)
        compute, memory = state.free_room()
        return compute >= profile.compute_slices and memory >= profile.memory_slices


class FlexMig(FlexPolicy):
    name = "fm"
    layout = FM_LAYOUT

    def __init__(self, params: FlexParams, model: GpuModel) -> None:
        super().__init__(params, model)
        self.next_gpu = 0

    def max_size(self) -> int:
        return len(self.layout) * self.params.gpus

    def room_suffices(self, job: FlexJob, state: HostState) -> bool:
        return sum(len(state.idle(g)) for g in range(len(state.gpus))) >= job.size

    def plan(self, job: FlexJob, state: HostState) -> Plan | None:
        order = [(self.next_gpu + i) % len(state.gpus) for i in range(len(state.gpus))]
        kinds = ("1g.10gb", LEAF) if job.size == 1 else (LEAF, "1g.10gb")  # size-aware prioritisation
        picks: list[tuple[int, Instance]] = []
        for kind in kinds:
            free = {g: state.idle(g, kind) for g in order}
            while len(picks) < job.size and any(free.values()):
                for g in order:  # round-robin: one leaf per GPU per pass
                    if free[g] and len(picks) < job.size:
                        picks.append((g, free[g].pop(0)))
        if len(picks) < job.size:
            return None
        self.next_gpu = (self.next_gpu + 1) % len(state.gpus)
        mode = "one-to-one" if job.size == 1 else "one-to-many"
        return Plan(picks, self.params.slowdown(job.size), mode)


class StaticMig(FlexPolicy):
    name = "sm"
    layout = SM_LAYOUT

    def max_size(self) -> int:
        return max(self.model.profile(p).compute_slices for _, p in self.layout)

    def asked(self, job: FlexJob) -> Profile:
        candidates = sorted({p for _, p in self.layout}, key=lambda p: self.model.profile(p).compute_slices)
        return next(self.model.profile(p) for p in candidates if self.model.profile(p).compute_slices >= job.size)

    def room_suffices(self, job: FlexJob, state: HostState) -> bool:
        asked = self.asked(job)
        idle = [state.profile(i) for g in range(len(state.gpus)) for i in state.idle(g)]
        return (sum(p.compute_slices for p in idle) >= asked.compute_slices
                and sum(p.memory_slices for p in idle) >= asked.memory_slices)  # fmt: skip

    def plan(self, job: FlexJob, state: HostState) -> Plan | None:
        asked = self.asked(job)
        idle = [(state.profile(i).compute_slices, state.profile(i).name != asked.name, g, i)
                for g in range(len(state.gpus)) for i in state.idle(g)
                if state.profile(i).compute_slices >= asked.compute_slices]  # fmt: skip
        if not idle:
            return None
        # the asked profile first, else the smallest larger idle instance (the paper's rule, after NVIDIA)
        given, _, g, inst = min(idle, key=lambda row: (row[1], row[0], row[2], row[3]))
        return Plan([(g, inst)], (asked.compute_slices / given) ** self.params.larger_exponent, "one-to-one")


class DynamicMig(FlexPolicy):
    name = "dm"

    def plan(self, job: FlexJob, state: HostState) -> Plan | None:
        profile = one_to_one_profile(self.model, job.size)
        for g in range(len(state.gpus)):
            idle = state.idle(g, profile.name)
            if idle:
                return Plan([(g, idle[0])], 1.0, "one-to-one")
        options = []
        for g in range(len(state.gpus)):
            busy = state.mask(g, busy_only=True)
            for s in profile.starts:
                window = profile.window(s)
                if window & busy:
                    continue
                doomed = [i for i in state.idle(g) if state.profile(i).window(i.start) & window]
                kept = sum(i.profile == profile.name for i in state.gpus[g] if i not in doomed)
                if kept < profile.max_instances:
                    options.append((len(doomed), g, s, doomed))
        if options:
            _, g, s, doomed = min(options, key=lambda o: o[:3])
            return Plan([(g, Instance(s, profile.name))], 1.0, "one-to-one", destroy=[(g, i) for i in doomed])
        return self._drain(job, profile, state)

    def _drain(self, job: FlexJob, profile: Profile, state: HostState) -> Plan | None:
        for g in range(len(state.gpus)):
            if state.runs_inference(g):
                continue  # Flex-MIG §5.1: no drain where inference runs
            busy = sorted((i for i, h in state.gpus[g].items() if h is not None),
                          key=lambda i: -state.profile(i).memory_slices)  # fmt: skip
            wanted = [state.profile(i) for i in busy] + [profile]
            if sum(p.compute_slices for p in wanted) > self.model.compute_slices:
                continue
            order = sorted(range(len(wanted)), key=lambda k: -wanted[k].memory_slices)
            starts = _pack([wanted[k] for k in order])
            if starts is None:
                continue
            new = {order[j]: Instance(starts[j], wanted[order[j]].name) for j in range(len(order))}
            moves = {busy[k]: new[k] for k in range(len(busy))}
            doomed = [(g, i) for i in state.gpus[g]]
            return Plan([(g, new[len(busy)])], 1.0, "one-to-one", destroy=doomed, drain_gpu=g, moves=moves)
        return None


def _pack(profiles: list[Profile], mask: int = 0) -> list[int] | None:
    """Starts that fit ``profiles`` together on an empty GPU (depth-first, lowest start first)."""
    if not profiles:
        return []
    head, *rest = profiles
    for s in head.starts:
        window = head.window(s)
        if window & mask:
            continue
        tail = _pack(rest, mask | window)
        if tail is not None:
            return [s, *tail]
    return None


class MigBatchDynamic(FlexPolicy):
    """Per-job create/destroy at the MFI spot; a job waits rather than disturb a running one."""

    name = "mbdyn"
    keeps_idle = False

    def __init__(self, params: FlexParams, model: GpuModel) -> None:
        super().__init__(params, model)
        self.tables = tables_for(model.name)

    def one_to_one(self, job: FlexJob, state: HostState) -> Plan | None:
        profile = one_to_one_profile(self.model, job.size)
        spots = _mfi_spots(self.tables, state, profile.name, [state.mask(g) for g in range(len(state.gpus))])
        if not spots:
            return None
        _, g, s = spots[0]
        return Plan([(g, Instance(s, profile.name))], 1.0, "one-to-one")

    def plan(self, job: FlexJob, state: HostState) -> Plan | None:
        return self.one_to_one(job, state)


class Hybrid(MigBatchDynamic):
    """One-to-one where an instance fits now, else ``size`` 1g.5gb instances at MFI spots, one-to-many."""

    name = "hybrid"

    def room_suffices(self, job: FlexJob, state: HostState) -> bool:
        return super().room_suffices(job, state) or state.free_room()[0] >= job.size

    def plan(self, job: FlexJob, state: HostState) -> Plan | None:
        direct = self.one_to_one(job, state)
        if direct is not None or job.size == 1:
            return direct
        masks = [state.mask(g) for g in range(len(state.gpus))]
        counts = [sum(i.profile == LEAF for i in state.gpus[g]) for g in range(len(state.gpus))]
        cap = self.model.profile(LEAF).max_instances
        k = self.tables.index(LEAF)
        frag = self.tables.frag[FragVariant.PRINTED]
        picks: list[tuple[int, Instance]] = []
        for _ in range(job.size):
            spots = sorted((after - frag[masks[g]], g, s)
                           for g in range(len(masks)) if counts[g] < cap
                           for s, after in self.tables.frag_after[FragVariant.PRINTED][k][masks[g]])  # fmt: skip
            if not spots:
                return None
            _, g, s = spots[0]
            picks.append((g, Instance(s, LEAF)))
            masks[g] |= self.model.profile(LEAF).window(s)
            counts[g] += 1
        return Plan(picks, self.params.slowdown(job.size), "one-to-many")


POLICY_CLASSES: dict[str, type[FlexPolicy]] = {
    "fm": FlexMig, "dm": DynamicMig, "sm": StaticMig, "mbdyn": MigBatchDynamic, "hybrid": Hybrid,
}  # fmt: skip


def make_policy(name: str, params: FlexParams) -> FlexPolicy:
    if name not in POLICY_CLASSES:
        raise FlexSimError(f"unknown Flex-MIG simulation policy {name!r}; known: {', '.join(POLICY_CLASSES)}")
    return POLICY_CLASSES[name](params, get_model(params.model))


# --- the event loop --------------------------------------------------------------------------------


def _reconfig_s(model: GpuModel, created: Sequence[str], destroyed: Sequence[str]) -> float:
    def slices(name: str) -> int:
        return model.profile(name).compute_slices

    def near(table: dict[int, float], c: int) -> float:
        return table[min(table, key=lambda k: (abs(k - c), k))]

    create = sum(near(A100_CREATE_S, slices(p)) for p in created)
    return create + sum(near(A100_DESTROY_S, slices(p)) for p in destroyed)


def simulate(policy_name: str, jobs: Sequence[FlexJob], params: FlexParams) -> RunResult:
    """Run ``jobs`` through one policy; jobs are queued in submit order (ties: the trace's order)."""
    if not jobs:
        raise FlexSimError("a trace needs at least one job")
    policy = make_policy(policy_name, params)
    model = policy.model
    too_big = sorted({j.size for j in jobs if j.size < 1 or j.size > policy.max_size()})
    if too_big:
        raise FlexSimError(f"policy {policy_name} holds job sizes 1..{policy.max_size()} on {params.gpus} x "
                           f"{model.name}; the trace has size(s) {', '.join(map(str, too_big))}")  # fmt: skip
    state = HostState(model, params.gpus)
    for g in range(params.gpus):
        state.gpus[g] = {Instance(s, p): None for s, p in policy.layout}
    result = RunResult(policy_name, [], [], model.compute_slices * params.gpus)
    arrivals = sorted(jobs, key=lambda j: j.submit_s)
    queue: list[FlexJob] = []
    events: list[tuple[float, int, int, int]] = []  # (end, seq, job id, version)
    frag: dict[int, float] = {j.job_id: 0.0 for j in jobs}
    seq = 0
    now = 0.0

    def factor(mode: str) -> float:
        return params.contention if params.contention_everywhere or mode == "one-to-many" else 1.0

    def close_segments(run: _Running, until: float) -> None:
        for g, inst in run.allocation:
            mask = model.profile(inst.profile).window(inst.start)
            result.segments.append(Segment(run.job.job_id, g, mask, run.seg_start, until))

    def start(job: FlexJob, plan: Plan) -> None:
        nonlocal seq
        destroyed = [inst.profile for _, inst in plan.destroy]
        for g, inst in plan.destroy:
            del state.gpus[g][inst]
        if plan.drain_gpu is not None:
            result.drains += 1
            holders = {old: next(r for r in state.running.values() if (plan.drain_gpu, old) in r.allocation)
                       for old in plan.moves}  # fmt: skip
            for old, new in plan.moves.items():
                holder = holders[old]
                close_segments(holder, now)
                holder.allocation = [(plan.drain_gpu, new)]
                holder.seg_start = now
                state.gpus[plan.drain_gpu][new] = holder.job.job_id
            lost = params.drain_penalty_s + _reconfig_s(model, [n.profile for n in plan.moves.values()], [])
            for job_id in sorted({h for h in state.gpus[plan.drain_gpu].values() if h is not None}):
                holder = state.running[job_id]
                holder.end += lost
                holder.version += 1
                heapq.heappush(events, (holder.end, seq, holder.job.job_id, holder.version))
                seq += 1
        created = [inst.profile for g, inst in plan.allocation if inst not in state.gpus[g]]
        if created:
            result.reconfigurations += 1
        result.created += len(created)
        result.destroyed += len(destroyed)
        for g, inst in plan.allocation:
            state.gpus[g][inst] = job.job_id
        exec_s = job.work_s * plan.time_factor * factor(plan.mode)
        setup = _reconfig_s(model, created, destroyed)
        compute = sum(model.profile(inst.profile).compute_slices for _, inst in plan.allocation)
        run = _Running(job, list(plan.allocation), now, now + setup + exec_s, exec_s, compute, plan.mode, 0, now)
        state.running[job.job_id] = run
        heapq.heappush(events, (run.end, seq, job.job_id, 0))
        seq += 1

    def finish(run: _Running) -> None:
        close_segments(run, run.end)
        for g, inst in run.allocation:
            if policy.keeps_idle:
                state.gpus[g][inst] = None
            else:
                del state.gpus[g][inst]
        del state.running[run.job.job_id]
        job = run.job
        result.jobs.append(JobRecord(job.job_id, job.size, job.kind, job.submit_s, run.start, run.end, run.exec_s,
                                     run.compute, run.mode, frag[job.job_id]))  # fmt: skip

    next_arrival = 0
    while next_arrival < len(arrivals) or queue or state.running:
        while next_arrival < len(arrivals) and arrivals[next_arrival].submit_s <= now:
            queue.append(arrivals[next_arrival])
            next_arrival += 1
        placed = True
        while placed and queue:  # FIFO over the first `window` jobs; restart after every start
            placed = False
            for k, job in enumerate(queue[: params.window]):
                plan = policy.plan(job, state)
                if plan is not None:
                    start(job, plan)
                    del queue[k]
                    placed = True
                    break
        blocked = [j for j in queue[: params.window] if policy.room_suffices(j, state)]
        upcoming = [events[0][0]] if events else []
        if next_arrival < len(arrivals):
            upcoming.append(arrivals[next_arrival].submit_s)
        if not upcoming:
            if queue:
                raise FlexSimError(f"policy {policy_name} can never place job {queue[0].job_id} (size {queue[0].size})")
            break
        later = min(upcoming)
        for j in blocked:
            frag[j.job_id] += later - now
        now = later
        while events and events[0][0] <= now:
            _, _, job_id, version = heapq.heappop(events)
            run = state.running.get(job_id)
            if run is not None and run.version == version:
                finish(run)
    return result


def lower_bound_makespan(jobs: Sequence[FlexJob], params: FlexParams) -> float:
    """Total slice-seconds every job needs at least, over the host's compute slices (all jobs at t = 0)."""
    model = get_model(params.model)
    area = sum(j.work_s * min(j.size, model.compute_slices) for j in jobs)
    return area / (model.compute_slices * params.gpus)


def _summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    n = len(ordered)
    mean = sum(ordered) / n
    return {"mean": mean, "min": ordered[0], "max": ordered[-1], "median": ordered[n // 2] if n % 2 else
            (ordered[n // 2 - 1] + ordered[n // 2]) / 2}  # fmt: skip


def ratio_table(per_trace: Mapping[str, Sequence[Mapping[str, float]]], numerator: str, denominator: str,
                metric: str) -> dict[str, Any]:  # fmt: skip
    """Per-trace ratios numerator/denominator of one metric (the paper's Fig. 7 boxes), summarised."""
    ratios = []
    for a, b in zip(per_trace[numerator], per_trace[denominator], strict=True):
        if b[metric] > 0:
            ratios.append(a[metric] / b[metric])
        elif a[metric] == 0:
            ratios.append(1.0)
    if not ratios:
        return {"mean": math.nan, "min": math.nan, "max": math.nan, "median": math.nan, "values": []}
    return {**_summary(ratios), "values": ratios}
