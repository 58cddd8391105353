"""Arrival workloads for the live moldable simulation (:mod:`mig_batch.sim.moldable_live`).

* ``migdrl-<type>`` (e.g. ``migdrl-mixscalinguniform``, ``migdrl-widetimes``): tasks of one MIG-DRL
  workload type (:func:`mig_batch.planner.workloads.synthetic_dataset`);
* ``rodinia``: the 16 Rodinia benchmarks' measured A100 times (../shared/data/mig-tasks, Villarrubia
  et al.; the mean of 10 runs per size), drawn with replacement;
* ``alibaba-mix``: consecutive pods of the Alibaba 2023 trace (openb_pod_list_default.csv, GRMU's
  profile mapping): half of them rigid (their profile's size, their duration), half moldable (the
  pod's duration on its size, the other sizes by the MIG-DRL generator's scaling curve).

In the first two a share ``rigid_share`` of the tasks are rigid: one size drawn uniformly among the
task's sizes, its time there. Arrivals are Poisson (the trace's own gaps, rescaled, for
``alibaba-mix``) at the rate that offers ``load`` of the cluster's compute slices, a task's work being
its least area (size x time). Prediction noise: lognormal with sigma ``noise`` per moldable job.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

from mig_batch.mig.models import get_model
from mig_batch.planner.problem import Task
from mig_batch.planner.workloads import WORKLOAD_TYPES, synthetic_dataset, synthetic_task
from mig_batch.sim.moldable_live import SimJob
from mig_batch.sim.traces import TracePod, trace_arrivals

WORKLOADS = ("rodinia", "alibaba-mix", *(f"migdrl-{t}" for t in WORKLOAD_TYPES))
SIZES = [1, 2, 3, 4, 7]


def _least_area(times: dict[int, float]) -> float:
    return min(s * t for s, t in times.items() if math.isfinite(t))


def _arrive(tasks: Sequence[tuple[str, dict[int, float], bool]], gpus: int, load: float, rng: random.Random,
            noise: float, gaps: Sequence[float] | None = None) -> list[SimJob]:  # fmt: skip
    """Poisson arrivals (or ``gaps`` rescaled) offering ``load`` of ``gpus`` x 7 slices."""
    work = sum(_least_area(times) for _, times, _ in tasks)
    rate = load * gpus * 7 * len(tasks) / work  # jobs per second
    if gaps is None:
        gaps = [rng.expovariate(1.0) for _ in tasks]
    scale = len(tasks) / (sum(gaps) or 1.0) / rate
    out, clock = [], 0.0
    for (name, times, rigid), gap in zip(tasks, gaps, strict=True):
        factor = 1.0 if rigid or noise <= 0 else math.exp(rng.gauss(0.0, noise))
        out.append(SimJob(name, round(clock, 6), times, rigid, factor))
        clock += gap * scale
    return out


def _rigidify(rng: random.Random, tasks: Sequence[Task], share: float) -> list[tuple[str, dict[int, float], bool]]:
    out = []
    for task in tasks:
        times = {s: t for s, t in task.times.items() if s in SIZES and math.isfinite(t)}
        if rng.random() < share:
            size = rng.choice(sorted(times))
            out.append((task.name, {size: times[size]}, True))
        else:
            out.append((task.name, times, False))
    return out


def build_workload(name: str, jobs: int, gpus: int, load: float, seed: int, rigid_share: float = 0.25,
                   noise: float = 0.1, rodinia: Sequence[Task] | None = None,
                   pods: Sequence[TracePod] | None = None) -> list[SimJob]:  # fmt: skip
    """``jobs`` arrivals of workload ``name`` (see the module text); ``rodinia``: the Rodinia tasks
    (:func:`~mig_batch.planner.workloads.read_rodinia`), ``pods``: the trace's, read by the caller."""
    rng = random.Random(seed)
    if name.startswith("migdrl-"):
        tasks = synthetic_dataset(name.removeprefix("migdrl-"), jobs, seed)
        return _arrive(_rigidify(rng, tasks, rigid_share), gpus, load, rng, noise)
    if name == "rodinia":
        if not rodinia:
            raise ValueError("the rodinia workload needs the Rodinia task times")
        pool = list(rodinia)
        tasks = [Task(f"{t.name}-{i}", t.times) for i, t in enumerate(rng.choice(pool) for _ in range(jobs))]
        return _arrive(_rigidify(rng, tasks, rigid_share), gpus, load, rng, noise)
    if name == "alibaba-mix":
        if pods is None:
            raise ValueError("alibaba-mix needs the trace's pods")
        model = get_model("A100-80GB")
        arrivals = trace_arrivals(pods, model)
        if len(arrivals) < jobs + 1:
            raise ValueError(f"the trace has {len(arrivals)} usable pods, fewer than --jobs {jobs}")
        first = rng.randrange(len(arrivals) - jobs)
        window = arrivals[first : first + jobs + 1]
        gaps = [max(b.slot - a.slot, 0) + 1e-3 for a, b in itertools.pairwise(window)]
        out = []
        for a in window[:jobs]:
            size = model.profile(a.profile).compute_slices
            size = max(s for s in SIZES if s <= size)
            duration = float(a.duration)
            if rng.random() < 0.5:
                out.append((a.job, {size: duration}, True))
                continue
            curve = synthetic_task(rng, a.job, rng.choice(SIZES), rng.random() < 0.5, 1.0, 1.0, SIZES)
            factor = duration / curve.times[size]
            out.append((a.job, {s: t * factor for s, t in curve.times.items()}, False))
        return _arrive(out, gpus, load, rng, noise, gaps)
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
