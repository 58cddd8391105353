"""An in-memory batch system (the seam's protocol), for unit tests of the controller's decisions.

Tests drive it like a scheduler would: :meth:`FakeBatch.add` a managed job (held, tagged as
job_submit.lua would tag it), let the controller pin and release it, then :meth:`start` it (the node
agent's report appended as a Prolog would) and :meth:`finish` it. ``refuse`` makes pins of the named
jobs fail as Slurm would refuse them, as are pins to a node outside the job's partitions.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from mig_batch.batch.system import (
    MANAGED_PREFIX,
    After,
    BatchError,
    BatchJob,
    BatchSystem,
    JobState,
    NodeStatus,
    Pin,
)
from mig_batch.batch.tags import NodeReport, parse_place, with_report

REQUEUE_BEGIN_S = 121.0  # how far Slurm moves a requeued job's begin time: its cred_expire (default 120 s) + 1


class FakeBatch:
    def __init__(self, nodes: Sequence[str], cpus_per_node: int | None = None,
                 partitions: Mapping[str, Sequence[str]] | None = None):  # fmt: skip
        """``partitions``: each node's (default: none, as a batch system without them)."""
        self._jobs: dict[str, BatchJob] = {}
        self._nodes = {n: NodeStatus(n, True, partitions=tuple((partitions or {}).get(n, ()))) for n in nodes}
        self.cpus_per_node = cpus_per_node  # None: CPUs unknown, as a batch system that does not say
        self.refuse: set[str] = set()
        self.calls: list[tuple[str, ...]] = []
        self.clock = 1_000.0
        self._next = 1
        self._slots_taken: set[str] = set()  # prompt slots job_submit.lua bound a job to (add_bound)

    # the protocol
    def jobs(self) -> list[BatchJob]:
        return list(self._jobs.values())

    def nodes(self) -> list[NodeStatus]:
        if self.cpus_per_node is None:
            return list(self._nodes.values())
        held: dict[str, int] = {}
        for j in self._jobs.values():
            if j.running:
                held[j.node] = held.get(j.node, 0) + j.cpus
        return [
            dataclasses.replace(n, cpus_idle=self.cpus_per_node - held.get(n.node, 0), cpus_total=self.cpus_per_node)
            for n in self._nodes.values()
        ]

    def pin_and_release(self, pins: Sequence[Pin]) -> dict[str, str]:
        failed = {}
        for p in pins:
            self.calls.append(("pin", p.job_id, p.node))
            job = self._jobs.get(p.job_id)
            if p.job_id in self.refuse or job is None or not job.held:
                failed[p.job_id] = f"Job is no longer pending execution for job {p.job_id}"
                continue
            node = self._nodes.get(p.node)
            outside = node is not None and node.partitions and not set(job.partitions) & set(node.partitions)
            if job.partitions and outside:
                failed[p.job_id] = f"Requested node configuration is not available for job {p.job_id}"
                continue
            timed = p.time_limit_min is not None  # a subjob's pin, which also starts it at once (StartTime=now)
            self._jobs[p.job_id] = dataclasses.replace(
                job, admin_tag=p.admin_tag, node=p.node, state=JobState.PENDING,
                time_limit_s=p.time_limit_min * 60.0 if p.time_limit_min is not None else job.time_limit_s,
                not_before=0.0 if timed else job.not_before)  # fmt: skip
        return failed

    def release(self, jobs: Sequence[str]) -> None:
        for job in jobs:
            self.calls.append(("release", job))
            self._set(job, state=JobState.PENDING)

    def requeue_hold(self, job: str, reason: str = "") -> None:
        self.calls.append(("requeue_hold", job))  # a job its owner holds stays theirs (HTCondor: already held)
        self._set(job, state=JobState.HELD, start_time=0.0, end_time=0.0, **self._requeue_begin(job))

    def hold(self, job: str) -> None:
        self.calls.append(("hold", job))
        self._set(job, state=JobState.HELD)

    def cancel(self, job: str) -> None:
        self.calls.append(("cancel", job))
        if job in self._jobs and not self._jobs[job].finished:
            self._set(job, state=JobState.FINISHED, outcome="CANCELLED")

    def set_job_tag(self, job: str, admin_tag: str) -> None:
        self.calls.append(("set_job_tag", job))
        self._set(job, admin_tag=admin_tag)

    def set_node_tag(self, node: str, agent_tag: str) -> None:
        self._nodes[node] = dataclasses.replace(self._nodes[node], agent_tag=agent_tag)

    def submit(self, argv: Sequence[str], script: str | None = None) -> str:
        return self.add(" ".join(argv))

    def split_array(self, job: BatchJob, tasks: Sequence[int]) -> None:
        """As Slurm splits pending tasks off an array's record when they are updated apart from the rest;
        an update of every pending task changes the record itself and splits nothing."""
        self.calls.append(("split", job.job_id, *map(str, tasks)))
        record = self._jobs.get(job.job_id)
        if record is None or not record.held or job.job_id in self.refuse:
            raise BatchError(f"Job is no longer pending execution for job {job.job_id}")
        pending = [t for r in record.array_tasks for t in r]
        if not set(tasks) <= set(pending):
            raise BatchError(f"Invalid job id specified for job {job.job_id}_{tasks}")
        if set(tasks) == set(pending):
            return
        for task in tasks:
            new = str(self._next)
            self._next += 1
            self._jobs[new] = dataclasses.replace(record, job_id=new, array_tasks=(range(task, task + 1),),
                                                  array_limit=0)  # fmt: skip
        left = [t for t in pending if t not in set(tasks)]
        self._set(job.job_id, array_tasks=tuple(range(t, t + 1) for t in left))

    # the scheduler's side, for tests
    def add(self, tag: str, user_id: int = 1000, time_limit_s: float = 3600.0, cpus: int = 1,
            partitions: Sequence[str] = (), not_before: float = 0.0, after: Sequence[After] = (),
            job_id: str | None = None, array: str = "", array_tasks: Sequence[range] = (),
            array_limit: int = 0) -> str:  # fmt: skip
        """A job as submitted: held when ``tag`` is a managed job's (as job_submit.lua holds it), else pending.
        ``job_id``: the record's id (default: the next number; Slurm gives an array's pending tasks one record
        with the array's id, and each started task a record of its own), ``array`` and ``array_tasks``: the
        array and its tasks the record stands for, ``array_limit`` its %N."""
        job = job_id or str(self._next)
        self._next += 1
        self.clock += 1
        state = JobState.HELD if tag.startswith(MANAGED_PREFIX) else JobState.PENDING
        self._jobs[job] = BatchJob(job, state, tag, user_id, submit_time=self.clock, time_limit_s=time_limit_s,
                                   cpus=cpus, partitions=tuple(partitions), not_before=not_before,
                                   after=tuple(after), array=array, array_tasks=tuple(array_tasks),
                                   array_limit=array_limit)  # fmt: skip
        return job

    def add_bound(self, tag: str, slots_file: Path, cpus: int = 1, partitions: Sequence[str] = ()) -> str:
        """A job as job_submit.lua submits it with prompt slots: bound to the first slot of its request in
        ``slots_file`` that no job took yet and whose node fits it (pending there, not held), else as :meth:`add`."""
        lines = slots_file.read_text().splitlines()[1:] if slots_file.exists() else []
        for line in lines:
            slot, request, node, gpu, profile, start, room, parts = line.split(" ")
            fits = room == "-" or cpus <= int(room)
            if request != tag or slot in self._slots_taken or not fits:
                continue
            if parts != "-" and partitions and not set(parts.split(",")) & set(partitions):
                continue
            self._slots_taken.add(slot)
            job = self.add(tag, cpus=cpus, partitions=partitions)
            self._set(job, state=JobState.PENDING, node=node,
                      admin_tag=f"{tag};place={node}/{gpu}/{profile}@{start};slot={slot}")  # fmt: skip
            return job
        return self.add(tag, cpus=cpus, partitions=partitions)

    def job(self, job: str) -> BatchJob | None:
        return self._jobs.get(job)

    def jobs_named(self, jobs: Collection[str]) -> dict[str, BatchJob | None]:
        """As Slurm's adapter: one question a job."""
        return {job: self.job(job) for job in jobs}

    def start(self, job: str, report: NodeReport | None = None, node: str | None = None) -> None:
        """The scheduler starts a released job on its pinned node (or ``node``: its owner moved it after the
        release; an unmanaged job: there); the Prolog's report, if given."""
        j = self._jobs[job]
        if j.state is not JobState.PENDING or (j.managed and parse_place(j.admin_tag) is None):
            raise BatchError(f"job {job} is not released with a placement ({j.state}, {j.admin_tag!r})")
        tag = with_report(j.admin_tag, report) if report is not None else j.admin_tag
        self._set(job, state=JobState.RUNNING, start_time=self.clock, end_time=self.clock + j.time_limit_s,
                  admin_tag=tag, node=node or j.node)  # fmt: skip

    def finish(self, job: str, exit_status: int = 0, outcome: str = "COMPLETED") -> None:
        self._set(job, state=JobState.FINISHED, exit_status=exit_status, outcome=outcome)

    def forget(self, job: str) -> None:
        """The batch system purged the job's record."""
        self._jobs.pop(job, None)

    def set_node_up(self, node: str, up: bool) -> None:
        self._nodes[node] = dataclasses.replace(self._nodes[node], up=up)

    def user_hold(self, job: str, held: bool = True) -> None:
        """The job's owner holds it (a running job is vacated) or, with ``held=False``, releases it: a
        released managed job waits unpinned, as the controller's own hold leaves it."""
        if held:
            self._set(job, state=JobState.HELD, held_by_user=True, start_time=0.0, end_time=0.0)
        else:
            self._set(job, state=JobState.HELD, held_by_user=False)

    def requeue(self, job: str) -> None:
        """The batch system requeued a running job (its node failed): pending again, not held."""
        self._set(job, state=JobState.PENDING, start_time=0.0, end_time=0.0, **self._requeue_begin(job))

    def _requeue_begin(self, job: str) -> dict[str, float]:
        """A job requeued (held or not) after it started, running or ended, does not start again before its
        credential's lifetime has passed: Slurm (batch_requeue_fini) moves a begin time not in the future that
        far ahead."""
        now = time.time()
        j = self._jobs.get(job)
        if j is not None and (j.running or j.finished) and j.not_before <= now:  # it started
            return {"not_before": now + REQUEUE_BEGIN_S}
        return {}

    def _set(self, job: str, **changes: Any) -> None:
        if job not in self._jobs:
            raise BatchError(f"Invalid job id specified for job {job}")
        self._jobs[job] = dataclasses.replace(self._jobs[job], **changes)


# The seam, checked statically: mypy (see pyproject.toml) fails here when a method of FakeBatch no longer matches
# BatchSystem's (a missing method, another signature or return type).
_SEAM_CHECK: type[BatchSystem] = FakeBatch
