"""The Slurm adapter over its commands (squeue --json, scontrol, sbatch): thin, no decisions.

pyslurm has no release for Slurm 22.05, so the CLI is the default adapter. Every call has a timeout
and raises SlurmError with the command and Slurm's message.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MANAGED_PREFIX = "mig-batch:"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}  # fmt: skip


class SlurmError(RuntimeError):
    pass


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, COMPLETED, ...
    reason: str
    admin_comment: str
    features: str
    nodes: str
    priority: int
    submit_time: int
    end_time: int = 0  # running: start + time limit (epoch s); 0 when unknown
    start_time: int = 0  # running: when it started (epoch s); 0 when unknown
    time_limit_s: float = math.inf  # Slurm's time limit; inf when unlimited or unknown
    exit_code: int = 0  # the wait status squeue reports: exit status << 8 | signal
    user_id: int = -1

    @property
    def exit_status(self) -> int:
        """The batch script's exit status, 128 + N when signal N ended it."""
        return 128 + (self.exit_code & 0x7F) if self.exit_code & 0x7F else self.exit_code >> 8

    @property
    def managed(self) -> bool:
        return self.admin_comment.startswith(MANAGED_PREFIX)

    @property
    def held(self) -> bool:
        return self.state == "PENDING" and self.priority == 0

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


class SlurmCli:
    def __init__(self, bin_dir: str = "", env: dict[str, str] | None = None, timeout: float = 30):
        self.bin_dir, self.env, self.timeout = bin_dir, env, timeout

    def _run(self, command: str, *args: str) -> str:
        exe = str(Path(self.bin_dir) / command) if self.bin_dir else command
        try:
            proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=self.timeout,
                                  env=self.env or os.environ.copy())  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SlurmError(f"{command} {' '.join(args)}: {exc}") from None
        if proc.returncode != 0:
            raise SlurmError(f"{command} {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def jobs(self) -> list[SlurmJob]:
        data = json.loads(self._run("squeue", "--json"))
        return [
            SlurmJob(
                job_id=str(j["job_id"]),
                state=str(j.get("job_state", "")),
                reason=str(j.get("state_reason", "")),
                admin_comment=str(j.get("admin_comment") or ""),
                features=str(j.get("features") or ""),
                nodes=str(j.get("nodes") or ""),
                priority=int(j.get("priority") or 0),
                submit_time=int(j.get("submit_time") or 0),
                end_time=int(j.get("end_time") or 0),
                start_time=int(j.get("start_time") or 0),
                time_limit_s=_minutes(j.get("time_limit")),
                exit_code=int(j.get("exit_code") or 0),
                user_id=int(j.get("user_id", -1)),
            )
            for j in data.get("jobs", [])
        ]

    def pin(self, job: str, node: str, admin_comment: str, time_limit_min: int | None = None) -> None:
        """Pin a job to ``node``; a subjob (``time_limit_min``) also gets its limit and may start at once
        (Slurm delays a requeued job's start by about two minutes otherwise)."""
        subjob = [f"timelimit={time_limit_min}", "starttime=now"] if time_limit_min is not None else []
        self._run("scontrol", "update", f"jobid={job}", f"nodelist={node}", f"admincomment={admin_comment}", *subjob)

    def release(self, jobs: Sequence[str]) -> None:
        """Release held jobs, one scontrol call for many (slurmctld's RPCs are the bottleneck)."""
        for i in range(0, len(jobs), 200):
            self._run("scontrol", "release", ",".join(jobs[i : i + 200]))

    def requeue_hold(self, job: str) -> None:
        """Back to pending, held by an operator (the user cannot release it around the controller)."""
        self._run("scontrol", "requeuehold", job)
        self._run("scontrol", "hold", job)

    def cancel(self, job: str) -> None:
        self._run("scancel", job)

    def submit(self, argv: Sequence[str]) -> str:
        """``sbatch --parsable`` with ``argv``; returns the job id."""
        out = self._run("sbatch", "--parsable", *argv).strip()
        return out.split(";")[0]


def _minutes(value: object) -> float:
    """squeue's time limit (whole minutes) in seconds; its INFINITE and NO_VAL markers, or none: inf."""
    try:
        minutes = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return math.inf
    return minutes * 60.0 if 0 < minutes < 0xFFFFFFFE else math.inf
