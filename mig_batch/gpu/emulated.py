"""Emulated MIG node: a JSON file per node, with NVML's placement rules and errors.

The file survives restarts; every operation takes an exclusive ``fcntl`` lock on a side file, so
the prolog, epilog and tests of several slurmd on one machine see one consistent node. Geometry
comes from etc/gpus (starts, memory windows), so what NVML would refuse is refused here. Every
create and destroy is appended to ``<node>.history.jsonl`` (time, GPU, profile, start, uuid): tests
audit overlaps from it independently of the backend. Processes on an instance are emulated by
:meth:`attach` (a PID); destroy refuses while an attached PID lives, like NVML_ERROR_IN_USE.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid as uuidlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mig_batch.gpu.base import GpuBackend, GpuInfo, InsufficientResources, InUse, MigInstance, NotFound, NotSupported
from mig_batch.mig.models import get_model


class EmulatedNode(GpuBackend):
    def __init__(self, directory: Path, node: str, models: Sequence[str] | None = None):
        self.path = Path(directory) / f"{node}.json"
        self.lock_path = Path(directory) / f"{node}.lock"
        self.history_path = Path(directory) / f"{node}.history.jsonl"
        self.node = node
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._state() as state:
            if not state["gpus"]:
                if not models:
                    raise NotFound(f"emulated node {node} has no state at {self.path} and no GPU models were given")
                state["gpus"] = [
                    {"model": get_model(m).name, "uuid": f"GPU-{uuidlib.uuid4()}", "next_gi": 1, "instances": []}
                    for m in models
                ]

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        with open(self.lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(self.path.read_text()) if self.path.exists() else {"gpus": []}
                before = json.dumps(state, sort_keys=True)
                yield state
                if json.dumps(state, sort_keys=True) != before:
                    tmp = self.path.with_suffix(".tmp")
                    tmp.write_text(json.dumps(state, indent=1))
                    os.replace(tmp, self.path)  # atomic: a crash leaves the old or the new state
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _gpu(self, state: dict[str, Any], gpu: int) -> dict[str, Any]:
        if not 0 <= gpu < len(state["gpus"]):
            raise NotFound(f"{self.node} has no GPU {gpu} (it has {len(state['gpus'])})")
        return state["gpus"][gpu]

    def _log(self, **event: Any) -> None:
        with open(self.history_path, "a") as f:
            f.write(json.dumps({"time": time.time(), "node": self.node, **event}) + "\n")

    def gpus(self) -> list[GpuInfo]:
        with self._state() as state:
            return [GpuInfo(i, g["model"], True, g["uuid"]) for i, g in enumerate(state["gpus"])]

    def instances(self, gpu: int) -> list[MigInstance]:
        with self._state() as state:
            return [_instance(gpu, raw) for raw in self._gpu(state, gpu)["instances"]]

    def create(self, gpu: int, profile: str, start: int) -> MigInstance:
        with self._state() as state:
            g = self._gpu(state, gpu)
            model = get_model(g["model"])
            if not model.has_profile(profile):
                raise NotSupported(f"{model.name} has no MIG profile {profile}")
            p = model.profile(profile)
            if start not in p.starts:
                raise InsufficientResources(f"{profile} cannot start at {start} on {model.name}; starts: {p.starts}")
            window = p.window(start)
            for other in g["instances"]:
                if window & (((1 << other["size"]) - 1) << other["start"]):
                    raise InsufficientResources(
                        f"{profile}@{start} overlaps {other['profile']}@{other['start']} on {self.node} GPU {gpu}"
                    )
            raw = {"gi_id": g["next_gi"], "ci_id": 0, "profile": profile, "start": start,
                   "size": p.memory_slices, "uuid": f"MIG-{uuidlib.uuid4()}", "pids": [], "memory_used": 0}  # fmt: skip
            g["next_gi"] += 1
            g["instances"].append(raw)
            self._log(op="create", gpu=gpu, profile=profile, start=start, size=p.memory_slices, uuid=raw["uuid"])
            return _instance(gpu, raw)

    def destroy(self, gpu: int, gi_id: int) -> None:
        with self._state() as state:
            g = self._gpu(state, gpu)
            raw = next((r for r in g["instances"] if r["gi_id"] == gi_id), None)
            if raw is None:
                raise NotFound(f"{self.node} GPU {gpu} has no GPU instance {gi_id}")
            alive = [pid for pid in raw["pids"] if _alive(pid)]
            if alive:
                raise InUse(f"{raw['profile']}@{raw['start']} on {self.node} GPU {gpu} is in use by PIDs {alive}")
            g["instances"].remove(raw)
            self._log(op="destroy", gpu=gpu, profile=raw["profile"], start=raw["start"], uuid=raw["uuid"])

    def memory_used(self, gpu: int, gi_id: int) -> int:
        with self._state() as state:
            raw = next((r for r in self._gpu(state, gpu)["instances"] if r["gi_id"] == gi_id), None)
            if raw is None:
                raise NotFound(f"{self.node} GPU {gpu} has no GPU instance {gi_id}")
            replay = raw.get("replay")
            if replay:  # the value in force now, on the replayed trajectory's clock
                elapsed = time.time() - replay["t0"]
                in_force = [mib for t, mib in replay["points"] if t <= elapsed]
                return int((in_force[-1] if in_force else replay["points"][0][1]) * 2**20)
            return int(raw["memory_used"])

    # emulation controls (no NVML counterpart)
    def _by_uuid(self, state: dict[str, Any], uuid: str) -> dict[str, Any]:
        for g in state["gpus"]:
            for raw in g["instances"]:
                if raw["uuid"] == uuid:
                    return raw
        raise NotFound(f"no instance {uuid} on {self.node}")

    def attach(self, uuid: str, pid: int, memory_used: int = 0) -> None:
        with self._state() as state:
            raw = self._by_uuid(state, uuid)
            raw["pids"].append(pid)
            raw["memory_used"] = memory_used

    def replay(self, uuid: str, points: Sequence[tuple[float, float]]) -> None:
        """From now on, the instance's memory in use follows ``points`` ((seconds, MiB), held between)."""
        if not points:
            raise ValueError("a memory replay needs at least one (seconds, MiB) point")
        with self._state() as state:
            timeline = sorted([float(t), float(m)] for t, m in points)
            self._by_uuid(state, uuid)["replay"] = {"t0": time.time(), "points": timeline}


def _instance(gpu: int, raw: dict[str, Any]) -> MigInstance:
    return MigInstance(gpu, raw["gi_id"], raw["ci_id"], raw["profile"], raw["start"], raw["size"], raw["uuid"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
