"""What a site installs for HTCondor (``mig-batch htcondor install``): the schedd's policy, the execute
nodes' config with the job wrapper filled in, and the node agent's systemd unit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from mig_batch.batch import site_files
from mig_batch.htcondor import accounting, job_wrapper
from mig_batch.htcondor.attrs import execute_config, node_config, schedd_config
from mig_batch.mig.models import GpuModel, get_model
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


INSTALLER = "mig-batch htcondor install"


def install(dest: Path, models: Iterable[GpuModel], controller: str, agents: Iterable[str], python: str,
            socket: str, agent_file: str, wrapper_dir: str = "/usr/local/libexec/mig-batch", *, force: bool = False,
            dry_run: bool = False, report: site_files.Report | None = None,
            nodes: Mapping[str, Sequence[str]] | None = None) -> list[Path]:  # fmt: skip
    """Install into ``dest``: ``mig-batch-schedd.conf`` (for the submit host's config.d),
    ``mig-batch-execute.conf`` (every execute node's config.d), the wrapper (to copy into
    ``wrapper_dir`` on every execute node) and the agent's unit; the paths installed. A file of the site's is
    never replaced without ``force`` (:mod:`mig_batch.batch.site_files`); ``dry_run`` writes nothing and puts
    the diffs in ``report`` (filled in with what was done, when given). ``nodes`` (node -> its GPU models, the
    site's inventory) adds MIG slice accounting to both config files (:mod:`mig_batch.htcondor.accounting`)."""
    wrapper = f"{wrapper_dir.rstrip('/')}/{WRAPPER}"
    schedd_accounting = execute_accounting = ""
    if nodes:
        schedd_accounting = ("# MIG slices in accounting and limits (docs/htcondor.md \"Accounting\"): each job's\n"
                             "# slice request and its mig_slices.<Owner> concurrency limit, from the count pinned\n"
                             + accounting.schedd_config())
        inventory = {node: [get_model(m) for m in models] for node, models in nodes.items()}
        execute_accounting = ("# MIG slices in accounting and limits: each node's memory slices by its name, and the\n"
                              "# slot weight (a MIG job's slices, any other job's cores)\n"
                              + accounting.execute_config(inventory))
    files = {
        "mig-batch-schedd.conf": "# mig_batch schedd policy: written by `mig-batch htcondor install`; put in the\n"
        "# submit host's config.d, then condor_reconfig and `condor_qusers -add` each superuser below.\n"
        + schedd_config(controller, list(models), list(agents)) + schedd_accounting,
        "mig-batch-execute.conf": "# mig_batch execute-node policy: written by `mig-batch htcondor install`; put in\n"
        f"# every GPU node's config.d with {wrapper} beside it, then condor_reconfig.\n"
        "# MigBatchNodeName is the node's name in the site config's nodes: (default: the short host name).\n"
        + execute_config(wrapper) + node_config("$(HOSTNAME)", agent_file) + execute_accounting,
        WRAPPER: wrapper_text(python, socket),
        UNIT: resource_path("etc", "systemd", UNIT).read_text(),
    }
    wanted = [site_files.Wanted(name, text.encode(), 0o755 if name == WRAPPER else 0o644)
              for name, text in files.items()]  # fmt: skip
    done = site_files.install_files(dest, wanted, force=force, dry_run=dry_run, installer=INSTALLER)
    if report is not None:
        report.lines[:], report.diffs[:], report.paths[:] = done.lines, done.diffs, done.paths
    return done.paths


def uninstall(dest: Path, *, force: bool = False, dry_run: bool = False) -> site_files.Report:
    """Remove what `mig-batch htcondor install` put into ``dest`` and put back the site's files it replaced."""
    return site_files.uninstall_files(dest, force=force, dry_run=dry_run, installer=INSTALLER)
