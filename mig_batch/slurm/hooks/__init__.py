"""Slurm's side of the node agent: the hooks' slow path (the agent service's main and the wiring of a Slurm
node's agent are in :mod:`mig_batch.cli.daemons`, with the other daemons').

The Prolog and Epilog (the compiled hook client, or shims that run it or the standard-library Python
one) ask the node's agent (``mig-batch-agent``, a root service holding the GPUs open). When the agent is
down, the client runs ``python -I -m mig_batch.slurm.hooks prolog|epilog``: the same
:class:`~mig_batch.node.agent.NodeAgent` work in this process. Here only Slurm's environment is mapped
onto the agent's request; the decision and the report travel through the job's AdminComment
(operator-only), never through a shared file.
"""

from __future__ import annotations

from collections.abc import Mapping

from mig_batch.node.agent import NodeAgent

# how long the slow path waits for the node agent to finish its GPU work: well within its hook client's
# 120 s, so that a Prolog can still report the requeue
SLOW_PATH_LOCK_WAIT_S = 60.0


def hook_job(env: Mapping[str, str]) -> tuple[str, str]:
    """The job and the node a Prolog or Epilog runs for, from slurmd's environment."""
    return env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")


def run_hook(agent: NodeAgent, op: str, job: str) -> str:
    """The hook's work (``op``: prolog or epilog) in this process (the agent is down); what happened, in words."""
    if op == "prolog":
        result = agent.prolog(job)
        return result.problem or (result.report.text() if result.report else "nothing to do")
    return agent.epilog(job)
