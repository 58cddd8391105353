"""The emulated libnvidia-ml through the real pynvml: what a real H200 driver answered (docs/real-gpu),
NVML's return codes, one node shared by processes, and the history the audit reads."""

import ctypes
import json
import multiprocessing
import os
from pathlib import Path

import pynvml as nv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.gpu import nvml_emu
from mig_batch.gpu.base import GpuBackendError, InsufficientResources, InUse, NotSupported
from mig_batch.gpu.nvml import NvmlNode
from mig_batch.mig.models import get_model

REAL_H200 = Path(__file__).resolve().parents[1] / "docs" / "real-gpu" / "nvml-13.615.71.json"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="NVML creates MIG instances for root only")


def _code(call, *args) -> int:
    try:
        call(*args)
    except nv.NVMLError as exc:
        return exc.value
    return nv.NVML_SUCCESS


def test_h200_answers_what_the_real_driver_answered(nvml_emu_node):
    nvml_emu_node(["H200-141GB"], mig_enabled=False)
    real = json.loads(REAL_H200.read_text())["gpus"][0]
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetName(h) == real["name"]["result"]
    assert nv.nvmlDeviceGetMigMode(h) == real["mig_mode"]["result"] == [0, 0]
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == real["max_mig_device_count"]["result"] == 0
    compared = 0
    for enum_name, answers in real["gpu_instance_profiles"].items():
        enum, want = answers["enum"], answers["default_call"]
        if not want["ok"]:  # unsupported enums: the same error (NOT_SUPPORTED, or INVALID_ARGUMENT past the known)
            assert _code(nv.nvmlDeviceGetGpuInstanceProfileInfo, h, enum) == want["value"], enum_name
            continue
        got = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, enum)
        # the fields a model holds (engine counts other than OFA/encoders are derived, not modelled)
        for field in ("version", "id", "sliceCount", "instanceCount", "multiprocessorCount", "memorySizeMB",
                      "encoderCount", "ofaCount", "name"):  # fmt: skip
            value = getattr(got, field)
            assert (value.decode() if isinstance(value, bytes) else value) == want["result"][field], (enum_name, field)
        v1 = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, enum, version=1)
        assert (v1.id, v1.memorySizeMB) == (want["result"]["id"], want["result"]["memorySizeMB"])
        compared += 1
    assert compared == 7
    for profile_id, answers in real["per_profile_id"].items():
        placements = answers["possible_placements"]
        count = ctypes.c_uint(0)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, int(profile_id), None, ctypes.byref(count))
        assert count.value == placements["C_four_args_None_count0"]["count_out"]
        array = (nv.c_nvmlGpuInstancePlacement_t * 32)()
        count = ctypes.c_uint(1)  # the driver ignores the count passed in and writes all placements
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, int(profile_id), array, ctypes.byref(count))
        written = [{"start": array[k].start, "size": array[k].size} for k in range(count.value)]
        assert written == placements["D_four_args_count32"]["placements"], profile_id
        legacy = nv._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstancePossiblePlacements")
        assert legacy(h, int(profile_id), array, ctypes.byref(count)) == placements["G_raw_symbol_v1"].get(
            "nvml_return", 0
        ), profile_id
        assert (
            nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, int(profile_id)) == answers["remaining_capacity"]["result"]
        )
        instances = (nv.c_nvmlGpuInstance_t * 8)()
        nv.nvmlDeviceGetGpuInstances(h, int(profile_id), instances, ctypes.byref(count))
        assert count.value == answers["get_gpu_instances"]["count_out"] == 0


def test_versioned_structs_are_checked(nvml_emu_node):
    nvml_emu_node(["A100-40GB"])
    h = nv.nvmlDeviceGetHandleByIndex(0)
    info_v = nv._nvmlGetFunctionPointer("nvmlDeviceGetGpuInstanceProfileInfoV")
    v1 = nv.c_nvmlGpuInstanceProfileInfo_t()  # a v1 struct where the V call wants a versioned one
    assert info_v(h, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE, ctypes.byref(v1)) == nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    v3 = (ctypes.c_uint * 38)(0x03000098)  # the v3 layout, 152 bytes, as hand-built on the real H200
    assert info_v(h, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE, ctypes.byref(v3)) == nv.NVML_SUCCESS
    assert (v3[0], v3[1], v3[10]) == (0, 19, 4864)  # version overwritten with 0, id, memorySizeMB


@root_only
def test_return_codes_of_create_and_destroy(nvml_emu_node):
    nvml_emu_node(["A100-40GB", "A100-40GB"])
    h = nv.nvmlDeviceGetHandleByIndex(0)
    one = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE).id
    two = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_2_SLICE).id

    def at(start, size):
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        return ctypes.byref(placement)

    create = nv.nvmlDeviceCreateGpuInstanceWithPlacement
    assert _code(create, h, two, at(1, 2)) == nv.NVML_ERROR_INVALID_ARGUMENT  # 2g starts at even slices
    assert _code(create, h, one, at(0, 2)) == nv.NVML_ERROR_INVALID_ARGUMENT  # size is not the profile's
    gi = create(h, two, at(2, 2))
    assert _code(create, h, one, at(3, 1)) == nv.NVML_ERROR_INSUFFICIENT_RESOURCES  # overlaps the 2g
    ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, nv.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE)
    assert _code(nv.nvmlGpuInstanceCreateComputeInstance, gi, 0) == nv.NVML_ERROR_INSUFFICIENT_RESOURCES  # full
    assert _code(nv.nvmlGpuInstanceDestroy, gi) == nv.NVML_ERROR_IN_USE  # a compute instance is on it
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert nv.nvmlDeviceGetGpuInstanceId(mig) == nv.nvmlGpuInstanceGetInfo(gi).id
    assert nv.nvmlDeviceGetMemoryInfo(mig).total == 9856 * 2**20  # 2g.10gb's memory
    assert nv.nvmlDeviceGetHandleByUUID(nv.nvmlDeviceGetUUID(mig).encode()) is not None
    gi_id = nv.nvmlGpuInstanceGetInfo(gi).id
    nv.nvmlComputeInstanceDestroy(ci)
    nv.nvmlGpuInstanceDestroy(gi)
    assert _code(nv.nvmlDeviceGetGpuInstanceById, h, gi_id) == nv.NVML_ERROR_NOT_FOUND
    second = nv.nvmlDeviceCreateGpuInstance(nv.nvmlDeviceGetHandleByIndex(1), one)  # without a placement
    assert nv.nvmlGpuInstanceGetInfo(second).placement.start == 0
    nv.nvmlGpuInstanceDestroy(second)


@root_only
def test_mig_off_refuses_to_create(nvml_emu_node):
    backend, _ = nvml_emu_node(["A100-40GB"], mig_enabled=False)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    one = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE).id
    assert _code(nv.nvmlDeviceCreateGpuInstance, h, one) == nv.NVML_ERROR_NOT_SUPPORTED
    assert backend.gpus()[0].mig_enabled is False
    with pytest.raises(NotSupported, match="MIG mode is off on GPU 0"):
        backend.create(0, "1g.5gb", 0)


@root_only
def test_a_create_the_driver_accepts_reads_neither_the_mig_mode_nor_the_placements(nvml_emu_node, monkeypatch):
    """The driver checks both itself; only a refusal reads them, to name the reason."""
    backend, _ = nvml_emu_node(["A100-40GB"])
    backend.create(0, "1g.5gb", 0)  # the first create reads the GPU's profiles, once
    asked = []
    for name in ("nvmlDeviceGetMigMode", "nvmlDeviceGetGpuInstancePossiblePlacements"):
        real = getattr(nv, name)
        monkeypatch.setattr(nv, name, lambda *args, _real=real, _name=name: asked.append(_name) or _real(*args))
    backend.create(0, "1g.5gb", 1)
    assert asked == []
    with pytest.raises(InsufficientResources, match=r"cannot start at 1 on GPU 0; the driver allows starts \[0, 2, 4"):
        backend.create(0, "2g.10gb", 1)
    assert "nvmlDeviceGetGpuInstancePossiblePlacements" in asked


@root_only
def test_a_refusal_the_gpu_cannot_explain_keeps_the_drivers_own_error(nvml_emu_node, monkeypatch):
    backend, _ = nvml_emu_node(["A100-40GB"])

    def lost(*_args):
        raise nv.NVMLError(nv.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(nv, "nvmlDeviceGetMigMode", lost)
    with pytest.raises(GpuBackendError, match="Invalid Argument") as refused:
        backend.create(0, "2g.10gb", 1)  # 2g instances start at even slices: the driver refuses the argument
    assert type(refused.value) is GpuBackendError


def test_a_non_root_create_gets_no_permission(nvml_emu_node):
    nvml_emu_node(["A100-40GB"])
    h = nv.nvmlDeviceGetHandleByIndex(0)
    one = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_1_SLICE).id
    if os.geteuid() != 0:
        assert _code(nv.nvmlDeviceCreateGpuInstance, h, one) == nv.NVML_ERROR_NO_PERMISSION
        return
    child = os.fork()
    if child == 0:  # the library is initialised already; only the caller's identity changes
        os.setuid(65534)
        os._exit(_code(nv.nvmlDeviceCreateGpuInstance, h, one))
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == nv.NVML_ERROR_NO_PERMISSION


def _grab(args):
    directory, start = args
    os.environ[nvml_emu.NODE_ENV] = str(directory)
    try:
        NvmlNode().create(0, "1g.5gb", start)
        return True
    except InsufficientResources:
        return False


@root_only
def test_processes_share_one_node(nvml_emu_node):
    backend, directory = nvml_emu_node(["A100-40GB"])
    with multiprocessing.get_context("fork").Pool(4) as pool:
        results = pool.map(_grab, [(directory, s) for s in range(7) for _ in range(3)])
    assert sum(results) == 7  # each 1g start taken exactly once, across processes
    assert sorted(i.start for i in backend.instances(0)) == list(range(7))
    assert len({i.uuid for i in backend.instances(0)}) == 7
    for inst in backend.instances(0):
        backend.destroy(0, inst.gi_id)
    lives = nvml_emu.lifetimes(directory)
    assert len(lives) == 7 and all(life.destroyed is not None for life in lives)
    assert nvml_emu.live_instances(directory) == []


def _create_and_destroy(args) -> tuple[int, int]:
    directory, step = args
    os.environ[nvml_emu.NODE_ENV] = str(directory)
    node = NvmlNode()
    if step == "create":
        return node.create(0, "1g.5gb", 3).gi_id, 0
    node.destroy(0, node.instances(0)[0].gi_id)
    return 0, 0


@root_only
def test_a_listing_sees_what_another_process_changed_since_the_last(nvml_emu_node):
    """The library keeps the node's state between calls: another process's create and destroy show at once."""
    backend, directory = nvml_emu_node(["A100-40GB"])
    assert backend.instances(0) == []  # parsed and kept
    with multiprocessing.get_context("fork").Pool(1) as pool:
        pool.map(_create_and_destroy, [(directory, "create")])
        assert [i.start for i in backend.instances(0)] == [3]
        pool.map(_create_and_destroy, [(directory, "destroy")])
        assert backend.instances(0) == []
        pool.map(_create_and_destroy, [(directory, "create")])
    assert [i.start for i in backend.instances(0)] == [3]
    backend.destroy(0, backend.instances(0)[0].gi_id)
    assert nvml_emu.live_instances(directory) == []


@root_only
@settings(max_examples=25)
@given(st.lists(st.tuples(st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
                          st.integers(0, 7), st.booleans()), max_size=12))  # fmt: skip
def test_the_library_agrees_with_the_model_on_every_create(nvml_emu_library, tmp_path_factory, ops):
    """Any sequence of creates and destroys: NVML accepts exactly what the model's geometry allows."""
    model = get_model("A100-40GB")
    directory = nvml_emu.make_node(tmp_path_factory.mktemp("node"), "n1", ["A100-40GB"])
    os.environ[nvml_emu.NODE_ENV] = str(directory)
    try:
        backend = NvmlNode()
        held: dict[int, tuple[str, int]] = {}  # gi id -> (profile, start)
        for profile, start, destroy_first in ops:
            if destroy_first and held:
                gi_id = min(held)
                backend.destroy(0, gi_id)
                del held[gi_id]
            p = model.profile(profile)
            used = 0
            for name, s in held.values():
                used |= model.profile(name).window(s)
            fits = start in p.starts and not used & p.window(start)
            fits = fits and sum(name == profile for name, _ in held.values()) < p.max_instances
            try:
                inst = backend.create(0, profile, start)
                held[inst.gi_id] = (profile, start)
                assert fits, f"NVML made {profile}@{start} over {held}"
            except InsufficientResources:
                assert not fits, f"NVML refused {profile}@{start} with {held}"
        assert {(i.profile, i.start) for i in backend.instances(0)} == set(held.values())
        backend.close()
    finally:
        del os.environ[nvml_emu.NODE_ENV]


@root_only
def test_replayed_memory_is_what_nvml_reports_on_the_mig_device(nvml_emu_node):
    backend, directory = nvml_emu_node(["A100-40GB"])
    inst = backend.create(0, "3g.20gb", 4)
    assert backend.memory_used(0, inst.gi_id) == 0  # nothing replayed: an idle device
    nvml_emu.replay(directory, inst.uuid, [(0, 1500), (3600, 9000)])
    assert backend.memory_used(0, inst.gi_id) == 1500 * 2**20  # the second point lies an hour ahead
    mig = nv.nvmlDeviceGetHandleByUUID(inst.uuid)
    info = nv.nvmlDeviceGetMemoryInfo(mig)
    assert (info.used, info.free + info.used) == (1500 * 2**20, 20096 * 2**20)  # 3g.20gb: 20096 MiB
    assert nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(0)).used == 1500 * 2**20  # the GPU sums its MIGs
    nvml_emu.replay(directory, inst.uuid, [(-1, 100), (0, 4200)])  # a new replay replaces the old one
    assert backend.memory_used(0, inst.gi_id) == 4200 * 2**20
    nvml_emu.replay(directory, inst.uuid, [(0, 10**6)])
    assert backend.memory_used(0, inst.gi_id) == 20096 * 2**20  # never more than the device has


@root_only
def test_an_attached_process_is_listed_and_keeps_its_instance_until_it_ends(nvml_emu_node):
    from mig_batch.gpu.base import InUse

    backend, directory = nvml_emu_node(["A100-40GB"])
    inst = backend.create(0, "1g.5gb", 6)
    other = backend.create(0, "1g.5gb", 5)
    sleeper = multiprocessing.get_context("fork").Process(target=__import__("time").sleep, args=(60,))
    sleeper.start()
    try:
        nvml_emu.attach(directory, inst.uuid, sleeper.pid)
        nvml_emu.replay(directory, inst.uuid, [(0, 800)])
        mig = nv.nvmlDeviceGetHandleByUUID(inst.uuid)
        listed = nv.nvmlDeviceGetComputeRunningProcesses(mig)  # the symbol (_v2 or _v3) each pynvml version calls
        assert [(p.pid, p.gpuInstanceId, p.computeInstanceId, p.usedGpuMemory) for p in listed] == [
            (sleeper.pid, inst.gi_id, inst.ci_id, 800 * 2**20)]  # fmt: skip

        class ProcessInfoV1(ctypes.Structure):  # the unversioned symbol's layout: pid and memory only
            _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

        legacy = nv._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses")
        count, infos = ctypes.c_uint(0), (ProcessInfoV1 * 2)()
        assert legacy(mig, ctypes.byref(count), None) == nv.NVML_ERROR_INSUFFICIENT_SIZE and count.value == 1
        count.value = 2
        assert legacy(mig, ctypes.byref(count), infos) == nv.NVML_SUCCESS and count.value == 1
        assert (infos[0].pid, infos[0].usedGpuMemory) == (sleeper.pid, 800 * 2**20)
        assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(0))] == [
            sleeper.pid]  # fmt: skip
        assert nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByUUID(other.uuid)) == []
        with pytest.raises(InUse):
            backend.destroy(0, inst.gi_id)
        assert inst in backend.instances(0)  # refused whole: the compute instance is still there
        backend.destroy(0, other.gi_id)  # the neighbour has no process
    finally:
        sleeper.kill()
        sleeper.join()
    assert nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByUUID(inst.uuid)) == []
    backend.destroy(0, inst.gi_id)  # the process is gone: so is the refusal
    assert backend.instances(0) == []
    with pytest.raises(LookupError):
        nvml_emu.attach(directory, inst.uuid, os.getpid())  # a device that no longer exists


@root_only
def test_a_job_attaches_itself_from_the_command_line(nvml_emu_node, tmp_path):
    import subprocess
    import sys

    backend, directory = nvml_emu_node(["A100-40GB"])
    inst = backend.create(0, "2g.10gb", 0)
    (tmp_path / "memory.csv").write_text("0,1500\n")
    subprocess.run([sys.executable, "-m", "mig_batch.gpu.nvml_emu", "attach", "--pid", str(os.getpid()),
                    "--replay", str(tmp_path / "memory.csv"), inst.uuid],
                   env={**os.environ, nvml_emu.NODE_ENV: str(directory)}, check=True)  # fmt: skip
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByUUID(inst.uuid))] == [
        os.getpid()]  # fmt: skip
    assert backend.memory_used(0, inst.gi_id) == 1500 * 2**20


def test_a_node_of_the_benchmarks_size_is_served_and_a_larger_one_refused(nvml_emu_node, tmp_path):
    nvml_emu_node(["A100-80GB"] * nvml_emu.MAX_GPUS)  # the throughput bench emulates 48 per node
    assert nv.nvmlDeviceGetCount() == nvml_emu.MAX_GPUS
    assert nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(nvml_emu.MAX_GPUS - 1)).startswith("NVIDIA A100")
    with pytest.raises(ValueError, match="at most"):
        nvml_emu.make_node(tmp_path / "big", "big", ["A100-80GB"] * (nvml_emu.MAX_GPUS + 1))


@root_only
def test_destroy_removes_every_compute_instance_and_a_failed_profile_read_is_not_remembered(nvml_emu_node,
                                                                                          monkeypatch):  # fmt: skip
    """The backend remembers which compute profiles a GPU instance profile offers (read once): a 7g made
    elsewhere with two 3-slice compute instances is destroyed whole; a read that failed for another reason
    than "not offered" is read again next time, not remembered short."""
    backend, _ = nvml_emu_node(["A100-40GB"])
    h = nv.nvmlDeviceGetHandleByIndex(0)
    seven = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, nv.NVML_GPU_INSTANCE_PROFILE_7_SLICE).id
    real = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo
    failed = []

    def flaky(gi, profile, engine):  # the driver answers UNKNOWN once, for the 3-slice profile
        if profile == nv.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE and not failed:
            failed.append(profile)
            raise nv.NVMLError(nv.NVML_ERROR_UNKNOWN)
        return real(gi, profile, engine)

    for attempt in range(2):
        gi = nv.nvmlDeviceCreateGpuInstance(h, seven)
        three = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, nv.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0).id
        for _ in range(2):
            nv.nvmlGpuInstanceCreateComputeInstance(gi, three)
        gi_id = nv.nvmlGpuInstanceGetInfo(gi).id
        with monkeypatch.context() as m:
            m.setattr(nv, "nvmlGpuInstanceGetComputeInstanceProfileInfo", flaky)
            if attempt == 0:  # the 3-slice ones were not seen: the GPU instance is still in use
                with pytest.raises(InUse):
                    backend.destroy(0, gi_id)
                for ci in _compute_instances(gi, three):
                    nv.nvmlComputeInstanceDestroy(ci)
                nv.nvmlGpuInstanceDestroy(gi)
                continue
            backend.destroy(0, gi_id)  # read again (not remembered short): both 3-slice ones found
        assert backend.instances(0) == []
    assert failed


def _compute_instances(gi, profile_id):
    array = (nv.c_nvmlComputeInstance_t * 8)()
    count = ctypes.c_uint(0)
    nv.nvmlGpuInstanceGetComputeInstances(gi, profile_id, array, ctypes.byref(count))
    return [array[k] for k in range(count.value)]


@root_only
def test_the_history_a_killed_caller_left_a_line_short_of_still_reads_whole(nvml_emu_node):
    """The library renames the state file, then appends the history line: a caller killed in between (an
    agent stopped mid-create) leaves a create or a destroy out. The audit must still read every instance
    once, ended where the state file says it ended, never as a leak or an error."""
    backend, directory = nvml_emu_node(["A100-40GB"])
    first = backend.create(0, "1g.5gb", 0)
    backend.destroy(0, first.gi_id)
    lost_create = backend.create(0, "1g.5gb", 0)  # its create's line lost, then the reconcile destroys it
    backend.destroy(0, lost_create.gi_id)
    lost_destroy = backend.create(0, "2g.10gb", 2)  # its destroy's line lost
    backend.destroy(0, lost_destroy.gi_id)
    kept = backend.create(0, "1g.5gb", 6)
    history = Path(directory) / "history"
    lines = history.read_text().splitlines()
    gi_lines = [i for i, line in enumerate(lines) if json.loads(line)["op"] in ("create", "destroy")]
    drop = {gi_lines[2], gi_lines[5]}  # the second create, the third destroy
    history.write_text("".join(line + "\n" for i, line in enumerate(lines) if i not in drop))
    lives = sorted(nvml_emu.lifetimes(directory), key=lambda life: life.created)
    assert [(life.start, life.destroyed is None) for life in lives] == [(0, False), (0, False), (2, False), (6, True)]
    assert lives[1].created >= lives[0].destroyed  # counted from the end of the instance before it there
    assert lives[2].destroyed is not None and lives[3].gi_id == kept.gi_id
    assert all(a.destroyed <= b.created or a.start + a.size <= b.start or b.start + b.size <= a.start
               for i, a in enumerate(lives) for b in lives[i + 1:] if a.destroyed is not None)  # fmt: skip
