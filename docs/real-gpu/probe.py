#!/usr/bin/env python3
"""Read-only NVML MIG probe.  Usage: probe.py OUT.json

Only *queries* are issued: no MIG mode change, no GPU/compute instance
creation or destruction, no reset, no setting changes.  Every call is wrapped;
the JSON is (re)written after each section so a hard crash still leaves data.
"""
import ctypes
import json
import os
import platform
import sys
import time
import traceback

OUT = sys.argv[1] if len(sys.argv) > 1 else "nvml-probe.json"
R = {"probe_started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
     "python": sys.version, "platform": platform.platform(),
     "argv": sys.argv, "calls": {}, "gpus": []}


def dump():
    try:
        tmp = OUT + ".tmp"
        with open(tmp, "w") as f:
            json.dump(R, f, indent=1, sort_keys=False, default=repr)
        os.replace(tmp, OUT)
    except Exception as e:  # pragma: no cover
        sys.stderr.write("dump failed: %r\n" % (e,))


def exc(e):
    d = {"ok": False, "exc_type": type(e).__name__, "str": str(e)}
    v = getattr(e, "value", None)
    if v is not None:
        d["value"] = v
    if not hasattr(e, "value"):
        d["traceback_tail"] = traceback.format_exc().strip().splitlines()[-3:]
    return d


def conv(x):
    if isinstance(x, bytes):
        return x.decode("utf-8", "replace")
    if isinstance(x, ctypes.Structure):
        return struct_dict(x)
    if isinstance(x, (list, tuple)):
        return [conv(i) for i in x]
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return repr(x)


def struct_dict(s):
    out = {}
    for f in s._fields_:
        name = f[0]
        try:
            v = getattr(s, name)
            out[name] = conv(v)
        except Exception as e:
            out[name] = "<%s: %s>" % (type(e).__name__, e)
    return out


def call(fn, *a, **kw):
    try:
        return {"ok": True, "result": conv(fn(*a, **kw))}
    except BaseException as e:
        return exc(e)


def main():
    try:
        import pynvml as N
    except BaseException as e:
        R["import_error"] = exc(e)
        return
    R["pynvml_file"] = getattr(N, "__file__", None)
    try:
        from importlib import metadata
        R["nvidia_ml_py_version"] = metadata.version("nvidia-ml-py")
    except BaseException as e:
        R["nvidia_ml_py_version"] = exc(e)
    gip_names = sorted((n for n in dir(N) if n.startswith("NVML_GPU_INSTANCE_PROFILE_")
                        and n != "NVML_GPU_INSTANCE_PROFILE_COUNT"
                        and isinstance(getattr(N, n), int)),
                       key=lambda n: getattr(N, n))
    R["gpu_instance_profile_enums"] = {n: getattr(N, n) for n in gip_names}
    R["pynvml_has"] = {n: hasattr(N, n) for n in [
        "nvmlDeviceGetGpuInstanceProfileInfo", "nvmlDeviceGetGpuInstanceProfileInfoV",
        "nvmlDeviceGetGpuInstanceProfileInfoById", "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
        "nvmlDeviceGetGpuInstancePossiblePlacements",
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        "c_nvmlGpuInstanceProfileInfo_v2_t", "c_nvmlGpuInstanceProfileInfo_v3_t",
        "nvmlGpuInstanceProfileInfo_v2", "nvmlGpuInstanceProfileInfo_v3",
        "nvmlDeviceGetArchitecture", "nvmlDeviceGetMaxMigDeviceCount"]}
    R["pynvml_version_constants"] = {n: getattr(N, n) for n in dir(N)
                                     if n.startswith("nvmlGpuInstanceProfileInfo_v")}

    R["calls"]["nvmlInit"] = call(N.nvmlInit)
    dump()
    if not R["calls"]["nvmlInit"]["ok"]:
        return
    try:
        probe(N)
    finally:
        R["calls"]["nvmlShutdown"] = call(N.nvmlShutdown)


def raw_fn(N, name):
    """Function pointer from libnvidia-ml, or an error dict."""
    try:
        return N._nvmlGetFunctionPointer(name), None
    except BaseException as e:
        return None, exc(e)


def probe(N):
    c = R["calls"]
    c["nvmlSystemGetDriverVersion"] = call(N.nvmlSystemGetDriverVersion)
    c["nvmlSystemGetNVMLVersion"] = call(N.nvmlSystemGetNVMLVersion)
    c["nvmlSystemGetCudaDriverVersion"] = call(N.nvmlSystemGetCudaDriverVersion)
    if hasattr(N, "nvmlSystemGetCudaDriverVersion_v2"):
        c["nvmlSystemGetCudaDriverVersion_v2"] = call(N.nvmlSystemGetCudaDriverVersion_v2)
    c["nvmlDeviceGetCount"] = call(N.nvmlDeviceGetCount)
    dump()
    n = c["nvmlDeviceGetCount"].get("result") or 0
    for i in range(n):
        g = {"index": i}
        R["gpus"].append(g)
        try:
            probe_gpu(N, i, g)
        except BaseException as e:
            g["probe_gpu_crashed"] = exc(e)
            g["probe_gpu_crashed"]["traceback"] = traceback.format_exc()
        dump()


def probe_gpu(N, i, g):
    h = N.nvmlDeviceGetHandleByIndex(i)
    for k, fn, a in [
        ("name", N.nvmlDeviceGetName, ()),
        ("uuid", N.nvmlDeviceGetUUID, ()),
        ("pci", N.nvmlDeviceGetPciInfo, ()),
        ("memory_v1", N.nvmlDeviceGetMemoryInfo, ()),
        ("cuda_cc", N.nvmlDeviceGetCudaComputeCapability, ()),
        ("architecture", getattr(N, "nvmlDeviceGetArchitecture", None), ()),
        ("mig_mode", N.nvmlDeviceGetMigMode, ()),
        ("max_mig_device_count", N.nvmlDeviceGetMaxMigDeviceCount, ()),
        ("is_mig_device_handle", getattr(N, "nvmlDeviceIsMigDeviceHandle", None), ()),
        ("board_part_number", getattr(N, "nvmlDeviceGetBoardPartNumber", None), ()),
        ("brand", getattr(N, "nvmlDeviceGetBrand", None), ()),
        ("serial", getattr(N, "nvmlDeviceGetSerial", None), ()),
    ]:
        g[k] = call(fn, h, *a) if fn else {"ok": False, "missing_in_pynvml": True}
    if hasattr(N, "nvmlMemory_v2"):
        g["memory_v2"] = call(N.nvmlDeviceGetMemoryInfo, h, version=N.nvmlMemory_v2)
    arch = g["architecture"].get("result")
    if arch is not None:
        g["architecture_name"] = [n for n in dir(N) if n.startswith("NVML_DEVICE_ARCH_")
                                  and getattr(N, n) == arch]
    dump()

    # ---------- GPU instance profile info per enum ----------
    profs = {}
    g["gpu_instance_profiles"] = profs
    fnV, errV = raw_fn(N, "nvmlDeviceGetGpuInstanceProfileInfoV")
    g["raw_symbol_nvmlDeviceGetGpuInstanceProfileInfoV"] = errV or {"ok": True}

    class V3(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint),
                    ("sliceCount", ctypes.c_uint), ("instanceCount", ctypes.c_uint),
                    ("multiprocessorCount", ctypes.c_uint), ("copyEngineCount", ctypes.c_uint),
                    ("decoderCount", ctypes.c_uint), ("encoderCount", ctypes.c_uint),
                    ("jpegCount", ctypes.c_uint), ("ofaCount", ctypes.c_uint),
                    ("memorySizeMB", ctypes.c_ulonglong),
                    ("name", ctypes.c_char * 96), ("capabilities", ctypes.c_uint)]
    v3_version = ctypes.sizeof(V3) | (3 << 24)
    g["hand_built_v3_version_constant"] = hex(v3_version)

    supported = {}  # profile id -> (enum name, instanceCount)
    for en, ev in R["gpu_instance_profile_enums"].items():
        p = {"enum": ev}
        profs[en] = p
        p["default_call"] = call(N.nvmlDeviceGetGpuInstanceProfileInfo, h, ev)
        p["version_1"] = call(N.nvmlDeviceGetGpuInstanceProfileInfo, h, ev, version=1)
        p["version_2"] = call(N.nvmlDeviceGetGpuInstanceProfileInfo, h, ev, version=2)
        p["version_3_via_pynvml"] = call(N.nvmlDeviceGetGpuInstanceProfileInfo, h, ev, version=3)
        if fnV is not None:
            try:
                s = V3()
                s.version = v3_version
                ret = fnV(h, ctypes.c_uint(ev), ctypes.byref(s))
                p["version_3_raw_ctypes"] = {"ok": ret == 0, "nvml_return": ret,
                                             "result": struct_dict(s) if ret == 0 else None}
                if ret != 0:
                    p["version_3_raw_ctypes"]["str"] = call(N.nvmlErrorString, ret).get("result")
            except BaseException as e:
                p["version_3_raw_ctypes"] = exc(e)
        for form in ("version_2", "default_call", "version_1"):
            if p[form]["ok"]:
                r = p[form]["result"]
                supported.setdefault(r["id"], (en, r["instanceCount"]))
                break
        dump()

    # ---------- per supported profile id ----------
    g["supported_profile_ids"] = {str(k): v[0] for k, v in supported.items()}
    if not supported:
        # profile info unavailable (e.g. MIG off): still try the ids that
        # etc/gpus/h200-141gb.yaml expects, plus a small range, read-only.
        g["fallback_profile_ids_probed"] = True
        for pid in list(range(0, 48)):
            supported[pid] = ("<fallback>", 8)
    per = {}
    g["per_profile_id"] = per
    raw_v1, e1 = raw_fn(N, "nvmlDeviceGetGpuInstancePossiblePlacements")
    raw_v2, e2 = raw_fn(N, "nvmlDeviceGetGpuInstancePossiblePlacements_v2")
    g["raw_symbol_PossiblePlacements"] = e1 or {"ok": True}
    g["raw_symbol_PossiblePlacements_v2"] = e2 or {"ok": True}
    P = N.c_nvmlGpuInstancePlacement_t

    def placements_result(arr, cnt):
        return [{"start": arr[k].start, "size": arr[k].size} for k in range(min(cnt, len(arr)))]

    for pid, (en, icount) in sorted(supported.items()):
        d = {"enum_name": en, "instanceCount": icount}
        per[str(pid)] = d
        d["remaining_capacity"] = call(N.nvmlDeviceGetGpuInstanceRemainingCapacity, h, pid)
        if hasattr(N, "nvmlDeviceGetGpuInstanceProfileInfoById"):
            d["profile_info_by_id"] = call(N.nvmlDeviceGetGpuInstanceProfileInfoById, h, pid)
        pl = {}
        d["possible_placements"] = pl
        # A: two-argument form
        pl["A_two_args"] = call(N.nvmlDeviceGetGpuInstancePossiblePlacements, h, pid)
        # NOTE (learned on the H200, driver 580): NVML treats *count as
        # output-only and writes ALL placements regardless of the count passed
        # in, so every buffer here is 32 entries pre-filled with a sentinel;
        # "entries_written" shows how many the driver really wrote.
        SENT = 0xFFFFFFFF

        def four(count_in, fn=N.nvmlDeviceGetGpuInstancePossiblePlacements, none=False):
            try:
                arr = (P * 32)()
                for k in range(32):
                    arr[k].start = SENT
                    arr[k].size = SENT
                cnt = ctypes.c_uint(count_in)
                r = call(fn, h, pid, None if none else arr, ctypes.byref(cnt))
                r["count_in"] = count_in
                r["count_out"] = cnt.value
                if not none:
                    w = [k for k in range(32) if arr[k].start != SENT or arr[k].size != SENT]
                    r["entries_written"] = len(w)
                    r["placements"] = [{"start": arr[k].start, "size": arr[k].size} for k in w]
                return r
            except BaseException as e:
                return exc(e)

        # B: four-argument form, count = instanceCount
        size = max(int(icount or 0), 1)
        pl["B_four_args_count_instanceCount"] = four(size)
        # C: count query, placements=None, count=0
        pl["C_four_args_None_count0"] = four(0, none=True)
        # D: count 32
        pl["D_four_args_count32"] = four(32)
        # E: count 1 (smaller than the number of placements)
        pl["E_four_args_count1"] = four(1)
        # E0: count 0 with a real buffer
        pl["E0_four_args_count0_with_buffer"] = four(0)
        # F: pynvml attribute named *_v2, if any
        if hasattr(N, "nvmlDeviceGetGpuInstancePossiblePlacements_v2"):
            pl["F_pynvml_v2_attr"] = four(32, fn=N.nvmlDeviceGetGpuInstancePossiblePlacements_v2)
        else:
            pl["F_pynvml_v2_attr"] = {"ok": False, "missing_in_pynvml": True}
        # G/H: raw library symbols (legacy v1 and _v2)
        for key, fn in (("G_raw_symbol_v1", raw_v1), ("H_raw_symbol_v2", raw_v2)):
            if fn is None:
                pl[key] = {"ok": False, "symbol_missing": True}
                continue
            try:
                arr = (P * 32)()
                cnt = ctypes.c_uint(32)
                ret = fn(h, ctypes.c_uint(pid), arr, ctypes.byref(cnt))
                r = {"ok": ret == 0, "nvml_return": ret, "count_out": cnt.value}
                if ret == 0:
                    r["placements"] = placements_result(arr, cnt.value)
                else:
                    r["str"] = call(N.nvmlErrorString, ret).get("result")
                pl[key] = r
            except BaseException as e:
                pl[key] = exc(e)
        # existing GPU instances (expected to fail when MIG is off)
        try:
            gis = (N.c_nvmlGpuInstance_t * 32)()
            cnt = ctypes.c_uint(0)
            r = call(N.nvmlDeviceGetGpuInstances, h, pid, gis, ctypes.byref(cnt))
            r["count_out"] = cnt.value
            d["get_gpu_instances"] = r
        except BaseException as e:
            d["get_gpu_instances"] = exc(e)
        dump()


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:
        R["main_crashed"] = exc(e)
        R["main_crashed"]["traceback"] = traceback.format_exc()
    R["probe_finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    dump()
    print("wrote", OUT)
