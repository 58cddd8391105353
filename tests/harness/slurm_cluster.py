"""A real Slurm cluster on one machine, for tests, demos and ``mig-batch bench controller``: munged,
slurmctld, several slurmd.

Everything lives in one temporary directory: the munge key and socket, slurm.conf (free ports),
the controller's state, each node's spool, logs. Nodes are ``slurmd -N name`` processes on
127.0.0.1 with their own ports. Commands reach this cluster through ``SLURM_CONF``; use
:meth:`LocalCluster.env` or :meth:`LocalCluster.run`. Requires root and Debian's slurm-wlm + munge.
"""

from __future__ import annotations

import functools
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mig_batch.errors import MigBatchError


class ClusterError(MigBatchError, RuntimeError):
    pass


@dataclass
class LocalCluster:
    root: Path
    nodes: Sequence[str] = ("n1", "n2", "n3")
    cpus_per_node: int = 16
    features: dict[str, str] = field(default_factory=dict)  # node -> Slurm features (comma-separated)
    gres: dict[str, str] = field(default_factory=dict)  # node -> slurm.conf Gres= (e.g. mig_slices:16)
    accounting: bool = False  # slurmdbd over a private MariaDB: sacct, associations, QOS limits
    extra_conf: str = ""  # appended to slurm.conf (Prolog=..., JobSubmitPlugins=..., ...)
    node_prefix: Callable[[str], list[str]] | None = None  # a node's command prefix (its own namespaces)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @staticmethod
    def available() -> str | None:
        """None when this machine can run it, else why not."""
        missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue") if not shutil.which(b)]
        if missing:
            return f"missing {', '.join(missing)} (apt-get install slurm-wlm munge)"
        if os.geteuid() != 0:
            return "slurmd must run as root"
        return None

    @staticmethod
    def accounting_available() -> str | None:
        """None when this machine can also run slurmdbd over MariaDB, else why not."""
        why = LocalCluster.available()
        missing = [b for b in ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db")
                   if not shutil.which(b) and not Path("/usr/sbin", b).exists()]  # fmt: skip
        if why is None and missing:
            why = f"missing {', '.join(missing)} (apt-get install slurmdbd mariadb-server)"
        return why

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        proc = subprocess.run(args, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    # --- life cycle ---------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        why = self.available()
        if why:
            raise ClusterError(why)
        for sub in ("etc", "log", "state", "spool", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        ports = _free_ports(4 + len(self.nodes))
        self.dbd_port = ports[-1]
        self._write_conf(ports)  # before slurmdbd: sacctmgr finds slurmdbd through slurm.conf
        if self.accounting:
            self._start_slurmdbd(ports[-2], ports[-1])
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).stdout.find("UP") >= 0, "slurmctld")
        for node in self.nodes:
            self.start_node(node)
        self.wait_nodes_idle()
        return self

    def start_node(self, node: str) -> None:
        (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        prefix = self.node_prefix(node) if self.node_prefix else []
        self._spawn(f"slurmd-{node}", [*prefix, "slurmd", "-D", "-N", node, "-f", str(self.conf)])

    def stop_node(self, node: str, sig: int = signal.SIGTERM) -> None:
        self._stop(f"slurmd-{node}", sig)

    def node_pid(self, node: str) -> int:
        return self.procs[f"slurmd-{node}"].pid

    def wait_nodes_idle(self, timeout: float = 60) -> None:
        def ready() -> bool:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
            states = dict(zip(out[::2], out[1::2], strict=False))
            return all(states.get(n, "").rstrip("*") in ("idle", "mix", "alloc") for n in self.nodes)

        self._wait(ready, "nodes idle", timeout)

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return dict(zip(out[::2], out[1::2], strict=False))

    def stop(self) -> None:
        for name in [n for n in self.procs if n.startswith("slurmd-")]:
            self._stop(name)
        self._stop("slurmctld")
        self._stop("slurmdbd")
        self._stop("mariadbd")
        self._stop("munged")

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- pieces ---------------------------------------------------------------------------------
    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = self.root / "munge" / "munge.socket"
        self._spawn(
            "munged",
            ["munged", "-F", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
             f"--pid-file={self.root / 'munge' / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
             f"--seed-file={self.root / 'munge' / 'munged.seed'}"],
        )  # fmt: skip
        self._wait(self.munge_socket.exists, "munged")

    def _start_slurmdbd(self, db_port: int, dbd_port: int) -> None:
        """slurmdbd over a private MariaDB (or the one ``MIG_BATCH_TEST_DATABASE`` names, as host:port, in a
        database of this cluster's own); the cluster, an account and root's association are added before
        slurmctld starts."""
        db_host, storage = "127.0.0.1", "slurm_acct_db"
        if DATABASE_ENV in os.environ:
            db_host, _, port = os.environ[DATABASE_ENV].rpartition(":")
            db_port, storage = int(port), f"slurm_acct_{uuid.uuid4().hex}"  # a cluster's own, never an earlier one's
        else:
            start_mariadb(self.root / "mariadb", db_port, self._spawn, self._wait)
        dbd_conf = self.conf.parent / "slurmdbd.conf"  # slurmdbd finds it beside SLURM_CONF
        dbd_conf.write_text(f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
LogFile={self.root / "log"}/slurmdbd.log
PidFile={self.root / "state"}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost={db_host}
StoragePort={db_port}
StorageUser=root
StorageLoc={storage}
""")
        dbd_conf.chmod(0o600)
        self._spawn("slurmdbd", [_sbin("slurmdbd"), "-D"])
        self._wait(lambda: self.run("sacctmgr", "-n", "list", "cluster", check=False).returncode == 0, "slurmdbd", 60)
        for args in (("add", "cluster", "migbatch"), ("add", "account", "mig", "Cluster=migbatch"),
                     ("add", "user", "root", "Account=mig", "Cluster=migbatch"),
                     ("modify", "user", "root", "set", "DefaultAccount=mig")):  # fmt: skip
            self.run("sacctmgr", "-i", *args)

    def _write_conf(self, ports: list[int]) -> None:
        host = socket.gethostname()
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[2 + i]} "
            f"CPUs={self.cpus_per_node} RealMemory=64000 State=UNKNOWN"
            + (f" Features={self.features[n]}" if self.features.get(n) else "")
            + (f" Gres={self.gres[n]}" if self.gres.get(n) else "")
            for i, n in enumerate(self.nodes)
        )
        r = self.root
        self.conf.write_text(
            f"""ClusterName=migbatch
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket},cred_expire=30
CredType=cred/munge
StateSaveLocation={r / "state"}
SlurmdSpoolDir={r / "spool"}/%n
SlurmctldPidFile={r / "state"}/slurmctld.pid
SlurmdPidFile={r / "spool"}/slurmd-%n.pid
SlurmctldLogFile={r / "log"}/slurmctld.log
SlurmdLogFile={r / "log"}/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,batch_sched_delay=1
MpiDefault=none
ReturnToService=2
MinJobAge=600
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
JobCompType=jobcomp/none
{self._accounting_conf()}
{node_lines}
PartitionName=gpu Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
{self.extra_conf}
"""
        )
        if release_key(release_here()) >= release_key(CGROUP_PLUGIN_DISABLED_FROM):
            # without cgroups mounted (a chroot), slurmd of these releases refuses to start unless told
            (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=disabled\n")

    def _accounting_conf(self) -> str:
        if not self.accounting:
            return "AccountingStorageType=accounting_storage/none"
        return (f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
                f"AccountingStoragePort={self.dbd_port}\nJobAcctGatherType=jobacct_gather/none\n"
                f"AccountingStoragePass={self.munge_socket}")  # with munge, "Pass" names its socket

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - lives as long as the process
        self.procs[name] = subprocess.Popen(argv, env=env or self.env(), stdout=log, stderr=subprocess.STDOUT)

    def _stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def _wait(self, ready, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    log = (self.root / "log" / f"{name}.out").read_text(errors="replace")[-2000:]
                    raise ClusterError(f"{name} exited ({proc.returncode}) while waiting for {what}:\n{log}")
            time.sleep(0.2)
        raise ClusterError(f"timed out waiting for {what}; logs in {self.root / 'log'}")


DATABASE_ENV = "MIG_BATCH_TEST_DATABASE"  # host:port of a MariaDB for slurmdbd (the release images: slurm_image)


def start_mariadb(data: Path, port: int, spawn: Callable[[str, list[str]], None],
                  wait: Callable[..., None]) -> None:  # fmt: skip
    """A private MariaDB in ``data`` on 127.0.0.1:port, with no grant tables (nothing else reaches it)."""
    sock = data / "mysqld.sock"
    init = subprocess.run(["mariadb-install-db", f"--datadir={data}", "--user=root", "--skip-test-db"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    if init.returncode != 0:
        raise ClusterError(f"mariadb-install-db failed ({init.returncode}): {init.stderr.strip()[-2000:]}")
    spawn("mariadbd", [_sbin("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=root", f"--socket={sock}",
                       "--bind-address=127.0.0.1", f"--port={port}", "--skip-grant-tables",
                       "--innodb-buffer-pool-size=16M", f"--pid-file={data / 'mysqld.pid'}"])  # fmt: skip
    wait(sock.exists, "mariadbd", 60)


CGROUP_PLUGIN_DISABLED_FROM = "23.02"  # the first release whose cgroup.conf takes CgroupPlugin=disabled


@functools.cache
def release_here() -> str:
    """The Slurm release this machine's slurmd is (``22.05``), from ``slurmd -V`` (``slurm-wlm 24.11.5``)."""
    from mig_batch.slurm.versions import release_of

    said = subprocess.run([_sbin("slurmd"), "-V"], capture_output=True, text=True, timeout=30).stdout.split()
    release = release_of(said[-1]) if said else None
    if release is None:
        raise ClusterError(f"slurmd -V said {' '.join(said)!r}, not a Slurm version")
    return release


def release_key(release: str) -> tuple[int, ...]:
    """``22.05`` -> (22, 5): releases in order."""
    return tuple(int(part) for part in release.split("."))


def _sbin(name: str) -> str:
    """Daemons live in /usr/sbin, which a non-login PATH may lack."""
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


NODE_PATHS = ("/var/lib/mig-batch", "/run/mig-batch")  # what each node owns, in its own mount namespace
NODE_GPU_DIR = f"{NODE_PATHS[0]}/nvml-emu"  # each node's emulated GPUs, as the node sees them
MEMORY_FS = "mig-batch-node"  # the source name of the tmpfs mounts that keep a node's directories in memory


@dataclass
class MigTestbed:
    """A cluster in a box: the local cluster with mig_batch installed (job_submit.lua, the hooks, a
    node agent per node) and mig-batchd, on GPUs of the emulated libnvidia-ml with ``gpu_backend: nvml``.

    Each slurmd and its agent run in their own mount namespace: their own ``/var/lib/mig-batch``
    (emulated GPUs, journal) and ``/run/mig-batch`` (agent socket, job files), backed by
    ``nodes/<node>/``, where the run directory and the emulated GPUs' state are in memory (tmpfs, as a
    real node's ``/run`` and a GPU driver's state are; the journal is on disk); the controller's
    directory (``controller/``: its config and store) is covered by an empty file system there, so no
    node can reach the store. The controller runs on the host.

    Every process that opens NVML loads the emulated library by name and serves the node's GPUs at
    :data:`NODE_GPU_DIR` (the same path in every node's namespace): the agent and the hooks run
    :attr:`node_python`, a wrapper that sets that environment (slurmd starts the Prolog and Epilog
    with an environment of its own making, so nothing else reaches the hooks' slow path); jobs
    inherit it from their submitter (sbatch's ``--export=ALL``) through :meth:`env`.
    """

    root: Path
    nodes: dict[str, list[str]] = field(
        default_factory=lambda: {"n1": ["A100-40GB"], "n2": ["A100-80GB", "A100-80GB"], "n3": ["H100-80GB"]}
    )
    policy: str = "mfi"
    slice_gres: str = ""  # e.g. mig_slices: Slurm counts each MIG job's memory slices (site config slice_gres)
    accounting: bool = False  # slurmdbd + MariaDB: sacct and association/QOS limits on the slices
    poll_interval_s: float = 0.2
    reconcile_interval_s: float = 5.0
    mig_off: dict[str, list[int]] = field(default_factory=dict)  # GPUs emulated with MIG mode off, per node
    node_pythonpath: str = ""  # put first on the node processes' path (e.g. another nvidia-ml-py version)
    atomize: dict[str, object] = field(default_factory=dict)  # mig-batchd's atomize settings (e.g. live_defrag)
    moldable: dict[str, object] = field(default_factory=dict)  # mig-batchd's moldable settings (e.g. planner)
    hook_client: str = "auto"  # direct, c, python or auto (direct here: see mig_batch.slurm.install)
    slurm_api: bool = True  # the per-job Slurm calls through the helper library where it builds; False: commands
    slurm_library: str = ""  # the helper library the configs name ("": none)
    prompt_slots: int = 0  # mig-batchd's prompt slots per request (0: off; docs/slurm.md "Prompt slots")
    fence: bool = True  # each job fenced to its instance: the emulated driver's capability nodes (node/fence.py)
    cluster: LocalCluster | None = None
    controller: subprocess.Popen | None = None
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def config_path(self) -> Path:
        """The nodes' and users' config (no store)."""
        return self.root / "etc" / "mig-batch.yaml"

    @property
    def controller_dir(self) -> Path:
        return self.root / "controller"

    @property
    def controller_config(self) -> Path:
        return self.controller_dir / "mig-batchd.yaml"

    @property
    def store_path(self) -> Path:
        return self.controller_dir / "store" / "state.db"

    @property
    def slots_file(self) -> Path:
        """Where mig-batchd publishes its prompt slots and job_submit.lua (in slurmctld, on the host) reads them."""
        return self.controller_dir / "slots" / "slots"

    def node_dir(self, node: str) -> Path:
        return self.root / "nodes" / node

    def gpu_dir(self, node: str) -> Path:
        """The node's emulated GPUs (an ``nvml_emu`` node directory), seen from the host."""
        return self.node_dir(node) / "lib" / Path(NODE_GPU_DIR).relative_to(NODE_PATHS[0])

    @property
    def node_python(self) -> Path:
        """The Python of node processes: the interpreter, with the emulated GPUs' environment."""
        return self.root / "etc" / "python-on-emulated-gpus"

    def gpu_env(self) -> dict[str, str]:
        """What a process on a node needs to open the node's emulated GPUs through NVML."""
        from mig_batch.gpu import nvml_emu

        return nvml_emu.library_env(nvml_emu.build_library(), Path(NODE_GPU_DIR))

    def env(self) -> dict[str, str]:
        """Commands' environment; jobs submitted with it see their node's GPUs (sbatch exports it)."""
        assert self.cluster is not None
        return {**self.cluster.env(), **self.gpu_env(), "MIG_BATCH_CONFIG": str(self.config_path)}

    def make_gpus(self) -> None:
        """Each node's emulated GPUs and the Python that opens them (instances made earlier are kept)."""
        from mig_batch.gpu import nvml_emu
        from mig_batch.mig.models import get_model

        for node, models in self.nodes.items():
            off = self.mig_off.get(node, [])
            gpus = [nvml_emu.EmulatedGpu(get_model(m), i not in off) for i, m in enumerate(models)]
            nvml_emu.make_node(self.gpu_dir(node), node, gpus)
            shutil.copy(nvml_emu.CUDA_OPEN, self.gpu_dir(node) / "cuda-open")  # what a job's CUDA would open
        env = self.gpu_env() | ({"PYTHONPATH": self.node_pythonpath} if self.node_pythonpath else {})
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
        self.node_python.parent.mkdir(parents=True, exist_ok=True)
        self.node_python.write_text(f"#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} \"$@\"\n")
        self.node_python.chmod(0o755)

    def write_config(self, policy: str | None = None) -> None:
        import yaml

        common = {"policy": policy or self.policy, "nodes": self.nodes, "slice_gres": self.slice_gres,
                  "slurm_library": self.slurm_library}  # fmt: skip
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump({
            **common,
            "gpu_backend": "nvml",
            "node_dir": f"{NODE_PATHS[0]}/node",
            "job_dir": f"{NODE_PATHS[1]}/jobs",
            "agent_socket": f"{NODE_PATHS[1]}/agent.sock",
            "reconcile_interval_s": self.reconcile_interval_s,
            # the emulated driver's /proc capabilities, /proc/devices and /dev/nvidia-caps, as each node sees them
            "fence": {"mode": "capabilities", "capabilities": f"{NODE_GPU_DIR}/capabilities",
                      "devices": f"{NODE_GPU_DIR}/nvidia-caps", "proc_devices": f"{NODE_GPU_DIR}/devices"}
            if self.fence else {"mode": "off"},
        }))  # fmt: skip
        self.store_path.parent.mkdir(parents=True, exist_ok=True)
        self.controller_config.write_text(yaml.safe_dump({
            **common, "state": str(self.store_path), "poll_interval_s": self.poll_interval_s,
            **({"atomize": dict(self.atomize)} if self.atomize else {}),
            **({"moldable": dict(self.moldable)} if self.moldable else {}),
            **({"prompt_slots": self.prompt_slots, "slots_file": str(self.slots_file)} if self.prompt_slots else {}),
        }))  # fmt: skip

    def memory_dirs(self, node: str) -> tuple[Path, Path]:
        """The node's directories kept in memory (tmpfs), as on a real node: its ``/run`` (agent socket, job
        files) and its emulated GPUs' state, which a real GPU keeps in its driver, not in files on a disk."""
        return self.node_dir(node) / "run", self.gpu_dir(node)

    def _mount_memory_dirs(self) -> None:
        for node in self.nodes:
            for path in self.memory_dirs(node):
                path.mkdir(parents=True, exist_ok=True)
                if not os.path.ismount(path):
                    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=0755", MEMORY_FS, str(path)],
                                   check=True, capture_output=True)  # fmt: skip

    def _unmount_memory_dirs(self) -> None:
        _unmount([path for node in self.nodes for path in self.memory_dirs(node) if os.path.ismount(path)])

    @staticmethod
    def reap_stale_mounts() -> None:
        """Unmount every testbed's in-memory node directories (for the end of a test run that was killed:
        a testbed stopped in time unmounts its own)."""
        with open("/proc/mounts") as mounts:
            _unmount([line.split()[1] for line in mounts if line.split()[0] == MEMORY_FS])

    def node_prefix(self, node: str) -> list[str]:
        """``unshare`` into a new mount namespace with the node's own paths and no controller directory."""
        mounts = []
        for path, sub in zip(NODE_PATHS, ("lib", "run"), strict=True):
            backing = self.node_dir(node) / sub
            backing.mkdir(parents=True, exist_ok=True)
            Path(path).mkdir(parents=True, exist_ok=True)  # the mount point (empty on the host)
            mounts.append(f"mount --rbind {backing} {path}")  # with the in-memory directories mounted inside
        mounts.append(f"mount -t tmpfs -o size=64k,mode=0700 mig-batch-hidden {self.controller_dir}")
        script = "set -e; " + "; ".join(mounts) + '; exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]

    def start(self) -> MigTestbed:
        """Start it all; a start that fails stops what it started (and unmounts) before raising."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> MigTestbed:
        from mig_batch.mig.models import get_model
        from mig_batch.slurm.install import SLURM_LIBRARY, install, node_slices, slice_accounting_conf

        self.root.mkdir(parents=True, exist_ok=True)
        self.write_config()
        self._mount_memory_dirs()
        self.make_gpus()
        etc = self.root / "etc"
        models = [get_model(m) for m in sorted({m for ms in self.nodes.values() for m in ms})]
        written, _ = install(etc, str(self.node_python), str(self.config_path), f"{NODE_PATHS[1]}/jobs",
                             f"{NODE_PATHS[1]}/agent.sock", models, self.nodes, hook_client_kind=self.hook_client,
                             slots_file=str(self.slots_file) if self.prompt_slots else "")
        library = etc / SLURM_LIBRARY
        if self.slurm_api and library in written:
            self.slurm_library = str(library)
            self.write_config()
        # gpu: Slurm's own MIG forms (--gres=gpu:3g.40gb) reach job_submit.lua, as on a site that used them
        gres_types, gres, accounting = "mig,gpu", {}, ""
        if self.slice_gres:  # the generated gres.conf as a site would append it; counts on the node lines
            (etc / "gres.conf").write_text(slice_accounting_conf(self.nodes, self.slice_gres)[1])
            gres_types += f",{self.slice_gres}"
            gres = {n: f"{self.slice_gres}:{c}" for n, c in node_slices(self.nodes).items()}
            if self.accounting:
                accounting = (f"AccountingStorageTRES=gres/{self.slice_gres}\n"
                              "AccountingStorageEnforce=associations,limits,qos,safe\n")  # fmt: skip
        self.cluster = LocalCluster(
            self.root,
            nodes=tuple(self.nodes),
            features={n: ",".join(sorted(set(ms))) for n, ms in self.nodes.items()},
            gres=gres,
            accounting=self.accounting,
            extra_conf=(
                f"JobSubmitPlugins=lua\nGresTypes={gres_types}\n{accounting}"
                f"Prolog={etc / 'mig-batch-prolog'}\nEpilog={etc / 'mig-batch-epilog'}\n"
                f"TaskProlog={etc / 'mig-batch-taskprolog'}\n"
            ),
            node_prefix=self.node_prefix,
        )
        self.cluster.start()
        for node in self.nodes:
            self.start_agent(node)
        self.start_controller()
        return self

    def start_agent(self, node: str, wait: bool = True) -> None:
        """The node's agent, in the node's mount namespace (that of its slurmd)."""
        assert self.cluster is not None
        log = open(self.root / "log" / f"agent-{node}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.agents[node] = subprocess.Popen(
            [*self.enter_node(node), str(self.node_python), "-m", "mig_batch.slurm.hooks", "agent", "--node", node,
             "--log-level", "debug"],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        socket_file = self.node_dir(node) / "run" / "agent.sock"
        deadline = time.monotonic() + 30
        while wait and not socket_file.exists():
            if time.monotonic() > deadline or self.agents[node].poll() is not None:
                raise ClusterError(f"the agent of {node} did not start; see {log.name}")
            time.sleep(0.1)

    def stop_agent(self, node: str, sig: int = signal.SIGTERM) -> None:
        proc = self.agents.pop(node, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(15)
        (self.node_dir(node) / "run" / "agent.sock").unlink(missing_ok=True)

    def kill_node(self, node: str) -> None:
        """A hard node failure: slurmd, the agent and every job process of the node, SIGKILLed."""
        assert self.cluster is not None
        namespace = os.readlink(f"/proc/{self.cluster.node_pid(node)}/ns/mnt")
        self.stop_agent(node, signal.SIGKILL)
        self.cluster.stop_node(node, signal.SIGKILL)
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                if os.readlink(f"/proc/{pid}/ns/mnt") == namespace:
                    os.kill(int(pid), signal.SIGKILL)
            except OSError:
                continue  # gone already, or not ours to read

    def restart_node(self, node: str) -> None:
        assert self.cluster is not None
        self.cluster.start_node(node)
        self.start_agent(node)

    def start_controller(self) -> None:
        log = open(self.root / "log" / "mig-batchd.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.controller = subprocess.Popen(
            [sys.executable, "-m", "mig_batch.controller", "--config", str(self.controller_config), "--log-level",
             "debug"],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.store_path.exists():  # it opens its store before its first pass
            if time.monotonic() > deadline or self.controller.poll() is not None:
                raise ClusterError(f"mig-batchd did not start; see {log.name}")
            time.sleep(0.1)

    def stop_controller(self, sig: int = signal.SIGTERM) -> None:
        if self.controller is not None and self.controller.poll() is None:
            self.controller.send_signal(sig)
            self.controller.wait(15)
        self.controller = None

    def migsub(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "mig_batch.cli.migsub", *args], env=self.env(),
                              capture_output=True, text=True, timeout=60, cwd=self.root)  # fmt: skip
        if check and proc.returncode != 0:
            raise ClusterError(f"migsub {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def in_node(self, node: str, *argv: str) -> subprocess.CompletedProcess:
        """Run a command in the node's mount namespace (what the node sees)."""
        assert self.cluster is not None
        return subprocess.run([*self.enter_node(node), *argv], capture_output=True, text=True, timeout=30)

    def enter_node(self, node: str) -> list[str]:
        """The prefix that runs a command in the node's mount namespace, under the node's root: entering
        a mount namespace resets the root to the namespace's own, which is not a chroot's (the release
        images of tests/harness/slurm_image.py)."""
        assert self.cluster is not None
        proc = f"/proc/{self.cluster.node_pid(node)}"
        return ["nsenter", f"--mount={proc}/ns/mnt", f"--root={proc}/root", f"--wd={proc}/root", "--"]

    def stop(self) -> None:
        self.stop_controller()
        for node in list(self.agents):
            self.stop_agent(node)
        if self.cluster is not None:
            self.cluster.stop()
        self._unmount_memory_dirs()

    def __enter__(self) -> MigTestbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _unmount(paths: list) -> None:
    for path in paths:
        subprocess.run(["umount", "--lazy", str(path)], check=False, capture_output=True)


def ensure_user(name: str) -> pwd.struct_passwd:
    """An ordinary system user of that name (made with useradd the first time)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


def unprivileged(bed: MigTestbed, tmp_path: Path, user: str = "nobody") -> tuple[
        Path, Callable[..., subprocess.CompletedProcess], Callable[..., str]]:  # fmt: skip
    """A shared folder and the ``run``, ``sbatch`` of an unprivileged user (``nobody``, or ``user``: Slurm 26.05
    gives ``nobody`` no association, its uid being Slurm's own "nobody")."""
    shared = tmp_path / "user"
    shared.mkdir()
    shared.chmod(0o1777)
    for folder in (*shared.parents, *bed.cluster.conf.parents):  # pytest's folders are root's alone
        if folder.is_relative_to(tempfile.gettempdir()):
            folder.chmod(folder.stat().st_mode | 0o001)  # another user may pass through, not list
    bed.cluster.conf.chmod(0o644)  # slurm.conf: what the user's commands read

    def as_user(*argv):
        return bed.cluster.run("runuser", "-u", user, "--", *argv, check=False, timeout=15)

    def sbatch(*args, seconds, status=0, env=()):
        proc = as_user("env", *env, "sbatch", "--parsable", f"--chdir={shared}", f"--output={shared}/%j.out", *args,
                       "--wrap", f'echo "$SLURM_JOB_ID|$CUDA_VISIBLE_DEVICES|$MIG_BATCH_JOB"; sleep {seconds}; '
                       f"exit {status}")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    return shared, as_user, sbatch
