"""The one place that builds what the site config names: the batch system, a node's GPU backend and its fence.

mig-batchd, the node agents, the hooks' slow path, migsub and the subjob runner all get their batch system
from :func:`open_batch_system`, so a new batch system or a new setting is wired here once. It sits above the
adapters (mig_batch/slurm, mig_batch/htcondor) and below the programs that use it; the adapters are imported
only when chosen, so migsub does not pay for HTCondor's bindings on Slurm nor the other way round.
"""

from __future__ import annotations

import enum
from pathlib import Path

from mig_batch.config import BATCH_SYSTEMS, ConfigError, SiteConfig

TYPE_CHECKING = False  # typing costs ~2 ms at every start (migsub and the hooks' slow path use this); strings
if TYPE_CHECKING:
    from mig_batch.batch.system import BatchSystem
    from mig_batch.gpu.base import GpuBackend
    from mig_batch.node.fence import Fence

SUBMIT_TIMEOUT_S = 60  # sbatch as a user runs it: slurmctld may be slow to take a job under load


class Role(enum.Enum):
    """Who the batch system is built for: each needs its own connection to it."""

    CONTROLLER = "controller"  # mig-batchd: the site's commands, slice accounting, libslurm where built
    AGENT = "agent"  # a node agent (long-lived): one scontrol session, libslurm where built
    HOOK = "hook"  # a hook's slow path (one job, one process): Slurm's commands only
    SUBMITTER = "submitter"  # migsub, the subjob runner: the user's own client set-up (PATH, CONDOR_CONFIG)


def open_batch_system(config: SiteConfig | None, role: Role, kind: str = "",
                      env: dict[str, str] | None = None) -> BatchSystem:  # fmt: skip
    """The batch system ``kind`` (slurm | htcondor; "": the config's ``batch_system``, else Slurm) for ``role``.

    ``config`` may be None for a submitter only (migsub runs without a site config); ``env`` is the environment
    a submitter's commands run with (None: this process's)."""
    kind = kind or (config.batch_system if config is not None else "") or "slurm"
    if kind not in BATCH_SYSTEMS:
        raise ConfigError(f"batch system {kind!r} is not one of {', '.join(BATCH_SYSTEMS)}")
    if config is None and role is not Role.SUBMITTER:
        raise ValueError(f"the {role.value}'s batch system needs the site config")
    if kind == "htcondor":
        from mig_batch.htcondor.adapter import HTCondorBatch

        if role is Role.SUBMITTER or config is None:
            return HTCondorBatch()
        return HTCondorBatch(config.htcondor_config or None, agent_file=config.htcondor_agent_file)
    from mig_batch.slurm.commands import SlurmCli

    if role is Role.SUBMITTER or config is None:
        return SlurmCli(env=env, timeout=SUBMIT_TIMEOUT_S)
    if role is Role.HOOK:
        return SlurmCli(config.slurm_bin)
    from mig_batch.slurm.native import open_api

    api = open_api(config.slurm_library)
    if role is Role.AGENT:
        return SlurmCli(config.slurm_bin, session=True, api=api)
    return SlurmCli(config.slurm_bin, slice_gres=config.slice_gres, api=api)


def open_fence(config: SiteConfig, node: str) -> Fence:
    """Who may open each MIG instance on ``node``, as the config says (``{node}`` in a path: the node's name)."""
    from mig_batch.node.fence import CapabilityFence, Unfenced

    if config.fence.mode == "off":
        return Unfenced()
    f = config.fence
    return CapabilityFence(*(Path(p.format(node=node)) for p in (f.capabilities, f.devices, f.proc_devices)))


def open_backend(config: SiteConfig, node: str) -> GpuBackend:
    """The GPU backend of ``node`` as the config says (NVML: the node's own driver)."""
    from mig_batch.gpu.nvml import NvmlNode

    return NvmlNode()
