"""Flex-MIG's finer requests: a compute and memory demand met by N leaves (small MIG instances) of one node.

Flex-MIG (§3, "resource flattening") lets a job ask for a size no profile has, such as 5g.25gb, and
runs it on that many leaves instead of rounding up to 7g.40gb. Its leaf rule is
:func:`mig_batch.placement.multi.flex_mig_profile`: 1g.10gb for a job of one instance (where the model
has it), else the model's smallest profile. Here N is the fewest leaves whose compute slices and
memory together cover the request, under that rule:

- N = 1 when the one-instance leaf covers the request;
- else N = max(2, ceil(compute / leaf compute), ceil(memory / leaf memory)) with the smallest leaf.

Memory is compared with what the leaf really has (NVML's size, 4.75 GiB for A100-40GB's 1g.5gb), as in
:mod:`mig_batch.request`, so ``25G`` (25 GiB) needs six 1g.5gb leaves and ``25GB`` (23.3 GiB) five. The
paper counts leaves by their nominal size; it is silent on the rounding.

Pure: no I/O. Whether a site allows leaf requests is its ``flex.leaf_requests`` setting; callers pass it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mig_batch.mig.models import GpuModel, Profile
from mig_batch.request import MigRequest, RequestError, format_mib

SETTING = "flex.leaf_requests"


@dataclass(frozen=True)
class LeafPlan:
    """N leaves of one profile on one GPU model: the request's one-to-many translation there."""

    model: str
    leaf: Profile
    count: int
    compute_slices: int  # what the request asked for, in compute slices of this model (0: not asked)
    memory_mib: int  # 0: not asked

    @property
    def total_compute(self) -> int:
        return self.count * self.leaf.compute_slices

    @property
    def total_memory_mib(self) -> int:
        return self.count * self.leaf.memory_mib

    def covers(self) -> bool:
        return self.total_compute >= self.compute_slices and self.total_memory_mib >= self.memory_mib


def leaf_profiles(model: GpuModel) -> tuple[Profile, Profile]:
    """(the leaf of a one-instance job, the leaf of a job over two or more) by Flex-MIG's rule."""
    from mig_batch.placement.multi import flex_mig_profile

    return model.profile(flex_mig_profile(model, 1)), model.profile(flex_mig_profile(model, 2))


def compute_slices_asked(request: MigRequest, model: GpuModel) -> int:
    """The request's compute as slices of ``model`` (a share of the GPU rounds up); 0 when not asked."""
    if request.compute is None:
        return 0
    if request.compute.slices is not None:
        return request.compute.slices
    assert request.compute.fraction is not None
    return math.ceil(request.compute.fraction * model.compute_slices - 1e-9)


def leaves_for(request: MigRequest, model: GpuModel) -> LeafPlan:
    """The fewest leaves of ``model`` that cover ``request``'s compute and memory (Flex-MIG's rule)."""
    if request.profiles or request.media:
        raise RequestError("a request over leaves is a compute and/or memory demand; a profile name asks for "
                           "instances of that size: give their count instead (migsub --instances N)")  # fmt: skip
    if request.count != 1:
        raise RequestError(f"a request over leaves counts its own leaves; it cannot also ask for {request.count}")
    if request.compute is None and request.memory_mib is None:
        raise RequestError("a request over leaves needs GPU compute and/or GPU memory (migsub --gpu-compute, "
                           "--gpu-mem)")  # fmt: skip
    compute, memory = compute_slices_asked(request, model), request.memory_mib or 0
    one, many = leaf_profiles(model)
    plan = LeafPlan(model.name, one, 1, compute, memory)
    if plan.covers():
        return plan
    count = max(2, math.ceil(compute / many.compute_slices), math.ceil(memory / many.memory_mib))
    return LeafPlan(model.name, many, count, compute, memory)


@dataclass(frozen=True)
class LeafChoice:
    """The leaves a job gets, with each site model's plan (for the user to see) and what held each back."""

    chosen: LeafPlan
    plans: tuple[LeafPlan, ...]
    constrain: bool  # another site model has the same leaf but needs another count: pin the job's model


def choose_leaves(request: MigRequest, models: Sequence[GpuModel],
                  capacity: Mapping[str, tuple[int, str]] | None = None) -> LeafChoice:  # fmt: skip
    """Translate ``request`` into leaves on the site's ``models`` and pick one model's plan: the fewest
    leaves a node of the site can hold (ties: the model name). ``capacity``: model -> (the most leaves of
    its plan one node holds, that node); without it (no inventory) every plan counts as holdable.
    Refused when no node holds its model's N leaves."""
    plans = tuple(leaves_for(request, m) for m in sorted(models, key=lambda m: m.name))
    holdable = [p for p in plans if capacity is None or capacity.get(p.model, (0, ""))[0] >= p.count]
    if not holdable:
        why = "; ".join(_capacity_text(p, capacity) for p in plans)
        raise RequestError(f"{request.describe()} needs more leaves than any node of this site holds: {why}")
    chosen = min(holdable, key=lambda p: (p.count, p.model))
    constrain = any(p.leaf.name == chosen.leaf.name and p.count != chosen.count for p in plans)
    return LeafChoice(chosen, plans, constrain)


def _capacity_text(plan: LeafPlan, capacity: Mapping[str, tuple[int, str]] | None) -> str:
    most, where = (capacity or {}).get(plan.model, (0, ""))
    held = f"the most is {most} ({where})" if where else "no node has one"
    return f"{plan.model} needs {plan.count} x {plan.leaf.name}, {held}"


def needs_leaves(request: MigRequest, results: Mapping[str, Profile | RequestError]) -> bool:
    """True when no model meets ``request`` with one instance (``results``: :func:`translate_any`'s)."""
    return request.count == 1 and not request.profiles and not any(isinstance(r, Profile) for r in results.values())


def refused_without_setting(request: MigRequest, auto: bool) -> RequestError:
    """The message when the site has not enabled leaf requests."""
    why = "--instances auto asks for" if auto else "no single MIG instance holds it, so it needs"
    return RequestError(f"{request.describe()}: {why} several leaves (Flex-MIG's finer requests), which this "
                        f"site has not enabled; an administrator sets `{SETTING}: true` in the mig_batch config "
                        f"(docs/flex.md)")  # fmt: skip


def describe_plan(plan: LeafPlan) -> str:
    asked = [f"{plan.compute_slices}g" if plan.compute_slices else "", format_mib(plan.memory_mib)
             if plan.memory_mib else ""]  # fmt: skip
    return (f"{plan.count} x {plan.leaf.name} ({plan.total_compute} compute slices, "
            f"{format_mib(plan.total_memory_mib)}) for {' '.join(a for a in asked if a)}")  # fmt: skip
