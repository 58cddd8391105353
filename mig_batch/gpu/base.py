"""The GPU backend interface and its errors (the one implementation is ``nvml.NvmlNode``).

Errors mirror NVML's return codes: an overlapping placement is
``InsufficientResources`` (NVML_ERROR_INSUFFICIENT_RESOURCES), destroying an instance with processes
is ``InUse`` (NVML_ERROR_IN_USE), an unknown profile or a GPU without MIG is ``NotSupported``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from mig_batch.errors import MigBatchError


class GpuBackendError(MigBatchError, RuntimeError):
    pass


class InsufficientResources(GpuBackendError):
    pass


class InUse(GpuBackendError):
    pass


class NotSupported(GpuBackendError):
    pass


class NotFound(GpuBackendError):
    pass


@dataclass(frozen=True)
class GpuInfo:
    index: int
    model: str  # a model name of etc/gpus, e.g. A100-40GB
    mig_enabled: bool
    uuid: str


@dataclass(frozen=True)
class MigInstance:
    gpu: int
    gi_id: int
    ci_id: int
    profile: str  # e.g. 3g.40gb
    start: int  # placement start (memory slice)
    size: int  # placement size (memory slices)
    uuid: str  # MIG-<uuid>: what CUDA_VISIBLE_DEVICES takes


class GpuBackend(ABC):
    """One node's GPUs."""

    @abstractmethod
    def gpus(self) -> list[GpuInfo]: ...

    @abstractmethod
    def instances(self, gpu: int) -> list[MigInstance]: ...

    @abstractmethod
    def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        """Create a GPU instance of ``profile`` at placement ``start`` and one compute instance on it."""

    @abstractmethod
    def destroy(self, gpu: int, gi_id: int, uuid: str = "") -> None:
        """Destroy the GPU instance's compute instances, then the GPU instance. With ``uuid``, only the
        instance of that UUID: NotFound when the id is gone, or was made again for another instance after
        that one was destroyed behind the caller's back."""

    @abstractmethod
    def memory_used(self, gpu: int, gi_id: int) -> int:
        """Bytes of the instance's memory in use now."""

    def instance_ids(self, gpu: int) -> list[int]:
        """The GPU instance ids on ``gpu``: a cheaper question than :meth:`instances` where a backend can
        answer it without each instance's UUID."""
        return [inst.gi_id for inst in self.instances(gpu)]

    def find(self, uuid: str, gpu: int | None = None) -> MigInstance | None:
        """The instance with ``uuid``: on ``gpu`` when known (a journal entry says where), else on any."""
        for index in [gpu] if gpu is not None else [g.index for g in self.gpus()]:
            for inst in self.instances(index):
                if inst.uuid == uuid:
                    return inst
        return None
