"""mig_batch on a real HTCondor pool, for tests: the local pool (``htcondor_pool.LocalPool``)
with what ``mig-batch htcondor install`` writes (schedd policy with the site's models, the job wrapper),
one node agent per execute node on emulated GPUs, and mig-batchd over HTCondor.

The daemons of the pool run in the chroot; the agents and mig-batchd run on the host as root, each as
its own process with its own HTCondor identity's client config (the controller's token, a queue
superuser, for both). Each agent serves its node's GPUs of the emulated libnvidia-ml (an ``nvml_emu``
node directory under ``nodes/<node>/gpus``, chosen by the environment it starts with) and listens on
``<pool>/agent/<node>.sock``, a directory bind-mounted at the same path inside the chroot, where the
job wrappers find it; the wrapper itself lives there too and runs with the chroot's Python. Each node's
GPU directory is bind-mounted read-only at the same path inside the chroot, with ``cuda-open`` in it: a
job opens its MIG devices' capability nodes there as CUDA would, so the agents' fence is tested for real.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mig_batch.htcondor.install import wrapper_text

from .htcondor_pool import Image, LocalPool

CHROOT_PYTHON = "/usr/bin/python3"


@dataclass
class HTCondorTestbed:
    root: Path
    nodes: dict[str, list[str]] = field(default_factory=lambda: {"nodea": ["A100-80GB"], "nodeb": ["H100-80GB"]})
    policy: str = "mfi"
    reconcile_interval_s: float = 2.0
    poll_interval_s: float = 0.5
    pool: LocalPool | None = None
    agents: dict[str, subprocess.Popen] = field(default_factory=dict)
    controller: subprocess.Popen | None = None
    timings: dict[str, float] = field(default_factory=dict)
    image: Image | None = None  # the pool's image (None: the default suite's, htcondor_pool.SUITE)

    # --- paths ---------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.root / "etc" / "mig-batch.yaml"

    @property
    def store_path(self) -> Path:
        return self.root / "controller" / "state.db"

    def gpu_dir(self, node: str) -> Path:
        return self.root / "nodes" / node / "gpus"

    def log_path(self, name: str) -> Path:
        return self.root / "log" / f"{name}.log"

    def gpu_env(self, node: str) -> dict[str, str]:
        from mig_batch.gpu import nvml_emu

        return nvml_emu.library_env(nvml_emu.build_library(), self.gpu_dir(node))

    def user_env(self, user: str | None = None) -> dict[str, str]:
        """A job owner's environment on the host: the owner's HTCondor identity (``user``, default the
        pool's first job user), the site config."""
        assert self.pool is not None
        return {**self.pool.client_env(user or self.pool.user), "MIG_BATCH_CONFIG": str(self.config_path)}

    # --- life cycle --------------------------------------------------------------------------------
    def start(self) -> HTCondorTestbed:
        from mig_batch.gpu import nvml_emu

        t0 = time.monotonic()
        models = sorted({m for ms in self.nodes.values() for m in ms})
        pool_root = self.root / "pool"
        agent_dir = pool_root / "agent"  # bind-mounted at the same path in the chroot
        agent_dir.mkdir(parents=True, exist_ok=True)
        wrapper = agent_dir / "mig-batch-job-wrapper"
        wrapper.write_text(wrapper_text(CHROOT_PYTHON, str(agent_dir / "{node}.sock")))
        wrapper.chmod(0o755)
        for node, gpus in self.nodes.items():
            nvml_emu.make_node(self.gpu_dir(node), node, gpus)
            shutil.copy(nvml_emu.CUDA_OPEN, self.gpu_dir(node) / "cuda-open")  # what a job's CUDA would open
        self.pool = LocalPool(pool_root, nodes=tuple(self.nodes), models=models, wrapper=str(wrapper),
                              binds=[self.gpu_dir(node) for node in self.nodes],
                              **({"image": self.image} if self.image else {}))  # fmt: skip
        self.pool.start()
        self.timings["pool"] = time.monotonic() - t0
        self.write_config()
        (self.root / "log").mkdir(exist_ok=True)
        for node in self.nodes:
            self.start_agent(node)
        self.start_controller()
        self.timings["start"] = time.monotonic() - t0
        return self

    def write_config(self) -> None:
        import yaml

        assert self.pool is not None
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.store_path.parent.mkdir(parents=True, exist_ok=True)
        nodes_dir = self.root / "nodes"
        self.config_path.write_text(yaml.safe_dump({
            "batch_system": "htcondor",
            "policy": self.policy,
            "nodes": self.nodes,
            "gpu_backend": "nvml",
            "state": str(self.store_path),
            "poll_interval_s": self.poll_interval_s,
            "node_dir": f"{nodes_dir}/{{node}}/node",
            "job_dir": f"{nodes_dir}/{{node}}/jobs",
            "agent_socket": str(self.pool.root / "agent" / "{node}.sock"),
            "reconcile_interval_s": self.reconcile_interval_s,
            "htcondor_config": str(self.pool.client_config(self.pool.controller)),
            "htcondor_agent_file": str(self.pool.agent_file("{node}")),
            # each job fenced to its instance over the emulated driver's capabilities and device nodes
            "fence": {"capabilities": f"{nodes_dir}/{{node}}/gpus/capabilities",
                      "devices": f"{nodes_dir}/{{node}}/gpus/nvidia-caps",
                      "proc_devices": f"{nodes_dir}/{{node}}/gpus/devices"},
        }))  # fmt: skip

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.log_path(name), "a")  # noqa: SIM115 -- the child keeps it
        try:
            return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def start_agent(self, node: str) -> None:
        assert self.pool is not None
        local_name = "" if node == self.pool.nodes[0] else node.upper()  # see LocalPool: extra startds
        env = {**self.pool.client_env(self.pool.controller), **self.gpu_env(node)}
        agent = Path(sys.executable).with_name("mig-batch-htcondor-agent")  # the console script systemd runs
        argv = [str(agent), "--config", str(self.config_path), "--node", node,
                "--startd-local-name", local_name, "--log-level", "DEBUG"]  # fmt: skip
        socket = self.pool.root / "agent" / f"{node}.sock"
        socket.unlink(missing_ok=True)
        self.agents[node] = self._spawn(f"agent-{node}", argv, env)
        deadline = time.monotonic() + 30
        while not socket.exists():
            if self.agents[node].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent of {node} did not start; see {self.log_path(f'agent-{node}')}")
            time.sleep(0.1)

    def stop_agent(self, node: str, sig: int = signal.SIGTERM) -> None:
        proc = self.agents.pop(node, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=30)
        sock = Path(str(self.pool.root / "agent" / f"{node}.sock")) if self.pool else None
        if sock is not None:
            sock.unlink(missing_ok=True)

    def start_controller(self) -> None:
        assert self.pool is not None
        env = {**self.pool.client_env(self.pool.controller)}
        argv = [sys.executable, "-m", "mig_batch.controller", "--config", str(self.config_path)]
        self.controller = self._spawn("mig-batchd", argv, env)

    def stop_controller(self, sig: int = signal.SIGTERM) -> None:
        if self.controller is not None and self.controller.poll() is None:
            self.controller.send_signal(sig)
            self.controller.wait(timeout=30)
        self.controller = None

    def stop(self) -> None:
        self.stop_controller()
        for node in list(self.agents):
            self.stop_agent(node)
        if self.pool is not None:
            self.pool.stop()

    def __enter__(self) -> HTCondorTestbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- acting as a user ------------------------------------------------------------------------
    def migsub(self, script: Path, *args: str, backend: str | None = "htcondor", check: bool = True,
               user: str | None = None) -> subprocess.CompletedProcess:  # fmt: skip
        """migsub, run on the host as a job owner's HTCondor identity (``user``, default the pool's first
        job user); ``backend`` None: as the site config says (``batch_system: htcondor``)."""
        assert self.pool is not None
        migsub = Path(sys.executable).with_name("migsub")
        command = [str(migsub), *(["--backend", backend] if backend else []), *args, str(script)]
        proc = subprocess.run(command, env=self.user_env(user), cwd=str(script.parent), capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr or proc.stdout}")
        return proc
