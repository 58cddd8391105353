"""Per-model lookup tables indexed by occupancy mask, so that a placement decision is table look-ups.

A GPU with S memory slices has 2**S occupancy masks (256 for the 8-slice GPUs), so every score can be
precomputed once per model: F (both readings), CC, the free starts of each profile, and F / CC after
placing a profile at each free start. Built with bit operations, independently of the direct
computations in :mod:`mig_batch.mig.scores` (the tests compare the two on every mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from mig_batch.mig.models import GpuModel, get_model
from mig_batch.mig.scores import FragVariant

Starts = tuple[int, ...]


@dataclass(frozen=True)
class ModelTables:
    model: GpuModel
    base_names: tuple[str, ...]  # index -> base profile name
    profile_index: dict[str, int]  # any profile name (media extensions too) -> base index
    frag: dict[FragVariant, tuple[int, ...]]  # [variant][mask] -> F
    cc: tuple[int, ...]  # [mask] -> CC
    free_starts: tuple[tuple[Starts, ...], ...]  # [profile][mask] -> free allowed starts
    # [variant][profile][mask] -> ((start, F after placing there), ...) over free starts
    frag_after: dict[FragVariant, tuple[tuple[tuple[tuple[int, int], ...], ...], ...]]
    cc_after: tuple[tuple[tuple[tuple[int, int], ...], ...], ...]  # [profile][mask] -> ((start, CC after), ...)

    def index(self, profile_name: str) -> int:
        try:
            return self.profile_index[profile_name]
        except KeyError:
            raise KeyError(f"GPU model {self.model.name} has no MIG profile {profile_name!r}") from None

    def window(self, profile_name: str, start: int) -> int:
        return self.model.profile(profile_name).window(start)


def _popcount(x: int) -> int:
    return x.bit_count()


def build_tables(model: GpuModel) -> ModelTables:
    base = model.base_profiles
    size = 1 << model.memory_slices
    windows = [[(s, p.window(s)) for s in p.starts] for p in base]
    weights = [p.memory_slices for p in base]

    frag_printed, frag_partial, cc = [], [], []
    free = [[() for _ in range(size)] for _ in base]
    for mask in range(size):
        unused = model.memory_slices - _popcount(mask)
        printed = partial = capability = 0
        for k, profile_windows in enumerate(windows):
            starts = []
            for start, window in profile_windows:
                hit = window & mask
                if not hit:
                    starts.append(start)
                    capability += 1
                elif weights[k] <= unused:
                    printed += weights[k]
                    if hit != window:
                        partial += weights[k]
            free[k][mask] = tuple(starts)
        frag_printed.append(printed)
        frag_partial.append(partial)
        cc.append(capability)

    frag = {FragVariant.PRINTED: tuple(frag_printed), FragVariant.PARTIAL: tuple(frag_partial)}
    frag_after = {
        variant: tuple(
            tuple(tuple((s, table[mask | base[k].window(s)]) for s in free[k][mask]) for mask in range(size))
            for k in range(len(base))
        )
        for variant, table in frag.items()
    }
    cc_after = tuple(
        tuple(tuple((s, cc[mask | base[k].window(s)]) for s in free[k][mask]) for mask in range(size))
        for k in range(len(base))
    )
    index = {p.name: i for i, p in enumerate(base)}
    index.update({p.name: index[p.media_extension_of] for p in model.profiles if p.media_extension_of})
    return ModelTables(
        model=model,
        base_names=tuple(p.name for p in base),
        profile_index=index,
        frag=frag,
        cc=tuple(cc),
        free_starts=tuple(tuple(row) for row in free),
        frag_after=frag_after,
        cc_after=cc_after,
    )


@cache
def tables_for(model_name: str) -> ModelTables:
    """The cached tables of a model (by name or alias)."""
    return build_tables(get_model(model_name))
