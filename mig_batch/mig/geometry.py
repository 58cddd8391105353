"""Occupancy of one MIG GPU and the placement rules.

Placement is over memory slices: an instance of profile p started at index i occupies memory slices
i .. i + p.memory_slices - 1, i must be one of p's allowed starts, instances never overlap, and a
profile never has more than ``max_instances`` instances (this matters only for the media-extension
variants, which NVIDIA allows once per GPU). Occupancy is a bit mask over memory slices (bit i set =
slice i allocated); a :class:`Configuration` adds which instance sits where.
"""

from __future__ import annotations

from dataclasses import dataclass

from mig_batch.errors import MigBatchError
from mig_batch.mig.models import GpuModel, Profile
from mig_batch.yaml_text import shown


class PlacementError(MigBatchError, ValueError):
    """A place/remove that MIG would refuse; ``reason`` is a short machine-readable tag."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, order=True)
class Instance:
    start: int
    profile: str


@dataclass(frozen=True)
class Configuration:
    """The GPU instances on one GPU, sorted by start."""

    instances: tuple[Instance, ...] = ()

    @classmethod
    def of(cls, *pairs: tuple[str, int]) -> Configuration:
        return cls(tuple(sorted(Instance(start, name) for name, start in pairs)))

    def mask(self, model: GpuModel) -> int:
        mask = 0
        for inst in self.instances:
            mask |= model.profile(inst.profile).window(inst.start)
        return mask

    def count(self, profile: str) -> int:
        return sum(1 for inst in self.instances if inst.profile == profile)

    def __str__(self) -> str:
        return " ".join(f"{i.profile}@{i.start}" for i in self.instances) or "(empty)"


def window_is_free(profile: Profile, start: int, mask: int) -> bool:
    return not profile.window(start) & mask


def free_starts(profile: Profile, mask: int) -> tuple[int, ...]:
    """Allowed starts of ``profile`` whose memory slices are all free in ``mask``."""
    return tuple(s for s in profile.starts if not profile.window(s) & mask)


def feasible_starts(model: GpuModel, config: Configuration, profile_name: str) -> tuple[int, ...]:
    """Starts at which ``profile_name`` can be created on a GPU in ``config``."""
    profile = model.profile(profile_name)
    if config.count(profile_name) >= profile.max_instances:
        return ()
    return free_starts(profile, config.mask(model))


def place(model: GpuModel, config: Configuration, profile_name: str, start: int) -> Configuration:
    """The configuration after creating ``profile_name`` at ``start``; raises PlacementError if MIG would refuse."""
    profile = model.profile(profile_name)
    if start not in profile.starts:
        raise PlacementError(
            "bad-start",
            f"{profile_name} cannot start at memory slice {start} on {model.name}; "
            f"allowed starts: {', '.join(map(str, profile.starts))}",
        )
    if config.count(profile_name) >= profile.max_instances:
        raise PlacementError(
            "max-instances", f"{model.name} allows at most {profile.max_instances} {profile_name} instance(s)"
        )
    mask = config.mask(model)
    if profile.window(start) & mask:
        raise PlacementError(
            "overlap",
            f"{profile_name}@{start} overlaps allocated memory slices "
            f"{', '.join(str(i) for i in range(model.memory_slices) if (mask & profile.window(start)) >> i & 1)}",
        )
    return Configuration(tuple(sorted((*config.instances, Instance(start, profile_name)))))


def remove(config: Configuration, profile_name: str, start: int) -> Configuration:
    """The configuration after destroying the instance ``profile_name@start``."""
    target = Instance(start, profile_name)
    if target not in config.instances:
        raise PlacementError("not-found", f"no {profile_name} instance starts at memory slice {start}")
    remaining = list(config.instances)
    remaining.remove(target)
    return Configuration(tuple(remaining))


def mask_from_slices(slices: list[int] | tuple[int, ...]) -> int:
    mask = 0
    for s in slices:
        mask |= 1 << s
    return mask


def slices_of(mask: int, memory_slices: int) -> list[int]:
    return [i for i in range(memory_slices) if mask >> i & 1]


def parse_mask(text: str, memory_slices: int) -> int:
    """Parse an occupancy: a bit string over slices (``11000100``, slice 0 first) or a slice list (``0,1,5``)."""
    text = text.strip()
    if text in {"", "-", "empty"}:
        return 0
    if set(text) <= {"0", "1"} and len(text) == memory_slices:
        return mask_from_slices([i for i, ch in enumerate(text) if ch == "1"])
    try:
        slices = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise ValueError(
            f"cannot read occupancy {shown(text)}: give {memory_slices} characters of 0/1 (slice 0 first, "
            f"1 = allocated) or a comma-separated list of allocated memory slices"
        ) from None
    bad = [s for s in slices if not 0 <= s < memory_slices]
    if bad:
        raise ValueError(f"memory slice(s) {shown(bad)} out of range 0..{memory_slices - 1}")
    return mask_from_slices(slices)


def format_mask(mask: int, memory_slices: int) -> str:
    return "".join("1" if mask >> i & 1 else "0" for i in range(memory_slices))


def parse_configuration(model: GpuModel, text: str) -> Configuration:
    """Read ``3g.40gb@0,1g.10gb@5``; each instance is placed in turn, so an impossible set is refused."""
    config = Configuration()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, start = item.partition("@")
        if not sep or not start.strip().isdigit() or len(start.strip()) > 2:  # no GPU has 100 memory slices
            raise ValueError(f"cannot read instance {shown(item)}; write PROFILE@START, e.g. 3g.40gb@4")
        try:
            config = place(model, config, name.strip(), int(start))
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
    return config
