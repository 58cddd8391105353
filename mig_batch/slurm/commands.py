"""The Slurm side of the batch-system seam, over Slurm's commands (squeue/sinfo one record per job, scontrol,
sbatch, scancel): thin, no decisions.

pyslurm has no release for Slurm 22.05, so the CLI is the adapter. Every call has a timeout and
raises :class:`SlurmError` (a ``BatchError``) with the command and Slurm's message. The calls made once
per job (the agent's read of its decision, pins, releases, reports) go through libslurm when the site built
the helper library (:mod:`mig_batch.slurm.native`): one RPC each, no process. Without it, pins go to one
``scontrol`` process per chunk (its commands on stdin), not one process per job.
"""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

from mig_batch.batch.system import (
    After,
    Awaits,
    BatchError,
    BatchJob,
    BatchSystem,
    JobState,
    NodeStatus,
    Pin,
    Unanswered,
)
from mig_batch.slurm.native import SlurmApi, SlurmApiError
from mig_batch.slurm.session import ScontrolSession, SessionBroken, SessionError

# REVOKED: a federated job's record on a cluster where a sibling runs instead; it never runs here
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "REVOKED"}  # fmt: skip
NODE_UP = {"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "PLANNED"}
NODE_TROUBLE = {"NOT_RESPONDING", "DRAIN", "FAIL", "POWERED_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED"}
log = logging.getLogger("mig-batch")
_FAILED_JOB = re.compile(r"for job (\d+(?:_\d+)?)")
_STDIN_SAFE = re.compile(r"[!#-&(-~]{0,999}")  # printable ASCII but blanks and quotes, under 1000 characters
# Every job of this cluster in any state. --local: a one-job read (the agent's, per job) skips the
# federation read slurmctld would otherwise answer first.
SQUEUE_ARGS = ("--local", "-h", "-t", "all")
# An array's pending tasks with records of their own (requeued, held or updated alone) stay apart, as libslurm
# gives them, only with --array-unique (Slurm 22.05); without it squeue folds them back into the array's record
# and drops their records without saying so. 23.02 removed the option and still folds them: there, --array
# prints every task apart (a line each, pending ones under their record's id: fold_array_lines joins them).
ARRAY_UNIQUE = "--array-unique"
EVERY_TASK = "--array"
_REFUSE_ARRAY_UNIQUE: set[str] = set()  # the squeue binaries of this process that refused ARRAY_UNIQUE
# Settings of Slurm's commands read from the environment (SQUEUE_ARRAY, SQUEUE_USERS, SINFO_PARTITION, ...):
# they would change or filter the records mig_batch reads.
_COMMAND_SETTINGS = ("SQUEUE_", "SINFO_", "SCONTROL_")
PIN_CHUNK = 16  # pins per scontrol process: released as soon as their chunk is pinned
API_PAUSE_S = 60.0  # after libslurm could not reach slurmctld: Slurm's commands only, for this long


class SlurmError(BatchError):
    pass


@dataclass(frozen=True)
class JobUpdate:
    """One update of a job (``scontrol update``); None leaves a field as it is."""

    job_id: str
    nodes: str | None = None
    admin_comment: str | None = None
    time_limit_min: int | None = None
    start_now: bool = False
    tres_per_node: str | None = None

    def args(self) -> list[str]:
        """As scontrol's words."""
        args = [f"jobid={self.job_id}"]
        for key, value in (("nodelist", self.nodes), ("admincomment", self.admin_comment),
                           ("timelimit", self.time_limit_min), ("starttime", "now" if self.start_now else None),
                           ("tresPerNode", self.tres_per_node)):  # fmt: skip
            if value is not None:
                args.append(f"{key}={value}")
        return args

    def send(self, api: SlurmApi, release: bool = False) -> None:
        api.update_job(self.job_id, self.nodes, self.admin_comment, self.time_limit_min, self.start_now,
                       self.tres_per_node, release)  # fmt: skip

    @property
    def releasable_at_once(self) -> bool:
        """Whether a release may ride in the same RPC: slurmctld applies the TRES and the start time after it."""
        return self.tres_per_node is None and not self.start_now


# Slurm prints a job's state flag instead of its base state when one is set (job_state_string). These
# flags mean the job holds its node: allocated with its Prolog running (CONFIGURING, e.g. under
# PrologFlags=Alloc or Contain), stopped by a signal, being signalled or resized, staging out.
ON_ITS_NODE = {"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "SIGNALING", "RESIZING", "STAGE_OUT"}
# ... and these that it waits in the queue: being requeued, held by Slurm, staging in.
WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RESV_DEL_HOLD", "STAGE_IN"}


def job_state(state: str, priority: int) -> JobState:
    if state in FINISHED:
        return JobState.FINISHED
    if state in ON_ITS_NODE:
        return JobState.RUNNING
    return JobState.HELD if state in WAITING and priority == 0 else JobState.PENDING


def _exit_status(exit_code: str) -> int:
    """The shell's view of squeue's exit code (128 + the signal for a killed job). Slurm 22.05 prints the wait
    status (exit status << 8 | signal); 23.02 and later print ``EXIT:SIGNAL``, as scontrol does."""
    if ":" in exit_code:
        status, signal = (_int(part) for part in exit_code.split(":", 1))
        return 128 + signal if signal else status
    wait_status = _int(exit_code)
    return 128 + (wait_status & 0x7F) if wait_status & 0x7F else wait_status >> 8


# One record per job; epoch times through SLURM_TIME_FORMAT. squeue --json is ~4 KB a job and ignores --jobs
# in 22.05: too slow to poll. Two fields are free text, where Slurm or an administrator may write a "|" or a
# line break: the Reason (a job's state_desc: a failed Prolog's or burst buffer's message, ...), which ends
# with REASON_END, and the admin comment, last, which ends the record with RECORD_END and a newline.
FIELDS = ("JobID", "ArrayJobID", "ArrayTaskID", "State", "PriorityLong", "UserID", "NodeList", "SubmitTime",
          "StartTime", "EndTime", "TimeLimit", "exit_code", "Reason", "NumCPUs", "Partition", "EligibleTime",
          "Dependency", "admin_comment")  # fmt: skip
REASON_END = "\x1f"  # ASCII's unit separator
RECORD_END = "\x1e"  # ASCII's record separator
_ENDS = {"Reason": REASON_END, "admin_comment": RECORD_END}
FORMAT = ",".join(f"{f}:{_ENDS.get(f, '|')}" for f in FIELDS)
JOB_HEAD = re.compile(r"\d+\|\d+\|")  # JobID, ArrayJobID
_BEFORE_REASON = FIELDS.index("Reason")
_AFTER_REASON = len(FIELDS) - _BEFORE_REASON - 1


def records(text: str, head: re.Pattern[str]) -> list[str]:
    """squeue's or sinfo's records in ``text`` printed with FORMAT or NODE_FORMAT (not its lines: a field may
    hold a line break). A piece that does not begin as a record does (``head``: JOB_HEAD, NODE_HEAD) is the
    rest of the last field before it, whose free text held RECORD_END and a newline (an administrator's)."""
    found: list[str] = []
    pieces = text.split(RECORD_END + "\n")
    if pieces and not pieces[-1].strip():
        pieces.pop()  # after the last record
    for piece in pieces:
        if found and not head.match(piece):
            found[-1] += RECORD_END + "\n" + piece
        elif piece.strip():
            found.append(piece)
    return found


def parse_job_line(line: str) -> BatchJob:
    """One record of ``squeue -h -O FORMAT`` as a ``BatchJob``."""
    head, ended, tail = line.partition(REASON_END)
    f = head.split("|", _BEFORE_REASON) + tail.split("|", _AFTER_REASON - 1)
    if not ended or len(f) != len(FIELDS):
        raise SlurmError(f"squeue printed an unexpected record: {line!r}")
    (job_id, array, tasks, state, priority, uid, nodes, submit, start, end, limit, exit_code, reason, cpus,
     partitions, begin, dependency, comment) = f  # fmt: skip
    pending = state in WAITING  # its start time is a forecast
    seam_state = job_state(state, _int(priority))
    in_array = tasks != "N/A"
    held = expand_hostlist(nodes)
    return BatchJob(
        job_id=job_id,
        state=seam_state,
        admin_tag="" if comment == "(null)" else comment,
        user_id=_int(uid, -1),
        node=held[0] if held else nodes,
        nodes=held,
        submit_time=float(_int(submit)),
        start_time=0.0 if pending else float(_int(start)),
        end_time=0.0 if pending else float(_int(end)),
        time_limit_s=_limit_s(limit),
        exit_status=_exit_status(exit_code),
        outcome=state,
        reason=reason,
        cpus=max(1, _int(cpus, 1)),
        partitions=tuple(p for p in partitions.split(",") if p and p != "(null)"),  # pending: every one it named
        # released, it waits for its begin time only as long as slurmctld's clock says so (this host's may lag)
        not_before=float(_int(begin)) if pending and (seam_state is JobState.HELD or reason == "BeginTime") else 0.0,
        after=parse_dependency(dependency) if pending else (),
        array=array if in_array else "",
        array_tasks=array_tasks(tasks) if in_array else (),
        array_limit=array_limit(tasks) if in_array else 0,
    )


# squeue's ArrayTaskID: 3 (a task with its own record) or 4-9,11,13-19:2%2 (the array's pending tasks, in one
# record; %N: how many may run at once). Slurm cuts the pending tasks' text at 64 characters, ending it "...".
_TASKS = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")
_LEADING_NUMBER = re.compile(r"\d*")


def array_limit(text: str) -> int:
    """How many of the array's tasks may run at once, from its pending tasks' text (``1-40%8``: 8); 0: no limit."""
    limit = text.partition("%")[2]
    return int(limit) if limit.isdigit() else 0


def task_name(job: BatchJob) -> str:
    """How Slurm names one task of an array to users (``12_3``); a job that is no array's task: its id."""
    if job.array and len(job.array_tasks) == 1 and len(job.array_tasks[0]) == 1:
        return f"{job.array}_{job.array_tasks[0][0]}"
    return job.job_id


def task_list(tasks: Sequence[int]) -> str:
    """Tasks as Slurm's bracket list: [1-4,7]."""
    runs: list[list[int]] = []
    for t in sorted(set(tasks)):
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return "[" + ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs) + "]"


def array_tasks(text: str) -> tuple[range, ...]:
    """The tasks of an array one of its records stands for. Where Slurm cut the text short, every task from
    the cut on counts as the record's: a job that waits for one of them then waits until the text says more."""
    text = text.partition("%")[0]
    cut = text.endswith("...") or len(text) > 61  # squeue's own cut (a merge of pending tasks) adds no dots
    pieces = text.rstrip(".").split(",")
    last = pieces.pop() if cut else ""
    tasks: list[range] = []
    for piece in pieces:
        m = _TASKS.fullmatch(piece)
        if m is None:
            cut, last = True, piece  # not Slurm's grammar: as unknown as a cut
            break
        first, end, step = m.groups()
        tasks.append(range(int(first), int(end or first) + 1, int(step or 1)))
    if cut:
        leading = _LEADING_NUMBER.match(last)  # always matches (\d*)
        lead = leading.group() if leading is not None else ""  # a cut number reads no larger than it was
        tasks.append(range(int(lead) if lead else (tasks[-1][-1] + 1 if tasks else 0), 2**63))
    return tuple(tasks)


# What each kind of --dependency waits for (Slurm's _depend_type2str). singleton and expand name no job
# whose state tells: a job with them is placed when its turn comes, as before.
_AWAITS = {"after": Awaits.START, "afterany": Awaits.END, "afterburstbuffer": Awaits.END,
           "afterok": Awaits.SUCCESS, "aftercorr": Awaits.SUCCESS, "afternotok": Awaits.FAILURE}  # fmt: skip
_DEPENDENCY = re.compile(r"(\w+):(\d+(?:_(?:\d+|\*))?)(?:\+(\d+))?\((\w+)\)")


def parse_dependency(text: str) -> tuple[After, ...]:
    """The jobs squeue's Dependency names, all of which the job waits for: ``afterok:12(unfulfilled),after:13+5
    (unfulfilled)``. Slurm shows only what is not yet met, and looks again at a held job's only in its purge
    pass (once a minute by default), so "unfulfilled" may be stale; "failed" is final, an array task's too,
    and so is every alternative (``?``) failed. An array's task (``12_3``) or all its tasks (``12_*``) are
    found by their records' ArrayJobID and ArrayTaskID. Left to Slurm: alternatives not all failed."""
    alternatives = "?" in text
    found = []
    for item in text.replace("?", ",").split(","):
        match = _DEPENDENCY.fullmatch(item.strip())
        kind, job, minutes, state = match.groups() if match is not None else ("", "", None, "")
        if state == "failed":  # whatever its kind (expand too)
            found.append(After(job, Awaits.NEVER))
        elif alternatives:
            return ()
        elif kind in _AWAITS:
            array, _, task = job.partition("_")
            found.append(After(job, _AWAITS[kind], 60.0 * int(minutes) if minutes else 0.0, array if task else "",
                               int(task) if task.isdigit() else None))  # fmt: skip
    return tuple(found[:1]) if alternatives else tuple(found)


# Slurm's compressed host lists (hostlist.c): names apart by commas outside brackets; a bracket holds numbers and
# ranges, zero-padded to the width of each one's first number (gpu[01-03,07]); several brackets in one name
# multiply (r[1-2]n[1-2]: r1n1, r1n2, r2n1, r2n2).
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_HOSTLIST_ITEM = re.compile(r"(\d+)(?:-(\d+))?")
MAX_HOSTS = 1 << 16  # no cluster of Slurm's has more nodes: a longer list is not a job's


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Every node name of Slurm's host list ``text`` (``n[1-2]``, ``gpu[01-03,07]``, ``a1,b[2-3]``), in its
    order; () for none ("", or a pending job's ``(null)``, ``None assigned``). A node is compared with these,
    never with the compressed text, which names none of them."""
    if text.strip() in ("", "(null)", "None assigned"):
        return ()
    names: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise SlurmError(f"not a host list: {text!r}")
        if char == "," and depth == 0:
            names.extend(_expand_name(text[start:i].strip(), text))
            start = i + 1
        if len(names) > MAX_HOSTS:
            raise SlurmError(f"a host list of more than {MAX_HOSTS} nodes: {text[:80]!r}")
    if depth != 0:
        raise SlurmError(f"not a host list: {text!r}")
    return tuple(names)


def _expand_name(item: str, text: str) -> list[str]:
    """One name of a host list with its brackets expanded (``r[1-2]n[01-02]``)."""
    match = _BRACKET.search(item)
    if match is None:
        if not item or "]" in item:
            raise SlurmError(f"not a host list: {text!r}")
        return [item]
    numbers: list[str] = []
    for piece in match.group(1).split(","):
        m = _HOSTLIST_ITEM.fullmatch(piece.strip())
        if m is None or int(m.group(2) or m.group(1)) < int(m.group(1)):
            raise SlurmError(f"not a host list: {text!r}")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if last - first > MAX_HOSTS:
            raise SlurmError(f"a host list of more than {MAX_HOSTS} nodes: {text[:80]!r}")
        width = len(m.group(1))
        numbers.extend(f"{n:0{width}d}" for n in range(first, last + 1))
    head, rest = item[: match.start()], _expand_name(item[match.end():], text) if item[match.end():] else [""]
    if len(numbers) * len(rest) > MAX_HOSTS:
        raise SlurmError(f"a host list of more than {MAX_HOSTS} nodes: {text[:80]!r}")
    return [head + n + tail for n in numbers for tail in rest]


def job_in(lines: str, job: str) -> BatchJob | None:
    """The record of ``job`` among squeue's lines (an id can list an array's other records too)."""
    return next((j for j in fold_array_lines(map(parse_job_line, records(lines, JOB_HEAD))) if j.job_id == job), None)


def fold_array_lines(jobs: Iterable[BatchJob]) -> list[BatchJob]:
    """One job per record: ``squeue --array`` (Slurm 23.02 and later) prints each pending task of an array's
    record on a line of its own, all with the record's id; they are that record's tasks, as ranges."""
    first: dict[str, BatchJob] = {}
    tasks: dict[str, list[range]] = {}
    for job in jobs:
        if job.job_id not in first:
            first[job.job_id] = job
        elif job.array_tasks:
            tasks.setdefault(job.job_id, list(first[job.job_id].array_tasks)).extend(job.array_tasks)
    return [replace(job, array_tasks=_ranges(tasks[i])) if i in tasks else job for i, job in first.items()]


def _ranges(tasks: list[range]) -> tuple[range, ...]:
    """Task ranges as few as can say them (overlapping or touching runs of tasks join); step ranges are kept."""
    merged: list[range] = []
    for run in sorted((r for r in tasks if r.step == 1), key=lambda r: r.start):
        if merged and run.start <= merged[-1].stop:
            merged[-1] = range(merged[-1].start, max(merged[-1].stop, run.stop))
        else:
            merged.append(run)
    return (*merged, *(r for r in tasks if r.step != 1))


NODE_FIELDS = ("NodeList", "StateComplete", "CPUsState", "PartitionName", "Comment")  # the comment last: any character
NODE_HEAD = re.compile(r"[^|]+\|[^|]+\|\d+/\d+/\d+/\d+\|")  # NodeList, StateComplete, CPUsState
NODE_FORMAT = ",".join(f"{f}:{RECORD_END if f == 'Comment' else '|'}" for f in NODE_FIELDS)


def parse_node_line(line: str) -> NodeStatus:
    """One record of ``sinfo -h -N -O NODE_FORMAT``: ``n1|idle+drain|0/0/16/16|gpu|<comment>`` (a node in
    several partitions has one in each)."""
    f = line.split("|", len(NODE_FIELDS) - 1)
    if len(f) != len(NODE_FIELDS):
        raise SlurmError(f"sinfo printed an unexpected record: {line!r}")
    name, state, cpus, partition, comment = f
    base, *flags = state.upper().rstrip("*~#!%$@^-").split("+")
    counts = cpus.split("/")  # allocated/idle/other/total
    idle, total = (_int(counts[1], 0), _int(counts[3], 0)) if len(counts) == 4 else (None, None)
    return NodeStatus(name, base in NODE_UP and not set(flags) & NODE_TROUBLE, "" if comment == "(null)" else comment,
                      idle, total, (partition,) if partition else ())  # fmt: skip


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


_Item = TypeVar("_Item")


@dataclass
class _Slot(Generic[_Item]):
    """A caller's item in a GroupCommit's queue: whether its run is done, and its error."""

    item: _Item
    done: bool = False
    error: Exception | None = None


class GroupCommit(Generic[_Item]):
    """Concurrent calls combined into one run: a caller that finds no run under way runs everything queued
    by then, its own item included; the others wait for that run, or lead the next. ``run`` returns the
    errors by position in the batch. Each caller gets its own item's error."""

    def __init__(self, run: Callable[[list[_Item]], dict[int, Exception]]):
        self._run, self._cond = run, threading.Condition()
        self._queue: list[_Slot[_Item]] = []
        self._running = False

    def submit(self, item: _Item) -> None:
        slot = _Slot(item)
        with self._cond:
            self._queue.append(slot)
            while self._running and not slot.done:
                self._cond.wait()
            if not slot.done:  # no run under way: this caller runs the queue
                batch, self._queue, self._running = self._queue, [], True
        if not slot.done:
            errors: dict[int, Exception] = {}
            try:
                errors = self._run([s.item for s in batch])
            except BaseException as exc:  # every caller of the batch learns it failed
                shared = exc if isinstance(exc, Exception) else RuntimeError(f"the batch was interrupted: {exc!r}")
                errors = dict.fromkeys(range(len(batch)), shared)
                if shared is not exc:
                    raise
            finally:
                with self._cond:
                    for i, s in enumerate(batch):
                        s.done, s.error = True, errors.get(i)
                    self._running = False
                    self._cond.notify_all()
        if slot.error is not None:
            raise slot.error


class SlurmCli:
    """:class:`~mig_batch.batch.system.BatchSystem` over Slurm's command-line tools."""

    def __init__(self, bin_dir: str = "", env: dict[str, str] | None = None, timeout: float = 30,
                 slice_gres: str = "", session: bool = False, api: SlurmApi | None = None):  # fmt: skip
        """``session``: updates go through one long-lived scontrol (for a long-lived caller: the node agent).
        ``api``: the per-job reads and updates through libslurm instead (its RPCs time out after slurm.conf's
        MessageTimeout)."""
        self.bin_dir, self.env, self.timeout, self.api = bin_dir, env, timeout, api
        self._parsed: dict[str, BatchJob] = {}  # the last poll's jobs by their line
        self._jobs: list[BatchJob] = []  # the last poll's jobs, one per record
        self._jobs_stamp = 0  # slurmctld's stamp of the last poll through libslurm
        # An array's own record once it stands for one task, by its id: the task's name (12_3), by which it is
        # addressed. By the array's id Slurm would update, release or cancel every task of the array.
        self._task_names: dict[str, str] = {}
        self._api_paused_until = 0.0
        self.slice_gres = slice_gres  # the GRES a pin sets to the job's MIG slices ("": none)
        self._session = ScontrolSession(self._exe("scontrol"), env, timeout) if session else None
        # a node's Prologs report at once in a burst: one scontrol process for all of them (~3 ms of CPU each)
        self._job_tags = GroupCommit(self._set_job_tags)

    def _live_api(self) -> SlurmApi | None:
        """The helper library, unless it could not reach slurmctld within the last ``API_PAUSE_S``: a call that
        waits out Slurm's MessageTimeout once should not make every other call of the pass wait too."""
        return self.api if self.api is not None and time.monotonic() >= self._api_paused_until else None

    def _pause_api(self, exc: SlurmApiError) -> None:
        log.warning("libslurm: %s; Slurm's commands for the next %.0f s", exc, API_PAUSE_S)
        self._api_paused_until = time.monotonic() + API_PAUSE_S

    def _exe(self, command: str) -> str:
        return str(Path(self.bin_dir) / command) if self.bin_dir else command

    def _run(self, command: str, *args: str, stdin: str | None = None, check: bool = True,
             time_format: str | None = None) -> str:  # fmt: skip
        exe = self._exe(command)
        env = {k: v for k, v in (self.env or os.environ).items() if not k.startswith(_COMMAND_SETTINGS)}
        env["SLURM_BITSTR_LEN"] = "0"  # an array's pending tasks in full: cut at 64 characters, they name no task
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

    def _squeue(self, *args: str, time_format: str | None = None) -> str:
        """squeue over every record (:data:`SQUEUE_ARGS`), with ``--array-unique`` where this squeue has it."""
        squeue = self._exe("squeue")
        if squeue not in _REFUSE_ARRAY_UNIQUE:
            try:
                return self._run("squeue", *SQUEUE_ARGS, ARRAY_UNIQUE, *args, time_format=time_format)
            except SlurmError as exc:
                if "unrecognized option" not in str(exc):  # squeue's getopt, naming the option
                    raise
                _REFUSE_ARRAY_UNIQUE.add(squeue)
                log.info("squeue has no %s (Slurm 23.02 and later): reading with %s", ARRAY_UNIQUE, EVERY_TASK)
        return self._run("squeue", *SQUEUE_ARGS, EVERY_TASK, *args, time_format=time_format)

    def jobs(self) -> list[BatchJob]:
        """Every job; through libslurm, read and parsed again only when one changed since the last call."""
        if (api := self._live_api()) is not None:
            try:
                lines, stamp = api.all_job_lines(self._jobs_stamp)
            except SlurmApiError as exc:
                if exc.answered:
                    raise SlurmError(str(exc)) from None
                self._pause_api(exc)
            else:
                if lines is None:  # no job changed since the last poll
                    return list(self._jobs)
                self._jobs_stamp = stamp
                return self._parse_jobs(lines)
        out = self._squeue("-O", FORMAT, time_format="%s")
        return self._parse_jobs(out)

    def _parse_jobs(self, lines: str) -> list[BatchJob]:
        """Every job's line parsed, a line seen in the last poll not again (most are: a queue changes by a
        few jobs a pass)."""
        seen, self._parsed = self._parsed, {}
        for line in records(lines, JOB_HEAD):
            self._parsed[line] = seen.get(line) or parse_job_line(line)
        self._jobs = fold_array_lines(self._parsed.values())
        if self._jobs and any(j.array for j in self._jobs) and self._squeue_folds_tasks():
            self._jobs = self._with_array_limits(self._jobs)
        # swapped in whole: another thread (the agent's workers) addresses jobs meanwhile
        self._task_names = {j.job_id: name for j in self._jobs
                            if j.array == j.job_id and (name := task_name(j)) != j.job_id}  # fmt: skip
        return list(self._jobs)

    def _squeue_folds_tasks(self) -> bool:
        """Whether this process reads squeue with ``--array`` (Slurm 23.02 and later), whose lines lose an
        array's ``%N``."""
        return self._exe("squeue") in _REFUSE_ARRAY_UNIQUE and self._live_api() is None

    def _with_array_limits(self, jobs: list[BatchJob]) -> list[BatchJob]:
        """``jobs`` with each array's ``%N`` read again from squeue's folded record of its pending tasks (one
        call for every array with pending tasks in one record)."""
        arrays = sorted({j.array for j in jobs if j.task_count > 1})
        if not arrays:
            return jobs
        out = self._run("squeue", *SQUEUE_ARGS, "-j", ",".join(arrays), "-O", "JobID:|,ArrayTaskID:|")
        limits = {}
        for line in out.splitlines():
            job, _, tasks = line.partition("|")
            if limit := array_limit(tasks.rstrip("|").strip()):
                limits[job.strip()] = limit
        return [replace(j, array_limit=limits[j.job_id]) if j.job_id in limits and j.task_count > 1 else j
                for j in jobs]  # fmt: skip

    def _remember(self, job: BatchJob) -> None:
        if job.array == job.job_id:
            name = task_name(job)
            names = dict(self._task_names)  # a copy swapped in: readers never see it half changed
            if name != job.job_id:
                names[job.job_id] = name
            else:
                names.pop(job.job_id, None)
            self._task_names = names

    def _address(self, job: str) -> str:
        """How to name ``job`` to Slurm's commands so that they act on that record alone."""
        return self._task_names.get(job, job)

    def nodes(self) -> list[NodeStatus]:
        """Every node once, with all its partitions (sinfo -N lists a node once per partition)."""
        out = self._run("sinfo", "-h", "-N", "-O", NODE_FORMAT)
        merged: dict[str, NodeStatus] = {}
        for n in map(parse_node_line, records(out, NODE_HEAD)):
            seen = merged.get(n.node)
            merged[n.node] = n if seen is None else replace(seen, partitions=seen.partitions + n.partitions)
        return list(merged.values())

    def pin_and_release(self, pins: Sequence[Pin]) -> dict[str, str]:
        """Pin and release; the jobs that failed, with Slurm's message. Through libslurm, a job at a time (see
        :meth:`_pins_through_api`); through the commands, in chunks: each chunk is one ``scontrol`` process
        with its pins on stdin, then one release of those it pinned, so that a job is released as soon as
        its chunk is pinned and the first jobs of a long pass start while the rest are pinned."""
        if not pins:
            return {}
        names = {self._address(p.job_id): p.job_id for p in pins}
        pins = [replace(p, job_id=self._address(p.job_id)) for p in pins]
        tres = self._tres_per_node([p.job_id for p in pins if p.slices]) if self.slice_gres else {}
        updates = [self._pin_update(p, tres) for p in pins]
        failed: dict[str, str] = {}
        if (api := self._live_api()) is not None:
            updates = self._pins_through_api(api, updates, failed)
        for i in range(0, len(updates), PIN_CHUNK):
            failed.update(self._pin_chunk(updates[i : i + PIN_CHUNK]))
        return {names.get(job, job): why for job, why in failed.items()}

    def _pin_update(self, pin: Pin, tres: dict[str, str]) -> JobUpdate:
        timed = pin.time_limit_min is not None
        # Slurm counts the slices: sacct, fair-share and QOS/association limits see them
        slices = with_slices(tres[pin.job_id], self.slice_gres, pin.slices) if pin.job_id in tres else None
        return JobUpdate(pin.job_id, pin.node, pin.admin_tag, pin.time_limit_min, timed, slices)

    def _pins_through_api(self, api: SlurmApi, updates: Sequence[JobUpdate],
                          failed: dict[str, str]) -> list[JobUpdate]:  # fmt: skip
        """Each pin and its release through libslurm; refusals into ``failed``. A pin Slurm did not answer is
        failed too and not sent again (it may have been applied and the job started: the next pass decides
        again what is still held); the pins after it are returned, for Slurm's commands."""
        for i, update in enumerate(updates):
            try:
                self._send_pin(api, update)
            except SlurmApiError as exc:
                failed[update.job_id] = str(exc) if exc.answered else Unanswered(str(exc))
                if not exc.answered:
                    self._pause_api(exc)
                    return list(updates[i + 1 :])
        return []

    def _send_pin(self, api: SlurmApi, update: JobUpdate) -> None:
        """The pin, then its release: in the same RPC where Slurm applies the pin's fields first, else in a
        second. Slurm checks a job's limits after its release: a job refused there, released with the pin
        applied, is pinned (the pin is not an error)."""
        try:
            update.send(api, release=update.releasable_at_once)
        except SlurmApiError as exc:
            if not (exc.answered and update.releasable_at_once and self._released_as_pinned(api, update)):
                raise
            log.info("job %s: released as pinned although Slurm said %s", update.job_id, exc)
            return
        if not update.releasable_at_once:
            JobUpdate(update.job_id).send(api, release=True)

    @staticmethod
    def _released_as_pinned(api: SlurmApi, update: JobUpdate) -> bool:
        if not update.job_id.isdigit():
            return False
        try:
            lines = api.job_lines(int(update.job_id))
        except SlurmApiError:
            return False
        job = job_in(lines, update.job_id)
        return job is not None and job.state != JobState.HELD and job.admin_tag == update.admin_comment

    def _through_api(self, api: SlurmApi, updates: Sequence[JobUpdate], failed: dict[str, str],
                     release: bool = False) -> list[JobUpdate]:  # fmt: skip
        """Each update through libslurm; Slurm's refusals into ``failed``. Returns those from the first one
        Slurm did not answer on, for Slurm's commands (which read slurm.conf again): sending a tag or a
        release again is safe (the same text; a second release is ignored)."""
        for i, update in enumerate(updates):
            try:
                update.send(api, release=release)
            except SlurmApiError as exc:
                if not exc.answered:
                    self._pause_api(exc)
                    return list(updates[i:])
                failed[update.job_id] = str(exc)
        return []

    def _pin_chunk(self, updates: Sequence[JobUpdate]) -> dict[str, str]:
        failed = self._update_jobs(updates)
        pinned = [u.job_id for u in updates if u.job_id not in failed]
        try:
            self.release(pinned)
        except SlurmError as exc:
            failed.update({job: Unanswered(str(exc)) for job in pinned})
        return failed

    def _update_jobs(self, job_updates: Sequence[JobUpdate]) -> dict[str, str]:
        """Updates of several jobs: the jobs whose update failed, with Slurm's message. Through libslurm when
        there is the helper; else through the session when there is one, else several through one scontrol
        process (its stdin); one alone, or one with a value scontrol would not keep verbatim on stdin,
        through its own."""
        failed: dict[str, str] = {}
        if (api := self._live_api()) is not None:
            job_updates = self._through_api(api, job_updates, failed)
        updates = [(u.job_id, u.args()) for u in job_updates]
        batched: list[tuple[str, list[str]]] = []
        alone: list[tuple[str, list[str]]] = []
        for update in updates:  # an array's task alone: its error then needs no reading to be its own
            (batched if all(map(stdin_safe, update[1])) and "_" not in update[0] else alone).append(update)
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
                failed.update({j: Unanswered(str(exc)) for j, _ in updates[i:]})
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
            return {job: Unanswered(str(exc)) for job, _ in updates}
        failed = {}
        for line in errors.splitlines():
            match = _FAILED_JOB.search(line)
            if match:
                failed[match.group(1)] = line.strip()
            elif line.strip():  # an error scontrol did not attribute to a job: trust none of them
                return {job: Unanswered(f"scontrol: {line.strip()}") for job, _ in updates}
        return failed

    def _tres_per_node(self, jobs: Sequence[str]) -> dict[str, str]:
        """Each job's TresPerNode now ("" for none): the pin replaces the whole list, so it keeps the rest."""
        if not jobs:
            return {}
        out = self._squeue("-j", ",".join(jobs), "-O", "JobID:|,ArrayJobID:|,ArrayTaskID:|,tres-per-node:|")
        found = {}
        for line in out.splitlines():
            job, array, task, tres = [*line.split("|", 3), "", "", ""][:4]
            tres = tres.rstrip("|").strip()
            tres = "" if tres in ("N/A", "(null)") else tres
            found[job.strip()] = tres
            task = task.partition("%")[0].strip()  # the array's own record of its last task: 100%8
            if task.isdigit():  # an array's task, as the pins name it (12_3)
                found[f"{array.strip()}_{task}"] = tres
        return {j: found.get(j, "") for j in jobs}

    def release(self, jobs: Sequence[str]) -> None:
        """Release held jobs: one scontrol call for many, or an RPC each through libslurm."""
        failed: dict[str, str] = {}
        jobs = [self._address(j) for j in jobs]
        if (api := self._live_api()) is not None:
            jobs = [u.job_id for u in self._through_api(api, [JobUpdate(j) for j in jobs], failed, release=True)]
        for i in range(0, len(jobs), 200):
            self._run("scontrol", "release", ",".join(jobs[i : i + 200]))
        if failed:
            raise SlurmError("release failed: " + "; ".join(failed.values()))

    def requeue_hold(self, job: str, reason: str = "") -> None:
        self._run("scontrol", "requeuehold", self._address(job))
        self.hold(job)

    def hold(self, job: str) -> None:
        self._run("scontrol", "hold", self._address(job))

    def cancel(self, job: str) -> None:
        self._run("scancel", self._address(job))

    def set_job_tag(self, job: str, admin_tag: str) -> None:
        """Thread-safe; concurrent calls share one ``scontrol`` process."""
        self._job_tags.submit((self._address(job), admin_tag))

    def split_array(self, job: BatchJob, tasks: Sequence[int]) -> None:
        """One update of the tasks apart from the rest of the array's record, which splits them off (with
        the record's own tag: nothing else changes)."""
        if tasks:
            self._run("scontrol", "update", f"jobid={job.array}_{task_list(tasks)}", f"admincomment={job.admin_tag}")

    def _set_job_tags(self, tags: list[tuple[str, str]]) -> dict[int, Exception]:
        failed = self._update_jobs([JobUpdate(job, admin_comment=tag) for job, tag in tags])
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
        if job.isdigit() and (api := self._live_api()) is not None:
            try:
                lines = api.job_lines(int(job))
            except SlurmApiError as exc:
                if exc.answered:
                    raise SlurmError(str(exc)) from None
                self._pause_api(exc)
            else:
                return self._named(job_in(lines, job))
        try:
            return self._named(job_in(self._squeue("-O", FORMAT, "-j", job, time_format="%s"), job))
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise

    def _named(self, job: BatchJob | None) -> BatchJob | None:
        if job is not None:
            self._remember(job)
        return job

    def jobs_named(self, jobs: Collection[str]) -> dict[str, BatchJob | None]:
        """One job-info RPC (or ``squeue -j``) a job: slurmctld's cost is that of the jobs asked about, where a
        listing costs it a pass over its whole queue. The first question Slurm does not answer ends them all
        (``SlurmError``): the next would wait as long."""
        return {job: self.job(job) for job in jobs}

    def submit(self, argv: Sequence[str], script: str | None = None) -> str:
        """``sbatch --parsable`` with ``argv`` (the script on stdin when given); returns the job id."""
        out = self._run("sbatch", "--parsable", *argv, stdin=script).strip()
        return out.split(";")[0]


def sbatch_args(command: Sequence[str]) -> list[str]:
    """sbatch's arguments in a command migsub built (``sbatch --parsable ...``): what :meth:`SlurmCli.submit`
    takes (it adds ``--parsable`` itself)."""
    return [a for a in command[1:] if a != "--parsable"]


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


# The seam, checked statically: mypy (see pyproject.toml) fails here when a method of SlurmCli no longer matches
# BatchSystem's (a missing method, another signature or return type).
_SEAM_CHECK: type[BatchSystem] = SlurmCli
