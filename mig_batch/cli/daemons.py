"""The daemons' mains, in one place with one set-up of flags and logging.

* ``mig-batchd`` (:func:`batchd_main`, also ``python -m mig_batch.controller``): the controller loop.
* ``mig-batch-agent`` (:func:`slurm_agent_main`): the node agent of a Slurm node (root, systemd).
* ``mig-batch-htcondor-agent`` (:func:`htcondor_agent_main`): the node agent of an HTCondor execute node
  (root, systemd).
* ``python -I -m mig_batch.slurm.hooks prolog|epilog|agent`` (:func:`slurm_hook_main`): the Slurm hooks' slow
  path when the agent is down, and the agent started by that module's name.

Each daemon takes ``--config``, its own flags, then ``--log-level`` and ``--debug`` (:func:`parse_daemon_args`),
runs under :func:`~mig_batch.entry.run_guarded` (bad input: a message and exit status 2) and gets its batch
system from :func:`~mig_batch.factory.open_batch_system`. Heavy imports stay inside the mains: the hooks' slow
path imports this module on every Prolog the agent misses.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from mig_batch.config import load_config
from mig_batch.entry import DEBUG_HELP, LOG_LEVELS, log_level, run_guarded
from mig_batch.factory import Role, open_backend, open_batch_system, open_fence

TYPE_CHECKING = False  # typing costs ~2 ms at every start (the hooks' slow path starts here); strings
if TYPE_CHECKING:
    from mig_batch.config import SiteConfig
    from mig_batch.controller.metrics import ControllerMetrics
    from mig_batch.node.agent import NodeAgent

CONFIG_HELP = "site config (default: MIG_BATCH_CONFIG or /etc/mig-batch/mig-batch.yaml)"
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
HOOK_OPS = ("prolog", "epilog")


def parse_daemon_args(prog: str, description: str, argv: list[str],
                      own_options: Callable[[argparse.ArgumentParser], None]) -> argparse.Namespace:  # fmt: skip
    """A daemon's flags (``--config``, then ``own_options``'s, then ``--log-level`` and ``--debug``), parsed;
    logging is set up at the level asked for."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help=CONFIG_HELP)
    own_options(parser)
    parser.add_argument("--log-level", type=log_level, default="INFO", help=f"one of {', '.join(LOG_LEVELS)}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    return args


def short_host_name() -> str:
    """The default ``--node`` of an agent: this host's name up to the first dot."""
    return socket.gethostname().split(".")[0]


def batchd_main(argv: Sequence[str] | None = None) -> int:
    """``mig-batchd``: the controller loop."""
    return run_guarded(_batchd, argv, "mig-batchd")


def _batchd(argv: list[str]) -> int:
    from mig_batch.batch.system import BatchError
    from mig_batch.controller.daemon import Controller
    from mig_batch.state import Store

    def own_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true", help="one pass, then exit")

    args = parse_daemon_args("mig-batchd", "mig_batch controller: places managed jobs.", argv, own_options)
    config = load_config(args.config)
    metrics = None if args.once or not config.metrics_listen else serve_metrics(config.metrics_listen)
    controller = Controller(config, Store(config.state), open_batch_system(config, Role.CONTROLLER), metrics=metrics)
    if not args.once:
        controller.run()
        return 0
    try:
        stats = controller.step()
    except BatchError as exc:
        if config.batch_system == "htcondor":
            raise BatchError(f"{exc}; check that the schedd and collector answer with htcondor_config "
                             f"{config.htcondor_config!r} (from the site config)") from exc  # fmt: skip
        where = f"slurm_bin {config.slurm_bin!r}" if config.slurm_bin else "Slurm's commands on PATH"
        raise BatchError(f"{exc}; check that slurmctld is up and that {where} (from the site config) "
                         "holds squeue, scontrol and sinfo") from exc  # fmt: skip
    from mig_batch.cli.output import console  # rich: only for this line

    console.print(f"placed {stats.placed}, waiting {stats.waiting}, ended {stats.ended}, "
                  f"{stats.seconds * 1e3:.1f} ms", highlight=False)  # fmt: skip
    return 0


def serve_metrics(listen: str) -> ControllerMetrics:
    """mig-batchd's OpenMetrics endpoint on ``listen`` (``[host:]port``), in a thread; what the passes fill."""
    from mig_batch.config import ConfigError, listen_address
    from mig_batch.controller.metrics import ControllerMetrics
    from mig_batch.controller.metrics_server import MetricsServer

    host, port = listen_address(listen)
    metrics = ControllerMetrics()
    try:
        server = MetricsServer(host, port, metrics)
    except OSError as exc:
        raise ConfigError(f"metrics_listen {listen}: cannot listen there: {exc.strerror or exc}") from None
    server.start()
    logging.getLogger("mig-batchd").info("metrics on http://%s:%d/metrics", host, server.server_address[1])
    return metrics


def slurm_agent_main(argv: Sequence[str] | None = None) -> int:
    """``mig-batch-agent``: the node agent of a Slurm node (run as root by systemd)."""
    return run_guarded(_slurm_agent, argv, "mig-batch-agent")


def slurm_node_agent(config: SiteConfig, node: str, long_lived: bool) -> NodeAgent:
    """A Slurm node's agent: ``long_lived`` (the service) keeps one scontrol open for its reports, makes its
    per-job Slurm calls through libslurm where the site built the helper and adopts the journal's old files;
    the hooks' slow path runs Slurm's commands and waits for the service's GPU work a bounded time."""
    from mig_batch.node.agent import NodeAgent
    from mig_batch.node.journal import Journal
    from mig_batch.slurm.hooks import SLOW_PATH_LOCK_WAIT_S

    batch = open_batch_system(config, Role.AGENT if long_lived else Role.HOOK, "slurm")
    return NodeAgent(node, open_backend(config, node), Journal(config.node_dir / "journal", adopt_old_files=long_lived),
                     batch, config.job_dir, config.policy, config.atomize.checkpoint_margin_s,
                     lock_wait_s=None if long_lived else SLOW_PATH_LOCK_WAIT_S,
                     fence=open_fence(config, node))  # fmt: skip


def _slurm_agent(argv: list[str]) -> int:
    from mig_batch.node.service import AgentServer, serve

    def own_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--node", default=short_host_name(),
                            help="this node's Slurm NodeName (default: the short host name)")  # fmt: skip

    args = parse_daemon_args("mig-batch-agent", "mig_batch node agent for a Slurm node", argv, own_options)
    config = load_config(args.config)
    agent = slurm_node_agent(config, args.node, long_lived=True)
    serve(AgentServer(config.agent_socket, agent), agent, config.reconcile_interval_s,
          config.metrics_textfile.replace("{node}", args.node))  # fmt: skip
    return 0


def slurm_hook_main(argv: Sequence[str] | None = None) -> int:
    """``python -m mig_batch.slurm.hooks prolog|epilog``: the hook's work in this process (the agent is down);
    ``... agent [flags]``: the agent, as ``mig-batch-agent``. A hook never fails: that would drain the node."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["agent"]:
        return slurm_agent_main(args[1:])
    if not args or args[0] not in HOOK_OPS:
        print(f"usage: python -m mig_batch.slurm.hooks {'|'.join(HOOK_OPS)}|agent", file=sys.stderr)
        return 0
    from mig_batch.slurm.hooks import hook_job, run_hook

    try:
        job, node = hook_job(os.environ)
        print(run_hook(slurm_node_agent(load_config(), node, long_lived=False), args[0], job))
    except Exception as exc:  # never fail a hook: that drains the node
        print(f"mig-batch {args[0]}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


def htcondor_agent_main(argv: Sequence[str] | None = None) -> int:
    """``mig-batch-htcondor-agent``: the node agent of an HTCondor execute node (root, systemd)."""
    return run_guarded(_htcondor_agent, argv, "mig-batch-htcondor-agent")


def _htcondor_agent(argv: list[str]) -> int:
    from mig_batch.htcondor.adapter import HTCondorBatch
    from mig_batch.htcondor.node import SlotGuard
    from mig_batch.htcondor.server import WrapperServer, raise_open_files_limit
    from mig_batch.node.agent import NodeAgent
    from mig_batch.node.journal import Journal
    from mig_batch.node.service import serve

    def own_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--node", default=short_host_name(),
                            help="this node's MigBatchNodeName (default: the short host name)")  # fmt: skip
        parser.add_argument("--startd-local-name", default="",
                            help="the -local-name of this node's startd when several run on one host")  # fmt: skip

    args = parse_daemon_args("mig-batch-htcondor-agent", "mig_batch node agent for an HTCondor execute node", argv,
                             own_options)  # fmt: skip
    raise_open_files_limit()
    config = load_config(args.config)
    batch = open_batch_system(config, Role.AGENT, "htcondor")
    assert isinstance(batch, HTCondorBatch)  # the slot guard asks the schedd HTCondor's own questions
    node_dir = Path(str(config.node_dir).format(node=args.node))
    journal = Journal(node_dir / "journal", adopt_old_files=True)
    agent = NodeAgent(args.node, open_backend(config, args.node), journal, batch,
                      Path(str(config.job_dir).format(node=args.node)), config.policy,
                      config.atomize.checkpoint_margin_s, fence=open_fence(config, args.node))  # fmt: skip
    guard = SlotGuard(batch, args.node, args.startd_local_name, directory=node_dir / "slots", journal=journal)
    server = WrapperServer(Path(str(config.agent_socket).format(node=args.node)), agent, guard)
    serve(server, agent, config.reconcile_interval_s, config.metrics_textfile.replace("{node}", args.node))
    return 0
