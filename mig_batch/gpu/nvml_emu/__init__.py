"""An emulated libnvidia-ml.so.1 (C, ``nvml_emu.c``) and the files one emulated node is made of.

The library is built with the system C compiler into a cache directory keyed by the source's hash
(:func:`build_library`). A node is a directory (:func:`make_node`): ``gpus``, the GPUs and their MIG
profile tables generated from etc/gpus models; ``state``, the instances now; ``history``, one JSON
line per create/destroy; ``usage``, what the test harness says runs on the MIG devices (:func:`attach`,
:func:`replay`), which the library reports through NVML's own calls; ``capabilities/``, each instance's
capability as the driver's ``/proc/driver/nvidia/capabilities`` holds it (the library writes and removes
them with the instances), ``devices``, the node's ``/proc/devices`` (the ``nvidia-caps`` major), and
``nvidia-caps/``, the node's ``/dev/nvidia-caps`` where the node agent makes the device nodes a job opens
(:data:`CUDA_OPEN` opens them as CUDA would). The library serves the node named
by ``$MIG_BATCH_NVML_EMU_DIR``, read at ``nvmlInit``.

pynvml opens the library as ``CDLL("libnvidia-ml.so.1")``, i.e. by name through the dynamic loader,
so a process finds the emulated library the way it finds the driver's: the directory holding it on
``LD_LIBRARY_PATH`` when the process starts (:func:`library_env`). A running process (a test) can
instead load it by absolute path first (:func:`preload`): the loader then answers pynvml's
``dlopen("libnvidia-ml.so.1")`` with the already loaded object of that soname, and pynvml itself
runs unchanged.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
import time
import uuid as uuidlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mig_batch.mig.models import GpuModel, get_model

SOURCE = Path(__file__).with_name("nvml_emu.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
NODE_ENV = "MIG_BATCH_NVML_EMU_DIR"

# NVML_GPU_INSTANCE_PROFILE_* values from nvml.h (part of NVML's ABI; pynvml repeats them)
PROFILE_ENUM_VALUES = {
    "1_SLICE": 0,
    "2_SLICE": 1,
    "3_SLICE": 2,
    "4_SLICE": 3,
    "7_SLICE": 4,
    "8_SLICE": 5,
    "6_SLICE": 6,
    "1_SLICE_REV1": 7,
    "2_SLICE_REV1": 8,
    "1_SLICE_REV2": 9,
}
CAPS_MAJOR = 240  # the emulated nvidia-caps major: in Linux's range for local use, no driver behind it
CUDA_OPEN = Path(__file__).with_name("cuda-open")  # opens a MIG device's capabilities as CUDA does (sh)
SMS_PER_COMPUTE_SLICE = 16  # only for models that do not state their SMs (Hopper's figure)
MAX_GPUS = 64  # per node: nvml_emu.c's MAX_GPUS


class BuildError(RuntimeError):
    """The emulated library could not be compiled; the message carries the compiler's output."""


def _cache_root() -> Path:
    explicit = os.environ.get("MIG_BATCH_NVML_EMU_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mig-batch" / "nvml-emu"


def build_library(cache: Path | None = None, compiler: str = "cc") -> Path:
    """The emulated ``libnvidia-ml.so.1``, compiled once per source version; returns its path."""
    source = SOURCE.read_bytes()
    directory = (cache or _cache_root()) / hashlib.sha256(source).hexdigest()[:16]
    library = directory / LIBRARY_NAME
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=directory, suffix=".so")
    os.close(fd)
    command = [compiler, "-shared", "-fPIC", "-O2", "-std=c11", "-Wall", "-Wextra",
               f"-Wl,-soname,{LIBRARY_NAME}", "-o", partial, str(SOURCE)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        os.unlink(partial)
        raise BuildError(f"no C compiler {compiler!r} to build the emulated NVML library") from None
    if done.returncode != 0:
        os.unlink(partial)
        raise BuildError(f"{' '.join(command)} failed:\n{done.stderr}")
    os.chmod(partial, 0o755)
    os.replace(partial, library)  # atomic: concurrent builders all end with one whole library
    return library


def library_env(library: Path, node_dir: Path) -> dict[str, str]:
    """Environment entries for a new process that should load ``library`` and serve ``node_dir``."""
    search = [str(library.parent), *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":"))]
    return {"LD_LIBRARY_PATH": ":".join(search), NODE_ENV: str(node_dir)}


def preload(library: Path) -> None:
    """Load ``library`` into this process so that pynvml's ``CDLL("libnvidia-ml.so.1")`` gets it.

    Refuses when pynvml already holds another library: a process keeps the first one it loaded.
    """
    import pynvml

    loaded = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    held = pynvml.nvmlLib
    if held is not None and held._handle != loaded._handle:
        raise RuntimeError(f"pynvml already loaded {held._name}, not the emulated {library}")


# ---------------------------------------------------------------------------------------------
# the node's files


@dataclass(frozen=True)
class EmulatedGpu:
    model: GpuModel
    mig_enabled: bool = True
    device_name: str = ""  # what nvmlDeviceGetName answers; default: the model's "NVIDIA ..." alias


def device_name(model: GpuModel) -> str:
    """The name a driver reports for ``model``: its first ``NVIDIA ...`` alias."""
    return next((a for a in model.aliases if a.startswith("NVIDIA ")), f"NVIDIA {model.name}")


def profile_rows(model: GpuModel) -> list[str]:
    """The ``profile`` lines of one GPU: NVML's view of each MIG profile of the model."""
    rows = []
    for p in model.profiles:
        sms = p.sms if p.sms is not None else p.compute_slices * SMS_PER_COMPUTE_SLICE
        media = 1 if p.is_media_extension or p.memory_slices == model.memory_slices else 0
        fields = [PROFILE_ENUM_VALUES[p.nvml_profile], p.profile_id, p.compute_slices, p.max_instances,
                  p.memory_mib, sms, p.compute_slices, p.compute_slices, 0, p.compute_slices, media,
                  p.memory_slices, ",".join(map(str, p.starts)), f"MIG {p.name}"]  # fmt: skip
        rows.append("\t".join(["profile", *map(str, fields)]))
    return rows


def node_table(node: str, gpus: Sequence[EmulatedGpu]) -> str:
    """The text of a node's ``gpus`` file (tab-separated; read by nvml_emu.c's ``load_table``)."""
    if len(gpus) > MAX_GPUS:
        raise ValueError(f"an emulated node holds at most {MAX_GPUS} GPUs; {node} was given {len(gpus)}")
    lines = ["# emulated NVML node: written by mig_batch.gpu.nvml_emu.make_node", f"node\t{node}"]
    for index, gpu in enumerate(gpus):
        model = gpu.model
        total = max(p.memory_mib for p in model.profiles)
        name = gpu.device_name or device_name(model)
        uuid = f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'mig-batch/{node}/{index}/{model.name}')}"
        lines.append("\t".join(["gpu", str(index), name, uuid, str(total), str(int(gpu.mig_enabled)),
                                str(model.memory_slices), str(model.compute_slices)]))  # fmt: skip
        lines += profile_rows(model)
    return "\n".join(lines) + "\n"


def make_node(directory: Path, node: str, gpus: Sequence[str | GpuModel | EmulatedGpu]) -> Path:
    """Create (or re-create, keeping instances) the emulated node in ``directory``; returns it."""
    resolved = [g if isinstance(g, EmulatedGpu) else EmulatedGpu(g if isinstance(g, GpuModel) else get_model(g))
                for g in gpus]  # fmt: skip
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / "gpus.tmp"
    partial.write_text(node_table(node, resolved))
    os.replace(partial, directory / "gpus")
    _make_capabilities(directory)
    return directory


def _make_capabilities(directory: Path) -> None:
    """What the driver and nvidia-modprobe give a node before any instance: the MIG config and monitor
    capabilities (root only; everyone), the nvidia-caps major, and /dev/nvidia-caps (root's, 0755)."""
    for name, minor, mode in (("config", 1, 0o400), ("monitor", 2, 0o444)):
        path = directory / "capabilities" / "mig" / name / "access"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
    (directory / "devices").write_text(f"Character devices:\n  1 mem\n{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n")
    (directory / "nvidia-caps").mkdir(mode=0o755, exist_ok=True)
    os.chmod(directory / "nvidia-caps", 0o755)


# ---------------------------------------------------------------------------------------------
# reading what happened (the tests' audit)


@dataclass(frozen=True)
class Lifetime:
    """One GPU instance from creation to destruction (``destroyed`` None while it lives)."""

    node: str
    gpu: int
    gi_id: int
    profile: str
    start: int
    size: int
    key: str
    created: float
    destroyed: float | None
    mig_uuids: tuple[str, ...] = ()  # its compute instances' MIG devices (what CUDA_VISIBLE_DEVICES names)


def read_history(directory: Path) -> list[dict]:
    path = Path(directory) / "history"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def lifetimes(directory: Path) -> list[Lifetime]:
    """Every GPU instance the node ever had, from its history file. The library renames the state file, then
    appends the line: a caller killed in between (an agent stopped mid-create) leaves the line out. A destroy
    whose create is missing then counts from the last end of an instance on its slices before it; an
    instance the history leaves alive but the state file no longer holds ended by the next create on its
    slices (or the history's last event). The library itself never lets two instances share slices."""
    events = read_history(directory)
    open_: dict[str, dict] = {}
    by_id: dict[tuple[int, int], str] = {}  # (GPU, GPU instance id) -> key of the instance alive with that id
    migs: dict[str, list[str]] = {}
    done: list[Lifetime] = []
    for event in events:
        if event["op"] == "create":
            open_[event["uuid"]] = event
            by_id[event["gpu"], event["gi_id"]] = event["uuid"]
            migs[event["uuid"]] = []
        elif event["op"] == "ci_create" and (event["gpu"], event["gi_id"]) in by_id:
            migs[by_id[event["gpu"], event["gi_id"]]].append(event["uuid"])
        elif event["op"] == "destroy":
            made = open_.pop(event["uuid"], None)
            if made is None:  # its create's line was lost
                since = max((d.destroyed for d in done if d.destroyed is not None
                             and _shares_slices((d.node, d.gpu, d.start, d.size), event)),
                            default=events[0]["time"])  # fmt: skip
                made = {**event, "time": since}
            done.append(_lifetime(made, event["time"], migs.get(made["uuid"], [])))
    live = set(_live_spots(directory))
    for made in open_.values():
        later = (e["time"] for e in events
                 if e["op"] == "create" and e["time"] > made["time"] and _shares_slices(_spot(e), made))  # fmt: skip
        ended = next(later, None)
        if ended is None and (made["gpu"], made["gi_id"], made["start"], made["size"]) not in live:
            ended = events[-1]["time"]
        done.append(_lifetime(made, ended, migs[made["uuid"]]))  # ended: its destroy's line was lost
    return done


def _live_spots(directory: Path) -> list[tuple[int, int, int, int]]:
    """(GPU, GPU instance id, start, size) of every instance in the node's state file now, in its order."""
    path = Path(directory) / "state"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(f[1]), int(f[2]), int(f[4]), int(f[5])) for f in map(str.split, lines) if f and f[0] == "gi"]


def _spot(event: dict) -> tuple[str, int, int, int]:
    return event["node"], event["gpu"], event["start"], event["size"]


def _shares_slices(spot: tuple[str, int, int, int], event: dict) -> bool:
    """Whether an instance at ``spot`` (node, GPU, start, size) and ``event``'s share a memory slice."""
    node, gpu, start, size = spot
    return node == event["node"] and gpu == event["gpu"] and start < event["start"] + event["size"] \
        and event["start"] < start + size  # fmt: skip


def _lifetime(made: dict, destroyed: float | None, mig_uuids: list[str]) -> Lifetime:
    return Lifetime(made["node"], made["gpu"], made["gi_id"], made["profile"], made["start"], made["size"],
                    made["uuid"], made["time"], destroyed, tuple(mig_uuids))  # fmt: skip


def live_instances(directory: Path) -> list[tuple[int, int]]:
    """(GPU, GPU instance id) of every instance in the node's state file now."""
    return [(gpu, gi_id) for gpu, gi_id, _, _ in _live_spots(directory)]


# ---------------------------------------------------------------------------------------------
# what runs on the MIG devices (the harness's controls; the library reports them through NVML)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """The node's lock, the one every library call that touches instances takes."""
    with open(Path(directory) / "lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def mig_uuids(directory: Path) -> set[str]:
    """UUIDs of the node's MIG devices now (one per compute instance)."""
    path = Path(directory) / "state"
    lines = path.read_text().splitlines() if path.exists() else []
    return {fields[7] for fields in map(str.split, lines) if fields[0] == "ci" and len(fields) == 8}


def _add_usage(directory: Path, uuid: str, line: str, replaces: str | None = None) -> None:
    """Append ``line`` to the node's usage file, dropping lines of devices gone and, if given, the
    device's earlier lines of kind ``replaces``."""
    path = Path(directory) / "usage"
    with _locked(directory):
        live = mig_uuids(directory)
        if uuid not in live:
            raise LookupError(f"the emulated node {directory} has no MIG device {uuid}")
        kept = [old for old in (path.read_text().splitlines() if path.exists() else [])
                if old.split()[1] in live and not (old.split()[0] == replaces and old.split()[1] == uuid)]  # fmt: skip
        partial = path.with_name("usage.tmp")
        partial.write_text("".join(f"{old}\n" for old in [*kept, line]))
        os.replace(partial, path)


def attach(directory: Path, uuid: str, pid: int) -> None:
    """From now on, process ``pid`` runs on MIG device ``uuid``: while it lives, NVML lists it among
    the device's compute processes and refuses to destroy the instance (NVML_ERROR_IN_USE)."""
    _add_usage(directory, uuid, f"attach {uuid} {int(pid)}")


def replay(directory: Path, uuid: str, points: Sequence[tuple[float, float]]) -> None:
    """From now on, MIG device ``uuid``'s memory in use (nvmlDeviceGetMemoryInfo) follows ``points``:
    (seconds from now, MiB), each value held until the next point."""
    if not points:
        raise ValueError("a memory replay needs at least one (seconds, MiB) point")
    timeline = ",".join(f"{float(t):g}:{float(mib):g}" for t, mib in sorted(points))
    _add_usage(directory, uuid, f"replay {uuid} {time.time():.6f} {timeline}", replaces="replay")
