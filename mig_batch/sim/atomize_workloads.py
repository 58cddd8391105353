"""Workloads for ``simulate atomize``: rigid jobs and checkpointable training jobs.

Two sources, the same jobs and memory model:
* :func:`generate`: a seeded synthetic mix (Poisson arrivals, uniform run times);
* :func:`from_trace`: a window of the Alibaba GPU trace 2023 ("openb"), mapped to MIG profiles the
  way GRMU does (:mod:`mig_batch.sim.traces`). Each pod keeps its arrival order, its profile and its
  run time (deletion - creation, at most ``max_run_s``); arrivals are rescaled so that the offered
  load (memory-slice seconds asked / cluster capacity over the window) is ``load``, since the trace's
  thousands of GPUs are simulated as a few. A best-effort (``BE``: batch) pod that runs at least one
  minimum subjob is a checkpointable training job; every other pod (``LS`` inference services among
  them) is rigid. The trace has no memory use per pod: a training job declares its profile's memory
  and really uses 40-77 % of it, with noise and spikes shared by the jobs of one profile (the
  application key). Data: Weng et al., USENIX ATC'23 (alibaba/clusterdata); research/study use.

Pure code: the CLI reads the trace file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mig_batch.atomize.profiles import Trajectory
from mig_batch.mig.models import get_model
from mig_batch.sim.traces import TracePod, map_pods_to_profiles


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
    # sja-defrag (mig_batch.atomize.defrag)
    defrag_consolidate: bool = True  # each grant to the spot that keeps the most useful capacity
    defrag_max_steered: int = 4  # rigid jobs per schedule whose window is kept from chain grants
    defrag_max_hold_s: float = 3600.0  # a chain that waited this long is offered the kept windows too
    # trace workloads (from_trace) only
    trace_jobs: int = 300
    load: float = 1.0
    max_run_s: float = 24 * 3600.0



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


def from_trace(pods: Sequence[TracePod], setup: AtomizeSetup, seed: int) -> tuple[list[Job], list[App]]:
    """``setup.trace_jobs`` consecutive mapped pods from a seeded offset (see the module text)."""
    model = get_model(setup.model)
    mapped = sorted(map_pods_to_profiles(pods, model), key=lambda pm: (pm[0].creation, pm[0].name))
    if not mapped:
        raise ValueError("the trace has no pod that maps to a MIG profile (single-GPU pods with a GPU share)")
    rng = np.random.default_rng(seed)
    n = min(setup.trace_jobs, len(mapped))
    offset = int(rng.integers(0, len(mapped) - n + 1))
    window = mapped[offset : offset + n]
    runs = [float(min(max(pod.deletion - pod.creation, 60), setup.max_run_s)) for pod, _ in window]
    slices = [model.profile(profile).memory_slices for _, profile in window]
    offered = sum(r * s for r, s in zip(runs, slices, strict=True))
    span = max(window[-1][0].creation - window[0][0].creation, 1)
    scale = offered / (setup.load * setup.gpus * model.memory_slices * span)
    apps: dict[str, App] = {}
    jobs: list[Job] = []
    for (pod, profile), run in zip(window, runs, strict=True):
        submit = (pod.creation - window[0][0].creation) * scale
        declared = float(model.profile(profile).memory_mib)
        if pod.qos == "BE" and run >= setup.min_subjob_s:
            if profile not in apps:
                base = declared * float(rng.uniform(0.4, 0.77))
                apps[profile] = App(base, base * float(rng.uniform(0.02, 0.08)), base * float(rng.uniform(0.05, 0.3)))
            app = list(apps).index(profile)
            jobs.append(Job(pod.name, "training", submit, run, profile, run * 1.2, declared, app))
        else:
            jobs.append(Job(pod.name, "rigid", submit, run, profile, run * float(rng.uniform(1, 2))))
    return jobs, list(apps.values())


def offered_load(jobs: Sequence[Job], setup: AtomizeSetup) -> float:
    """Memory-slice seconds the jobs ask for (training at its declared profile) over the cluster's
    capacity between the first and the last arrival."""
    model = get_model(setup.model)
    asked = sum(j.work_s * model.profile(j.profile).memory_slices for j in jobs)
    span = max(jobs[-1].submit - jobs[0].submit, 1.0) if jobs else 1.0
    return asked / (setup.gpus * model.memory_slices * span)
