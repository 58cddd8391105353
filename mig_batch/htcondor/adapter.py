"""The HTCondor side of the batch-system seam, over the ``htcondor2``/``classad2`` bindings: thin, no
decisions.

A job is ``<cluster>.<proc>``. The managed-job tag lives in the protected job attribute ``MigBatchTag``
and the pin in ``MigBatchNode`` (see ``attrs``); the startd's START matches a managed job only on the
node it is pinned to. So a managed job waits for the controller in either of two HTCondor states, and
the seam sees both as ``HELD``: held (JobStatus 5), or idle without a pin (it can match no node; this is
also where an owner's ``condor_release`` of a job the controller held leaves it). Pinning writes the tag
and the pin into such a job only (the edits are constrained on it, so a job that started or ended is
refused, as Slurm refuses it) and releases it if it was held. A node's agent state is a
startd attribute, ``MigBatchAgent``, published by a startd cron job from a node-local file that
:meth:`HTCondorBatch.set_node_tag` writes.

The bindings keep their configuration and security session per process: the identity this adapter
acts as (the controller's token, a queue superuser) is the process's, from ``CONDOR_CONFIG`` or the
``condor_config`` given here. Every failure is an :class:`HTCondorError` naming the call.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import pwd
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from mig_batch.batch.system import BatchError, BatchJob, BatchSystem, JobState, NodeStatus, Pin
from mig_batch.htcondor import versions
from mig_batch.htcondor.accounting import SLICES_ATTR
from mig_batch.htcondor.attrs import (
    AGENT_ATTR,
    CHAIN_HOLD_SUBCODE,
    JOB_POLICY_HOLD,
    NODE_NAME_ATTR,
    PIN_ATTR,
    STARTS_ATTR,
    TAG_ATTR,
    TIME_LIMIT_ATTR,
)
from mig_batch.safe_files import write_file


class HTCondorError(BatchError):
    pass


# JobStatus codes
IDLE, RUNNING, REMOVED, COMPLETED, HELD, TRANSFERRING_OUTPUT, SUSPENDED = 1, 2, 3, 4, 5, 6, 7
PROJECTION = ["ClusterId", "ProcId", "JobStatus", "Owner", TAG_ATTR, "RemoteHost", "LastRemoteHost", "QDate",
              "JobCurrentStartDate", TIME_LIMIT_ATTR, "ExitCode", "ExitBySignal", "ExitSignal", "HoldReason",
              "LastRejMatchReason", "EnteredCurrentStatus", PIN_ATTR, "HoldReasonCode",
              "HoldReasonSubCode", "NumJobStarts", STARTS_ATTR]  # fmt: skip
MANAGED = f"{TAG_ATTR} =!= undefined"
WAITING = f"(JobStatus == {HELD} || (JobStatus == {IDLE} && {PIN_ATTR} =?= undefined))"  # the seam's HELD


def check_bindings(version_text: str) -> None:
    """HTCondorError unless ``htcondor2.version()``'s text names a release in the supported range (``versions``)."""
    if not versions.supported_bindings(versions.version_in(version_text)):
        raise HTCondorError(versions.refusal(version_text))


def _bindings() -> tuple[Any, Any]:
    try:
        import classad2
        import htcondor2
    except ImportError as exc:
        raise HTCondorError(f"no HTCondor bindings (pip install 'mig-batch[htcondor]'): {exc}") from None
    check_bindings(htcondor2.version())
    return htcondor2, classad2


def job_state(status: int) -> JobState:
    if status == HELD:
        return JobState.HELD
    if status in (RUNNING, TRANSFERRING_OUTPUT, SUSPENDED):
        return JobState.RUNNING  # its slot, and so its instance, is still in use
    if status in (REMOVED, COMPLETED):
        return JobState.FINISHED
    return JobState.PENDING


def _outcome(status: int, exit_status: int) -> str:
    if status == REMOVED:
        return "CANCELLED"  # the seam's word (BatchJob.cancelled) for condor_rm
    if status == COMPLETED:
        return "COMPLETED" if exit_status == 0 else "FAILED"
    return {IDLE: "IDLE", RUNNING: "RUNNING", HELD: "HELD", TRANSFERRING_OUTPUT: "TRANSFERRING_OUTPUT",
            SUSPENDED: "SUSPENDED"}.get(status, str(status))  # fmt: skip


def _host(slot: str) -> str:
    """``slot1_1@nodeb@migpool`` -> ``nodeb@migpool``: the startd, not the slot."""
    return slot.partition("@")[2] if "@" in slot else slot


def subjob_ended(ad: Mapping[str, Any]) -> bool:
    """A chain's subjob that ended (any exit but 0) and is held by the chain's exit policy (``attrs``), still
    pinned: to the seam it has finished, with its exit status, until mig-batchd's requeue-hold unpins it (then it
    waits, held, for the chain's next grant). Only a chain's job that started since its pin: an owner can hold
    any job by a policy of its own with the same code and subcode (``periodic_hold``), which must not read as an
    end that frees its spot while it stays pinned."""
    held = int(ad.get("JobStatus", IDLE)) == HELD and isinstance(ad.get(PIN_ATTR), str)
    chain = ";atomize=1" in str(ad.get(TAG_ATTR, "") or "")
    started = ad.get(STARTS_ATTR) is not None and int(ad.get("NumJobStarts", 0) or 0) > int(ad[STARTS_ATTR])
    return held and chain and started and ad.get("HoldReasonCode") == JOB_POLICY_HOLD \
        and ad.get("HoldReasonSubCode") == CHAIN_HOLD_SUBCODE


def to_batch_job(ad: Mapping[str, Any], nodes_by_startd: dict[str, str] | None = None) -> BatchJob:
    """A job ad (without undefined values: ``HTCondorBatch._plain``) as the seam's record. ``node`` is the startd's
    ``MigBatchNodeName`` when ``nodes_by_startd`` knows it, else the startd's name. A chain's subjob that ended and
    waits for mig-batchd, held, is finished (:func:`subjob_ended`)."""
    status = int(ad.get("JobStatus", IDLE))
    if subjob_ended(ad):
        status = COMPLETED
    state = job_state(status)
    if state is JobState.PENDING and ad.get(TAG_ATTR) and not isinstance(ad.get(PIN_ATTR), str):
        state = JobState.HELD  # managed and unpinned: START lets it match no node until the controller pins it
    signalled = bool(ad.get("ExitBySignal", False))
    exit_status = 128 + int(ad.get("ExitSignal", 0)) if signalled else int(ad.get("ExitCode", 0) or 0)
    startd = _host(str(ad.get("RemoteHost") or ad.get("LastRemoteHost") or ""))
    running = status in (RUNNING, TRANSFERRING_OUTPUT, SUSPENDED)
    start = float(ad.get("JobCurrentStartDate", 0) or 0) if running else 0.0
    limit = float(ad.get(TIME_LIMIT_ATTR, 0) or 0) or math.inf
    return BatchJob(
        job_id=f"{ad['ClusterId']}.{ad['ProcId']}",
        state=state,
        admin_tag=str(ad.get(TAG_ATTR, "") or ""),
        user_id=_uid(str(ad.get("Owner", "") or "")),
        node=(nodes_by_startd or {}).get(startd, startd),
        submit_time=float(ad.get("QDate", 0) or 0),
        start_time=start,
        end_time=start + limit if start and limit != math.inf else 0.0,
        time_limit_s=limit,
        exit_status=exit_status,
        outcome=_outcome(status, exit_status),
        # stripped: 23.9's negotiator writes "no match found " where 25.x writes "no match found"
        reason=str(ad.get({HELD: "HoldReason", IDLE: "LastRejMatchReason"}.get(status, ""), "") or "").strip(),
        # every hold of the controller's says "mig-batch...": any other is the owner's (or an operator's)
        held_by_user=status == HELD and not str(ad.get("HoldReason", "") or "").startswith("mig-batch"),
    )


@functools.lru_cache(maxsize=4096)
def _uid(owner: str) -> int:
    """The job's owner's uid on this host (-1: unknown here), so that checks by user (a chain's jobs) hold."""
    try:
        return pwd.getpwnam(owner).pw_uid if owner else -1
    except KeyError:
        return -1


def _cluster_proc(job: str) -> tuple[int, int]:
    """(ClusterId, ProcId) of ``cluster.proc`` (``cluster``: its proc 0)."""
    cluster, _, proc = job.partition(".")
    if not all(part.isascii() and part.isdigit() for part in (cluster, proc or "0")):
        raise HTCondorError(f"not an HTCondor job id: {job!r}")
    return int(cluster), int(proc or 0)


def _job_constraint(job: str) -> str:
    cluster, proc = _cluster_proc(job)
    return f"ClusterId == {cluster} && ProcId == {proc}"


class HTCondorBatch:
    """:class:`~mig_batch.batch.system.BatchSystem` over the htcondor2 bindings.

    ``condor_config``: the client config to use (this process's whole HTCondor configuration, as the
    bindings have one per process); ``agent_file``: where :meth:`set_node_tag` writes, ``{node}``
    replaced by the node's name; ``history_s``: how long finished jobs stay visible in :meth:`jobs`
    (HTCondor moves them to its history at once; Slurm keeps them for MinJobAge)."""

    def __init__(self, condor_config: str | Path | None = None, agent_file: str = "/run/mig-batch/htcondor-agent.ad",
                 history_s: float = 600.0):  # fmt: skip
        self.htcondor, self.classad = _bindings()
        if condor_config is not None:
            os.environ["CONDOR_CONFIG"] = str(condor_config)
            self.htcondor.reload_config()
        self.agent_file, self.history_s = agent_file, history_s
        self._schedd: Any = None
        # Bindings before 24.12 (the 24.0 LTS) need a way round their Schedd.submit: see submit
        release = versions.release_of(versions.version_in(self.htcondor.version()) or "")
        self._submit_needs_queue_args = release is not None and release < (24, 12)

    @contextlib.contextmanager
    def _call(self, what: str) -> Iterator[None]:
        try:
            yield
        except HTCondorError:
            raise
        except (self.htcondor.HTCondorException, self.classad.ClassAdException, RuntimeError, ValueError,
                OSError) as exc:  # fmt: skip
            self._schedd = None  # located again next time: the schedd may have restarted elsewhere
            raise HTCondorError(f"{what}: {exc}") from None

    @property
    def schedd(self) -> Any:
        if self._schedd is None:
            with self._call("locate the schedd"):
                self._schedd = self.htcondor.Schedd()
        return self._schedd

    # --- reading ---------------------------------------------------------------------------------
    def _plain(self, ad: Any) -> dict[str, Any]:
        """A job ad as a dict without its undefined and error values (classad2 returns them as
        ``classad2.Value`` members, which are truthy and print as numbers)."""
        return {k: v for k, v in ad.items() if not isinstance(v, self.classad.Value)}

    def _startds(self) -> list[Any]:
        """The slot ads of mig_batch's nodes."""
        with self._call("query the collector for startds"):
            collector = self.htcondor.Collector()
            ads: list[Any] = collector.query(self.htcondor.AdType.Startd, constraint=f"{NODE_NAME_ATTR} =!= undefined",
                                             projection=["Name", NODE_NAME_ATTR, AGENT_ATTR, "State"])  # fmt: skip
            return ads

    def _startd_nodes(self) -> dict[str, str]:
        """startd name (``nodeb@migpool``) -> its MigBatchNodeName."""
        ads = self._startds()
        return {_host(str(ad["Name"])): str(ad[NODE_NAME_ATTR]) for ad in map(self._plain, ads)}

    def jobs(self) -> list[BatchJob]:
        """The managed jobs (those with a tag) in the queue, and those finished in the last ``history_s``."""
        nodes = self._startd_nodes()
        with self._call(f"schedd.query({MANAGED})"):
            queued = self.schedd.query(constraint=MANAGED, projection=PROJECTION)
        since = int(time.time() - self.history_s)
        with self._call("schedd.history"):
            ended = self.schedd.history(constraint=f"{MANAGED} && EnteredCurrentStatus >= {since}",
                                        projection=PROJECTION)  # fmt: skip
        out = {}
        for ad in [*ended, *queued]:  # the queue's copy wins
            job = to_batch_job(self._plain(ad), nodes)
            out[job.job_id] = job
        return list(out.values())

    def job(self, job: str) -> BatchJob | None:
        """One job, from the queue or else the history; None when HTCondor no longer knows it."""
        constraint = _job_constraint(job)
        with self._call(f"schedd.query({constraint})"):
            ads = self.schedd.query(constraint=constraint, projection=PROJECTION)
            if not ads:
                ads = self.schedd.history(constraint=constraint, projection=PROJECTION, match=1)
        return to_batch_job(self._plain(ads[0]), self._startd_nodes()) if ads else None

    def jobs_named(self, jobs: Collection[str]) -> dict[str, BatchJob | None]:
        """The queue's records of ``jobs`` in one query (None: no longer queued, so not running); an id that is
        not HTCondor's is left out."""
        wanted: dict[str, tuple[int, int]] = {}  # the id as asked -> (ClusterId, ProcId)
        for job in jobs:
            with contextlib.suppress(HTCondorError):
                wanted[job] = _cluster_proc(job)
        if not wanted:
            return {}
        constraint = " || ".join(f"(ClusterId == {c} && ProcId == {p})" for c, p in set(wanted.values()))
        nodes = self._startd_nodes()
        with self._call("schedd.query(the jobs named)"):
            ads = self.schedd.query(constraint=constraint, projection=PROJECTION)
        found = {(int(ad["ClusterId"]), int(ad["ProcId"])): ad for ad in map(self._plain, ads)}
        return {job: to_batch_job(found[key], nodes) if key in found else None for job, key in wanted.items()}

    def nodes(self) -> list[NodeStatus]:
        """One status per MigBatchNodeName: up while its startd advertises a slot that is not drained."""
        out: dict[str, NodeStatus] = {}
        for ad in map(self._plain, self._startds()):
            name = str(ad[NODE_NAME_ATTR])
            up = str(ad.get("State", "")) != "Drained" or (name in out and out[name].up)
            out[name] = NodeStatus(name, up, str(ad.get(AGENT_ATTR, "") or ""))
        return list(out.values())

    # --- acting ----------------------------------------------------------------------------------
    def _quote(self, text: str) -> str:
        quoted: str = self.classad.quote(text)
        return quoted

    def pin_and_release(self, pins: Sequence[Pin]) -> dict[str, str]:
        """Write each waiting job's tag, time limit (subjobs) and pin, then release it if it was held; the
        jobs that failed, with HTCondor's message (a job no longer waiting is refused and left alone)."""
        failed: dict[str, str] = {}
        for p in pins:
            try:
                # every edit constrained on the job still waiting: the schedd refuses it otherwise
                waiting = f"{_job_constraint(p.job_id)} && {WAITING}"
                with self._call(f"pin {p.job_id} to {p.node} (is it still waiting?)"):
                    ads = self.schedd.query(constraint=waiting, projection=["NumJobStarts"])
                    if not ads:
                        raise HTCondorError(f"pin {p.job_id}: no such job waiting")
                    starts = int(self._plain(ads[0]).get("NumJobStarts", 0) or 0)
                    self.schedd.edit(waiting, STARTS_ATTR, str(starts))  # one start per pin (attrs.START_POLICY)
                    if p.time_limit_min is not None:
                        self.schedd.edit(waiting, TIME_LIMIT_ATTR, str(p.time_limit_min * 60))
                    self.schedd.edit(waiting, TAG_ATTR, self._quote(p.admin_tag))
                    if p.slices:  # what accounting counts, where the site turns it on (accounting.py)
                        self.schedd.edit(waiting, SLICES_ATTR, str(int(p.slices)))
                    self.schedd.edit(waiting, PIN_ATTR, self._quote(p.node))  # last: it ends "waiting"
                    result = self.schedd.act(self.htcondor.JobAction.Release, p.job_id, ("mig-batch: placed", 0))
                if int(result.get("TotalSuccess", 0)) + int(result.get("TotalBadStatus", 0)) != 1:
                    raise HTCondorError(f"release {p.job_id}: {dict(result)}")  # BadStatus: it was idle, not held
            except HTCondorError as exc:
                failed[p.job_id] = str(exc)
        if len(failed) < len(pins):
            self._reschedule()
        return failed

    def release(self, jobs: Sequence[str]) -> None:
        for job in jobs:
            self._act("Release", job, "mig-batch: placed")
        if jobs:
            self._reschedule()

    def _reschedule(self) -> None:
        """Ask for a negotiation cycle now rather than at the next interval (seconds saved per job)."""
        with self._call("reschedule"):
            self.schedd.reschedule()

    def _act(self, action: str, job: str, reason: str = "", done_ok: bool = False) -> None:
        """One job action; ``done_ok``: a job already in that state counts as success."""
        with self._call(f"{action.lower()} {job}"):
            # a (text, code) tuple: htcondor2 25.14.1 drops a plain string reason
            result = self.schedd.act(getattr(self.htcondor.JobAction, action), job, (reason or "mig-batch", 0))
        if int(result.get("TotalSuccess", 0)) != 1 and not (done_ok and int(result.get("TotalAlreadyDone", 0)) == 1):
            counts = {k: v for k, v in dict(result).items() if v}
            raise HTCondorError(f"{action.lower()} {job}: {counts or 'no such job'}")

    def hold(self, job: str, reason: str = "mig-batch: waits for the controller") -> None:
        self._act("Hold", job, reason, done_ok=True)

    def requeue_hold(self, job: str, reason: str = "") -> None:
        """Held by the controller's identity (vacated if running) and unpinned: its owner may release it
        (HTCondor lets them), but unpinned it matches no node and the seam still sees it held."""
        self.hold(job, f"mig-batch: requeued{': ' + reason if reason else ''}")
        with self._call(f"unpin {job}"):
            self.schedd.edit(_job_constraint(job), PIN_ATTR, "undefined")

    def cancel(self, job: str) -> None:
        self._act("Remove", job, "mig-batch: cancelled", done_ok=True)

    def set_job_tag(self, job: str, admin_tag: str) -> None:
        with self._call(f"set {TAG_ATTR} of {job}"):
            if not self.schedd.edit(_job_constraint(job), TAG_ATTR, self._quote(admin_tag)):
                raise HTCondorError(f"set {TAG_ATTR} of {job}: no such job")

    def set_node_tag(self, node: str, agent_tag: str) -> None:
        """Write the node's agent file (one ClassAd line); the startd's cron job publishes it within a
        few seconds. Runs on that node (the file is node-local)."""
        path = Path(self.agent_file.format(node=node))
        line = f"{AGENT_ATTR} = {self._quote(agent_tag)}\n"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file(path, line, 0o644)  # the cron job runs as condor
        except OSError as exc:
            raise HTCondorError(f"write the agent file {path} of {node}: {exc}") from None

    def submit(self, argv: Sequence[str], script: str | None = None) -> str:
        """Submit one job from submit-description commands (``key=value`` items); ``script``, when given,
        becomes the executable (written beside the job, in ``initialdir`` or the current directory)."""
        description: dict[str, str] = {}
        for item in argv:
            key, sep, value = item.partition("=")
            if not sep:
                raise HTCondorError(f"submit: {item!r} is not a key=value submit command")
            description[key.strip()] = value.strip()
        if script is not None:
            where = Path(description.get("initialdir", os.getcwd()))
            try:
                fd, exe = tempfile.mkstemp(dir=where, prefix=".mig-batch-job-", suffix=".sh")
                with os.fdopen(fd, "w") as f:
                    f.write(script)
                os.chmod(exe, 0o755)
            except OSError as exc:
                raise HTCondorError(f"submit: write the script in {where}: {exc}") from None
            description["executable"] = exe
        with self._call(f"submit {description}"):
            submit = self.htcondor.Submit(description)
            if not self._submit_needs_queue_args:
                result = self.schedd.submit(submit, count=1)
            else:
                # The 24.0 LTS bindings' Schedd.submit reads the queue arguments' next-to-last character (IndexError
                # when there are fewer than two) and prints the whole description to stdout, where migsub prints the
                # job id. "01" is one job (count=1 decides anyway) and two characters; the print is swallowed.
                submit.setQArgs("01")
                with contextlib.redirect_stdout(io.StringIO()):
                    result = self.schedd.submit(submit, count=1)
        return f"{result.cluster()}.0"


# The seam, checked statically: mypy (see pyproject.toml) fails here when a method of HTCondorBatch no longer matches
# BatchSystem's (a missing method, another signature or return type).
_SEAM_CHECK: type[BatchSystem] = HTCondorBatch
