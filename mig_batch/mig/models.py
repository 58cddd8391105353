"""GPU models and their MIG profiles, loaded from ``etc/gpus/*.yaml``.

A model file describes one GPU product: how many memory and compute slices it has and, per GPU
instance profile, its size and the memory-slice start indices NVIDIA allows. Sites add a model by
dropping a file into a config directory (see :func:`config_dirs`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from mig_batch.errors import MigBatchError
from mig_batch.resources import resource_path
from mig_batch.yaml_text import NotTextError, YAMLError, load_yaml_file, shown

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from typing import Any

NVML_PROFILE_ENUMS = (
    "1_SLICE",
    "2_SLICE",
    "3_SLICE",
    "4_SLICE",
    "7_SLICE",
    "8_SLICE",
    "6_SLICE",
    "1_SLICE_REV1",
    "2_SLICE_REV1",
    "1_SLICE_REV2",
)


MAX_MODEL_BYTES = 256 << 10  # the shipped model files are about 5 KiB


class ModelError(MigBatchError, ValueError):
    """A GPU model file is malformed; the message names file, profile and field."""


class UnknownModelError(MigBatchError, KeyError):
    def __init__(self, name: str, known: list[str]):
        self.name, self.known = name, known
        super().__init__(name)

    def __str__(self) -> str:
        return f"unknown GPU model {shown(self.name)}; known models: {', '.join(self.known)}"

    def __reduce__(self) -> tuple:  # travels back from a worker process (pickle re-calls __init__)
        return type(self), (self.name, self.known)


@dataclass(frozen=True)
class Profile:
    """One GPU instance profile of one GPU model."""

    name: str
    nvml_profile: str  # NVML_GPU_INSTANCE_PROFILE_<this>; the numeric id is read from NVML at run time
    profile_id: int  # id as documented / printed by nvidia-smi for this model (informative)
    compute_slices: int
    memory_slices: int
    memory_mib: int
    starts: tuple[int, ...]
    max_instances: int
    media_extension_of: str | None = None
    sms: int | None = None  # streaming multiprocessors, as NVML reports them; optional (not all models state it)

    @property
    def is_media_extension(self) -> bool:
        return self.media_extension_of is not None

    @property
    def geometry_name(self) -> str:
        """The profile whose placement geometry this one shares (itself unless +me)."""
        return self.media_extension_of or self.name

    def window(self, start: int) -> int:
        """Bit mask of the memory slices an instance started at ``start`` occupies."""
        return ((1 << self.memory_slices) - 1) << start


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_slices: int
    compute_slices: int
    profiles: tuple[Profile, ...]
    aliases: tuple[str, ...] = ()
    placements_verified: bool = False
    memory_source: str = "estimated"
    source: str = ""
    path: str = ""
    _by_name: dict[str, Profile] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.profiles})

    def profile(self, name: str) -> Profile:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(
                f"GPU model {self.name} has no MIG profile {shown(name)}; "
                f"its profiles are: {', '.join(p.name for p in self.profiles)}"
            ) from None

    def has_profile(self, name: str) -> bool:
        return name in self._by_name

    @property
    def base_profiles(self) -> tuple[Profile, ...]:
        """Profiles without media extensions: the set scores (F, CC) and configurations range over."""
        return tuple(p for p in self.profiles if not p.is_media_extension)

    @property
    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1

    @property
    def largest_profile(self) -> Profile:
        return max(self.base_profiles, key=lambda p: (p.memory_mib, p.compute_slices))


# ---------------------------------------------------------------------------------------------
# loading and validation


def builtin_gpu_dir() -> Path:
    """The GPU model files shipped with mig_batch (repo checkout or installed wheel)."""
    return resource_path("etc", "gpus")


def config_dirs() -> list[Path]:
    """Directories searched for GPU model files; later ones override earlier ones by model name.

    Built-in models, then ``/etc/mig-batch/gpus`` (when there), then each directory in
    ``$MIG_BATCH_GPU_DIRS`` (colon separated): one it names that is not a directory is an error, since its
    models would be missing without a word.
    """
    dirs = [builtin_gpu_dir(), Path("/etc/mig-batch/gpus")]
    dirs = [d for d in dirs if d.is_dir()]
    for named in os.environ.get("MIG_BATCH_GPU_DIRS", "").split(":"):
        if not named:
            continue
        if not Path(named).is_dir():
            why = "is a file" if Path(named).exists() else "does not exist"
            raise ModelError(f"MIG_BATCH_GPU_DIRS names {shown(named, 300)}, which {why}; give folders of GPU model "
                             "files (*.yaml), separated by ':', or leave it unset")  # fmt: skip
        dirs.append(Path(named))
    return dirs


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise ModelError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ModelError(f"{where}: field {key!r} must be {names}, got {shown(value)}")
    return value


MODEL_FIELDS = ("model", "aliases", "memory_slices", "compute_slices", "placements_verified", "memory_source",
                "source", "profiles")  # fmt: skip
PROFILE_FIELDS = ("name", "nvml_profile", "profile_id", "compute_slices", "memory_slices", "memory_mib", "starts",
                  "max_instances", "media_extension_of", "sms")  # fmt: skip


def _known_fields(raw: dict, known: tuple[str, ...], where: str) -> None:
    """A misspelt field would otherwise be dropped silently (``placement_verified: true`` leaving the model
    unverified)."""
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise ModelError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(known)}")


def _parse_profile(raw: Any, model_where: str, slices: tuple[int, int]) -> Profile:
    if not isinstance(raw, dict):
        raise ModelError(f"{model_where}: each entry of 'profiles' must be a mapping, got {shown(raw)}")
    name = _require(raw, "name", str, f"{model_where}, a profile")
    where = f"{model_where}, profile {name}"
    _known_fields(raw, PROFILE_FIELDS, where)
    memory_total, compute_total = slices
    enum = _require(raw, "nvml_profile", str, where)
    if enum not in NVML_PROFILE_ENUMS:
        raise ModelError(f"{where}: field 'nvml_profile' must be one of {', '.join(NVML_PROFILE_ENUMS)}; got "
                         f"{shown(enum)}")  # fmt: skip
    compute = _require(raw, "compute_slices", int, where)
    memory = _require(raw, "memory_slices", int, where)
    if not 1 <= compute <= compute_total:
        raise ModelError(f"{where}: field 'compute_slices' must be 1..{compute_total}, got {compute}")
    if not 1 <= memory <= memory_total:
        raise ModelError(f"{where}: field 'memory_slices' must be 1..{memory_total}, got {memory}")
    starts = _require(raw, "starts", list, where)
    if not starts or any(not isinstance(s, int) or isinstance(s, bool) for s in starts):
        raise ModelError(f"{where}: field 'starts' must be a non-empty list of integers, got {shown(starts)}")
    for s in starts:
        if s < 0 or s + memory > memory_total:
            raise ModelError(f"{where}: start {s} puts {memory} memory slices outside 0..{memory_total - 1}")
    if len(set(starts)) != len(starts):
        raise ModelError(f"{where}: field 'starts' lists a start twice: {starts}")
    memory_mib = _require(raw, "memory_mib", int, where)
    max_instances = _require(raw, "max_instances", int, where)
    if memory_mib <= 0 or max_instances <= 0:
        raise ModelError(f"{where}: 'memory_mib' and 'max_instances' must be positive")
    media_of = raw.get("media_extension_of")
    if media_of is not None and not isinstance(media_of, str):
        raise ModelError(f"{where}: field 'media_extension_of' must be a profile name, got {shown(media_of)}")
    sms = raw.get("sms")
    if sms is not None and (not isinstance(sms, int) or isinstance(sms, bool) or sms <= 0):
        raise ModelError(f"{where}: field 'sms' must be a positive integer, got {shown(sms)}")
    return Profile(
        name=name,
        nvml_profile=enum,
        profile_id=_require(raw, "profile_id", int, where),
        compute_slices=compute,
        memory_slices=memory,
        memory_mib=memory_mib,
        starts=tuple(sorted(starts)),
        max_instances=max_instances,
        media_extension_of=media_of,
        sms=sms,
    )


def parse_model(data: Any, path: str = "<memory>") -> GpuModel:
    """Validate one model document; errors name the file, the profile and the field."""
    if not isinstance(data, dict):
        raise ModelError(f"{path}: a GPU model file must be a mapping, got {type(data).__name__}")
    name = _require(data, "model", str, path)
    where = f"{path} (model {name})"
    _known_fields(data, MODEL_FIELDS, where)
    verified = data.get("placements_verified", False)
    if not isinstance(verified, bool):
        raise ModelError(f"{where}: field 'placements_verified' must be true or false, got {shown(verified)}")
    memory_total = _require(data, "memory_slices", int, where)
    compute_total = _require(data, "compute_slices", int, where)
    if not 1 <= memory_total <= 16 or not 1 <= compute_total <= 16:
        raise ModelError(f"{where}: 'memory_slices' and 'compute_slices' must be 1..16")
    raw_profiles = _require(data, "profiles", list, where)
    profiles = tuple(_parse_profile(p, where, (memory_total, compute_total)) for p in raw_profiles)
    names = [p.name for p in profiles]
    duplicated = {n for n in names if names.count(n) > 1}
    if duplicated:
        raise ModelError(f"{where}: profile names appear twice: {', '.join(sorted(duplicated))}")
    for p in profiles:
        if p.media_extension_of is None:
            continue
        base = next((b for b in profiles if b.name == p.media_extension_of), None)
        if base is None or base.is_media_extension:
            raise ModelError(f"{where}, profile {p.name}: 'media_extension_of' names no base profile of this model")
        if (base.memory_slices, base.starts) != (p.memory_slices, p.starts):
            raise ModelError(f"{where}, profile {p.name}: must have the geometry of {base.name}")
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ModelError(f"{where}: field 'aliases' must be a list of strings")
    return GpuModel(
        name=name,
        memory_slices=memory_total,
        compute_slices=compute_total,
        profiles=profiles,
        aliases=tuple(aliases),
        placements_verified=verified,
        memory_source=str(data.get("memory_source", "estimated")),
        source=str(data.get("source", "")).strip(),
        path=path,
    )


def read_model_document(path: Path) -> Any:
    """The YAML document of one model file, not yet validated."""
    try:
        return load_yaml_file(path, "a GPU model file", MAX_MODEL_BYTES)
    except (YAMLError, NotTextError) as exc:  # each names the file, the line and what is accepted
        raise ModelError(str(exc)) from None
    except OSError as exc:
        raise ModelError(f"cannot read the GPU model file {path}: {exc.strerror or exc}; a model file must be "
                         "readable by every user of mig-batch") from None  # fmt: skip


def load_model_file(path: Path) -> GpuModel:
    return parse_model(read_model_document(path), str(path))


@cache
def _load_all(dirs: tuple[Path, ...]) -> dict[str, GpuModel]:
    from mig_batch.mig.model_cache import load_documents

    paths = [path for directory in dirs for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])]
    models: dict[str, GpuModel] = {}
    try:
        documents = load_documents(paths, read_model_document)
    except OSError as exc:  # a file gone, or a dangling link, between the listing and its stamp
        raise ModelError(f"cannot read the GPU model file {exc.filename}: {exc.strerror or exc}") from None
    for path, document in zip(paths, documents, strict=True):
        model = parse_model(document, str(path))
        models[model.name] = model
    return models


def all_models() -> dict[str, GpuModel]:
    """Every known GPU model by canonical name."""
    return _load_all(tuple(config_dirs()))


def _normalise(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


_ALIASES: dict[int, tuple[dict[str, GpuModel], dict[str, GpuModel]]] = {}  # id(models) -> (models, index)


def _alias_index(models: dict[str, GpuModel]) -> dict[str, GpuModel]:
    """Each normalised name and alias -> the first model in ``models`` that has it (built once per load)."""
    known = _ALIASES.get(id(models))
    if known is None or known[0] is not models:
        index: dict[str, GpuModel] = {}
        for model in models.values():
            for key in (model.name, *model.aliases):
                index.setdefault(_normalise(key), model)
        known = _ALIASES[id(models)] = (models, index)
    return known[1]


def get_model(name: str) -> GpuModel:
    """Look up a model by name or alias, ignoring case, spaces and dashes (``a100-40gb`` works)."""
    models = all_models()
    model = _alias_index(models).get(_normalise(name))
    if model is None:
        raise UnknownModelError(name, sorted(models))
    return model
