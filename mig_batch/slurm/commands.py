"""The Slurm side of the batch-system seam, over Slurm's commands (squeue/sinfo one line per record, scontrol,
sbatch, scancel): thin, no decisions.

pyslurm has no release for Slurm 22.05, so the CLI is the adapter. Every call has a timeout and
raises :class:`SlurmError` (a ``BatchError``) with the command and Slurm's message. Pins go to one
``scontrol`` process per pass (its commands on stdin), not one process per job.
"""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mig_batch.batch.system import BatchError, BatchJob, JobState, NodeStatus, Pin
from mig_batch.slurm.session import ScontrolSession, SessionBroken, SessionError

# REVOKED: a federated job's record on a cluster where a sibling runs instead; it never runs here
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "REVOKED"}  # fmt: skip
NODE_UP = {"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "PLANNED"}
NODE_TROUBLE = {"NOT_RESPONDING", "DRAIN", "FAIL", "POWERED_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED"}
log = logging.getLogger("mig-batch")
_FAILED_JOB = re.compile(r"for job (\d+)")
_STDIN_SAFE = re.compile(r"[!#-&(-~]{0,999}")  # printable ASCII but blanks and quotes, under 1000 characters
# Every job of this cluster in any state. --local: a one-job read (the agent's, per job) skips the
# federation read slurmctld would otherwise answer first.
SQUEUE_ARGS = ("--local", "-h", "-t", "all")
PIN_CHUNK = 16  # pins per scontrol process: released as soon as their chunk is pinned


class SlurmError(BatchError):
    pass


def job_state(state: str, priority: int) -> JobState:
    if state in FINISHED:
        return JobState.FINISHED
    if state in ("RUNNING", "COMPLETING", "SUSPENDED"):
        return JobState.RUNNING
    return JobState.HELD if state == "PENDING" and priority == 0 else JobState.PENDING


def _exit_status(wait_status: int) -> int:
    """squeue's exit code is a wait status: exit status << 8 | signal."""
    return 128 + (wait_status & 0x7F) if wait_status & 0x7F else wait_status >> 8


# One line per job, admin_comment last so that it may hold any character; epoch times through
# SLURM_TIME_FORMAT. squeue --json is ~4 KB a job and ignores --jobs in 22.05: too slow to poll.
FIELDS = ("JobID", "State", "PriorityLong", "UserID", "NodeList", "SubmitTime", "StartTime", "EndTime",
          "TimeLimit", "exit_code", "Reason", "NumCPUs", "admin_comment")  # fmt: skip
FORMAT = ",".join(f"{f}:|" for f in FIELDS)


def parse_job_line(line: str) -> BatchJob:
    """One line of ``squeue -h -O FORMAT`` as a ``BatchJob``."""
    f = line.split("|", len(FIELDS) - 1)
    if len(f) != len(FIELDS):
        raise SlurmError(f"squeue printed an unexpected line: {line!r}")
    job_id, state, priority, uid, nodes, submit, start, end, limit, exit_code, reason, cpus, comment = f
    comment = comment[:-1] if comment.endswith("|") else comment
    pending = state == "PENDING"  # its start time is a forecast
    return BatchJob(
        job_id=job_id,
        state=job_state(state, _int(priority)),
        admin_tag="" if comment == "(null)" else comment,
        user_id=_int(uid, -1),
        node=nodes,
        submit_time=float(_int(submit)),
        start_time=0.0 if pending else float(_int(start)),
        end_time=0.0 if pending else float(_int(end)),
        time_limit_s=_limit_s(limit),
        exit_status=_exit_status(_int(exit_code)),
        outcome=state,
        reason=reason,
        cpus=max(1, _int(cpus, 1)),
    )


NODE_FIELDS = ("NodeList", "StateComplete", "CPUsState", "Comment")  # the comment last: any character
NODE_FORMAT = ",".join(f"{f}:|" for f in NODE_FIELDS)


def parse_node_line(line: str) -> NodeStatus:
    """One line of ``sinfo -h -N -O NODE_FORMAT``: ``n1|idle+drain|0/0/16/16|<comment>|``."""
    f = line.split("|", len(NODE_FIELDS) - 1)
    if len(f) != len(NODE_FIELDS):
        raise SlurmError(f"sinfo printed an unexpected line: {line!r}")
    name, state, cpus, comment = f
    comment = comment[:-1] if comment.endswith("|") else comment
    base, *flags = state.upper().rstrip("*~#!%$@^-").split("+")
    counts = cpus.split("/")  # allocated/idle/other/total
    return NodeStatus(name, base in NODE_UP and not set(flags) & NODE_TROUBLE, "" if comment == "(null)" else comment,
                      _int(counts[1], 0) if len(counts) == 4 else None)  # fmt: skip


def _int(text: str, default: int = 0) -> int:
    try:
        return int(text)
    except ValueError:  # N/A, NONE, Unknown
        return default


def _limit_s(text: str) -> float:
    """squeue's [days-][hh:]mm:ss time limit in seconds; UNLIMITED, INVALID and the like: inf."""
    days, _, clock = text.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        seconds = sum(v * m for v, m in zip(reversed(parts), (1, 60, 3600), strict=False))
        return (int(days) if days else 0) * 86400.0 + seconds
    except ValueError:
        return math.inf


class GroupCommit:
    """Concurrent calls combined into one run: a caller that finds no run under way runs everything queued
    by then, its own item included; the others wait for that run, or lead the next. ``run`` returns the
    errors by position in the batch. Each caller gets its own item's error."""

    def __init__(self, run: Callable[[list], dict[int, Exception]]):
        self._run, self._cond = run, threading.Condition()
        self._queue: list[list] = []  # [item, done, error]
        self._running = False

    def submit(self, item: object) -> None:
        slot = [item, False, None]
        with self._cond:
            self._queue.append(slot)
            while self._running and not slot[1]:
                self._cond.wait()
            if not slot[1]:  # no run under way: this caller runs the queue
                batch, self._queue, self._running = self._queue, [], True
        if not slot[1]:
            errors: dict[int, Exception] = {}
            try:
                errors = self._run([s[0] for s in batch])
            except BaseException as exc:  # every caller of the batch learns it failed
                shared = exc if isinstance(exc, Exception) else RuntimeError(f"the batch was interrupted: {exc!r}")
                errors = dict.fromkeys(range(len(batch)), shared)
                if shared is not exc:
                    raise
            finally:
                with self._cond:
                    for i, s in enumerate(batch):
                        s[1], s[2] = True, errors.get(i)
                    self._running = False
                    self._cond.notify_all()
        if slot[2] is not None:
            raise slot[2]


class SlurmCli:
    """:class:`~mig_batch.batch.system.BatchSystem` over Slurm's command-line tools."""

    def __init__(self, bin_dir: str = "", env: dict[str, str] | None = None, timeout: float = 30,
                 slice_gres: str = "", session: bool = False):  # fmt: skip
        """``session``: updates go through one long-lived scontrol (for a long-lived caller: the node agent)."""
        self.bin_dir, self.env, self.timeout = bin_dir, env, timeout
        self.slice_gres = slice_gres  # the GRES a pin sets to the job's MIG slices ("": none)
        self._session = ScontrolSession(self._exe("scontrol"), env, timeout) if session else None
        # a node's Prologs report at once in a burst: one scontrol process for all of them (~3 ms of CPU each)
        self._job_tags = GroupCommit(self._set_job_tags)

    def _exe(self, command: str) -> str:
        return str(Path(self.bin_dir) / command) if self.bin_dir else command

    def _run(self, command: str, *args: str, stdin: str | None = None, check: bool = True,
             time_format: str | None = None) -> str:  # fmt: skip
        exe = self._exe(command)
        env = dict(self.env or os.environ)
        if time_format is not None:
            env["SLURM_TIME_FORMAT"] = time_format
        try:
            proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=self.timeout, input=stdin,
                                  env=env)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{command} {' '.join(args)}: {exc}") from None
        if check and proc.returncode != 0:
            raise SlurmError(f"{command} {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout if check else proc.stderr

    def _squeue(self, *args: str) -> list[BatchJob]:
        out = self._run("squeue", *SQUEUE_ARGS, "-O", FORMAT, *args, time_format="%s")
        return [parse_job_line(line) for line in out.splitlines() if line.strip()]

    def jobs(self) -> list[BatchJob]:
        return self._squeue()

    def nodes(self) -> list[NodeStatus]:
        """Every node once (sinfo -N lists a node once per partition)."""
        out = self._run("sinfo", "-h", "-N", "-O", NODE_FORMAT)
        return list({n.node: n for n in map(parse_node_line, filter(str.strip, out.splitlines()))}.values())

    def pin_and_release(self, pins: Sequence[Pin]) -> dict[str, str]:
        """Pin and release in chunks: each chunk is one ``scontrol`` process with its pins on stdin, then one
        release of those it pinned, so that a job is released as soon as its chunk is pinned and the first
        jobs of a long pass start while the rest are pinned."""
        if not pins:
            return {}
        tres = self._tres_per_node([p.job_id for p in pins if p.slices]) if self.slice_gres else {}
        failed: dict[str, str] = {}
        for i in range(0, len(pins), PIN_CHUNK):
            failed.update(self._pin_chunk(pins[i : i + PIN_CHUNK], tres))
        return failed

    def _pin_chunk(self, pins: Sequence[Pin], tres: dict[str, str]) -> dict[str, str]:
        updates = []
        for p in pins:
            args = [f"jobid={p.job_id}", f"nodelist={p.node}", f"admincomment={p.admin_tag}"]
            if p.time_limit_min is not None:
                args += [f"timelimit={p.time_limit_min}", "starttime=now"]
            if p.job_id in tres:  # Slurm counts the slices: sacct, fair-share and QOS/association limits see them
                args.append(f"tresPerNode={with_slices(tres[p.job_id], self.slice_gres, p.slices)}")
            updates.append((p.job_id, args))
        failed = self._update_jobs(updates)
        pinned = [p.job_id for p in pins if p.job_id not in failed]
        try:
            self.release(pinned)
        except SlurmError as exc:
            failed.update({job: str(exc) for job in pinned})
        return failed

    def _update_jobs(self, updates: Sequence[tuple[str, list[str]]]) -> dict[str, str]:
        """``scontrol update`` for several jobs: the jobs whose update failed, with Slurm's message. Through
        the session when there is one, else several through one scontrol process (its stdin); one alone, or
        one with a value scontrol would not keep verbatim on stdin, through its own."""
        failed: dict[str, str] = {}
        batched, alone = [], []
        for update in updates:
            (batched if all(map(stdin_safe, update[1])) else alone).append(update)
        if self._session is not None:
            batched = self._updates_in_session(batched, failed)
        if len(batched) == 1:
            alone, batched = alone + batched, []
        for job, args in alone:
            try:
                self._run("scontrol", "update", *args)
            except SlurmError as exc:
                failed[job] = str(exc)
        if batched:
            failed.update(self._updates_on_stdin(batched))
        return failed

    def _updates_in_session(self, updates: list[tuple[str, list[str]]],
                            failed: dict[str, str]) -> list[tuple[str, list[str]]]:  # fmt: skip
        """Updates through the session within one deadline, their failures into ``failed``; those for a
        process of their own are returned (see :meth:`_session_update`)."""
        deadline = time.monotonic() + self.timeout
        for i, (job, args) in enumerate(updates):
            try:
                answer = self._session_update(args, deadline)
            except SessionError as exc:  # no answer in time: Slurm is not answering, the rest would wait too
                failed.update({j: str(exc) for j, _ in updates[i:]})
                return []
            if answer is None:
                return updates[i:]
            if answer:
                failed[job] = answer
        return []

    def _session_update(self, args: list[str], deadline: float | None = None) -> str | None:
        """One ``update`` through the session: "" done, Slurm's error naming the job, or None for a process of
        its own (no usable session, a value it would alter, the session broke before sending, or an error that
        names no job: a session gone stale, and a process reads slurm.conf again). Raises
        :class:`SessionError` when the update's fate is unknown (no answer by ``deadline``)."""
        if self._session is None or not self._session.usable or not all(map(stdin_safe, args)):
            return None
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        try:
            answer = self._session.run(f"update {' '.join(args)}", left)
        except SessionBroken:
            return None  # never sent: sending it again is safe
        if answer and _FAILED_JOB.search(answer) is None:
            log.info("scontrol session answered %r to %s; sent through a process of its own", answer, args[0])
            self._session.close()
            return None
        return answer

    def _updates_on_stdin(self, updates: Sequence[tuple[str, list[str]]]) -> dict[str, str]:
        """``update`` commands for several jobs through one scontrol process (its stdin): the jobs whose
        update failed, with Slurm's message. An error scontrol does not attribute to a job fails them all."""
        lines = "".join(f"update {' '.join(args)}\n" for _, args in updates)
        try:
            errors = self._run("scontrol", stdin=lines, check=False)
        except SlurmError as exc:
            return {job: str(exc) for job, _ in updates}
        failed = {}
        for line in errors.splitlines():
            match = _FAILED_JOB.search(line)
            if match:
                failed[match.group(1)] = line.strip()
            elif line.strip():  # an error scontrol did not attribute to a job: trust none of them
                return {job: f"scontrol: {line.strip()}" for job, _ in updates}
        return failed

    def _tres_per_node(self, jobs: Sequence[str]) -> dict[str, str]:
        """Each job's TresPerNode now ("" for none): the pin replaces the whole list, so it keeps the rest."""
        if not jobs:
            return {}
        out = self._run("squeue", *SQUEUE_ARGS, "-j", ",".join(jobs), "-O", "JobID:|,tres-per-node:|")
        found = {}
        for line in out.splitlines():
            job, _, tres = line.partition("|")
            tres = tres.rstrip("|").strip()
            found[job.strip()] = "" if tres in ("N/A", "(null)") else tres
        return {j: found.get(j, "") for j in jobs}

    def release(self, jobs: Sequence[str]) -> None:
        """Release held jobs, one scontrol call for many."""
        for i in range(0, len(jobs), 200):
            self._run("scontrol", "release", ",".join(jobs[i : i + 200]))

    def requeue_hold(self, job: str, reason: str = "") -> None:
        self._run("scontrol", "requeuehold", job)
        self.hold(job)

    def hold(self, job: str) -> None:
        self._run("scontrol", "hold", job)

    def cancel(self, job: str) -> None:
        self._run("scancel", job)

    def set_job_tag(self, job: str, admin_tag: str) -> None:
        """Thread-safe; concurrent calls share one ``scontrol`` process."""
        self._job_tags.submit((job, admin_tag))

    def _set_job_tags(self, tags: list[tuple[str, str]]) -> dict[int, Exception]:
        failed = self._update_jobs([(job, [f"jobid={job}", f"admincomment={tag}"]) for job, tag in tags])
        return {i: SlurmError(failed[job]) for i, (job, _) in enumerate(tags) if job in failed}

    def set_node_tag(self, node: str, agent_tag: str) -> None:
        args = [f"nodename={node}", f"comment={agent_tag}"]
        try:
            if self._session_update(args) is not None:  # a node's error names no job: it comes back as None
                return
        except SessionError as exc:
            raise SlurmError(str(exc)) from None
        self._run("scontrol", "update", *args)

    def job(self, job: str) -> BatchJob | None:
        """One job (the node agent's read of its decision), None when Slurm no longer knows it."""
        try:
            found = [j for j in self._squeue("-j", job) if j.job_id == job]
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        return found[0] if found else None

    def submit(self, argv: Sequence[str], script: str | None = None) -> str:
        """``sbatch --parsable`` with ``argv`` (the script on stdin when given); returns the job id."""
        out = self._run("sbatch", "--parsable", *argv, stdin=script).strip()
        return out.split(";")[0]


def with_slices(tres_per_node: str, gres: str, slices: int) -> str:
    """``tres_per_node`` (Slurm's ``gres:name[:type]:count,...``) with ``gres`` set to ``slices``; every other
    item kept as it was."""
    items = [t for t in tres_per_node.split(",") if t and t.split(":")[:2] != ["gres", gres]]
    return ",".join([*items, f"gres:{gres}:{slices}"])


def stdin_safe(arg: str) -> bool:
    """Whether ``key=value`` reaches Slurm unchanged as a word of an scontrol command read from stdin:
    scontrol splits such lines at blanks and keeps quotes in values, drops a line of 4 KiB, and its readline
    may alter control and non-ASCII characters."""
    return _STDIN_SAFE.fullmatch(arg) is not None
