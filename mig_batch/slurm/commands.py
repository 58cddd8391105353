"""The Slurm side of the batch-system seam, over Slurm's commands (squeue/sinfo one line per record, scontrol,
sbatch, scancel): thin, no decisions.

pyslurm has no release for Slurm 22.05, so the CLI is the adapter. Every call has a timeout and
raises :class:`SlurmError` (a ``BatchError``) with the command and Slurm's message. Pins go to one
``scontrol`` process per pass (its commands on stdin), not one process per job.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mig_batch.batch.system import BatchError, BatchJob, JobState, NodeStatus, Pin

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}  # fmt: skip
NODE_UP = {"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "PLANNED"}
NODE_TROUBLE = {"NOT_RESPONDING", "DRAIN", "FAIL", "POWERED_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED"}
_FAILED_JOB = re.compile(r"for job (\d+)")
PIN_CHUNK = 16  # pins per scontrol process: released as soon as their chunk is pinned
PIN_PROCESSES = 4  # chunks under way at once


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


class SlurmCli:
    """:class:`~mig_batch.batch.system.BatchSystem` over Slurm's command-line tools."""

    def __init__(self, bin_dir: str = "", env: dict[str, str] | None = None, timeout: float = 30,
                 slice_gres: str = ""):  # fmt: skip
        self.bin_dir, self.env, self.timeout = bin_dir, env, timeout
        self.slice_gres = slice_gres  # the GRES a pin sets to the job's MIG slices ("": none)

    def _run(self, command: str, *args: str, stdin: str | None = None, check: bool = True,
             time_format: str | None = None) -> str:  # fmt: skip
        exe = str(Path(self.bin_dir) / command) if self.bin_dir else command
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
        out = self._run("squeue", "-h", "-t", "all", "-O", FORMAT, *args, time_format="%s")
        return [parse_job_line(line) for line in out.splitlines() if line.strip()]

    def jobs(self) -> list[BatchJob]:
        return self._squeue()

    def nodes(self) -> list[NodeStatus]:
        """Every node once (sinfo -N lists a node once per partition)."""
        out = self._run("sinfo", "-h", "-N", "-O", NODE_FORMAT)
        return list({n.node: n for n in map(parse_node_line, filter(str.strip, out.splitlines()))}.values())

    def pin_and_release(self, pins: Sequence[Pin]) -> dict[str, str]:
        """Pin and release in chunks, several chunks at once: each chunk is one ``scontrol`` process with
        its pins on stdin, then one release of those it pinned. A job is released as soon as its chunk is
        pinned, and slurmctld serves the chunks' RPCs on several threads while one waits for a lock."""
        if not pins:
            return {}
        tres = self._tres_per_node([p.job_id for p in pins if p.slices]) if self.slice_gres else {}
        chunks = [pins[i : i + PIN_CHUNK] for i in range(0, len(pins), PIN_CHUNK)]
        if len(chunks) == 1:
            return self._pin_chunk(chunks[0], tres)
        failed: dict[str, str] = {}
        with ThreadPoolExecutor(max_workers=min(PIN_PROCESSES, len(chunks))) as pool:
            for chunk_failed in pool.map(lambda chunk: self._pin_chunk(chunk, tres), chunks):
                failed.update(chunk_failed)
        return failed

    def _pin_chunk(self, pins: Sequence[Pin], tres: dict[str, str]) -> dict[str, str]:
        lines = []
        for p in pins:
            subjob = f" timelimit={p.time_limit_min} starttime=now" if p.time_limit_min is not None else ""
            if p.job_id in tres:  # Slurm counts the slices: sacct, fair-share and QOS/association limits see them
                subjob += f" tresPerNode={with_slices(tres[p.job_id], self.slice_gres, p.slices)}"
            lines.append(f"update jobid={p.job_id} nodelist={p.node} admincomment={_quote(p.admin_tag)}{subjob}\n")
        try:
            errors = self._run("scontrol", stdin="".join(lines), check=False)
        except SlurmError as exc:
            return {p.job_id: str(exc) for p in pins}
        failed = {}
        for line in errors.splitlines():
            match = _FAILED_JOB.search(line)
            if match:
                failed[match.group(1)] = line.strip()
            elif line.strip():  # an error scontrol did not attribute to a job: trust none of the pins
                return {p.job_id: f"scontrol: {line.strip()}" for p in pins}
        pinned = [p.job_id for p in pins if p.job_id not in failed]
        try:
            self.release(pinned)
        except SlurmError as exc:
            failed.update({job: str(exc) for job in pinned})
        return failed

    def _tres_per_node(self, jobs: Sequence[str]) -> dict[str, str]:
        """Each job's TresPerNode now ("" for none): the pin replaces the whole list, so it keeps the rest."""
        if not jobs:
            return {}
        out = self._run("squeue", "-h", "-t", "all", "-j", ",".join(jobs), "-O", "JobID:|,tres-per-node:|")
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
        self._run("scontrol", "update", f"jobid={job}", f"admincomment={admin_tag}")

    def set_node_tag(self, node: str, agent_tag: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", f"comment={agent_tag}")

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


def _quote(value: str) -> str:
    return f'"{value}"' if any(c.isspace() for c in value) else value
