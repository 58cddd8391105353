"""Real GPUs through NVML (nvidia-ml-py's ``pynvml``).

Profile ids differ per GPU model and driver, so they are read from NVML by the profile's enum
(NVML_GPU_INSTANCE_PROFILE_<n>_SLICE[_REV1|_GFX|...], from etc/gpus), never hard-coded. A GPU
instance is created at an explicit placement, passed by reference (the C call takes a pointer; the
driver checks the MIG mode and the placement, and only a refusal reads them to name the reason), then
one compute instance spanning it; the MIG UUID is read from the MIG device handle whose GPU instance
id matches. NVML errors become the backend's errors (see ``base``). Only calls that nvidia-ml-py 12.535
and 13.x both have are used. Tested against the emulated libnvidia-ml in ``mig_batch.gpu.nvml_emu``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from mig_batch.gpu.base import (
    GpuBackend,
    GpuBackendError,
    GpuInfo,
    InsufficientResources,
    InUse,
    MigInstance,
    NotFound,
    NotSupported,
)
from mig_batch.mig.models import NVML_PROFILE_ENUMS, GpuModel, UnknownModelError, get_model
from mig_batch.mig.probe import DriverGpu, DriverProfile


def _nvml():
    import pynvml  # imported here so that hosts without GPUs (the controller, submit hosts) never load it

    return pynvml


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except _nvml().NVMLError as exc:
        raise _mapped(exc) from exc


def _mapped(exc: Exception) -> GpuBackendError:
    """NVML's error as ours. INVALID_ARGUMENT is not mapped: it means this code called NVML wrongly, never a
    full GPU."""
    nv = _nvml()
    kind = {
        nv.NVML_ERROR_INSUFFICIENT_RESOURCES: InsufficientResources,
        nv.NVML_ERROR_IN_USE: InUse,
        nv.NVML_ERROR_NOT_SUPPORTED: NotSupported,
        nv.NVML_ERROR_NOT_FOUND: NotFound,
    }.get(getattr(exc, "value", None), GpuBackendError)
    return kind(f"NVML: {exc}")


@dataclass(frozen=True)
class GpuInstanceProfile:
    id: int  # NVML's profile id on this GPU and driver
    instance_count: int


class NvmlNode(GpuBackend):
    def __init__(self) -> None:
        with _errors():
            _nvml().nvmlInit()
        # a GPU's model and its profiles' ids hold while its MIG mode does (they are read with MIG mode off
        # too): read once, not at every create, destroy and listing
        self._models: dict[int, GpuModel] = {}
        self._offered: dict[int, dict[str, GpuInstanceProfile]] = {}
        # compute instance profile ids a GPU instance profile offers, per GPU: (gpu, GI profile id) -> ids
        self._ci_profiles: dict[tuple[int, int], tuple[int, ...]] = {}
        self._mig_modes: dict[int, int] = {}  # as gpus() saw them last
        self._handles: dict[int, object] = {}

    def close(self) -> None:
        self._handles.clear()
        with _errors():
            _nvml().nvmlShutdown()

    def _handle(self, gpu: int):
        if gpu not in self._handles:  # a handle holds from nvmlInit to nvmlShutdown
            with _errors():
                self._handles[gpu] = _nvml().nvmlDeviceGetHandleByIndex(gpu)
        return self._handles[gpu]

    def _model(self, gpu: int) -> GpuModel:
        if gpu in self._models:
            return self._models[gpu]
        nv = _nvml()
        with _errors():
            name = nv.nvmlDeviceGetName(self._handle(gpu))
        name = name.decode() if isinstance(name, bytes) else name
        try:
            model = self._models[gpu] = get_model(name)
        except UnknownModelError:
            raise NotSupported(f"GPU {gpu} is a {name}, which no etc/gpus model lists as an alias") from None
        return model

    def _profiles(self, gpu: int) -> dict[str, GpuInstanceProfile]:
        """Profile name -> what the driver says of it, for the model's profiles this GPU offers."""
        if gpu in self._offered:
            return self._offered[gpu]
        nv = _nvml()
        handle, model = self._handle(gpu), self._model(gpu)
        out = {}
        for profile in model.profiles:
            enum = getattr(nv, f"NVML_GPU_INSTANCE_PROFILE_{profile.nvml_profile}", None)
            if enum is None:
                continue
            try:
                with _errors():
                    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)  # v2 struct, in every nvidia-ml-py
            except NotSupported:
                continue  # not offered by this GPU / driver; any other error is a fault, and raised
            out[profile.name] = GpuInstanceProfile(info.id, info.instanceCount)
        if out:  # none offered may be a GPU in reset: asked again next time
            self._offered[gpu] = out
        return out

    def gpus(self) -> list[GpuInfo]:
        nv = _nvml()
        out = []
        with _errors():
            for i in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                try:
                    current, _pending = nv.nvmlDeviceGetMigMode(handle)
                except nv.NVMLError:
                    current = 0
                if self._mig_modes.setdefault(i, current) != current:  # ids hold for one MIG mode's lifetime
                    self._mig_modes[i] = current
                    self._offered.pop(i, None)
                    self._ci_profiles = {key: ids for key, ids in self._ci_profiles.items() if key[0] != i}
                uuid = nv.nvmlDeviceGetUUID(handle)
                try:
                    model = self._model(i).name
                except NotSupported:
                    model = "unknown"
                out.append(GpuInfo(i, model, current == nv.NVML_DEVICE_MIG_ENABLE, _text(uuid)))
        return out

    def _gpu_instances(self, gpu: int) -> Iterator[tuple[str, object]]:
        """(profile name, GPU instance handle) of every GPU instance on ``gpu``."""
        nv = _nvml()
        handle = self._handle(gpu)
        for name, profile in self._profiles(gpu).items():
            array = (nv.c_nvmlGpuInstance_t * max(profile.instance_count, 1))()
            count = ctypes.c_uint(0)
            nv.nvmlDeviceGetGpuInstances(handle, profile.id, array, ctypes.byref(count))
            for k in range(count.value):
                yield name, array[k]

    def instance_ids(self, gpu: int) -> list[int]:
        nv = _nvml()
        with _errors():
            return [nv.nvmlGpuInstanceGetInfo(gi).id for _, gi in self._gpu_instances(gpu)]

    def instances(self, gpu: int) -> list[MigInstance]:
        nv = _nvml()
        handle = self._handle(gpu)
        out = []
        with _errors():
            migs = None
            for name, gi in self._gpu_instances(gpu):
                info = nv.nvmlGpuInstanceGetInfo(gi)
                migs = self._mig_devices(handle) if migs is None else migs
                mig = migs.get(info.id)
                ci_id = nv.nvmlDeviceGetComputeInstanceId(mig) if mig is not None else 0
                uuid = _text(nv.nvmlDeviceGetUUID(mig)) if mig is not None else ""
                out.append(MigInstance(gpu, info.id, ci_id, name, info.placement.start, info.placement.size, uuid))
        return sorted(out, key=lambda i: i.start)

    def possible_starts(self, gpu: int, profile_id: int) -> list[tuple[int, int]]:
        """(start, size) of every placement the driver allows for a GPU instance profile id."""
        handle = self._handle(gpu)
        with _errors():
            return list(_placements(handle, profile_id))

    @staticmethod
    def _mig_device(handle, gi_id: int):
        """The MIG device handle of a GPU instance (None without a compute instance): the scan stops at it."""
        nv = _nvml()
        for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
            except nv.NVMLError:
                continue
            if nv.nvmlDeviceGetGpuInstanceId(mig) == gi_id:
                return mig
        return None

    def _compute_profiles(self, gpu: int, gi) -> tuple[int, ...]:
        """The compute instance profile ids a GPU instance's profile offers (read once per GPU and profile)."""
        nv = _nvml()
        key = (gpu, nv.nvmlGpuInstanceGetInfo(gi).profileId)
        if key in self._ci_profiles:
            return self._ci_profiles[key]
        ids, settled = [], True
        for slices in (1, 2, 3, 4, 6, 7, 8):
            enum = getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE", None)
            if enum is None:
                continue
            try:
                ids.append(nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, enum, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED).id)  # fmt: skip
            except nv.NVMLError as exc:  # not offered by this profile; anything else: ask again next time
                settled = settled and getattr(exc, "value", None) in (nv.NVML_ERROR_NOT_SUPPORTED,
                                                                      nv.NVML_ERROR_INVALID_ARGUMENT)
        if settled:
            self._ci_profiles[key] = tuple(ids)
        return tuple(ids)

    @staticmethod
    def _mig_devices(handle) -> dict[int, object]:
        """GPU instance id -> its MIG device handle, for every GPU instance with a compute instance."""
        nv = _nvml()
        out = {}
        for k in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
            except nv.NVMLError:
                continue
            out.setdefault(nv.nvmlDeviceGetGpuInstanceId(mig), mig)
        return out

    def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        """Make a GPU instance of ``profile`` at ``start`` with one compute instance over all of it. The
        driver checks the MIG mode and the placement itself: only a refusal reads them, to say why."""
        nv = _nvml()
        handle, model = self._handle(gpu), self._model(gpu)
        if not model.has_profile(profile):
            raise NotSupported(f"{model.name} has no MIG profile {profile}")
        p = model.profile(profile)
        offered = self._profiles(gpu)
        if profile not in offered:
            raise NotSupported(f"this GPU or driver does not offer {profile}")
        profile_id = offered[profile].id
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, p.memory_slices
        try:
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, ctypes.byref(placement))
        except nv.NVMLError as exc:
            raise self._refusal(gpu, profile, profile_id, start, p.memory_slices, exc) from exc
        with _errors():
            try:
                ci_enum = getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{p.compute_slices}_SLICE")
                ci_profile = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_enum, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
                ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            except nv.NVMLError:
                nv.nvmlGpuInstanceDestroy(gi)  # no half-made instance left behind
                raise
            gi_info = nv.nvmlGpuInstanceGetInfo(gi)
            ci_info = nv.nvmlComputeInstanceGetInfo(ci)
            mig = self._mig_device(handle, gi_info.id)
            uuid = _text(nv.nvmlDeviceGetUUID(mig)) if mig is not None else ""
            return MigInstance(gpu, gi_info.id, ci_info.id, profile, gi_info.placement.start,
                               gi_info.placement.size, uuid)  # fmt: skip

    def _refusal(self, gpu: int, profile: str, profile_id: int, start: int, size: int, exc: Exception) -> Exception:
        """Why the driver refused a GPU instance, as the error to raise: MIG mode off, or a start the
        profile does not allow (with the allowed ones), read now; else the driver's own error."""
        nv = _nvml()
        if getattr(exc, "value", None) == nv.NVML_ERROR_INSUFFICIENT_RESOURCES:  # a full GPU: nothing to read
            return _mapped(exc)
        try:
            with _errors():
                current, _pending = nv.nvmlDeviceGetMigMode(self._handle(gpu))
            if current != nv.NVML_DEVICE_MIG_ENABLE:
                return NotSupported(f"MIG mode is off on GPU {gpu}; an administrator enables it with "
                                    f"'nvidia-smi -i {gpu} -mig 1' (then a GPU reset)")  # fmt: skip
            allowed = self.possible_starts(gpu, profile_id)
        except GpuBackendError:  # the GPU cannot say why now (lost, in reset): the driver's own error stands
            return _mapped(exc)
        if (start, size) not in allowed:
            return InsufficientResources(f"{profile} cannot start at {start} on GPU {gpu}; the driver allows "
                                         f"starts {[s for s, _ in allowed]}")  # fmt: skip
        return _mapped(exc)

    def destroy(self, gpu: int, gi_id: int, uuid: str = "") -> None:
        nv = _nvml()
        handle = self._handle(gpu)
        with _errors():
            if uuid and not self._is_instance(gpu, gi_id, uuid):
                raise NotFound(f"instance {uuid} is not GPU instance {gi_id} of GPU {gpu} (any more)")
            gi = nv.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            for profile_id in self._compute_profiles(gpu, gi):
                array = (nv.c_nvmlComputeInstance_t * 8)()
                count = ctypes.c_uint(0)
                nv.nvmlGpuInstanceGetComputeInstances(gi, profile_id, array, ctypes.byref(count))
                for k in range(count.value):
                    nv.nvmlComputeInstanceDestroy(array[k])
            nv.nvmlGpuInstanceDestroy(gi)

    @staticmethod
    def _is_instance(gpu: int, gi_id: int, uuid: str) -> bool:
        """Whether the MIG device ``uuid`` is GPU instance ``gi_id`` of GPU ``gpu``: four calls, where listing
        the GPU's instances would read every one's UUID."""
        nv = _nvml()
        try:
            mig = nv.nvmlDeviceGetHandleByUUID(uuid.encode())
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_NOT_FOUND:
                return False
            raise
        parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        return nv.nvmlDeviceGetIndex(parent) == gpu and nv.nvmlDeviceGetGpuInstanceId(mig) == gi_id

    def memory_used(self, gpu: int, gi_id: int) -> int:
        nv = _nvml()
        handle = self._handle(gpu)
        with _errors():
            mig = self._mig_device(handle, gi_id)
            if mig is not None:
                return int(nv.nvmlDeviceGetMemoryInfo(mig).used)
        raise NotFound(f"GPU {gpu} has no MIG device for GPU instance {gi_id}")


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_driver_gpus() -> list[DriverGpu]:
    """Every local GPU's MIG profiles as the driver states them (works with MIG mode off)."""
    nv = _nvml()
    with _errors():
        nv.nvmlInit()
    try:
        out = []
        with _errors():
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                try:
                    current, _pending = nv.nvmlDeviceGetMigMode(handle)
                except nv.NVMLError_NotSupported:
                    current = nv.NVML_DEVICE_MIG_DISABLE  # a GPU without MIG
                profiles = tuple(p for enum in NVML_PROFILE_ENUMS if (p := _driver_profile(handle, enum)) is not None)
                name = _text(nv.nvmlDeviceGetName(handle))
                out.append(DriverGpu(index, name, current == nv.NVML_DEVICE_MIG_ENABLE, profiles))
        return out
    finally:
        nv.nvmlShutdown()


def _driver_profile(handle, enum_name: str) -> DriverProfile | None:
    nv = _nvml()
    enum = getattr(nv, f"NVML_GPU_INSTANCE_PROFILE_{enum_name}", None)
    if enum is None:
        return None  # this nvidia-ml-py predates the enum
    try:
        with _errors():
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
    except NotSupported:
        return None
    return DriverProfile(
        nvml_profile=enum_name,
        profile_id=info.id,
        name=_text(info.name).removeprefix("MIG "),
        compute_slices=info.sliceCount,
        instance_count=info.instanceCount,
        memory_mib=int(info.memorySizeMB),
        sms=info.multiprocessorCount,
        placements=_placements(handle, info.id),
    )


def _placements(handle, profile_id: int) -> tuple[tuple[int, int], ...]:
    """(start, size) of every placement the driver allows for a profile id."""
    nv = _nvml()
    # The driver writes every placement whatever count says (a short array overflows), so ask for the count first.
    count = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    array = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return tuple((array[k].start, array[k].size) for k in range(count.value))
