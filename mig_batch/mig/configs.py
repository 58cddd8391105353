"""Enumeration of configurations and their canonical form.

*Reachable* configurations are all sets of instances that can coexist on one GPU, found by
depth-first search from the empty GPU adding one instance at a time (GRMU §5.1); *maximal* ones admit
no further instance. Two configurations are *equivalent* when a symmetry of the model's placement
structure (a permutation of memory slices that maps every allowed window of every profile to an
allowed window of the same profile) maps one onto the other; the *canonical* representative is the
lexicographically highest (MIG-DRL §4.1: 2-1-1-3 is preferred to 1-1-2-3).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from itertools import product

from mig_batch.mig.geometry import Configuration, Instance, feasible_starts, place
from mig_batch.mig.models import GpuModel, get_model

Permutation = tuple[int, ...]  # perm[i] = slice that slice i moves to


def _profile_names(model: GpuModel, profiles: Sequence[str] | None) -> tuple[str, ...]:
    if profiles is None:
        return tuple(p.name for p in model.base_profiles)
    for name in profiles:
        model.profile(name)  # raises a clear KeyError for unknown names
    return tuple(profiles)


def successors(model: GpuModel, config: Configuration, profiles: Sequence[str]) -> Iterable[Configuration]:
    for name in profiles:
        for start in feasible_starts(model, config, name):
            yield place(model, config, name, start)


def reachable_configurations(model: GpuModel, profiles: Sequence[str] | None = None) -> set[Configuration]:
    """Every configuration reachable from the empty GPU (the empty one included)."""
    names = _profile_names(model, profiles)
    seen = {Configuration()}
    stack = [Configuration()]
    while stack:
        for nxt in successors(model, stack.pop(), names):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def is_maximal(model: GpuModel, config: Configuration, profiles: Sequence[str] | None = None) -> bool:
    names = _profile_names(model, profiles)
    return not any(feasible_starts(model, config, name) for name in names)


def maximal_configurations(model: GpuModel, profiles: Sequence[str] | None = None) -> list[Configuration]:
    names = _profile_names(model, profiles)
    found = [c for c in reachable_configurations(model, names) if is_maximal(model, c, names)]
    return sorted(found, key=lambda c: order_key(model, c), reverse=True)


# ---------------------------------------------------------------------------------------------
# symmetry and canonical form


def _map_mask(mask: int, perm: Permutation) -> int:
    out = 0
    for i, target in enumerate(perm):
        if mask >> i & 1:
            out |= 1 << target
    return out


def _buddy_permutations(slices: int) -> list[Permutation]:
    """Permutations obtained by swapping the halves of aligned blocks (the MIG slice hierarchy)."""
    blocks = []
    size = slices
    while size >= 2:
        blocks += [(lo, size) for lo in range(0, slices - size + 1, size)]
        size //= 2
    perms = set()
    for choice in product((False, True), repeat=len(blocks)):
        perm = list(range(slices))
        for (lo, size), swap in zip(blocks, choice, strict=True):
            if swap:
                half = size // 2
                perm = [
                    p + half if lo <= p < lo + half else p - half if lo + half <= p < lo + size else p for p in perm
                ]
        perms.add(tuple(perm))
    return sorted(perms)


@cache
def symmetries(model_name: str, profiles: tuple[str, ...] | None = None) -> tuple[Permutation, ...]:
    """The slice permutations that preserve every profile's set of allowed windows (identity first)."""
    model = get_model(model_name)
    names = _profile_names(model, profiles)
    window_sets = [frozenset(model.profile(n).window(s) for s in model.profile(n).starts) for n in names]
    found = [
        perm
        for perm in _buddy_permutations(model.memory_slices)
        if all(frozenset(_map_mask(w, perm) for w in ws) == ws for ws in window_sets)
    ]
    identity = tuple(range(model.memory_slices))
    return (identity, *sorted(p for p in found if p != identity))


def apply_symmetry(model: GpuModel, config: Configuration, perm: Permutation) -> Configuration:
    moved = []
    for inst in config.instances:
        mask = _map_mask(model.profile(inst.profile).window(inst.start), perm)
        moved.append(Instance((mask & -mask).bit_length() - 1, inst.profile))
    return Configuration(tuple(sorted(moved)))


def order_key(model: GpuModel, config: Configuration) -> tuple[tuple[int, int], ...]:
    """Per memory slice, (compute, memory) slices of the instance starting there; (0, 0) where none does."""
    key = [(0, 0)] * model.memory_slices
    for inst in config.instances:
        p = model.profile(inst.profile)
        key[inst.start] = (p.compute_slices, p.memory_slices)
    return tuple(key)


def canonical(model: GpuModel, config: Configuration, profiles: Sequence[str] | None = None) -> Configuration:
    """The lexicographically highest configuration equivalent to ``config`` (MIG-DRL §4.1)."""
    names = tuple(profiles) if profiles is not None else None
    images = (apply_symmetry(model, config, perm) for perm in symmetries(model.name, names))
    return max(images, key=lambda c: order_key(model, c))


def partition_label(model: GpuModel, config: Configuration) -> str:
    """Compute-slice sizes left to right, e.g. ``2-1-1-3`` (MIG-DRL's notation)."""
    return "-".join(str(model.profile(i.profile).compute_slices) for i in config.instances) or "empty"
