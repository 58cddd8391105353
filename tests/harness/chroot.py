"""Debian chroots for the test harnesses: an *image* built once with debootstrap (or restored from a cached
tarball) and shared read-only, and what a run needs to use one (mounts that never reach the host's own
directories, and commands inside it with a clean environment).

The HTCondor pool (``htcondor_pool``) runs minicondor in one; the Slurm release matrix (``slurm_image``) runs
each Slurm release's daemons, commands and mig_batch in one. Requires root.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mig_batch.errors import MigBatchError

MIRROR = "http://deb.debian.org/debian"
CHROOT_ENV = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
              "DEBIAN_FRONTEND=noninteractive"]  # fmt: skip
# a daemon started in a chroot would otherwise pass the caller's environment (host PATH, CONDOR_CONFIG,
# SLURM_CONF, a venv) on to everything it starts
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


class ChrootError(MigBatchError, RuntimeError):
    """A chroot could not be built, mounted or run in; the message names the command and its output."""


def run(argv: Sequence[str], timeout: float = 60, check: bool = True, **kw: object) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]  # kw: run()'s own
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ChrootError(f"{' '.join(argv)}: {exc}") from None
    if check and proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip()[-2000:]
        raise ChrootError(f"{' '.join(argv)} failed ({proc.returncode}): {said}")
    return proc


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first."""
    prefix = str(path)
    points = []
    with open("/proc/mounts") as mounts:
        for line in mounts:
            point = line.split()[1].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def unmount_all(path: Path) -> None:
    for point in mounts_under(path):
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)
    if mounts_under(path):
        raise ChrootError(f"still mounted under {path}: {mounts_under(path)}")


def mount(what: str, where: Path, *args: str) -> None:
    if str(where) not in mounts_under(where):
        run(["mount", *args, what, str(where)])


def mount_dev(root: Path) -> None:
    """A private /dev (tmpfs with the few nodes daemons use, its own devpts): not a bind of the host's,
    so a recursive delete of a chroot left mounted cannot remove the host's device nodes."""
    dev = root / "dev"
    mount("mig-batch-dev", dev, "-t", "tmpfs", "-o", "mode=0755,size=1m")
    for name, (major, minor) in DEVICES.items():
        if not (dev / name).exists():
            os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(dev / name, 0o666)  # mknod applies the umask
    for sub in ("pts", "shm"):
        (dev / sub).mkdir(exist_ok=True)
    mount("devpts", dev / "pts", "-t", "devpts", "-o", "newinstance,ptmxmode=0666")
    mount("mig-batch-shm", dev / "shm", "-t", "tmpfs", "-o", "mode=1777,size=64m")
    links = {"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}  # fmt: skip
    for name, target in links.items():
        if not (dev / name).is_symlink():
            os.symlink(target, dev / name)


def inside(root: Path, path: str) -> Path:
    """``path`` of the chroot, seen from the host; refuses one that resolves outside the chroot (its
    absolute symlinks, /var/lock -> /run/lock, would otherwise reach the host's own directories)."""
    host = root / path.lstrip("/")
    resolved, real_root = host.resolve(), root.resolve()
    if resolved != real_root and real_root not in resolved.parents:
        raise ChrootError(f"{path} in the chroot resolves outside it ({resolved})")
    return host


def write_hosts(root: Path, *names: str) -> None:
    """The chroot's /etc/hosts: loopback for localhost, this machine's name and ``names`` (never written
    through a link)."""
    hosts = inside(root, "/etc/hosts")
    hosts.unlink(missing_ok=True)
    hosts.write_text(f"127.0.0.1 localhost {' '.join(dict.fromkeys([socket.gethostname(), *names]))}\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_rooted_at(root: Path) -> list[int]:
    """Processes whose root directory is ``root``: only a chroot's own live there."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/root") == str(root):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def orphaned_chroots() -> list[Path]:
    """The run folders of overlay chroots (``<run>/chroot``) whose ``<run>/owner.pid`` names a process that is
    gone: a test run killed before it could stop what it started. A run of a live process is never named."""
    with open("/proc/mounts") as mounts:
        points = [Path(line.split()[1]) for line in mounts if line.startswith("overlay ")]
    orphans = []
    for point in points:
        owner = point.parent / "owner.pid"
        if point.name != "chroot" or not owner.exists():
            continue  # not a run of ours
        try:
            os.kill(int(owner.read_text()), 0)
            continue  # its owner still runs
        except ProcessLookupError:
            orphans.append(point.parent)
        except (ValueError, PermissionError):
            continue
    return orphans


@dataclass
class ChrootImage:
    """A Debian suite with ``packages`` installed (debootstrap, then apt in the chroot), built once under
    ``cache`` and shared read-only; :meth:`finish` adds what apt does not and names the image's version.
    Subclasses say what goes in."""

    cache: Path
    suite: str

    packages: tuple[str, ...] = ()
    name = "image"

    @property
    def path(self) -> Path:
        return self.cache / f"{self.name}-{self.suite}"

    @property
    def tarball(self) -> Path:
        """Restored instead of a build when present (``make_tarball`` writes it; no secrets: it is made
        from the image, which nothing ever started in)."""
        return self.cache / f"{self.name}-{self.suite}.tar.zst"

    @property
    def marker(self) -> Path:
        return self.path / ".mig-batch-image"  # written last: its presence means a finished image

    def ready(self) -> bool:
        return self.marker.exists()

    def version(self) -> str:
        return self.marker.read_text().strip() if self.ready() else ""

    def ensure(self, log: Callable[[str], None] = lambda _: None) -> str:
        """Build, restore or reuse the image; returns how (``reused``, ``restored``, ``built``)."""
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.cache / f"{self.path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be building it right now
            if self.ready():
                return "reused"
            staging = self.path.with_name(self.path.name + ".partial")
            unmount_all(staging)
            shutil.rmtree(staging, ignore_errors=True)
            if self.tarball.exists():
                log(f"restoring {self.tarball}")
                staging.mkdir()
                run(["sh", "-c", f'zstd -q -dc "{self.tarball}" | tar -C "{staging}" -xpf -'], timeout=300)
                how = "restored"
            else:
                self._build(staging, log)
                how = "built"
            staging.rename(self.path)
            return how

    def _build(self, root: Path, log: Callable[[str], None]) -> None:
        if not shutil.which("debootstrap"):
            raise ChrootError(f"no {self.path.name} and no debootstrap to build it (apt-get install debootstrap)")
        log(f"debootstrap {self.suite} -> {root}")
        debs = self.cache / f"debs-{self.suite}"
        debs.mkdir(exist_ok=True)
        run(["debootstrap", "--variant=minbase", f"--cache-dir={debs}", self.suite, str(root), MIRROR], timeout=900)
        # never start services from package scripts
        (root / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
        (root / "usr/sbin/policy-rc.d").chmod(0o755)
        archives = self.cache / f"apt-archives-{self.suite}"
        (archives / "partial").mkdir(parents=True, exist_ok=True)
        try:
            mount("proc", root / "proc", "-t", "proc")
            mount_dev(root)
            mount(str(archives), inside(root, "/var/cache/apt/archives"), "--bind")  # .debs kept for rebuilds
            log(f"apt-get install {' '.join(self.packages)} (in the chroot)")
            # the mirror's sid Release may be past its Valid-Until; debootstrap's lists still work
            self.run_in(root, "apt-get", "-o", "Acquire::Check-Valid-Until=false", "update", "-qq",
                        timeout=300, check=False)  # fmt: skip
            self.run_in(root, "apt-get", "install", "-y", "-qq", "--no-install-recommends", *self.packages,
                        timeout=900)  # fmt: skip
            version = self.finish(root, log)
        finally:
            unmount_all(root)
        # lists and caches are not needed at run time (over 100 MB)
        for junk in ("var/lib/apt/lists", "var/cache/apt"):
            shutil.rmtree(root / junk, ignore_errors=True)
            (root / junk).mkdir(parents=True)
        (root / ".mig-batch-image").write_text(version + "\n")

    def finish(self, root: Path, log: Callable[[str], None]) -> str:
        """What goes in after apt (the chroot is mounted); returns the image's version line."""
        raise NotImplementedError

    @staticmethod
    def run_in(root: Path, *argv: str, timeout: float = 60, check: bool = True,
               env: Sequence[str] = ()) -> subprocess.CompletedProcess:  # fmt: skip
        return run([*CHROOT_ENV, *env, "chroot", str(root), *argv], timeout=timeout, check=check)

    def make_tarball(self) -> Path:
        """Pack the image for a cache elsewhere."""
        run(["sh", "-c", f'tar -C "{self.path}" --one-file-system -cf - . | zstd -q -T0 -3 -f -o "{self.tarball}"'],
            timeout=600)  # fmt: skip
        return self.tarball
