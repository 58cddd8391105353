"""A real Slurm cluster on one machine, for tests and demos: munged, slurmctld, several slurmd.

Everything lives in one temporary directory: the munge key and socket, slurm.conf (free ports),
the controller's state, each node's spool, logs. Nodes are ``slurmd -N name`` processes on
127.0.0.1 with their own ports. Commands reach this cluster through ``SLURM_CONF``; use
:meth:`LocalCluster.env` or :meth:`LocalCluster.run`. Requires root and Debian's slurm-wlm + munge.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


class ClusterError(RuntimeError):
    pass


@dataclass
class LocalCluster:
    root: Path
    nodes: Sequence[str] = ("n1", "n2", "n3")
    cpus_per_node: int = 16
    features: dict[str, str] = field(default_factory=dict)  # node -> Slurm features (comma-separated)
    extra_conf: str = ""  # appended to slurm.conf (Prolog=..., JobSubmitPlugins=..., ...)
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
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).stdout.find("UP") >= 0, "slurmctld")
        for node in self.nodes:
            self.start_node(node)
        self.wait_nodes_idle()
        return self

    def start_node(self, node: str) -> None:
        (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])

    def stop_node(self, node: str, sig: int = signal.SIGTERM) -> None:
        self._stop(f"slurmd-{node}", sig)

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

    def _write_conf(self) -> None:
        ports = _free_ports(2 + len(self.nodes))
        host = socket.gethostname()
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[2 + i]} "
            f"CPUs={self.cpus_per_node} RealMemory=64000 State=UNKNOWN"
            + (f" Features={self.features[n]}" if self.features.get(n) else "")
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
AuthInfo=socket={self.munge_socket}
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
SchedulerParameters=sched_interval=2
MpiDefault=none
ReturnToService=2
MinJobAge=600
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{node_lines}
PartitionName=gpu Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
{self.extra_conf}
"""
        )

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - lives as long as the process
        self.procs[name] = subprocess.Popen(argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT)

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


@dataclass
class MigTestbed:
    """The local cluster with mig_batch installed: job_submit.lua, hook shims, emulated GPUs, mig-batchd."""

    root: Path
    nodes: dict[str, list[str]] = field(
        default_factory=lambda: {"n1": ["A100-40GB"], "n2": ["A100-80GB", "A100-80GB"], "n3": ["H100-80GB"]}
    )
    policy: str = "mfi"
    poll_interval_s: float = 0.2
    cluster: LocalCluster | None = None
    controller: subprocess.Popen | None = None

    @property
    def config_path(self) -> Path:
        return self.root / "mig-batch.yaml"

    def env(self) -> dict[str, str]:
        assert self.cluster is not None
        return {**self.cluster.env(), "MIG_BATCH_CONFIG": str(self.config_path)}

    def write_config(self, policy: str | None = None) -> None:
        import yaml

        self.config_path.write_text(yaml.safe_dump({
            "state": str(self.root / "state.db"),
            "policy": policy or self.policy,
            "poll_interval_s": self.poll_interval_s,
            "gpu_backend": "emulated",
            "emulated_dir": str(self.root / "gpus"),
            "job_dir": str(self.root / "jobs"),
            "nodes": self.nodes,
        }))  # fmt: skip

    def start(self) -> MigTestbed:
        from mig_batch.config import load_config, open_backend
        from mig_batch.mig.models import get_model
        from mig_batch.slurm.install import install

        self.root.mkdir(parents=True, exist_ok=True)
        self.write_config()
        config = load_config(self.config_path)
        for node in self.nodes:
            open_backend(config, node)  # creates the emulated node files
        etc = self.root / "etc"
        models = [get_model(m) for m in sorted({m for ms in self.nodes.values() for m in ms})]
        install(etc, sys.executable, str(self.config_path), str(config.job_dir), models)
        self.cluster = LocalCluster(
            self.root,
            nodes=tuple(self.nodes),
            features={n: ",".join(sorted(set(ms))) for n, ms in self.nodes.items()},
            extra_conf=(
                "JobSubmitPlugins=lua\nGresTypes=mig\n"
                f"Prolog={etc / 'mig-batch-prolog'}\nEpilog={etc / 'mig-batch-epilog'}\n"
                f"TaskProlog={etc / 'mig-batch-taskprolog'}\n"
            ),
        )
        self.cluster.start()
        self.start_controller()
        return self

    def start_controller(self) -> None:
        log = open(self.root / "log" / "mig-batchd.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.controller = subprocess.Popen(
            [sys.executable, "-m", "mig_batch.controller", "--config", str(self.config_path), "--log-level", "debug"],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

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

    def stop(self) -> None:
        self.stop_controller()
        if self.cluster is not None:
            self.cluster.stop()

    def __enter__(self) -> MigTestbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
