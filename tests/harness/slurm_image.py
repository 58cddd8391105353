"""Slurm releases other than the host's, for the release matrix: a Debian image per release (trixie: 24.11,
sid: 26.05) with that release's slurmctld, slurmd, slurmdbd, munge, commands, libslurm and headers, MariaDB,
a C compiler, and a venv of the image's Python holding mig_batch's dependencies; and a run of the test suite
inside one (:class:`ReleaseRun`), with mig_batch installed from the wheel under test.

Everything Slurm-facing of a run happens in the image: the daemons, the commands, libslurm and the helper
library compiled against the image's slurm.h, mig-batchd, the node agents, the hooks and the tests' own
commands (a client of one release never talks to daemons of another). A run is one PID and mount namespace
(``unshare --pid --fork --mount-proc``): when its command ends, or the test process dies, every process
and mount made inside goes with it; the host side (an overlay of the image, /dev, /sys) is unmounted at
:meth:`ReleaseRun.stop` or by :func:`reap_stale`. Images are cached like the HTCondor pool's, under a name
keyed by their recipe, so a changed recipe builds a new one. Requires root.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .chroot import (
    CHROOT_ENV,
    ChrootError,
    ChrootImage,
    free_port,
    inside,
    mount,
    mount_dev,
    mounts_under,
    orphaned_chroots,
    unmount_all,
    write_hosts,
)
from .slurm_cluster import DATABASE_ENV, start_mariadb

T = TypeVar("T")
RELEASES = {"24.11": "trixie", "26.05": "sid"}  # the Slurm release each Debian suite ships (docs/slurm.md)
PACKAGES = ("slurm-wlm", "slurmdbd", "libslurm-dev", "munge", "mariadb-server", "gcc", "libc6-dev", "python3",
            "python3-venv", "passwd", "procps")  # fmt: skip
TEST_TOOLS = ("pytest", "hypothesis", "lupa")  # of the test extra: what the suite needs in an image
VENV = "/opt/mig-batch"  # the image's venv
SOURCE = "/mig-batch-src"  # where a run finds the tests and the wheel, inside
CA_BUNDLE = "/etc/mig-batch-pip-ca.crt"  # the host's CA bundle, for pip through this machine's egress
RECIPE = 1  # bump to rebuild every image


_DATABASE_START = threading.Lock()


def cache_dir() -> Path:
    return Path(os.environ.get("MIG_BATCH_SLURM_CACHE", "/var/cache/mig-batch/slurm"))


def requirements(pyproject: Path) -> list[str]:
    """What the image's venv holds: mig_batch's dependencies with its controller and sim extras (mig-batchd, the
    simulators the fast tests run) and the test tools, as pyproject names them."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    tools = [r for r in extras["test"] if r.split(">")[0].split("=")[0] in TEST_TOOLS]
    # an extra names another by a self-reference (mig-batch[controller]): that one is listed here already
    wanted = [r for name in ("controller", "sim") for r in extras[name] if not r.startswith(f"{project['name']}[")]
    return [*project["dependencies"], *wanted, *tools]


@dataclass
class SlurmImage(ChrootImage):
    """A Debian suite's Slurm with mig_batch's dependencies in a venv of its Python."""

    cache: Path = field(default_factory=cache_dir)
    suite: str = "trixie"
    packages: tuple[str, ...] = PACKAGES
    pip: Sequence[str] = ()  # the venv's requirements (:func:`requirements`)

    @property
    def name(self) -> str:  # type: ignore[override]  # a plain attribute in the base, keyed by the recipe here
        recipe = repr((RECIPE, self.suite, self.packages, sorted(self.pip))).encode()
        return f"image-{hashlib.sha256(recipe).hexdigest()[:10]}"

    def ensure(self, log: Callable[[str], None] = lambda _: None) -> str:
        how = super().ensure(log)
        if how != "reused":
            self.prune_superseded(log)
        return how

    def prune_superseded(self, log: Callable[[str], None] = lambda _: None) -> list[Path]:
        """Remove this suite's images of other recipes (2-3 GB each): those no session builds or runs now."""
        with open("/proc/mounts") as mounts:
            in_use = mounts.read()
        pruned = []
        for old in self.cache.glob(f"image-*-{self.suite}"):
            if old == self.path or not old.is_dir() or f"lowerdir={old}" in in_use:
                continue
            with open(old.with_name(old.name + ".lock"), "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being built
                log(f"removing the superseded image {old}")
                shutil.rmtree(old, ignore_errors=True)
                old.with_name(old.name + ".lock").unlink(missing_ok=True)
                pruned.append(old)
        return pruned

    @staticmethod
    def for_release(release: str, pyproject: Path) -> SlurmImage:
        return SlurmImage(suite=RELEASES[release], pip=requirements(pyproject))

    @staticmethod
    def available() -> str | None:
        if os.geteuid() != 0:
            return "the Slurm release images need root (chroot, mounts, namespaces)"
        missing = [b for b in ("unshare", "setpriv", "chroot", "nsenter") if not shutil.which(b)]
        if missing:
            return f"missing {', '.join(missing)}"
        return None

    def finish(self, root: Path, log: Callable[[str], None]) -> str:
        slurm = self.run_in(root, "slurmd", "-V").stdout.strip()
        python = self.run_in(root, "python3", "-V").stdout.strip()
        log(f"{slurm}, {python}: venv {VENV} with {' '.join(self.pip)}")
        self.run_in(root, "python3", "-m", "venv", VENV)
        shutil.copy(host_ca_bundle(), inside(root, CA_BUNDLE))
        pip_conf = inside(root, "/etc/pip.conf")  # not the command line: an index URL or proxy may hold a secret
        pip_conf.unlink(missing_ok=True)
        pip_conf.touch(mode=0o600)
        pip_conf.write_text(pip_config())
        try:
            self.run_in(root, f"{VENV}/bin/pip", "install", "-q", "--no-cache-dir", *self.pip, timeout=900)
        finally:
            pip_conf.unlink()
            inside(root, CA_BUNDLE).unlink()
        return f"{slurm}; {python}"


def host_ca_bundle() -> str:
    """The CA bundle this machine's pip trusts (its egress may re-sign), else Debian's."""
    candidates = (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt")
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise ChrootError("no CA bundle for pip in the image (PIP_CERT, SSL_CERT_FILE, /etc/ssl/certs)")


def pip_config() -> str:
    """pip's settings in the image: the host's CA bundle, index and proxy (not its local file mirrors)."""
    settings = {"cert": CA_BUNDLE, "disable-pip-version-check": "true", "timeout": "180"}
    for key, names in (("index-url", ("PIP_INDEX_URL",)), ("extra-index-url", ("PIP_EXTRA_INDEX_URL",)),
                       ("proxy", ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"))):  # fmt: skip
        value = next((os.environ[n] for n in names if os.environ.get(n)), "")
        if value and "file:" not in value:
            settings[key] = value
    return "[global]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items())


@dataclass
class Results:
    """A run's pytest results, from its JUnit XML."""

    passed: int
    failed: int
    skipped: int
    seconds: float
    returncode: int
    output: str
    skipped_why: list[str]
    passed_in: dict[str, int]  # passed tests by module (test_slurm_e2e, ...)

    def summary(self) -> str:
        return f"{self.passed} passed, {self.failed} failed, {self.skipped} skipped in {self.seconds:.0f} s"


@dataclass
class ReleaseRun:
    """A run of commands in one release's image: ``root/chroot`` (an overlay of the image, its writable
    layer in ``root/overlay``) with a copy of ``checkout`` and the wheel at :data:`SOURCE`, and the wheel
    installed in the image's venv (the tests import mig_batch from there, not from the copy)."""

    root: Path
    image: SlurmImage
    checkout: Path
    wheel: Path
    timings: dict[str, float] = field(default_factory=dict)
    database: subprocess.Popen | None = None  # the host's MariaDB, for slurmdbd in the image
    database_address: str = ""

    @property
    def chroot(self) -> Path:
        return self.root / "chroot"

    def start(self, log: Callable[[str], None] = lambda _: None) -> ReleaseRun:
        t0 = time.monotonic()
        how = self.image.ensure(log)
        self.timings[f"image_{how}"] = time.monotonic() - t0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "owner.pid").write_text(f"{os.getpid()}\n")  # a run whose owner died is reaped
            self._start_database()
            self._mount()
            self._copy_source()
            self.run(f"{VENV}/bin/pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall",
                     f"{SOURCE}/{self.wheel.name}", timeout=300)  # fmt: skip
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    def run(self, *argv: str, env: Sequence[str] = (), timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess:  # fmt: skip
        """``argv`` in the image, in a PID and mount namespace of its own, from :data:`SOURCE`: nothing it
        starts or mounts outlives it, nor this process."""
        namespace = ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--pid", "--fork", "--kill-child",
                     f"--mount-proc={self.chroot}/proc"]  # fmt: skip
        # sh stays the namespace's PID 1 (no exec): it reaps the orphans reparented to it (every slurmstepd),
        # which a Python PID 1 would leave as zombies by the thousand in a burst
        command = [*namespace, *CHROOT_ENV, *env, "chroot", str(self.chroot), "sh", "-c", f'cd {SOURCE} && "$@"',
                   "sh", *argv]  # fmt: skip
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise ChrootError(f"{' '.join(argv)} ran past {timeout:.0f} s in {self.chroot}") from exc
        if check and proc.returncode != 0:
            said = (proc.stdout + proc.stderr).strip()[-3000:]
            raise ChrootError(f"{' '.join(argv)} failed in the image ({proc.returncode}):\n{said}")
        return proc

    def pytest(self, *args: str, timeout: float = 1800) -> Results:
        """The suite's ``args`` (test files, -m ...) with the image's Python, mig_batch the installed wheel."""
        report = f"{SOURCE}/results-{time.monotonic_ns()}.xml"  # never an earlier run's
        env = ["MIG_BATCH_EXPECT_INSTALLED=1", "PYTHONSAFEPATH=1", "PYTHONDONTWRITEBYTECODE=1",
               f"{DATABASE_ENV}={self.database_address}"]  # fmt: skip
        t0 = time.monotonic()
        proc = self.run(f"{VENV}/bin/python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        f"--junitxml={report}", *args, env=env, timeout=timeout, check=False)  # fmt: skip
        seconds = time.monotonic() - t0
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        skipped_why: list[str] = []
        passed_in: dict[str, int] = {}
        xml = inside(self.chroot, report)
        if xml.exists():
            tree = ET.parse(xml)
            for suite in tree.iter("testsuite"):
                for key in counts:
                    counts[key] += int(suite.get(key, 0))
            # a module skipped at collection says why in the text, "collection skipped" in the message
            skipped_why = [f"{case.get('classname')}.{case.get('name')}: {skip.get('message')} {skip.text or ''}"
                           for case in tree.iter("testcase") for skip in case.iter("skipped")]  # fmt: skip
            for case in tree.iter("testcase"):
                if not any(case.iter("failure")) and not any(case.iter("error")) and not any(case.iter("skipped")):
                    module = str(case.get("classname", "")).rpartition("tests.")[2].split(".")[0]
                    passed_in[module] = passed_in.get(module, 0) + 1
        failed = counts["failures"] + counts["errors"]
        return Results(counts["tests"] - failed - counts["skipped"], failed, counts["skipped"], seconds,
                       proc.returncode, (proc.stdout + proc.stderr)[-20000:], skipped_why, passed_in)  # fmt: skip

    def stop(self) -> None:
        try:
            unmount_all(self.chroot)
            shutil.rmtree(self.root / "overlay", ignore_errors=True)
        finally:
            if self.database is not None and self.database.poll() is None:
                self.database.terminate()
                try:
                    self.database.wait(30)
                except subprocess.TimeoutExpired:
                    self.database.kill()
                    self.database.wait(10)

    def _start_database(self) -> None:
        """The host's MariaDB for the image's slurmdbd: the images' own MariaDB 11.8 is one slurmdbd 24.11.5
        and 26.05.5 cannot use (docs/slurm.md, "Slurm versions"); Debian 12's 10.11 they can."""
        port = free_port()
        log = self.root / "mariadb.log"

        def spawn(_: str, argv: list[str]) -> None:  # killed with the thread that starts it, if not stopped
            with log.open("ab") as out:
                self.database = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", *argv], stdout=out,
                                                 stderr=subprocess.STDOUT)  # fmt: skip

        def wait(ready: Callable[[], bool], what: str, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while not ready():
                if time.monotonic() > deadline or (self.database is not None and self.database.poll() is not None):
                    raise ChrootError(f"{what} did not start; see {log}")
                time.sleep(0.2)

        with _DATABASE_START:  # two mariadb-install-db at once in one process collide over their temporary tables
            start_mariadb(self.root / "mariadb", port, spawn, wait)
        self.database_address = f"127.0.0.1:{port}"

    def __enter__(self) -> ReleaseRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _mount(self) -> None:
        upper, work = self.root / "overlay" / "upper", self.root / "overlay" / "work"
        for d in (upper, work, self.chroot):
            d.mkdir(parents=True, exist_ok=True)
        mount("overlay", self.chroot, "-t", "overlay",
              "-o", f"lowerdir={self.image.path},upperdir={upper},workdir={work}")  # fmt: skip
        mount("sysfs", self.chroot / "sys", "-t", "sysfs")
        mount_dev(self.chroot)
        write_hosts(self.chroot)

    def _copy_source(self) -> None:
        """The checkout (the tests read its README, docs and sources), without what builds and runs leave."""
        source = inside(self.chroot, SOURCE)
        left = shutil.ignore_patterns(".git", ".venv", "dist", "build", "__pycache__", ".*_cache", "*.egg-info")
        shutil.copytree(self.checkout, source, ignore=left, symlinks=True)
        shutil.copy(self.wheel, source)


# The release matrix (tests/test_slurm_releases.py). The e2e modules that touch Slurm's surface: the 30-mixed-jobs
# audit, forged placement, arrays and dependencies, controller SIGKILL (test_slurm_e2e); libslurm through the
# helper library; accounting; prompt slots; Flex-MIG; controller down, node killed, agent killed and a chain
# requeued by an operator (test_failures_e2e: a chain without PyTorch, which the images lack); each job fenced
# to its instance, two users.
E2E_SUBSET = ("tests/test_slurm_e2e.py", "tests/test_slurm_native.py", "tests/test_slurm_accounting.py",
              "tests/test_prompt_slots_e2e.py", "tests/test_flex_e2e.py", "tests/test_failures_e2e.py",
              "tests/test_fence_e2e.py")  # fmt: skip
FAST_TESTS = ("-m", "not slow", *(f"--ignore={m}" for m in E2E_SUBSET), "tests")  # the rest, but the slow ones
FAST_ENV = "MIG_BATCH_RELEASE_FAST_TESTS"  # "1": the matrix runs the fast tests too (about 2 CPU-minutes each)


class Matrix:
    """The matrix's runs of one session: every release side by side in threads, started once, from the start
    of the session (tests/conftest.py) so that they overlap the host's tests, or when a test first asks."""

    started: Matrix | None = None

    def __init__(self, checkout: Path, fast: bool):
        self.checkout, self.fast = checkout, fast
        self.root = Path(tempfile.mkdtemp(prefix="mig-batch-releases-"))
        self._wheel = _in_background(build_wheel, checkout, self.root / "wheel")
        self._done = {release: _in_background(self._run, release, i % 2 == 1)  # one runs its fast tests first
                      for i, release in enumerate(sorted(RELEASES))}  # fmt: skip

    @classmethod
    def start(cls, checkout: Path) -> Matrix:
        if cls.started is None:
            cls.started = Matrix(checkout, os.environ.get(FAST_ENV) == "1")
        return cls.started

    def results(self, release: str) -> dict[str, object]:
        return self._done[release].result()

    def _run(self, release: str, fast_first: bool) -> dict[str, object]:
        image = SlurmImage.for_release(release, self.checkout / "pyproject.toml")
        with ReleaseRun(self.root / release, image, self.checkout, self._wheel.result()) as run:
            found: dict[str, object] = {"version": run.run("slurmd", "-V").stdout.split()[-1],
                                        "image": image.version()}  # fmt: skip
            suites = [("e2e", E2E_SUBSET), *([("fast", FAST_TESTS)] if self.fast else [])]
            for name, args in suites[:: -1 if fast_first else 1]:
                found[name] = run.pytest(*args)
        shutil.rmtree(self.root / release / "mariadb", ignore_errors=True)  # its data: about 100 MB
        lines = [f"Slurm {found['version']} ({found['image']}), started in {run.timings['start']:.0f} s"]
        lines += [f"{name}: {found[name].summary()}" for name, _ in suites]  # type: ignore[attr-defined]  # Results
        (cache_dir() / f"results-{release}.txt").write_text("\n".join(lines) + "\n")
        return found


def _in_background(call: Callable[..., T], *args: object) -> Future[T]:
    """``call(*args)`` in a daemon thread: a session that ends first does not wait for it (its processes die
    with this one: ``setpriv --pdeathsig``; its mounts are reaped by :func:`reap_stale`)."""
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(call(*args))
        except BaseException as exc:  # handed to whoever asks for the result
            done.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return done


def reap_stale() -> list[Path]:
    """Unmount the runs whose owning process is gone (a test run that was killed), and stop their MariaDB."""
    reaped = []
    for run in orphaned_chroots():
        point = run / "chroot"
        if not (point / SOURCE.lstrip("/")).is_dir():
            continue  # not a release run (an HTCondor pool's)
        unmount_all(point)
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((point.parent / "mariadb" / "mysqld.pid").read_text()), signal.SIGTERM)
        reaped.append(point.parent)
    for partial in cache_dir().glob("*.partial"):  # a build whose session ended first (tests/conftest.py)
        with open(cache_dir() / f"{partial.name.removesuffix('.partial')}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # still being built
            unmount_all(partial)
            reaped.append(partial)
    return reaped


def build_wheel(checkout: Path, into: Path) -> Path:
    """The checkout's wheel, built offline (hatchling from the test extra)."""
    into.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(into), str(checkout)], capture_output=True, text=True, timeout=300)  # fmt: skip
    if proc.returncode != 0:
        raise ChrootError(f"building the wheel failed: {proc.stderr.strip()[-2000:]}")
    return next(into.glob("mig_batch-*.whl"))


__all__ = ["E2E_SUBSET", "FAST_ENV", "RELEASES", "Matrix", "ReleaseRun", "Results", "SlurmImage", "build_wheel",
           "mounts_under", "reap_stale"]
