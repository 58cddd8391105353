"""The batch-system protocol and its neutral records.

A batch system holds the jobs; mig_batch adds where each managed job's MIG instance goes. The
controller sees jobs as :class:`BatchJob` and acts through :class:`BatchSystem` only: pin a held job
to a node with its placement (an operator-only field), release it, requeue-hold it, cancel it, submit
one. Nodes publish their agent's state the same way (:class:`NodeStatus`). Every adapter error is a
:class:`BatchError` that names the command and the batch system's message.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from mig_batch.errors import MigBatchError

MANAGED_PREFIX = "mig-batch:"


class BatchError(MigBatchError, RuntimeError):
    """A batch-system call failed; the message names the call and the batch system's answer."""


class JobState(enum.StrEnum):
    HELD = "held"  # pending and not eligible until released (mig_batch's managed jobs wait here)
    PENDING = "pending"
    RUNNING = "running"  # running or completing: its instance is in use
    FINISHED = "finished"


class Awaits(enum.StrEnum):
    """What a job waits for of another before the batch system may start it."""

    START = "start"  # that it started (or ended)
    END = "end"  # that it ended, however
    SUCCESS = "success"  # that it completed
    FAILURE = "failure"  # that it ended otherwise
    NEVER = "never"  # nothing: the batch system found it can never be met


@dataclass(frozen=True)
class After:
    """Another job this one depends on (Slurm's ``--dependency=afterok:<job>`` and the like)."""

    job_id: str  # as the batch system names it to users (Slurm: 12, an array's task 12_3, every task 12_*)
    awaits: Awaits
    delay_s: float = 0.0  # START: that long after it started (Slurm's after:<job>+<minutes>)
    array: str = ""  # a job array's id: what is awaited is its ``task``, or every task (None)
    task: int | None = None


@dataclass(frozen=True)
class BatchJob:
    job_id: str
    state: JobState
    admin_tag: str  # the operator-only field: mig_batch's tag, its placement and the node's report
    user_id: int = -1
    node: str = ""  # where it runs (Slurm: its first node)
    nodes: tuple[str, ...] = ()  # every node it holds, node first (Slurm: its NodeList expanded); (): node alone
    submit_time: float = 0.0
    start_time: float = 0.0  # when it started (epoch s); 0 before
    end_time: float = 0.0  # running: start + time limit (epoch s); 0 when unknown
    time_limit_s: float = math.inf
    exit_status: int = 0  # the script's exit status, 128 + N when signal N ended it
    outcome: str = ""  # how it finished, in the batch system's words (COMPLETED, CANCELLED, ...)
    reason: str = ""  # why it waits, in the batch system's words
    cpus: int = 1  # CPUs it asked for: a node without them idle cannot start it
    held_by_user: bool = False  # held by its owner or an operator, not by mig_batch: left held until they release it
    partitions: tuple[str, ...] = ()  # where it may run (Slurm: its partitions); (): anywhere
    not_before: float = 0.0  # the batch system starts it no sooner (epoch s; Slurm's --begin); 0: no such time
    after: tuple[After, ...] = ()  # the jobs it depends on, all of them (one of several alternatives: none)
    array: str = ""  # the id of the job array this record belongs to ("": none)
    array_tasks: tuple[range, ...] = ()  # the array's tasks this record stands for (Slurm: one running, or all pending)
    array_limit: int = 0  # how many of the array's tasks may run at once (Slurm's --array=...%N); 0: no limit

    @property
    def task_count(self) -> int:
        """How many of its array's tasks this record stands for (1 for a job that is no array's)."""
        return sum(len(r) for r in self.array_tasks) if self.array_tasks else 1

    def on(self, node: str) -> bool:
        """Whether it holds ``node`` (one of several too)."""
        return node in self.nodes if self.nodes else node == self.node

    @property
    def managed(self) -> bool:
        return self.admin_tag.startswith(MANAGED_PREFIX)

    @property
    def held(self) -> bool:
        return self.state is JobState.HELD

    @property
    def running(self) -> bool:
        return self.state is JobState.RUNNING

    @property
    def finished(self) -> bool:
        return self.state is JobState.FINISHED

    @property
    def succeeded(self) -> bool:
        return self.finished and self.outcome == "COMPLETED"

    @property
    def exited_special(self) -> bool:
        """Held after an exit its job asked to be requeued on (Slurm's SPECIAL_EXIT): not finished, yet a
        dependency on its failure (afternotok) is met."""
        return self.outcome == "SPECIAL_EXIT"

    @property
    def cancelled(self) -> bool:
        return self.finished and self.outcome == "CANCELLED"

    @property
    def order(self) -> tuple[float, int]:
        """Queue order: submission time, then the job number."""
        return self.submit_time, int(self.job_id.split("_")[0].split(".")[0])


class Unanswered(str):
    """A failure message of a call the batch system gave no answer to (a timeout, a lost connection): its
    fate is unknown, so it is not a refusal of the job."""


@dataclass(frozen=True)
class NodeStatus:
    node: str
    up: bool  # the batch system can run jobs there (not down, not failing)
    agent_tag: str = ""  # what the node's agent published (see tags.NodeAgentTag)
    cpus_idle: int | None = None  # CPUs no job holds now; None: the batch system does not say
    cpus_total: int | None = None  # the node's CPUs, held or not; None: the batch system does not say
    partitions: tuple[str, ...] = ()  # the node's partitions (Slurm); (): the batch system has none


@dataclass(frozen=True)
class Pin:
    """A decided job for the batch system: node, operator-only tag, and (subjobs) a time limit."""

    job_id: str
    node: str
    admin_tag: str
    time_limit_min: int | None = None
    slices: int = 0  # memory slices the MIG instance holds, for the batch system's accounting; 0: none


@runtime_checkable
class SplitsArrays(Protocol):
    """A batch system whose record can stand for several pending tasks of a job array (Slurm): those tasks
    share one record until some are split off into records of their own, each then a job like any other."""

    def split_array(self, job: BatchJob, tasks: Sequence[int]) -> None:
        """Split ``tasks`` of ``job`` (a record of several pending tasks) off into records of their own, held
        and tagged as ``job`` is. ``BatchError`` when the batch system refuses or does not answer."""


class BatchSystem(Protocol):
    def jobs(self) -> list[BatchJob]: ...

    def job(self, job: str) -> BatchJob | None:
        """One job (a node agent reading its decision); None when the batch system no longer knows it."""

    def jobs_named(self, jobs: Collection[str]) -> dict[str, BatchJob | None]:
        """Each of ``jobs`` (the ids a node agent journaled, for its reconcile): its record, or None when the
        batch system no longer shows the job; an id that is not one of this batch system's is left out.
        ``BatchError`` when it does not answer."""

    def nodes(self) -> list[NodeStatus]: ...

    def pin_and_release(self, pins: Sequence[Pin]) -> Mapping[str, str]:
        """Pin each job to its node with its tag, and release the ones pinned; the jobs that failed,
        with the batch system's message (they stay held; the caller retries)."""

    def release(self, jobs: Sequence[str]) -> None: ...

    def requeue_hold(self, job: str, reason: str) -> None:
        """Back to the queue, held by an operator (the user cannot release it around the controller)."""

    def hold(self, job: str) -> None:
        """Hold a pending job (it waits for the controller's next decision)."""

    def cancel(self, job: str) -> None: ...

    def set_job_tag(self, job: str, admin_tag: str) -> None:
        """Rewrite a job's operator-only tag (the node's report goes back this way)."""

    def set_node_tag(self, node: str, agent_tag: str) -> None:
        """Publish what a node's agent reports about the node."""

    def submit(self, argv: Sequence[str], script: str | None = None) -> str:
        """Submit a job (the batch system's own submit arguments, the script on stdin); its id."""
