"""What a site installs for HTCondor (``mig-batch htcondor install``): the schedd's policy, the execute
nodes' config with the job wrapper filled in, and the node agent's systemd unit."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mig_batch.htcondor import job_wrapper
from mig_batch.htcondor.attrs import execute_config, node_config, schedd_config
from mig_batch.mig.models import GpuModel
from mig_batch.resources import resource_path

WRAPPER = "mig-batch-job-wrapper"
UNIT = "mig-batch-htcondor-agent.service"


def wrapper_text(python: str, socket: str) -> str:
    """The job wrapper as installed: run by ``python`` in isolated mode, asking the agent at ``socket``."""
    source = Path(job_wrapper.__file__).read_text()
    marker = 'SOCKET = "/run/mig-batch/agent.sock"'
    if marker not in source:
        raise RuntimeError(f"{job_wrapper.__file__} has no {marker!r} line to fill in")
    return f"#!{python} -IS\n" + source.replace(marker, f"SOCKET = {socket!r}", 1)


def install(dest: Path, models: Iterable[GpuModel], controller: str, agents: Iterable[str], python: str,
            socket: str, agent_file: str, wrapper_dir: str = "/usr/local/libexec/mig-batch") -> list[Path]:  # fmt: skip
    """Write into ``dest``: ``mig-batch-schedd.conf`` (for the submit host's config.d),
    ``mig-batch-execute.conf`` (every execute node's config.d), the wrapper (to copy into
    ``wrapper_dir`` on every execute node) and the agent's unit; the paths written."""
    dest.mkdir(parents=True, exist_ok=True)
    wrapper = f"{wrapper_dir.rstrip('/')}/{WRAPPER}"
    files = {
        "mig-batch-schedd.conf": "# mig_batch schedd policy: written by `mig-batch htcondor install`; put in the\n"
        "# submit host's config.d, then condor_reconfig and `condor_qusers -add` each superuser below.\n"
        + schedd_config(controller, list(models), list(agents)),
        "mig-batch-execute.conf": "# mig_batch execute-node policy: written by `mig-batch htcondor install`; put in\n"
        f"# every GPU node's config.d with {wrapper} beside it, then condor_reconfig.\n"
        "# MigBatchNodeName is the node's name in the site config's nodes: (default: the short host name).\n"
        + execute_config(wrapper) + node_config("$(HOSTNAME)", agent_file),
        WRAPPER: wrapper_text(python, socket),
        UNIT: resource_path("etc", "systemd", UNIT).read_text(),
    }
    written = []
    for name, text in files.items():
        path = dest / name
        path.write_text(text)
        path.chmod(0o755 if name == WRAPPER else 0o644)
        written.append(path)
    return written
