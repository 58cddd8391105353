"""Waiting moldable jobs planned together (``moldable.planner: far|auto``; docs/moldable.md).

The jobs the live planner (:mod:`mig_batch.planner.live`) can take - sizes that are the planner's
profile on every model of the cluster that has them (a job asking more memory than that profile is
left to the earliest-finish rule) - are planned over the GPUs' timelines, EASY reservation included
(no plan runs on its slices after it opens). The plan's start-now steps are decided (pinned and
released by the caller) where the job may go now: its partitions, a node with room, slices free in
the view; the rest of the plan holds reservations that chains and the earliest-finish rule respect,
revised at the next pass. Jobs the plan could not start go to the earliest-finish rule.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mig_batch.batch.system import BatchJob
from mig_batch.batch.tags import JobTag
from mig_batch.config import MoldableConfig
from mig_batch.controller.fences import Fences
from mig_batch.controller.ledger import ViewLedger
from mig_batch.controller.place import Placer
from mig_batch.controller.translations import Translations
from mig_batch.mig.models import get_model
from mig_batch.placement.base import placement_on
from mig_batch.placement.timelines import GpuTimeline, Hold
from mig_batch.planner.live import LiveJob, LivePlan, LiveState, Step, from_timeline, plan_live
from mig_batch.planner.problem import GpuScheme, gpu_scheme
from mig_batch.state import Decision

log = logging.getLogger("mig-batchd")


@dataclass
class LiveOutcome:
    decided: list[Decision] = field(default_factory=list)
    holds: list[tuple[int, Hold]] = field(default_factory=list)  # the starts, for the rule after
    reserved: list[tuple[int, Hold]] = field(default_factory=list)
    waiting: int = 0
    left: list[tuple[BatchJob, JobTag]] = field(default_factory=list)  # to the earliest-finish rule


def sizes_of(times: Mapping[str, Mapping[str, float]],
             schemes: Mapping[str, GpuScheme]) -> tuple[dict[int, float], frozenset[str]]:  # fmt: skip
    """(size -> seconds, the models it may run on): the cluster's models the job lists times for (``--gpu
    A100-40GB``: that model only; the GPUs of the others are barred to it); a size counts when, on every
    one of them that has it, the job lists that model's planner profile (the longest of those times is
    taken). A size the job lists on a model under another profile only (``1g.10gb`` on an A100-40GB,
    whose planner 1g is 1g.5gb) could run there, and the plan could neither use it nor leave it to the
    job: then nothing is planned ({}) and the rule after decides."""
    def listed(model: str, size: int) -> float | None:
        value = times.get(model, {}).get(schemes[model].profiles[size].name)
        return float(value) if value is not None and math.isfinite(value) and value > 0 else None

    models = frozenset(m for m in schemes if times.get(m))
    for m in models:
        shape = get_model(m)
        sizes = {shape.profile(name).compute_slices for name in times[m] if shape.has_profile(name)}
        if any(size not in schemes[m].profiles or listed(m, size) is None for size in sizes):
            return {}, frozenset()
    out: dict[int, float] = {}
    for size in sorted({s for m in models for s in schemes[m].profiles}):
        seconds = [listed(m, size) for m in models if size in schemes[m].profiles]
        if all(v is not None for v in seconds):
            out[size] = max(v for v in seconds if v is not None)
    return out, models if out else frozenset()


class LiveMoldable:
    def __init__(self, ledger: ViewLedger, fences: Fences, placer: Placer, translations: Translations,
                 config: MoldableConfig) -> None:  # fmt: skip
        self.ledger, self.fences, self.placer = ledger, fences, placer
        self.translations, self.config = translations, config
        self._schemes: dict[str, GpuScheme] = {}
        self._recorded: list[Step] = []  # the last plan recorded (a moldable-plan event each time it changes)
        self._last: tuple[Any, LivePlan] | None = None  # (what it was planned from, the plan)

    def scheme(self, model: str) -> GpuScheme:
        if model not in self._schemes:
            self._schemes[model] = gpu_scheme(model)
        return self._schemes[model]

    def plan(self, waiting: Sequence[tuple[BatchJob, JobTag]], timelines: Sequence[GpuTimeline],
             now: float) -> LiveOutcome:  # fmt: skip
        out = LiveOutcome()
        schemes = {t.model: self.scheme(t.model) for t in timelines}
        eligible: dict[str, tuple[BatchJob, JobTag, dict[int, float]]] = {}
        barred: dict[str, frozenset[int]] = {}  # the GPUs a job may not have, now or later (as the rule after)
        barred_of: dict[tuple[frozenset[str], frozenset[str]], frozenset[int]] = {}  # by reach and models: shared
        for job, tag in waiting:
            times = self.translations.moldable(tag)
            sizes, models = sizes_of(times, schemes) if not isinstance(times, str) else ({}, frozenset())
            if not sizes or self.fences.partition_problem(job) is not None:
                out.left.append((job, tag))  # the rule after records why (unplaceable, partitions) or sizes it
                continue
            eligible[job.job_id] = (job, tag, sizes)
            key = (self.fences.outside_of_job(job, now), models)  # no fence applied: nothing is decided here
            if key not in barred_of:
                barred_of[key] = self.fences.barred(key[0]) | {t.gid for t in timelines if t.model not in models}
            barred[job.job_id] = barred_of[key]
        if not eligible:
            return out
        jobs = tuple(LiveJob(name, sizes, barred[name]) for name, (_, _, sizes) in eligible.items())
        plan = self._plan(jobs, timelines, schemes, now)
        if plan.steps and plan_changed(self._recorded, plan.steps):  # before its decisions: what they follow
            self._recorded = list(plan.steps)
            self.placer.store.event(None, "moldable-plan", planner=plan.planner, planned=len(plan.steps),
                                    unplaced=len(plan.unplaced), steps=[
                {"job": s.job, "gpu": s.gid, "profile": s.profile, "slot": s.slot, "start": round(s.start, 3),
                 "end": round(s.end, 3), "now": s.now} for s in plan.steps[:EVENT_STEPS]])  # fmt: skip
        queue = {name: i for i, name in enumerate(eligible)}
        held = {s.job for s in sorted((s for s in plan.steps if not s.now), key=lambda s: queue[s.job])
                [: self.config.max_reservations]}  # the oldest waiting jobs hold their slices, as under the rule
        view = self.ledger.view
        with self.fences.confinement(now) as confine:
            for step in plan.steps:
                job, tag, sizes = eligible[step.job]
                gpu = view.gpus[step.gid]
                window = get_model(gpu.model).profile(step.profile).window(step.slot)
                if not step.now:
                    if step.job in held:
                        out.reserved.append((step.gid, Hold(window, until=step.end, since=step.start)))
                    out.waiting += 1
                    continue
                confine(job)
                if step.gid in view.fenced or gpu.mask & window:  # not its partitions, a full node, or taken
                    out.left.append((job, tag))
                    continue
                self.ledger.predicted[job.job_id] = sizes[step.size]
                placement = placement_on(view, step.gid, step.profile, step.slot)
                out.decided.append(self.placer.decide(job, tag, placement, f"moldable-{plan.planner}"))
                out.holds.append((step.gid, Hold(window, until=now + sizes[step.size])))
                self.fences.use_room(placement.host, job.cpus)
        out.left += [(eligible[name][0], eligible[name][1]) for name in plan.unplaced]
        return out


    def _plan(self, jobs: tuple[LiveJob, ...], timelines: Sequence[GpuTimeline], schemes: Mapping[str, GpuScheme],
              now: float) -> LivePlan:  # fmt: skip
        """The plan for this pass: the last one again when its jobs and the GPUs' holds are the same and none of
        its steps can start yet (planning again would find it again, at the cost of the whole budget)."""
        key = (jobs, tuple((t.gid, t.model, t.holds) for t in timelines))
        if self._last is not None and self._last[0] == key and all(s.opens > now for s in self._last[1].steps):
            return self._last[1]
        state = LiveState(now, tuple(from_timeline(t) for t in timelines), jobs)
        plan = plan_live(state, self.config.planner, budget_s=self.config.planner_budget_s, schemes=schemes)
        log.debug("moldable plan (%s): %d steps, %d now, %d decodings in %.3f s", plan.planner, len(plan.steps),
                  len(plan.start_now()), plan.evaluations, plan.elapsed_s)  # fmt: skip
        self._last = (key, plan)
        return plan


PLAN_MOVED_S = 2.0  # a planned start that moves by more than this makes the plan a new one (recorded)
EVENT_STEPS = 64  # steps a moldable-plan event keeps (the first, in plan order; ``planned`` counts them all)


def plan_changed(before: Sequence[Step], after: Sequence[Step]) -> bool:
    """Whether ``after`` differs from ``before`` in a job's GPU, slot, size or whether it starts now, or a start
    by over PLAN_MOVED_S
    (a pass with nothing new plans the same again: the passes in between record nothing)."""
    was = {s.job: s for s in before}
    if set(was) != {s.job for s in after}:
        return True
    return any((s.gid, s.slot, s.size, s.now) != (was[s.job].gid, was[s.job].slot, was[s.job].size, was[s.job].now)
               or abs(s.start - was[s.job].start) > PLAN_MOVED_S for s in after)  # fmt: skip
