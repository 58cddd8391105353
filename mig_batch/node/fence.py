"""Each job fenced to its own MIG instance: its instance's capability device nodes, its owner's only.

The driver lets a process use a GPU instance and a compute instance only once it has opened their
capability device nodes, ``/dev/nvidia-caps/nvidia-cap<minor>``, the minor written in
``/proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>[/ci<C>]/access`` (NVIDIA's MIG user guide, "Device
Nodes and Capabilities"). ``CUDA_VISIBLE_DEVICES`` only chooses among the devices a process may open; the
file mode of these nodes is what decides who may. nvidia-modprobe makes them 0444 (the access file's
``DeviceFileMode: 292``): every local user could use every instance. The node agent instead makes a
job's nodes itself, owned by the job's owner and mode 0400, before the job starts, and gives them back to
root (0400) before the instance is destroyed; :meth:`CapabilityFence.enforce` sets every node of the
directory to what the journal says at the agent's start and at each reconcile, so a restart, an instance
destroyed behind the agent's back or a node nvidia-modprobe made anew ends fenced again.

Nodes are made under a fresh temporary name in the root-owned directory and renamed over the old one:
a user's symlink there is replaced, never followed. The driver checks only a descriptor's minor, and a
minor belongs to a (GPU, instance id), not to one instance: before a minor is granted to a job, every
process other than root's still holding a descriptor of it (kept from an earlier job on that slice) is
killed, so an old descriptor never opens the next job's instance. The site keeps nvidia-modprobe from making or
changing these nodes (``NVreg_ModifyDeviceFiles=0``, or no setuid bit on nvidia-modprobe): see
docs/security.md and ``mig-batch doctor --role node``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import signal
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mig_batch.errors import MigBatchError
from mig_batch.safe_files import UnsafePath, make_dir, untrusted_dir

log = logging.getLogger("mig-batch-agent")
GRANTED_MODE = 0o400  # the driver needs read access to the node; nothing else
NODE_NAME = re.compile(r"nvidia-cap(\d+)")


class FenceError(MigBatchError, RuntimeError):
    """An instance could not be fenced (no capability, no device directory, a node not made)."""


class Fence(Protocol):
    """Who may open a GPU instance's device nodes: ``grant`` before its job starts, ``revoke`` before it
    is destroyed, ``enforce`` the journal's view of who holds what (``holders``: (gpu, gi id) -> uid;
    ``unknown``: instances whose holder is not known yet, their nodes left as they are)."""

    def grant(self, gpu: int, gi_id: int, uid: int) -> None: ...

    def revoke(self, gpu: int, gi_id: int) -> None: ...

    def enforce(self, holders: Mapping[tuple[int, int], int], unknown: Collection[tuple[int, int]] = ()) -> list[str]:
        ...


class Unfenced:
    """No fence (``fence: off``, or a GPU backend without capabilities): every local user may open every
    instance, as with nvidia-modprobe's defaults."""

    def grant(self, gpu: int, gi_id: int, uid: int) -> None:
        return None

    def revoke(self, gpu: int, gi_id: int) -> None:
        return None

    def enforce(self, holders: Mapping[tuple[int, int], int], unknown: Collection[tuple[int, int]] = ()) -> list[str]:
        return []


def read_minor(access: Path) -> int:
    """The ``DeviceFileMinor`` of a capability's access file."""
    text = access.read_text()
    found = re.search(r"^DeviceFileMinor:\s*(\d+)\s*$", text, re.MULTILINE)
    if found is None:
        raise FenceError(f"{access} names no DeviceFileMinor")
    return int(found.group(1))


def caps_major(proc_devices: Path) -> int:
    """The ``nvidia-caps`` character device major, from ``/proc/devices``."""
    try:
        text = proc_devices.read_text()
    except OSError as exc:
        raise FenceError(f"cannot read {proc_devices}: {exc.strerror}") from None
    found = re.search(r"^\s*(\d+)\s+nvidia-caps\s*$", text.partition("Block devices:")[0], re.MULTILINE)
    if found is None:
        raise FenceError(f"{proc_devices} lists no nvidia-caps devices: the driver does not expose MIG "
                         "capabilities as device files (load nvidia with nv_cap_enable_devfs=1)")  # fmt: skip
    return int(found.group(1))


@dataclass
class CapabilityFence:
    """The fence over the driver's capabilities (see the module's text). ``capabilities``: the driver's
    ``/proc/driver/nvidia/capabilities``; ``devices``: ``/dev/nvidia-caps``; ``proc_devices``: ``/proc/devices``."""

    capabilities: Path = Path("/proc/driver/nvidia/capabilities")
    devices: Path = Path("/dev/nvidia-caps")
    proc_devices: Path = Path("/proc/devices")
    proc: Path = Path("/proc")  # where the processes holding a node are looked for

    def __post_init__(self) -> None:
        self._major: int | None = None
        self._granted: dict[int, int] = {}  # minor -> the uid this agent last granted it to

    def minors(self, gpu: int, gi_id: int) -> list[int]:
        """The GPU instance's capability minor and those of its compute instances (none once it is gone)."""
        base = self.capabilities / f"gpu{gpu}" / "mig" / f"gi{gi_id}"
        try:
            found = [read_minor(base / "access")]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise FenceError(f"cannot read {base / 'access'}: {exc.strerror}") from None
        with contextlib.suppress(FileNotFoundError):
            for ci in sorted(base.iterdir()):
                if ci.name.startswith("ci") and ci.name[2:].isdigit():
                    with contextlib.suppress(FileNotFoundError):  # destroyed meanwhile
                        found.append(read_minor(ci / "access"))
        return found

    def grant(self, gpu: int, gi_id: int, uid: int) -> None:
        if uid < 0:
            raise FenceError(f"the owner of GPU {gpu} instance {gi_id}'s job is unknown: not granted to anyone")
        minors = self.minors(gpu, gi_id)
        if len(minors) < 2:  # a job needs its GPU instance's and its compute instance's
            raise FenceError(f"GPU {gpu} instance {gi_id} has no capability under {self.capabilities} for its "
                             f"{'compute' if minors else 'GPU'} instance")  # fmt: skip
        if any(self._may_be_held(minor, uid) for minor in minors):
            self.evict(minors, uid)  # the same user's are not fenced from each other anyway
        for minor in minors:
            self._set(minor, uid)
            self._granted[minor] = uid

    def _may_be_held(self, minor: int, uid: int) -> bool:
        """Whether a process of another user than ``uid`` (and root) may hold ``minor`` open: its last holder
        was another user, or it is not known and the node was there to open before (since boot or an agent
        restart). A scan of every process costs ms on a busy node: only then is it done."""
        last = self._granted.get(minor)
        if last is not None:
            return last not in (0, uid)
        return os.path.lexists(self.devices / f"nvidia-cap{minor}")

    def holders_of(self, minors: Collection[int], but: Collection[int] = ()) -> dict[int, int]:
        """pid -> uid of every process, but those of the uids ``but``, with a descriptor of one of these
        capability minors open. Only descriptors opened through a path naming an ``nvidia-cap`` node are
        looked at: one of ours, or a link to it, which no user can make where the directory is the driver's
        devtmpfs (docs/security.md)."""
        wanted = {os.makedev(self._major_number(), m) for m in minors}
        proc, found = str(self.proc), {}
        for pid in os.listdir(proc):
            if not pid.isdigit():
                continue
            try:
                uid = os.stat(f"{proc}/{pid}").st_uid
            except OSError:
                continue
            if uid in but:
                continue
            fds = f"{proc}/{pid}/fd"
            try:
                names = os.listdir(fds)
            except OSError:
                continue  # gone, or not a process we may look into
            for name in names:
                try:
                    if "nvidia-cap" not in os.readlink(f"{fds}/{name}"):
                        continue
                    info = os.stat(f"{fds}/{name}")
                except OSError:
                    continue
                if stat.S_ISCHR(info.st_mode) and info.st_rdev in wanted:
                    found[int(pid)] = uid
                    break
        return found

    def evict(self, minors: Collection[int], owner: int) -> list[str]:
        """Kill every process, but root's and the next ``owner``'s, holding one of these minors open (what it
        held was an earlier job's instance: the same minor now names the next one's); who was, in words."""
        killed = []
        for pid, uid in self.holders_of(minors, but=(0, owner)).items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(f"pid {pid} (uid {uid})")
        if killed:
            log.warning("fence: killed %s, holding the capability minor(s) %s of an earlier job's instance",
                        ", ".join(killed), ", ".join(map(str, sorted(minors))))  # fmt: skip
        return killed

    def revoke(self, gpu: int, gi_id: int) -> None:
        for minor in self.minors(gpu, gi_id):
            self._set(minor, 0)

    def enforce(self, holders: Mapping[tuple[int, int], int], unknown: Collection[tuple[int, int]] = ()) -> list[str]:
        """Every instance node of the directory as ``holders`` says: a held instance's nodes its holder's, any
        other node root's; what was changed, in words. The MIG config and monitor nodes, and the nodes of the
        ``unknown`` instances, are left as they are."""
        wanted = {minor: uid for (gpu, gi), uid in holders.items() for minor in self.minors(gpu, gi)}
        others = self._global_minors() | {minor for gpu, gi in unknown for minor in self.minors(gpu, gi)}
        changed = []
        try:
            names = os.listdir(self.devices)
        except FileNotFoundError:
            names = []
        for name in names:
            match = NODE_NAME.fullmatch(name)
            if match is None or int(match.group(1)) in others:
                continue
            minor = int(match.group(1))
            uid = wanted.pop(minor, 0)
            if not self._is(minor, uid):
                self._set(minor, uid)
                changed.append(f"{name} -> uid {uid}")
        for minor, uid in wanted.items():  # a held instance without its node (an operator's clean-up)
            self._set(minor, uid)
            changed.append(f"nvidia-cap{minor} -> uid {uid} (made again)")
        return changed

    def check(self) -> list[str]:
        """What keeps the fence from working on this node, in words (none: it works)."""
        problems = []
        if not self.capabilities.is_dir():
            problems.append(f"{self.capabilities} is missing: this driver exposes no MIG capabilities")
        try:
            self._check_directory()
        except FenceError as exc:
            problems.append(str(exc))
        try:
            caps_major(self.proc_devices)
        except FenceError as exc:
            problems.append(str(exc))
        return problems

    # --- device nodes -------------------------------------------------------------------------------
    def _major_number(self) -> int:
        if self._major is None:
            self._major = caps_major(self.proc_devices)
        return self._major

    def _global_minors(self) -> set[int]:
        """The node-wide MIG capabilities (config, monitor): not an instance's, never changed here."""
        found = set()
        for name in ("config", "monitor"):
            with contextlib.suppress(OSError, FenceError):
                found.add(read_minor(self.capabilities / "mig" / name / "access"))
        return found

    def _check_directory(self) -> None:
        """The device directory (and every one above it) must be writable by root only: a user who could change
        it could put a node of their own in place of a job's. A missing one is made, root's, when first needed."""
        why = untrusted_dir(self.devices) if os.path.lexists(self.devices) else ""
        if why:
            raise FenceError(f"{self.devices} must be a directory owned by root and writable by root only ({why})")

    def _ready(self) -> None:
        """The device directory, made when missing and checked, before a node is made in it."""
        try:
            make_dir(self.devices, 0o755)
        except UnsafePath as why:
            raise FenceError(f"{self.devices} must be a directory owned by root and writable by root only "
                             f"({why})") from None  # fmt: skip

    def _is(self, minor: int, uid: int) -> bool:
        try:
            info = os.lstat(self.devices / f"nvidia-cap{minor}")
        except FileNotFoundError:
            return uid == 0  # no node: nobody but root can make one
        return (stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(self._major_number(), minor)
                and info.st_uid == uid and stat.S_IMODE(info.st_mode) == GRANTED_MODE)  # fmt: skip

    def _set(self, minor: int, uid: int) -> None:
        """``nvidia-cap<minor>`` as a node of ``uid``, mode 0400, put in place by a rename."""
        if self._is(minor, uid):
            return
        self._ready()
        final = self.devices / f"nvidia-cap{minor}"
        partial = self.devices / f".nvidia-cap{minor}.{secrets.token_hex(6)}"
        try:
            os.mknod(partial, stat.S_IFCHR | 0, os.makedev(self._major_number(), minor))  # EEXIST: never reused
            os.chown(partial, uid, 0, follow_symlinks=False)
            os.chmod(partial, GRANTED_MODE)  # our own fresh node in a root-only directory: nothing to follow
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise FenceError(f"cannot make {final} for uid {uid}: {exc.strerror}") from None
