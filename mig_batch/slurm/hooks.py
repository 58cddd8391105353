"""Slurm's side of the node agent: the agent service for a Slurm node, and the hooks' slow path.

The Prolog and Epilog (the compiled hook client, or shims that run it or the standard-library Python
one) ask the node's agent (``mig-batch-agent``, a root service holding the GPUs open). When the agent is
down, the client runs ``python -I -m mig_batch.slurm.hooks prolog|epilog``: the same
:class:`~mig_batch.node.agent.NodeAgent` work in this process. Here only Slurm's environment is mapped
onto the agent's request; the decision and the report travel through the job's AdminComment
(operator-only), never through a shared file.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence

from mig_batch.config import SiteConfig, load_config, open_backend, open_fence
from mig_batch.node.agent import NodeAgent
from mig_batch.node.journal import Journal
from mig_batch.slurm.commands import SlurmCli
from mig_batch.slurm.native import open_api

# how long the slow path waits for the node agent to finish its GPU work: well within its hook client's
# 120 s, so that a Prolog can still report the requeue
SLOW_PATH_LOCK_WAIT_S = 60.0


def make_agent(config: SiteConfig, node: str, long_lived: bool = False) -> NodeAgent:
    """The node's agent; ``long_lived`` (the service) keeps one scontrol open for its reports and makes its
    per-job Slurm calls through libslurm where the site built the helper (the slow path runs commands)."""
    api = open_api(config.slurm_library) if long_lived else None
    return NodeAgent(node, open_backend(config, node), Journal(config.node_dir / "journal", adopt_old_files=long_lived),
                     SlurmCli(config.slurm_bin, session=long_lived, api=api), config.job_dir, config.policy,
                     config.atomize.checkpoint_margin_s,
                     lock_wait_s=None if long_lived else SLOW_PATH_LOCK_WAIT_S,
                     fence=open_fence(config, node))  # fmt: skip


def slow_path(config: SiteConfig, op: str, env: Mapping[str, str]) -> str:
    """The hook's work in this process (the agent is down); what happened, in words."""
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    agent = make_agent(config, node)
    if op == "prolog":
        result = agent.prolog(job)
        return result.problem or (result.report.text() if result.report else "nothing to do")
    return agent.epilog(job)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["agent"]:
        return agent_main(args[1:])
    if not args or args[0] not in ("prolog", "epilog"):
        print("usage: python -m mig_batch.slurm.hooks prolog|epilog|agent", file=sys.stderr)
        return 0
    try:
        print(slow_path(load_config(), args[0], os.environ))
    except Exception as exc:  # never fail a hook: that drains the node
        print(f"mig-batch {args[0]}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 0


def agent_main(argv: Sequence[str] | None = None) -> int:
    """``mig-batch-agent``: the node agent of a Slurm node (run as root by systemd)."""
    from mig_batch.entry import run_guarded

    return run_guarded(_agent, argv, "mig-batch-agent")


def _agent(argv: list[str]) -> int:
    from mig_batch.entry import DEBUG_HELP, LOG_LEVELS, log_level
    from mig_batch.node.service import AgentServer, serve

    parser = argparse.ArgumentParser(prog="mig-batch-agent", description="mig_batch node agent for a Slurm node")
    parser.add_argument("--config", help="site config (default: MIG_BATCH_CONFIG or /etc/mig-batch/mig-batch.yaml)")
    parser.add_argument("--node", default=socket.gethostname().split(".")[0],
                        help="this node's Slurm NodeName (default: the short host name)")  # fmt: skip
    parser.add_argument("--log-level", type=log_level, default="INFO", help=f"one of {', '.join(LOG_LEVELS)}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config(args.config)
    agent = make_agent(config, args.node, long_lived=True)
    serve(AgentServer(config.agent_socket, agent), agent, config.reconcile_interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
