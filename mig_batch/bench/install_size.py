"""``mig-batch bench install-size``: the disk each kind of host's venv takes, mig_batch installed from a wheel.

A GPU node installs mig_batch alone (``pip install mig-batch``: the agents, the hooks, doctor, migsub; an
HTCondor execute node adds the ``htcondor`` extra, the bindings its agent asks the schedd through); the
controller host adds the ``controller`` extra (mig-batchd's numpy, rich's tables); a host that runs the
simulators, planners and benchmarks, the ``sim`` extra. Each venv is made fresh with the given Python's
``venv`` (pip and, before Python 3.12, setuptools come with it) and pip installs the wheel with the extra
from the package index pip is set up for. Sizes are the files' own (apparent) sizes in MB (10^6 bytes);
"packages" leaves out what an empty venv already holds.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mig_batch.errors import MigBatchError

# role -> the extra its venv installs; an HTCondor execute node's agent asks the schedd through the bindings
ROLES = {"node": "", "htcondor-node": "[htcondor]", "controller": "[controller]", "sim": "[sim]"}
NODE_GOAL_MB = 40.0  # issue 48: a node's venv under 40 MB


class InstallError(MigBatchError):
    """A venv could not be made or the wheel not installed into it."""


@dataclass(frozen=True)
class VenvSize:
    role: str
    requirement: str  # what pip installed: the wheel's file name with the extra
    total_mb: float  # the whole venv
    packages_mb: float  # the venv less an empty venv of the same Python
    largest: list[tuple[str, float]] = field(default_factory=list)  # site-packages' biggest entries, MB


def tree_bytes(path: Path) -> int:
    """The sizes of the files under ``path`` added up (links not followed, each hard link once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            total += info.st_size
    return total


def site_packages(venv: Path) -> Path:
    (site,) = venv.glob("lib/python3*/site-packages")
    return site


def largest_entries(site: Path, count: int = 6) -> list[tuple[str, float]]:
    """site-packages' biggest top-level entries (packages, modules), with their dist-info folded in by name."""
    sizes: dict[str, int] = {}
    for entry in site.iterdir():
        if entry.name == "__pycache__":
            continue
        key = entry.name.split("-")[0].lower() if entry.name.endswith(".dist-info") else entry.name.lower()
        key = key.removesuffix(".py")
        sizes[key] = sizes.get(key, 0) + (tree_bytes(entry) if entry.is_dir() else entry.lstat().st_size)
    return [(name, size / 1e6) for name, size in sorted(sizes.items(), key=lambda item: -item[1])[:count]]


def _run(command: Sequence[str | Path], what: str) -> None:
    proc = subprocess.run([str(c) for c in command], capture_output=True, text=True)
    if proc.returncode:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise InstallError(f"{what} failed (exit {proc.returncode}): {tail}")


def make_venv(python: str, path: Path) -> Path:
    _run([python, "-m", "venv", "--clear", path], f"making a venv with {python}")
    return path


def measure(wheel: Path, roles: Sequence[str], python: str, work: Path | None = None, pip_args: Sequence[str] = (),
            progress: Callable[[str], None] = lambda _: None) -> list[VenvSize]:  # fmt: skip
    """One fresh venv per role under ``work`` (a temporary folder, removed after, when None), the wheel
    installed with the role's extra; their sizes."""
    if not wheel.is_file() or wheel.suffix != ".whl":
        raise InstallError(f"{wheel}: not a wheel file; build one with `python3 -m build` (dist/mig_batch-*.whl)")
    unknown = [role for role in roles if role not in ROLES]
    if unknown:
        raise InstallError(f"unknown role(s) {', '.join(unknown)}; known: {', '.join(ROLES)}")
    if work is None:
        with tempfile.TemporaryDirectory(prefix="mig-batch-install-size-") as folder:
            return measure(wheel, roles, python, Path(folder), pip_args, progress)
    work.mkdir(parents=True, exist_ok=True)
    progress("an empty venv (what every venv holds)")
    bare = tree_bytes(make_venv(python, work / "empty"))
    sizes = []
    for role in roles:
        progress(f"the {role} venv (mig-batch{ROLES[role]})")
        venv = make_venv(python, work / role)
        requirement = f"{wheel.resolve()}{ROLES[role]}"
        _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", *pip_args,
              requirement], f"pip install '{requirement}' into {venv}")  # fmt: skip
        total = tree_bytes(venv)
        sizes.append(VenvSize(role, f"{wheel.name}{ROLES[role]}", total / 1e6, (total - bare) / 1e6,
                              largest_entries(site_packages(venv))))  # fmt: skip
    return sizes


def default_wheel(folder: Path) -> Path:
    """The newest mig_batch wheel in ``folder`` (dist/ after ``python3 -m build``)."""
    wheels = sorted(folder.glob("mig_batch-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise InstallError(f"no mig_batch-*.whl in {folder}; build one (`python3 -m build` in a checkout) or give "
                           "--wheel")  # fmt: skip
    return wheels[-1]
