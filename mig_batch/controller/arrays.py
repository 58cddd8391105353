"""Job arrays: tasks split off as they can run, each then a job like any other.

Slurm keeps an array's pending tasks in one record until some are updated apart from the rest, which splits
them off into records of their own (the array's id and their task number stay what users see: ``12_3``).
A record of several tasks is never placed or pinned: one placement would go to every task of it. Each pass
splits off the next few tasks, within the array's own limit (``--array=...%N``) and as long as fewer than
``SPLIT_AHEAD`` of its tasks wait undecided (more would only wait too); the next pass places them as jobs.
Slurm splits nothing when an update names every pending task, so the last task is left in the record, which
then stands for that one task and is placed as it is, once the array's limit leaves room for it.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from mig_batch.batch.states import DECIDABLE
from mig_batch.batch.system import BatchError, BatchJob, BatchSystem, SplitsArrays
from mig_batch.controller.snapshot import PassSnapshot
from mig_batch.controller.waits import why_not_yet
from mig_batch.state import Store

log = logging.getLogger("mig-batchd")
SPLIT_AHEAD = 32  # an array's split-off tasks waiting undecided, at most
SPLITS_PER_PASS = 16  # arrays split a pass, at most (a call each) ...
SPLIT_BUDGET_S = 1.0  # ... and within this long: a pass places what waits first
CUT = 2**62  # an array's task list Slurm cut short runs on to here: no task of it is known


class ArrayTasks:
    def __init__(self, store: Store, batch: BatchSystem):
        self.store, self.batch = store, batch
        self._refused: dict[str, str] = {}  # each array's last refused split, by the batch system's message

    def held_back(self, snapshot: PassSnapshot) -> frozenset[str]:
        """The records not to place this pass: those of several tasks, and an array's own record of its last
        task while the array's limit is taken by its other tasks."""
        back = set()
        siblings: dict[str, list[BatchJob]] | None = None
        for j in snapshot.jobs.values():
            if not (j.array and j.managed and j.held):
                continue
            if several_tasks(j):
                back.add(j.job_id)
            elif j.array_limit:
                siblings = siblings if siblings is not None else _live_tasks(snapshot)
                if sum(1 for s in siblings[j.array] if s is not j and not s.held_by_user) >= j.array_limit:
                    back.add(j.job_id)
        return frozenset(back)

    def split(self, snapshot: PassSnapshot, errors: list[str]) -> int:
        """Split off the tasks that may be placed next; how many were split."""
        if not isinstance(self.batch, SplitsArrays):
            return 0
        several = [j for j in snapshot.jobs.values()
                   if several_tasks(j) and j.managed and j.held and not j.held_by_user]  # fmt: skip
        if not several:
            return 0
        siblings = _live_tasks(snapshot)
        self._refused = {a: why for a, why in self._refused.items() if any(j.array == a for j in several)}
        split, calls, deadline = 0, 0, time.monotonic() + SPLIT_BUDGET_S
        for record in sorted(several, key=lambda j: j.order):
            if calls == SPLITS_PER_PASS or time.monotonic() > deadline:
                break  # the next pass goes on
            if why_not_yet(record, snapshot.awaited, snapshot.now, begin=True) is not None:
                continue  # its tasks could not start yet: split records would only wait
            tasks = self.next_tasks(record, siblings[record.array])
            if not tasks:
                continue
            calls += 1
            try:
                self.batch.split_array(record, tasks)
            except BatchError as exc:  # the next pass tries again; said once while it keeps failing alike
                if self._refused.get(record.array) != str(exc):
                    self._refused[record.array] = str(exc)
                    errors.append(f"array {record.array}: splitting tasks {tasks[0]}-{tasks[-1]} off: {exc}")
                    log.warning("array %s: splitting tasks off failed: %s", record.array, exc)
                continue
            self._refused.pop(record.array, None)
            split += len(tasks)
        return split

    def next_tasks(self, record: BatchJob, siblings: list[BatchJob]) -> list[int]:
        """The array's lowest pending tasks that may be split off now (never all: see the module's text)."""
        active = [j for j in siblings if not j.held_by_user]
        waiting = sum(1 for j in active if j.held and self._undecided(j.job_id))
        room = SPLIT_AHEAD - waiting
        if record.array_limit:
            room = min(room, record.array_limit - len(active))
        room = min(room, record.task_count - 1)
        tasks: list[int] = []
        for run in record.array_tasks:
            if run.stop > CUT:  # named by no one: splitting made-up tasks could reach split ones
                continue
            for task in run:
                if len(tasks) >= room:
                    return tasks
                tasks.append(task)
        return tasks

    def _undecided(self, job: str) -> bool:
        d = self.store.decision(job)
        return d is None or d.state in DECIDABLE


def _live_tasks(snapshot: PassSnapshot) -> dict[str, list[BatchJob]]:
    """Each array's records of one task that have not finished."""
    live: dict[str, list[BatchJob]] = defaultdict(list)
    for j in snapshot.jobs.values():
        if j.array and not j.finished and not several_tasks(j):
            live[j.array].append(j)
    return live


def several_tasks(job: BatchJob) -> bool:
    """Whether ``job`` is a record of several pending tasks of an array (never placed as it is)."""
    return job.task_count > 1
