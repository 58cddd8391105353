"""One behavioural suite for the GPU backend, NvmlNode: over the emulated libnvidia-ml (pynvml and its
ctypes calls for real, every time), and on a real MIG GPU where one is free. Processes sharing a node,
and processes keeping an instance in use, are tested on the library in test_nvml_emu."""


import pytest

from mig_batch.gpu.base import InsufficientResources, NotFound, NotSupported
from mig_batch.mig.models import get_model


def _nvml_mig_gpu():
    """(backend, GPU index) of a real MIG-enabled GPU with no instances, else why there is none."""
    try:
        from mig_batch.gpu.nvml import NvmlNode

        backend = NvmlNode()
        gpus = backend.gpus()
        for gpu in gpus:
            if gpu.mig_enabled and gpu.model != "unknown" and not backend.instances(gpu.index):
                return backend, gpu.index
    except Exception as exc:
        return f"no NVIDIA driver here ({type(exc).__name__}: {exc})"
    seen = "; ".join(f"GPU {g.index} {g.model}: MIG {'on, in use' if g.mig_enabled else 'mode off'}" for g in gpus)
    return f"no free MIG-enabled GPU ({seen or 'none'}); never enabled here: creating rows need one"


REAL_GPU = _nvml_mig_gpu()


def _backends():
    yield pytest.param("nvml-emu:A100-40GB", id="nvml-emu-a100")
    yield pytest.param("nvml-emu:H200-141GB", id="nvml-emu-h200")  # the model a real driver's answers checked
    yield pytest.param("nvml", id="nvml", marks=pytest.mark.skipif(isinstance(REAL_GPU, str), reason=str(REAL_GPU)))


@pytest.fixture(params=list(_backends()))
def node(request):
    if request.param.startswith("nvml-emu:"):
        make = request.getfixturevalue("nvml_emu_creator")
        backend, _directory = make([request.param.removeprefix("nvml-emu:")])
        yield backend, 0
        return
    backend, gpu = REAL_GPU
    yield backend, gpu
    for inst in backend.instances(gpu):  # leave the GPU as found
        backend.destroy(gpu, inst.gi_id)


def test_create_at_a_placement_then_destroy(node):
    backend, gpu = node
    model = get_model(backend.gpus()[gpu].model)
    small = min(model.base_profiles, key=lambda p: (p.memory_slices, p.compute_slices))
    start = small.starts[-1]
    inst = backend.create(gpu, small.name, start)
    assert (inst.profile, inst.start, inst.size) == (small.name, start, small.memory_slices)
    assert inst.uuid.startswith("MIG-")
    assert [i.uuid for i in backend.instances(gpu)] == [inst.uuid]
    assert backend.find(inst.uuid) == inst
    backend.destroy(gpu, inst.gi_id)
    assert backend.instances(gpu) == []


def test_a_destroy_by_uuid_leaves_an_instance_that_took_the_ids_of_a_destroyed_one(node):
    backend, gpu = node
    model = get_model(backend.gpus()[gpu].model)
    small = min(model.base_profiles, key=lambda p: (p.memory_slices, p.compute_slices))
    first = backend.create(gpu, small.name, small.starts[0])
    backend.destroy(gpu, first.gi_id, first.uuid)
    assert backend.instances(gpu) == []
    again = backend.create(gpu, small.name, small.starts[0])
    with pytest.raises(NotFound):  # the id may be the same; the UUID is not
        backend.destroy(gpu, again.gi_id, first.uuid)
    assert backend.instances(gpu) == [again]
    backend.destroy(gpu, again.gi_id, again.uuid)
    assert backend.instances(gpu) == []


def test_nvml_errors_are_the_same_everywhere(node):
    backend, gpu = node
    model = get_model(backend.gpus()[gpu].model)
    full = model.largest_profile
    inst = backend.create(gpu, full.name, full.starts[0])
    small = min(model.base_profiles, key=lambda p: p.memory_slices)
    with pytest.raises(InsufficientResources):
        backend.create(gpu, small.name, small.starts[0])  # overlaps the full instance
    with pytest.raises(NotSupported):
        backend.create(gpu, "9g.999gb", 0)
    backend.destroy(gpu, inst.gi_id)
    with pytest.raises(NotFound):
        backend.destroy(gpu, inst.gi_id)
    two = next(p for p in model.base_profiles if p.compute_slices == 2)
    with pytest.raises(InsufficientResources):
        backend.create(gpu, two.name, 1)  # 2g instances start at even slices only
