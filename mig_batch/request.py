"""Translate what a batch user asks for into MIG profiles of a GPU model.

A request names any of: GPU memory (``18G``), a compute share (``0.3``, ``30%`` or ``2g``), an explicit
profile (``3g.40gb``) or a list of acceptable profiles. On a given model it becomes the *smallest
fitting profile*: fewest memory slices, then fewest compute slices, then least memory, then name.
Media-extension (``+me``) profiles are chosen only when asked for by name or with ``media=True``.

Memory units follow Slurm: ``K/M/G/T`` and ``KiB/MiB/GiB/TiB`` are binary (``18G`` = 18 GiB),
``KB/MB/GB/TB`` decimal (``18GB`` = 18 * 10**9 bytes). A number without a unit is refused.
Memory is compared with what the instance really has (NVML's size, e.g. 19.6 GiB for ``1g.20gb``),
not with the rounded number in the profile's name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mig_batch.errors import MigBatchError
from mig_batch.mig.models import GpuModel, Profile
from mig_batch.yaml_text import shown

MIB = 1 << 20
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])(I?B)?\s*$", re.IGNORECASE)
MEMORY_FORMS = "a number with a unit: 18G, 18GiB, 18GB, 18000M"
MAX_REQUEST_TEXT = 64  # characters of one request value: no size, share, count or time needs more


class RequestError(MigBatchError, ValueError):
    """A request that cannot be read or cannot be met; the message says what would be accepted."""


def parse_memory(text: str) -> int:
    """GPU memory in MiB (rounded up)."""
    match = _MEMORY_RE.match(str(text)) if len(str(text)) <= MAX_REQUEST_TEXT else None
    if not match:
        hint = " (a unit is required)" if re.fullmatch(r"\s*\d+(\.\d+)?\s*", str(text)) else ""
        raise RequestError(f"cannot read GPU memory {shown(text)}{hint}; accepted: {MEMORY_FORMS}")
    number, letter, suffix = float(match.group(1)), match.group(2).upper(), (match.group(3) or "").upper()
    scale = _DECIMAL[letter] if suffix == "B" else _BINARY[letter]
    value = number * scale
    if value <= 0:
        raise RequestError(f"GPU memory must be positive, got {shown(text)}; accepted: {MEMORY_FORMS}")
    if not value < 1 << 50:  # also infinity: a number of hundreds of digits
        raise RequestError(f"GPU memory {shown(text)} is over 1 PiB, more than any GPU has; accepted: {MEMORY_FORMS} "
                           "(`mig-batch gpus` lists the models)")  # fmt: skip
    return -(-int(value) // MIB)


def format_mib(mib: int) -> str:
    if mib >= 1 << 20:  # only a request no GPU meets: 999T reads as such, not as 1022976.00 GiB
        return f"{mib / (1 << 20):.2f} TiB"
    return f"{mib / 1024:.2f} GiB" if mib >= 1024 else f"{mib} MiB"


@dataclass(frozen=True)
class ComputeShare:
    """Either a fraction of the whole GPU's compute, or a number of compute slices."""

    fraction: float | None = None
    slices: int | None = None

    def satisfied_by(self, profile: Profile, model: GpuModel) -> bool:
        if self.slices is not None:
            return profile.compute_slices >= self.slices
        assert self.fraction is not None
        return profile.compute_slices / model.compute_slices >= self.fraction - 1e-9

    def __str__(self) -> str:
        return f"{self.slices}g" if self.slices is not None else f"{self.fraction:g} of the GPU"


def parse_compute(text: str | float) -> ComputeShare:
    """``0.3`` or ``30%`` (share of the GPU's compute) or ``2g`` (compute slices); a bare ``2`` is refused."""
    raw = str(text).strip().lower()
    if m := re.fullmatch(r"(\d{1,9})\s*g", raw):  # no int() of thousands of digits: float() below refuses them
        slices = int(m.group(1))
        if slices < 1:
            raise RequestError(f"compute slices must be at least 1, got {text!r}")
        return ComputeShare(slices=slices)
    try:
        fraction = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise RequestError(
            f"cannot read compute share {shown(text)}; accepted: a fraction of the GPU in (0, 1] such as 0.3, "
            f"a percentage such as 30%, or compute slices such as 2g"
        )
    return ComputeShare(fraction=fraction)


@dataclass(frozen=True)
class MigRequest:
    """What one job asks for, independent of GPU model."""

    memory_mib: int | None = None
    compute: ComputeShare | None = None
    profiles: tuple[str, ...] = ()  # an explicit profile, or the acceptable ones
    media: bool = False
    count: int = 1

    def describe(self) -> str:
        parts = []
        if self.profiles:
            parts.append(" or ".join(self.profiles))
        if self.memory_mib is not None:
            parts.append(f"{format_mib(self.memory_mib)} GPU memory")
        if self.compute is not None:
            parts.append(f"compute {self.compute}")
        if self.media:
            parts.append("media extensions")
        text = ", ".join(parts) or "any MIG instance"
        return f"{self.count} x ({text})" if self.count != 1 else text


def size_order(p: Profile) -> tuple[int, int, int, str]:
    return (p.memory_slices, p.compute_slices, p.memory_mib, p.name)


def _describe_profile(p: Profile, model: GpuModel) -> str:
    return f"{p.name} ({format_mib(p.memory_mib)}, {p.compute_slices}/{model.compute_slices} compute)"


def candidate_profiles(request: MigRequest, model: GpuModel) -> list[Profile]:
    """All profiles of ``model`` that satisfy ``request``, smallest first."""
    if request.profiles:
        pool = [model.profile(n) for n in request.profiles if model.has_profile(n)]
    else:
        pool = [p for p in model.profiles if p.is_media_extension == request.media]
    if request.media:
        pool = [p for p in pool if p.is_media_extension]
    fitting = [
        p
        for p in pool
        if (request.memory_mib is None or p.memory_mib >= request.memory_mib)
        and (request.compute is None or request.compute.satisfied_by(p, model))
    ]
    return sorted(fitting, key=size_order)


def translate(request: MigRequest, model: GpuModel) -> Profile:
    """The smallest profile of ``model`` that satisfies ``request``; RequestError if none does."""
    if request.profiles:
        known = [n for n in request.profiles if model.has_profile(n)]
        if not known:
            raise RequestError(
                f"{model.name} has no MIG profile {' or '.join(request.profiles)}; "
                f"its profiles are: {', '.join(p.name for p in model.profiles)}"
            )
    found = candidate_profiles(request, model)
    if found:
        return found[0]
    largest = model.largest_profile
    raise RequestError(
        f"no MIG profile of {model.name} satisfies {request.describe()}; "
        f"the largest is {_describe_profile(largest, model)}"
    )


def none_fits(request: MigRequest, models: Iterable[GpuModel]) -> RequestError:
    """Why no model of ``models`` meets ``request`` (when :func:`translate_any` found a profile on none): the
    largest profile there is, or, for profile names no model has, how profiles are named."""
    models = list(models)
    if request.profiles and not any(m.has_profile(n) for m in models for n in request.profiles):
        return RequestError(f"no GPU model here has a MIG profile {' or '.join(request.profiles)}; profiles are "
                            "named like 3g.40gb (`mig-batch profiles MODEL` lists a model's)")  # fmt: skip
    if not models:
        return RequestError("no GPU model is known; `mig-batch gpus` lists them")
    model = max(models, key=lambda m: (m.largest_profile.memory_mib, m.largest_profile.compute_slices))
    return RequestError(f"no MIG profile of {', '.join(m.name for m in models)} satisfies {request.describe()}; the "
                        f"largest is {_describe_profile(model.largest_profile, model)} on {model.name}")  # fmt: skip


def translate_any(request: MigRequest, models: Iterable[GpuModel]) -> dict[str, Profile | RequestError]:
    """Per model, the chosen profile or the reason none fits."""
    out: dict[str, Profile | RequestError] = {}
    for model in models:
        try:
            out[model.name] = translate(request, model)
        except RequestError as exc:
            out[model.name] = exc
    return out


# ---------------------------------------------------------------------------------------------
# Slurm-style GRES strings

_GRES_RE = re.compile(r"^(?:gres[:/])?(gpu|mig)(?::([^:]+))?(?::(\d+))?$", re.IGNORECASE)
GRES_FORMS = "mig:20G, mig:3g, mig:3g.40gb, mig:3g.40gb:4 (four instances), gpu:3g.40gb:1"
_PROFILE_RE = re.compile(r"^\d+g\.\d+gb(\+me)?$", re.IGNORECASE)


def parse_gres(spec: str) -> MigRequest:
    """Read ``gpu:3g.40gb:1``, ``mig:20G``, ``mig:3g`` or ``mig:3g.40gb`` (an optional ``gres:`` prefix); a count
    (``mig:1g.10gb:4``) asks for that many instances on one node, one per task.

    ``mig:3g`` (lower-case g, as in profile names) asks for 3 compute slices; ``mig:3G`` for 3 GiB.
    """
    match = _GRES_RE.match(spec.strip()) if len(spec) <= MAX_REQUEST_TEXT else None
    if not match or match.group(2) is None:
        raise RequestError(f"cannot read MIG request {shown(spec)}; accepted forms: {GRES_FORMS}")
    kind, what, count = match.group(1).lower(), match.group(2), int(match.group(3) or 1)
    if count < 1:  # job_submit.lua refuses the same
        raise RequestError(f"MIG request {spec!r} asks for {count} instances; give at least 1 (mig:1g.10gb:4 asks "
                           f"for four instances on one node, one per task)")  # fmt: skip
    if _PROFILE_RE.match(what):
        return MigRequest(profiles=(what.lower(),), count=count)
    if kind == "gpu":
        raise RequestError(
            f"gpu:{what} is not a MIG profile name (like 3g.40gb); for a memory or compute request use mig:, "
            f"accepted forms: {GRES_FORMS}"
        )
    if re.fullmatch(r"\d+g", what):  # lower-case g: compute slices as in MIG names; 3G is memory
        return MigRequest(compute=parse_compute(what), count=count)
    try:
        return MigRequest(memory_mib=parse_memory(what), count=count)
    except RequestError:
        raise RequestError(
            f"cannot read {what!r} in MIG request {spec!r}: neither a profile (3g.40gb), compute slices (3g) "
            f"nor memory ({MEMORY_FORMS})"
        ) from None


# ---------------------------------------------------------------------------------------------
# moldable requests


def parse_duration(text: str | float) -> float:
    """Seconds from ``90``, ``90s``, ``2.5m``, ``1h``, ``1h30m`` or ``HH:MM:SS`` / ``MM:SS``."""
    raw = str(text).strip().lower()
    value = math.nan  # refused below unless a form matches
    if len(raw) > MAX_REQUEST_TEXT:
        pass  # refused: no int() of thousands of digits
    elif re.fullmatch(r"\d+(\.\d+)?", raw):
        value = float(raw)
    elif re.fullmatch(r"\d+(:\d{1,2}){1,2}", raw):
        value = 0.0
        for part in raw.split(":"):
            value = value * 60 + int(part)
    elif re.fullmatch(r"(\d+(\.\d+)?[hms])+", raw):
        value = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([hms])", raw))
    if not value < 1e10:  # no form, over three centuries, or infinity
        raise RequestError(f"cannot read duration {shown(text)}; accepted: 90, 90s, 2.5m, 1h30m, 01:30:00")
    if value <= 0:
        raise RequestError(f"a predicted run time must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class MoldableRequest:
    """A job that can run on several instance sizes, each with a predicted run time (seconds).

    ``times`` maps a size to seconds; a size is a profile name (``3g.40gb``) or compute slices
    (``3g``, meaning the smallest profile with that many compute slices that meets the memory floor).
    """

    times: Mapping[str, float] = field(default_factory=dict)
    memory_mib: int | None = None

    def candidates(self, model: GpuModel) -> dict[str, float]:
        """Profile name -> predicted seconds, for the profiles of ``model`` the job may use."""
        if not self.times:
            raise RequestError("a moldable request needs at least one size with a predicted run time")
        out: dict[str, float] = {}
        for size, seconds in self.times.items():
            if _PROFILE_RE.match(size):
                if not model.has_profile(size):
                    continue
                chosen = [model.profile(size)]
                if self.memory_mib is not None and chosen[0].memory_mib < self.memory_mib:
                    continue
            elif re.fullmatch(r"\d+g", size, re.IGNORECASE):
                slices = int(size[:-1])
                chosen = [
                    p
                    for p in candidate_profiles(MigRequest(memory_mib=self.memory_mib), model)
                    if p.compute_slices == slices
                ][:1]
            else:
                raise RequestError(f"cannot read moldable size {size!r}; accepted: a profile (3g.40gb) or 3g")
            for profile in chosen:
                out[profile.name] = min(seconds, out.get(profile.name, float("inf")))
        if not out:
            raise RequestError(
                f"none of the moldable sizes {', '.join(self.times)} fits {model.name}"
                + (f" with {format_mib(self.memory_mib)}" if self.memory_mib else "")
                + f"; the largest profile is {_describe_profile(model.largest_profile, model)}"
            )
        return out


def moldable_per_model(request: MoldableRequest, models: Iterable[GpuModel]) -> dict[str, dict[str, float]]:
    """The moldable request's options on each model that can run one of its sizes; a model that can run none
    is left out. Refused when no model can (the message names each model's reason), or when a size runs on
    no model of the site (a mistake, such as 9g.90gb, that would otherwise vanish)."""
    models = list(models)
    for size, seconds in request.times.items():
        alone = MoldableRequest(times={size: seconds}, memory_mib=request.memory_mib)
        if not any(_runs(alone, m) for m in models):
            raise RequestError(f"moldable size {size!r} runs on no GPU model of this site "
                               f"({', '.join(m.name for m in models)}); give sizes one of them has")  # fmt: skip
    out, why = {}, []
    for model in models:
        try:
            out[model.name] = request.candidates(model)
        except RequestError as exc:
            why.append(str(exc))
    if not out:
        raise RequestError("; ".join(why) or "no GPU model to run the moldable job on")
    return out


def _runs(request: MoldableRequest, model: GpuModel) -> bool:
    try:
        return bool(request.candidates(model))
    except RequestError:
        return False


def parse_moldable(text: str, memory: str | None = None) -> MoldableRequest:
    """Read ``1g=300,2g=160,3g.40gb=1h`` (size=predicted time, ``:`` also accepted)."""
    times: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        size, sep, value = item.partition("=") if "=" in item else item.partition(":")
        if not sep:
            raise RequestError(f"moldable entry {item!r} needs a size and a time, like 3g=120s or 3g.40gb=2m")
        size = size.strip().lower()
        if size in times:
            raise RequestError(f"moldable size {size!r} is given twice in {text!r}; give each size once")
        times[size] = parse_duration(value)
    if not times:
        raise RequestError("a moldable request needs sizes with predicted times, like 1g=300,2g=160,3g=110")
    return MoldableRequest(times=times, memory_mib=parse_memory(memory) if memory else None)


# ---------------------------------------------------------------------------------------------
# round-up: the chosen profile holds much more than asked

# The rule, in one table job_submit.lua's generator can read beside the profile table: a request by size
# (memory and/or compute, not a profile by name) "rounds up" when its chosen profile holds more than
# ``factor`` times a dimension asked, and the profile just below it (in the size order of the choice)
# falls short only in dimensions so rounded up. migsub and translate then warn; --strict refuses.
ROUND_UP_RULE: dict[str, float] = {"factor": 1.5}


@dataclass(frozen=True)
class RoundUp:
    """A request that rounds up on one model: what was asked, what it got, and the profile that just missed."""

    model: str
    asked: str  # "20.00 GiB GPU memory"
    chosen: str  # "3g.40gb (38.80 GiB, 3/7 compute)"
    over: str  # "1.9x the memory"
    near: str  # "2g.20gb holds 19.40 GiB, 0.60 GiB short"

    def message(self) -> str:
        return f"{self.model}: {self.asked} asked, {self.chosen} chosen ({self.over}); {self.near}"


def _asked_slices(compute: ComputeShare, model: GpuModel) -> float:
    return float(compute.slices) if compute.slices is not None else (compute.fraction or 0.0) * model.compute_slices


def round_up(request: MigRequest, model: GpuModel, chosen: Profile) -> RoundUp | None:
    """Whether ``chosen`` (the translation of ``request`` on ``model``) holds much more than asked, by
    :data:`ROUND_UP_RULE`; None for a profile asked by name, or when nothing smaller comes near."""
    if request.profiles or (request.memory_mib is None and request.compute is None):
        return None
    factor = ROUND_UP_RULE["factor"]
    over: dict[str, float] = {}
    if request.memory_mib is not None and chosen.memory_mib > factor * request.memory_mib:
        over["memory"] = chosen.memory_mib / request.memory_mib
    if request.compute is not None and chosen.compute_slices > factor * _asked_slices(request.compute, model):
        over["compute"] = chosen.compute_slices / _asked_slices(request.compute, model)
    if not over:
        return None
    smaller = [p for p in model.profiles
               if p.is_media_extension == request.media and size_order(p) < size_order(chosen)]  # fmt: skip
    if not smaller:
        return None  # the model's smallest: nothing holds less
    near = max(smaller, key=size_order)
    short: dict[str, str] = {}
    if request.memory_mib is not None and near.memory_mib < request.memory_mib:
        short["memory"] = f"holds {format_mib(near.memory_mib)}, {format_mib(request.memory_mib - near.memory_mib)}"
    if request.compute is not None and not request.compute.satisfied_by(near, model):
        has = f"has {near.compute_slices}/{model.compute_slices} compute"
        if request.compute.slices is not None:
            missing = request.compute.slices - near.compute_slices
            short["compute"] = f"{has}, {missing} compute slice{'s' if missing > 1 else ''}"
        else:
            missing_share = (request.compute.fraction or 0.0) - near.compute_slices / model.compute_slices
            short["compute"] = f"{has}, {missing_share:.1%} of the GPU"
    if not short or not set(short) <= set(over):
        return None  # the size was forced by a dimension asked tightly: no smaller profile is near
    asked = []
    if request.memory_mib is not None:
        asked.append(f"{format_mib(request.memory_mib)} GPU memory")
    if request.compute is not None:
        asked.append(f"compute {request.compute}")
    return RoundUp(
        model=model.name,
        asked=" and ".join(asked),
        chosen=_describe_profile(chosen, model),
        over=" and ".join(f"{ratio:.1f}x the {kind}" for kind, ratio in over.items()),
        near=f"{near.name} " + " and ".join(short.values()) + " short",
    )


# ---------------------------------------------------------------------------------------------
# static-MIG request forms: Slurm's own MIG support names the profile as the GPU type

# option -> the form read there; a form is a MIG request only when <profile> is one of the site's
# profiles (the profile table job_submit.lua also carries); anything else (gpu:1, gpu:a100:2) is left
# with its meaning: whole GPUs as the site has them today.
STATIC_MIG_FORMS: dict[str, str] = {
    "--gres": "gpu:<profile>[:n]",
    "--gpus": "<profile>[:n]",
    "--gpus-per-node": "<profile>[:n]",
}
_STATIC_RE = re.compile(r"^(?:gres[:/])?gpu:([^:]+)(?::(\d+))?$", re.IGNORECASE)
_TYPED_RE = re.compile(r"^(?:gpu:)?([^:]+)(?::(\d+))?$", re.IGNORECASE)


def static_mig_request(option: str, value: str, site_profiles: Iterable[str]) -> MigRequest | None:
    """The MIG request of ``--gres=gpu:3g.40gb:1``, ``--gpus=1g.10gb:2`` or ``--gpus-per-node=1g.10gb:2`` (one
    item of the option's comma-separated list), or None where it is not one: no GPU type (``gpu:1``, ``2``),
    or a type that is not one of ``site_profiles`` (``gpu:a100:1``). Several instances are on one node, one
    per task, as with ``mig:1g.10gb:4``."""
    if option not in STATIC_MIG_FORMS:
        raise RequestError(f"{option} has no static-MIG form; they are: "
                           + ", ".join(f"{o}={f}" for o, f in STATIC_MIG_FORMS.items()))  # fmt: skip
    match = (_STATIC_RE if option == "--gres" else _TYPED_RE).match(value.strip())
    if not match:
        return None
    name, count = match.group(1).lower(), match.group(2)
    if name not in {p.lower() for p in site_profiles}:
        return None
    if count is not None and int(count) < 1:
        raise RequestError(f"{option}={value} asks for {count} instances of {name}; give at least 1 "
                           f"({option}={STATIC_MIG_FORMS[option].replace('<profile>', name).replace('[:n]', ':2')} "
                           "asks for two on one node)")  # fmt: skip
    return MigRequest(profiles=(name,), count=int(count or 1))
