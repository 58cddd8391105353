"""A real HTCondor pool on one machine, for tests and demos: a Debian sid chroot with ``minicondor``
(collector, negotiator, schedd, one startd per node), reachable from the host's ``htcondor2``
bindings on a loopback port only.

The recipe (verified, ../shared/htcondor/NOTES.md): Debian 12 has no HTCondor 25 packages, sid's
``minicondor`` is the same version as PyPI ``htcondor``; a chroot keeps it off the host. The chroot is
built once into a cache directory (the *image*: debootstrap + ``apt-get install minicondor``, minutes),
or unpacked from a cached tarball (seconds); each pool then runs on an overlay of that image under its
own directory, so the image stays clean, pools do not share state, and stopping a pool leaves nothing
mounted or running. Extra nodes are extra startds under the one condor_master (``-local-name``),
told apart by their ``MigBatchNodeName``.

Identities: the job users (``user``, and ``more_users``: unix accounts in the chroot) and the controller
(``controller``, a queue superuser with a schedd user record); each has an IDTOKEN and a client config
(:meth:`LocalPool.client_env`). A chroot shares the host's kernel, so a job user's uid is the same number
on the host (what SO_PEERCRED and file owners say there) even when the host's passwd has no such user or
names that uid otherwise: the host side must look a job user up in the chroot's passwd, never its own.
The htcondor2 bindings keep one security session per process, so one process acts as one identity.
Requires root (chroot, mounts), ``debootstrap`` or a built image, and the bindings
(``pip install mig-batch[htcondor]``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mig_batch.htcondor.attrs import execute_config, node_config, schedd_config
from mig_batch.mig.models import get_model

from .chroot import (
    CHROOT_ENV,
    ChrootError,
    ChrootImage,
    free_port,
    inside,
    mount,
    mount_dev,
    orphaned_chroots,
    pids_rooted_at,
    run,
    unmount_all,
    write_hosts,
)
from .slurm_image import SOURCE

# the Debian suite whose minicondor the pool runs: sid's matches the bindings; MIG_BATCH_HTCONDOR_SUITE=trixie
# runs the pool on trixie's 23.9.6 daemons (docs/htcondor.md, "Bindings")
SUITE = os.environ.get("MIG_BATCH_HTCONDOR_SUITE", "sid")
CONDOR_VERSION = "25.14.1"  # verified with htcondor==25.14.1 (P2: sid moves on; the image records its version)
DOMAIN = "migpool.local"  # UID_DOMAIN and FILESYSTEM_DOMAIN on both sides (jobs take the submitter's)
HOSTNAME = "migpool"  # NETWORK_HOSTNAME on both sides: stable daemon names, Schedd() finds its schedd


class PoolError(ChrootError):
    """The pool could not be built, started or asked; the message names the command and its output."""


def cache_dir() -> Path:
    return Path(os.environ.get("MIG_BATCH_HTCONDOR_CACHE", "/var/cache/mig-batch/htcondor"))


@dataclass
class Image(ChrootImage):
    """The built chroot with minicondor, shared read-only by every pool on this machine."""

    cache: Path = field(default_factory=cache_dir)
    suite: str = SUITE
    packages: tuple[str, ...] = ("minicondor",)

    @property
    def tarball(self) -> Path:
        return Path(os.environ.get("MIG_BATCH_HTCONDOR_TARBALL", super().tarball))

    def finish(self, root: Path, log: Callable[[str], None]) -> str:
        version = self.run_in(root, "condor_version").stdout.splitlines()[0]
        if CONDOR_VERSION not in version:
            log(f"warning: the image has {version!r}, the recipe verified {CONDOR_VERSION}")
        return version


@dataclass
class LocalPool:
    """A running pool under ``root``: ``chroot/`` (an overlay of the image), ``shared/`` (the same path
    inside the chroot: job files and outputs), ``client/`` (configs and tokens), ``log/`` (condor's logs,
    copied out at stop), ``agent/`` (each node's agent file, read by the startd cron)."""

    root: Path
    nodes: Sequence[str] = ("nodea", "nodeb")
    user: str = "ciuser"
    uid: int = 2000
    more_users: Sequence[tuple[str, int]] = (("ciuser2", 2001),)  # (name, uid): job owners beside ``user``
    controller: str = "migctl"
    cpus_per_node: int = 4  # advertised, not real: lets several small jobs share a 2-core machine
    memory_mib_per_node: int = 4096
    extra_config: str = ""  # appended to the pool's config (a site's policy under test)
    models: Sequence[str] = ()  # the site's GPU models: the schedd refuses requests larger than their largest
    wrapper: str = ""  # USER_JOB_WRAPPER (a path inside the chroot), as mig-batch htcondor install writes it
    binds: Sequence[Path] = ()  # host directories the jobs see at the same path, read-only (a node's driver files)
    image: Image = field(default_factory=Image)
    port: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    master_pid: int = 0

    @staticmethod
    def available(image: Image | None = None) -> str | None:
        """None when this machine can run a pool, else why not."""
        if os.geteuid() != 0:
            return "the HTCondor test pool needs root (chroot, mounts)"
        if importlib.util.find_spec("htcondor2") is None:
            return "no htcondor2 bindings (pip install 'mig-batch[htcondor]')"
        image = image or Image()
        if not image.ready() and not image.tarball.exists() and not shutil.which("debootstrap"):
            return f"no HTCondor image in {image.cache} and no debootstrap to build one (apt-get install debootstrap)"
        return None

    # --- paths -----------------------------------------------------------------------------------
    @property
    def chroot(self) -> Path:
        return self.root / "chroot"

    @property
    def shared(self) -> Path:
        return self.root / "shared"

    @property
    def users(self) -> dict[str, int]:
        """Every job user's name and uid, ``user`` first."""
        return {self.user: self.uid, **dict(self.more_users)}

    def agent_file(self, node: str) -> Path:
        """The file a node's agent writes and its startd cron publishes (see ``attrs``)."""
        return self.root / "agent" / f"{node}.ad"

    def client_config(self, identity: str) -> Path:
        return self.root / "client" / f"{identity}.conf"

    def client_env(self, identity: str) -> dict[str, str]:
        """The environment of a host process that talks to the pool as ``identity`` (user or controller)."""
        return {**os.environ, "CONDOR_CONFIG": str(self.client_config(identity))}

    @property
    def collector(self) -> str:
        return f"127.0.0.1:{self.port}"

    # --- commands ----------------------------------------------------------------------------------
    def run(self, *argv: str, user: str | None = None, check: bool = True, timeout: float = 30,
            stdin: str | None = None, cwd: str = "/") -> subprocess.CompletedProcess:  # fmt: skip
        """A command inside the chroot, as root or as ``user`` (condor's FS authentication then names
        that user: the way to act as a job's owner)."""
        if user is None:
            prefix = [*CHROOT_ENV, "chroot", str(self.chroot)]
        else:
            home = f"/home/{user}"
            prefix = [*CHROOT_ENV[:-3], f"HOME={home}", f"USER={user}", "LANG=C.UTF-8", "chroot",
                      f"--userspec={user}:{user}", str(self.chroot)]  # fmt: skip
        command = [*prefix, "sh", "-c", 'cd "$0" && exec "$@"', cwd, *argv]
        return run(command, timeout=timeout, check=check, input=stdin)

    # --- life cycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> LocalPool:
        why = self.available(self.image)
        if why:
            raise PoolError(why)
        t0 = time.monotonic()
        self.reap_stale()
        how = self.image.ensure()
        self.timings["image"] = time.monotonic() - t0
        self.timings[f"image_{how}"] = self.timings["image"]
        try:
            self._mount_chroot()
            self._prepare()
            t1 = time.monotonic()
            self._start_master()
            self._wait_ready(timeout)
            self.timings["daemons"] = time.monotonic() - t1
            self._identities()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    @staticmethod
    def reap_stale() -> list[Path]:
        """Stop the pools whose owning process is gone (a test run that was killed): their daemons still
        run and their mounts stay until someone stops them. Pools of live processes are left alone."""
        reaped = []
        for root in orphaned_chroots():
            if (root / "chroot" / SOURCE.lstrip("/")).is_dir():
                continue  # a Slurm release run (slurm_image.reap_stale reaps those)
            LocalPool(root).stop()
            reaped.append(root)
        return reaped

    def stop(self) -> None:
        """Stop every process of this pool (by pid: those whose root is this chroot), copy condor's logs
        to ``log/``, unmount everything, and drop the overlay's writable layer."""
        pid = self.master_pid or self._pidfile_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)  # condor's fast shutdown
        deadline = time.monotonic() + 30
        while self._pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        for left in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(left, signal.SIGKILL)
        self.master_pid = 0
        logs = self.chroot / "var/log/condor"
        if logs.is_dir() and not logs.is_symlink():
            shutil.copytree(logs, self.root / "log", dirs_exist_ok=True)
        unmount_all(self.chroot)
        shutil.rmtree(self.root / "overlay", ignore_errors=True)

    def __enter__(self) -> LocalPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- pieces ------------------------------------------------------------------------------------
    def _mount_chroot(self) -> None:
        upper, work = self.root / "overlay" / "upper", self.root / "overlay" / "work"
        for d in (upper, work, self.chroot, self.shared, self.root / "client", self.root / "agent"):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "owner.pid").write_text(f"{os.getpid()}\n")  # a pool whose owner died is reaped
        mount("overlay", self.chroot, "-t", "overlay",
               "-o", f"lowerdir={self.image.path},upperdir={upper},workdir={work}")  # fmt: skip
        mount("proc", self.chroot / "proc", "-t", "proc")
        mount("sysfs", self.chroot / "sys", "-t", "sysfs")
        mount_dev(self.chroot)
        for host_dir in (self.shared, self.root / "agent"):  # the same path inside, so paths need no mapping
            self.run("mkdir", "-p", str(host_dir))
            mount(str(host_dir), inside(self.chroot, str(host_dir)), "--bind")
        for host_dir in self.binds:  # read-only: jobs read a node's files, only the host side writes them
            self.run("mkdir", "-p", str(host_dir))
            mount(str(host_dir), inside(self.chroot, str(host_dir)), "--bind", "-o", "ro")

    def _prepare(self) -> None:
        for user, uid in self.users.items():
            self.run("useradd", "-m", "-u", str(uid), "-s", "/bin/sh", user)
        write_hosts(self.chroot, HOSTNAME)
        executes = [f"/var/lib/condor/execute-{n}" for n in self.nodes]
        dirs = ["/run/condor", "/run/lock/condor", "/var/spool/condor", "/var/log/condor", *executes]
        self.run("mkdir", "-p", *dirs)  # inside: /var/lock and /run are the chroot's own
        self.run("chown", "condor:condor", *dirs)
        self.shared.chmod(0o1777)
        self.port = self.port or free_port()
        config = [
            f"# written by the test harness (tests/harness/htcondor_pool.py) for {self.root}",
            "CONDOR_HOST = 127.0.0.1",
            f"COLLECTOR_HOST = 127.0.0.1:{self.port}",
            f"SHARED_PORT_PORT = {self.port}",
            "NETWORK_INTERFACE = 127.0.0.1",
            "BIND_ALL_INTERFACES = False",
            "ENABLE_IPV6 = False",
            f"UID_DOMAIN = {DOMAIN}",
            f"FILESYSTEM_DOMAIN = {DOMAIN}",
            f"NETWORK_HOSTNAME = {HOSTNAME}",
            "# a chroot cannot unshare a mount namespace: every job would be held (errno 22)",
            "MOUNT_UNDER_SCRATCH =",
            "MAIL = /bin/true",
            "SEC_DEFAULT_AUTHENTICATION_METHODS = FS, IDTOKENS",
            f"NUM_CPUS = {self.cpus_per_node}",
            f"MEMORY = {self.memory_mib_per_node}",
            "# one startd per node; the first is condor's own STARTD",
            f"EXECUTE = /var/lib/condor/execute-{self.nodes[0]}",
            execute_config(self.wrapper),
            schedd_config(self.controller, [get_model(m) for m in self.models]),
            node_config(self.nodes[0], str(self.agent_file(self.nodes[0]))),
        ]
        for node in self.nodes[1:]:
            local = node.upper()
            config += [
                f"STARTD_{local} = $(STARTD)",
                f"STARTD_{local}_ARGS = -local-name {local}",
                f"DAEMON_LIST = $(DAEMON_LIST) STARTD_{local}",
                f"{local}.STARTD_NAME = {node}",
                f"{local}.STARTD_LOG = $(LOG)/StartLog.{node}",
                f"{local}.EXECUTE = /var/lib/condor/execute-{node}",
                f"{local}.STARTD_ADDRESS_FILE = $(LOG)/.startd_{node}_address",
                node_config(node, str(self.agent_file(node)), prefix=f"{local}."),
            ]
        config.append(self.extra_config)
        inside(self.chroot, "/etc/condor/config.d/50-mig-batch-pool.conf").write_text("\n".join(config) + "\n")

    def _start_master(self) -> None:
        self.run("/usr/sbin/condor_master", "-pidfile", "/run/condor/condor_master.pid")  # daemonizes
        deadline = time.monotonic() + 15
        while not self._pidfile_pid():
            if time.monotonic() > deadline:
                raise PoolError(f"condor_master wrote no pid file; see {self.chroot}/var/log/condor/MasterLog")
            time.sleep(0.1)
        self.master_pid = self._pidfile_pid()

    def _wait_ready(self, timeout: float) -> None:
        """Until every node's startd is in the collector and the schedd answers."""
        deadline = time.monotonic() + timeout
        seen: set[str] = set()
        while time.monotonic() < deadline:
            if not self._pidfile_pid():
                raise PoolError(f"condor_master exited; see {self.chroot}/var/log/condor/MasterLog")
            out = self.run("condor_status", "-af", "MigBatchNodeName", check=False).stdout
            seen = set(out.split())
            if seen >= set(self.nodes) and self.run("condor_q", "-totals", check=False).returncode == 0:
                return
            time.sleep(0.3)
        raise PoolError(f"pool not ready after {timeout:.0f}s (nodes seen: {sorted(seen)}); "
                        f"logs in {self.chroot}/var/log/condor")  # fmt: skip

    def _identities(self) -> None:
        """An IDTOKEN and a client config for each job user and the controller; the controller's schedd
        user record (25.x: QUEUE_SUPER_USERS alone is not honoured without one)."""
        for identity in (*self.users, self.controller):
            tokens = self.root / "client" / f"tokens-{identity}"
            tokens.mkdir(mode=0o700, exist_ok=True)
            token = self.run("condor_token_create", "-identity", f"{identity}@{DOMAIN}").stdout
            (tokens / "token").write_text(token)
            (tokens / "token").chmod(0o600)
            self.client_config(identity).write_text("\n".join([
                f"COLLECTOR_HOST = 127.0.0.1:{self.port}",
                "NETWORK_INTERFACE = 127.0.0.1",
                "ENABLE_IPV6 = False",
                f"UID_DOMAIN = {DOMAIN}",
                f"FILESYSTEM_DOMAIN = {DOMAIN}",
                f"NETWORK_HOSTNAME = {HOSTNAME}",
                "SEC_CLIENT_AUTHENTICATION_METHODS = IDTOKENS",
                f"SEC_TOKEN_DIRECTORY = {tokens}",
                "",
            ]))  # fmt: skip
        self.run("condor_qusers", "-add", f"{self.controller}@{DOMAIN}")
        if "CondorVersion: 23." in self.image.version():
            self._seed_user_record(self.controller)

    def _seed_user_record(self, identity: str) -> None:
        """23.x's ``condor_qusers -add`` says it added the record and makes none (NumAds 0); the schedd makes one
        when the identity first submits (as a unix account of the schedd's host): a held job, removed at once (a
        site on 23.x does the same, once)."""
        self.run("useradd", "-M", "-s", "/usr/sbin/nologin", identity)
        seed = ("from mig_batch.htcondor.adapter import HTCondorBatch\n"
                "batch = HTCondorBatch()\n"
                "batch.cancel(batch.submit(['executable=/bin/true', 'hold=true']))\n")  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", seed], env=self.client_env(identity), capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        if proc.returncode != 0:
            raise PoolError(f"could not seed the schedd user record of {identity}: {proc.stderr.strip()[-2000:]}")

    def _pidfile_pid(self) -> int:
        try:
            pid = int((self.chroot / "run/condor/condor_master.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0
        return pid if pid in self._pids() else 0

    def _pids(self) -> list[int]:
        """Processes whose root is this pool's chroot: only ours live there."""
        return pids_rooted_at(self.chroot)


@contextlib.contextmanager
def controller_batch(pool: LocalPool) -> Iterator[Any]:
    """The controller's HTCondorBatch on ``pool`` (its identity's client config); CONDOR_CONFIG, which that
    sets, is put back after."""
    from mig_batch.htcondor.adapter import HTCondorBatch

    before = os.environ.get("CONDOR_CONFIG")
    try:
        yield HTCondorBatch(pool.client_config(pool.controller), agent_file=str(pool.agent_file("{node}")))
    finally:
        if before is None:
            os.environ.pop("CONDOR_CONFIG", None)
        else:
            os.environ["CONDOR_CONFIG"] = before
