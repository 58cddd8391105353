"""The node agent's work, batch-neutral: provision a job's MIG instance where the controller decided,
fall back on this node when that spot is taken, bind it to the job, destroy it, reconcile strays.

It reads the decision from the job's operator-only tag through the batch system and reports what it
did the same way (``NodeReport``); the controller's store is never opened here. Every entry point
catches everything: a hook that fails would drain the node, so a problem becomes a report (requeue)
and a log line instead. Calls are serialized by one lock, across processes too (mig_batch/node/lock.py):
the journal, the GPUs and the reconcile see one consistent node.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from mig_batch.batch.system import BatchError, BatchJob
from mig_batch.batch.tags import (
    AgentTag,
    NodeProblem,
    NodeReport,
    Placed,
    job_of,
    parse_place,
    parse_report,
    parse_tag,
    profiles_by_model,
    rank_key,
    with_report,
)
from mig_batch.gpu.base import (
    GpuBackend,
    GpuBackendError,
    InsufficientResources,
    InUse,
    MigInstance,
    NotFound,
    NotSupported,
)
from mig_batch.job_env import ENV_DEADLINE, ENV_MARGIN
from mig_batch.node.fence import Fence, FenceError, Unfenced
from mig_batch.node.journal import NO_HOLDER, OWNER_UNKNOWN, Entry, Journal
from mig_batch.node.lock import LOCK_NAME, NodeBusy, NodeLock
from mig_batch.placement.base import Placement, PlacementRequest
from mig_batch.placement.cluster import Cluster, Gpu
from mig_batch.placement.multi import MULTI_POLICIES, MultiPlacement, MultiPolicy
from mig_batch.placement.policies import make_policy
from mig_batch.safe_files import make_dir, write_file

log = logging.getLogger("mig-batch-agent")
NO_DEVICE = "NoDevFiles"  # what a job gets when nothing could be made: CUDA sees no GPU
# the ids the batch systems give a job's hooks: Slurm's SLURM_JOB_ID (digits), HTCondor's cluster.proc. An id
# names the job's file in job_dir: anything else ("../x") is refused before it names one
JOB_ID = re.compile(r"[0-9]{1,20}(?:\.[0-9]{1,20})?")


def valid_job_id(job_id: object) -> bool:
    """Whether ``job_id`` is a job id of Slurm's or HTCondor's (see JOB_ID)."""
    return isinstance(job_id, str) and JOB_ID.fullmatch(job_id) is not None


class NodeChannel(Protocol):
    """What the agent needs from the batch system (a subset of ``BatchSystem``)."""

    def job(self, job: str) -> BatchJob | None: ...

    def jobs(self) -> list[BatchJob]: ...

    def jobs_named(self, jobs: Collection[str]) -> dict[str, BatchJob | None]: ...

    def set_job_tag(self, job: str, admin_tag: str) -> None: ...

    def set_node_tag(self, node: str, agent_tag: str) -> None: ...


@dataclass(frozen=True)
class PrologResult:
    exports: list[str]
    report: NodeReport | None  # None: not a managed job, or the instance existed already
    problem: str = ""  # a problem worth an operator's attention (logged by the caller too)


def node_view(backend: GpuBackend, node: str) -> Cluster:
    """This node's GPUs with their real instances, for a local placement."""
    gpus = backend.gpus()
    view = Cluster([Gpu(g.index, node, g.index, g.model) for g in gpus])
    for g in gpus:
        for inst in backend.instances(g.index):
            view.allocate(g.index, f"gi{g.index}.{inst.gi_id}", inst.profile, inst.start)
    return view


def place_locally(backend: GpuBackend, node: str, request: str, decided_model: str | None, decided_profile: str,
                  policy: str = "mfi") -> Placement | None:  # fmt: skip
    """Where on this node the job fits by ``policy``: the decided profile on GPUs of the decided model
    (a moldable job keeps its chosen size), the request's translation on the others."""
    view, profiles = _local_view(backend, node, request, decided_model, decided_profile)
    if not profiles:
        return None
    decision = make_policy(policy).decide(view, PlacementRequest("job", profiles))
    return decision if isinstance(decision, Placement) else None


def _local_view(backend: GpuBackend, node: str, request: str, decided_model: str | None,
                decided_profile: str) -> tuple[Cluster, dict[str, str]]:  # fmt: skip
    """This node's GPUs as a placement view, and the profile the job gets on each of their models."""
    view = node_view(backend, node)
    models = {g.model for g in view.gpus}
    profiles = profiles_by_model(parse_tag(request), models)
    profiles = {} if isinstance(profiles, str) else profiles
    if decided_model in models:
        profiles[decided_model] = decided_profile
    return view, profiles


def place_ranks_locally(backend: GpuBackend, node: str, request: str, decided_model: str | None,
                        decided_profile: str, instances: int,
                        policy: str = "mfi") -> MultiPlacement | None:  # fmt: skip
    """Where on this node all ``instances`` of a multi-instance job fit now (``policy`` if it is a
    multi-instance policy, else ours), as :func:`place_locally` does for one instance."""
    view, profiles = _local_view(backend, node, request, decided_model, decided_profile)
    if not profiles:
        return None
    decision = MultiPolicy(policy if policy in MULTI_POLICIES else "mfi").decide(view, profiles, instances)
    return decision if isinstance(decision, MultiPlacement) else None


def _reported(admin_tag: str) -> bool:
    try:
        return parse_report(admin_tag) is not None
    except ValueError:  # unreadable: ours replaces it
        return False


def _reported_spots(jobs: Mapping[str, BatchJob],
                    reports: Mapping[str, NodeReport]) -> dict[str, tuple[str, NodeReport, int]]:  # fmt: skip
    """UUID -> (journal key, report, owner uid) of every instance the jobs' node reports name (a job's rank r: job#r);
    ``reports``: the agent's own for jobs whose record as read has none (sent since, or not taken)."""
    spots = {}
    for job_id, job in jobs.items():
        try:
            report = (parse_report(job.admin_tag) if job.managed else None) or reports.get(job_id)
        except ValueError:
            continue
        for rank, spot in enumerate(report.ranks() if report is not None else ()):
            spots[spot.uuid] = (rank_key(job_id, rank), spot, job.user_id)
    return spots


def holders(entries: Collection[Entry], live: Mapping[tuple[int, int], str]) -> tuple[dict[tuple[int, int], int],
                                                                                     set[tuple[int, int]]]:  # fmt: skip
    """Who holds each live instance ((gpu, gi id) -> UUID in ``live``) by the journal: (gpu, gi id) -> uid, and the
    instances whose holder is not known (journaled before the fence, or taken back by their Epilog: their nodes
    left as they are). Only an entry naming the instance there now counts, the newest when several do: an entry
    whose instance is gone holds nothing, even where its id was made again for another job."""
    held: dict[tuple[int, int], int] = {}
    unknown: set[tuple[int, int]] = set()
    for entry in sorted(entries, key=lambda e: e.created):
        spot = (entry.gpu, entry.gi_id)
        if live.get(spot) != entry.uuid:
            continue
        held.pop(spot, None)
        unknown.discard(spot)
        if entry.uid >= 0:
            held[spot] = entry.uid
        else:
            unknown.add(spot)
    return held, unknown


def _spots(verb: str, entries: list[Entry]) -> str:
    """The entries as "<verb> 1g.10gb@3 on GPU 0, ..." ("" for none)."""
    return f"{verb} " + ", ".join(f"{e.profile}@{e.start} on GPU {e.gpu}" for e in entries) if entries else ""


class NodeAgent:
    def __init__(self, node: str, backend: GpuBackend, journal: Journal, channel: NodeChannel, job_dir: Path,
                 policy: str = "mfi", checkpoint_margin_s: float = 30.0,
                 clock: Callable[[], float] = time.time, lock_wait_s: float | None = None,
                 fence: Fence | None = None):  # fmt: skip
        """``lock_wait_s``: how long to wait while another process holds the node's GPU work (None: as long as
        it takes; a hook's in-process fallback waits less, see mig_batch/node/lock.py). ``fence``: who may open
        each instance (mig_batch/node/fence.py; None: no fence, for backends without capabilities)."""
        self.node, self.backend, self.journal, self.channel = node, backend, journal, channel
        self.fence: Fence = fence if fence is not None else Unfenced()
        self.job_dir, self.policy, self.margin, self.clock = Path(job_dir), policy, checkpoint_margin_s, clock
        make_dir(self.job_dir, 0o755)  # the jobs' TaskProlog reads it; refused (UnsafePath) if a user can write it
        self.started = clock()
        self.lock = NodeLock(journal.dir / LOCK_NAME, lock_wait_s)  # shared with a hook's in-process fallback
        self._publishing = threading.Lock()  # one publish at a time, its field built when its turn comes
        # what the node's field shows (see AgentTag): the last reconcile and the problems since start
        self.reconciled, self.strays, self.problems = 0.0, 0, 0
        self.last_problem: NodeProblem | None = None
        self.mig_off: tuple[int, ...] = ()  # GPUs found with MIG mode off: the controller places nothing there
        # reports the batch system did not take (or jobs it could not be asked about): sent again at each
        # reconcile while their job runs here, else a job the node asked to requeue would run unbound to its end
        self.unsent: dict[str, tuple[NodeReport, float]] = {}  # job -> (its report, when it was not taken)

    # --- job start --------------------------------------------------------------------------
    def prolog(self, job_id: str, owner_uid: int | None = None) -> PrologResult:
        """Make the job's instance and leave its environment for the job; never raises. Only the GPU work
        holds the node's lock: reading the decision, writing the job's file and reporting need not.
        ``owner_uid``: the job owner's uid as the caller verified it (HTCondor: the wrapper's peer); None:
        the batch system's record of the job says."""
        if not valid_job_id(job_id):  # before it names a file or reaches the batch system
            return PrologResult([f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"], None, f"not a job id: {job_id!r}")
        job = None
        try:
            job = self.channel.job(job_id)
            problems = self.problems
            uid = owner_uid if owner_uid is not None else (job.user_id if job is not None else -1)
            with self.lock:
                result = self._provision(job_id, job, uid)
            if self.problems != problems:
                self._publish()  # a problem found while provisioning; sent outside the node's lock
            self._bind(job_id, result.exports)
        except Exception as exc:  # never fail the hook: that would drain the node
            result = PrologResult([f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"],
                                  NodeReport("requeue", reason=f"{type(exc).__name__}: {exc}"),
                                  f"{type(exc).__name__}: {exc}")  # fmt: skip
            if job is None:
                with contextlib.suppress(BatchError):
                    job = self.channel.job(job_id)
            with contextlib.suppress(OSError):  # the file may be what failed: the requeue is reported anyway
                self._write_job_file(job_id, result.exports)
        self._report(job_id, job, result.report)
        return result

    def _bind(self, job_id: str, exports: list[str]) -> None:
        """Leave the job its environment. When that fails, the job's instances are destroyed and the error
        raised: a job without its CUDA_VISIBLE_DEVICES would run on whatever device CUDA finds first."""
        try:
            self._write_job_file(job_id, exports)  # file work: outside the lock the GPU work needs
        except OSError:
            with self.lock:
                self._forget(self.journal.ranks(job_id))
            raise

    def _forget(self, entries: list[Entry]) -> None:
        """Destroy these journaled instances (those still there) and drop their entries."""
        for entry in entries:
            found = self.backend.find(entry.uuid, entry.gpu)
            if found is not None:
                self.fence.revoke(found.gpu, found.gi_id)
                self._destroy_all([found])
            self.journal.remove(entry.job)

    def _owned_by(self, entries: list[Entry], uid: int) -> list[Entry]:
        """The entries with ``uid`` as their owner where they name none: journaled by a release without the
        fence (journaled again)."""
        if uid < 0 or all(e.uid != OWNER_UNKNOWN for e in entries):
            return entries
        owned = [replace(e, uid=uid) if e.uid == OWNER_UNKNOWN else e for e in entries]
        for entry in owned:
            self.journal.add(entry)
        return owned

    def _grant(self, job_id: str, entries: list[Entry]) -> PrologResult | None:
        """Give the job's owner its instances' device nodes; when that fails, destroy them and requeue the
        job (None: granted). A job never runs on an instance every local user could open."""
        try:
            for entry in entries:
                self.fence.grant(entry.gpu, entry.gi_id, entry.uid)
        except FenceError as exc:
            self._forget(entries)
            reason = f"could not fence the job's instance on {self.node}: {exc}"
            self._note_problem(NodeProblem("prolog", job_id, reason))
            report = NodeReport("requeue", reason=reason)
            return PrologResult([f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"], report, reason)
        return None

    def _provision(self, job_id: str, job: BatchJob | None, uid: int) -> PrologResult:
        if job is None or not job.managed:
            return PrologResult([], None)  # not ours
        place = parse_place(job.admin_tag)
        known = self.journal.ranks(job_id)
        wanted = len(place.ranks()) if place is not None else 1
        if known and len(known) == wanted and all(self.backend.find(e.uuid, e.gpu) is not None for e in known):
            known = self._owned_by(known, uid)  # journaled by a release without the fence: its owner now
            return self._grant(job_id, known) or PrologResult(self._exports(known, place), None)  # ran before
        self._forget(known)  # a part of a job's instances (an earlier prolog stopped midway): start again
        if place is None:
            report = NodeReport("requeue", reason=f"released without a placement, on {self.node}")
            return PrologResult([f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"], report, report.reason)
        if len(place.spots) > 1:
            return self._provision_ranks(job_id, job, place, uid)
        kind = "made"
        try:
            if place.node != self.node:
                raise InsufficientResources(f"decided for {place.node}, running on {self.node}")
            inst = self.backend.create(place.gpu, place.profile, place.start)
        except NotSupported:
            refused = self._refused_mig_off(job_id, [place.gpu])
            if refused is None:
                raise
            return refused
        except InsufficientResources as exc:
            decided_model = next((g.model for g in self.backend.gpus() if g.index == place.gpu), None)
            local = place_locally(self.backend, self.node, job.admin_tag, decided_model, place.profile, self.policy)
            if local is None:
                report = NodeReport("requeue", reason=f"decided spot taken ({exc}); nothing fits on {self.node}")
                return PrologResult([f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"], report, report.reason)
            inst = self.backend.create(local.gpu_index, local.profile, local.start)
            kind = "replaced"
        entry = Entry(job_id, inst.gpu, inst.gi_id, inst.profile, inst.start, inst.uuid, self.clock(), uid)
        try:
            self.journal.add(entry)  # before the job can use it: a restart knows what it owns
        except Exception:
            with contextlib.suppress(GpuBackendError):  # unjournaled, it would be a stray until a reconcile
                self.backend.destroy(inst.gpu, inst.gi_id, inst.uuid)
            raise
        refused = self._grant(job_id, [entry])
        if refused is not None:
            return refused
        report = NodeReport(kind, inst.gpu, inst.profile, inst.start, inst.gi_id, inst.uuid)
        return PrologResult(self._exports([entry], place), report)

    def _provision_ranks(self, job_id: str, job: BatchJob, place: Placed, uid: int) -> PrologResult:
        """A multi-instance job: every rank's instance or none. A partial failure destroys what it made
        and falls back, as for one instance, to a place for all of them elsewhere on this node."""
        kind = "made"
        try:
            if place.node != self.node:
                raise InsufficientResources(f"decided for {place.node}, running on {self.node}")
            made = self._create_all(place.ranks())
        except NotSupported:  # every rank's GPU is checked: one off refuses the whole job
            refused = self._refused_mig_off(job_id, sorted({gpu for gpu, _, _ in place.ranks()}))
            if refused is None:
                raise
            return refused
        except InsufficientResources as exc:
            decided_model = next((g.model for g in self.backend.gpus() if g.index == place.gpu), None)
            local = place_ranks_locally(self.backend, self.node, job.admin_tag, decided_model, place.profile,
                                        len(place.spots), self.policy)  # fmt: skip
            try:
                if local is None:
                    raise InsufficientResources("no room for all of them")
                made = self._create_all([(s.gpu_index, s.profile, s.start) for s in local.spots])
            except InsufficientResources as again:
                report = NodeReport("requeue", reason=f"decided spots taken ({exc}); {len(place.spots)} instances "
                                    f"do not fit on {self.node} ({again})")  # fmt: skip
                return PrologResult([f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"], report, report.reason)
            kind = "replaced"
        now = self.clock()
        entries = [Entry(rank_key(job_id, r), i.gpu, i.gi_id, i.profile, i.start, i.uuid, now, uid)
                   for r, i in enumerate(made)]  # fmt: skip
        try:
            for entry in entries:  # before the job can use them: a restart knows what it owns
                self.journal.add(entry)
        except Exception:
            self._destroy_all(made)
            with contextlib.suppress(OSError):  # an entry left names no instance: the reconcile drops it
                for entry in entries:
                    self.journal.remove(entry.job)
            raise
        refused = self._grant(job_id, entries)
        if refused is not None:
            return refused
        reports = [NodeReport(kind, i.gpu, i.profile, i.start, i.gi_id, i.uuid) for i in made]
        report = NodeReport(kind, made[0].gpu, made[0].profile, made[0].start, made[0].gi_id, made[0].uuid,
                            more=tuple(reports[1:]))  # fmt: skip
        return PrologResult(self._exports(entries, place), report)

    def _refused_mig_off(self, job_id: str, gpus: list[int]) -> PrologResult | None:
        """A create refused as not supported: when MIG mode is off on one of the job's ``gpus`` (read
        again, published for the controller), the job's requeue with the reason; None when it is not."""
        self._mig_off_now(-1)  # reads every GPU's mode again
        off = [gpu for gpu in gpus if gpu in self.mig_off]
        if not off:
            return None
        listed = ", ".join(map(str, off))
        reason = (f"MIG mode is off on GPU {listed} of {self.node}; the job is requeued and that GPU takes no MIG "
                  f"job until an administrator runs 'nvidia-smi -i {listed} -mig 1'")  # fmt: skip
        self._note_problem(NodeProblem("prolog", job_id, reason))
        report = NodeReport("requeue", reason=reason)
        return PrologResult([f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"], report, reason)

    def _create_all(self, spots: Iterable[tuple[int, str, int]]) -> list[MigInstance]:
        """Create an instance at every (gpu, profile, start); on any failure destroy the ones made and raise."""
        made: list[MigInstance] = []
        try:
            for gpu, profile, start in spots:
                made.append(self.backend.create(gpu, profile, start))
        except BaseException:
            self._destroy_all(made)
            raise
        return made

    def _destroy_all(self, made: Iterable[MigInstance]) -> None:
        for inst in made:
            with contextlib.suppress(GpuBackendError):
                self.backend.destroy(inst.gpu, inst.gi_id, inst.uuid)

    def _exports(self, entries: list[Entry], place: Placed | None) -> list[str]:
        """The job's environment. A multi-instance job also gets ``MIG_BATCH_INSTANCES`` (every UUID in rank
        order), ``MIG_BATCH_INSTANCE_COUNT`` and one ``#rank R export ...`` line per rank: the TaskProlog
        gives each task the lines of its own ``SLURM_LOCALID`` after the common ones (rank 0's instance by
        default)."""
        entry = entries[0]
        lines = [f"export CUDA_VISIBLE_DEVICES={entry.uuid}",
                 f"export MIG_BATCH_INSTANCE={self.node}/{entry.gpu}/{entry.profile}@{entry.start}"]  # fmt: skip
        if len(entries) > 1:
            lines += [f"export MIG_BATCH_INSTANCES={','.join(e.uuid for e in entries)}",
                      f"export MIG_BATCH_INSTANCE_COUNT={len(entries)}"]  # torchrun's --nproc-per-node
            for rank, e in enumerate(entries):
                spot = f"{self.node}/{e.gpu}/{e.profile}@{e.start}"
                lines += [f"#rank {rank} export CUDA_VISIBLE_DEVICES={e.uuid}",
                          f"#rank {rank} export MIG_BATCH_INSTANCE={spot}"]  # fmt: skip
        if place is not None and place.window_s is not None:  # a chain's subjob: its window starts now
            margin = min(self.margin, place.window_s / 4)  # short windows still do work
            lines += [f"export {ENV_DEADLINE}={self.clock() + place.window_s:.3f}", f"export {ENV_MARGIN}={margin:.3f}",
                      f"export MIG_BATCH_SUBJOB={place.subjob}"]  # fmt: skip
        return lines

    def _report(self, job_id: str, job: BatchJob | None, report: NodeReport | None) -> None:
        if report is None:
            return
        if job is None:  # its record could not be read: the reconcile sends the report once it can be
            self.unsent[job_id] = (report, self.clock())
            return
        try:
            self.channel.set_job_tag(job_id, with_report(job.admin_tag, report))
        except BatchError as exc:  # the job runs anyway; the node's field tells the controller meanwhile
            self.unsent[job_id] = (report, self.clock())
            problem = NodeProblem("prolog", job_id, f"could not report {report.text()}: {exc} (sent again at the "
                                  "next reconcile)")  # fmt: skip
            try:
                with self.lock:
                    self._note_problem(problem)
            except NodeBusy:  # a fallback while the agent holds the node: the log line is what it has
                log.warning("job %s prolog: %s", job_id, problem.reason)
                return
            self._publish()

    def _send_unsent(self, live: dict[str, BatchJob], asked: float) -> None:
        """The reports not taken at their Prolog, for jobs that still run here (those the question of
        ``asked`` does not show running are dropped, unless the report is newer than the question)."""
        for job_id, (report, since) in list(self.unsent.items()):
            job = live.get(job_id)
            if job is None and since >= asked:
                continue  # its job may have started after the question: the next reconcile sees it
            if job is None or not job.managed or _reported(job.admin_tag):
                self.unsent.pop(job_id, None)  # ended, not ours, or reported since
                continue
            try:
                self.channel.set_job_tag(job_id, with_report(job.admin_tag, report))
            except BatchError as exc:
                log.warning("job %s: could not report %s again: %s", job_id, report.text(), exc)
            else:
                self.unsent.pop(job_id, None)

    # --- job end ----------------------------------------------------------------------------
    def epilog(self, job_id: str, attempts: int = 10, pause_s: float = 0.5) -> str:
        """Destroy the job's instance; what happened, in words. Never raises. A problem (the instance
        still in use, an error, strays) is also published on the node for the controller's events."""
        if not valid_job_id(job_id):  # before it names a file
            return f"refused: not a job id: {job_id!r}"
        try:
            with self.lock:
                detail, problem = self._epilog(job_id, attempts, pause_s)
                if problem:
                    self._note_problem(NodeProblem("epilog", job_id, detail))
        except NodeBusy as exc:  # a fallback while the agent holds the node: the agent destroys it
            return f"{exc}; the instance is left to the agent's own run of this Epilog, or to its sweep"
        if problem:
            self._publish()
        return detail

    def _epilog(self, job_id: str, attempts: int, pause_s: float) -> tuple[str, bool]:
        """(what happened, whether it is a problem)."""
        self.unsent.pop(job_id, None)
        try:
            self._job_file(job_id).unlink(missing_ok=True)
            entries = self.journal.ranks(job_id)
            if not entries:
                return "nothing to destroy", False
            gone = []
            for entry in entries:
                if self._remade(entry):
                    gone.append(entry)  # its id holds another job's instance now
                else:
                    outcome = self._destroy_journaled(entry, attempts, pause_s)
                    if outcome is None:
                        self.journal.add(replace(entry, uid=NO_HOLDER))  # taken back: no reconcile gives it again
                        return f"instance {entry.profile}@{entry.start} on GPU {entry.gpu} still in use; " \
                               "the reconcile destroys it later", True  # fmt: skip
                    if not outcome:
                        gone.append(entry)
                self.journal.remove(entry.job)
            strays = [s for gpu in sorted({e.gpu for e in entries}) for s in self._local_strays(gpu)]
            destroyed = "; ".join(part for part in (_spots("destroyed", [e for e in entries if e not in gone]),
                                                    _spots("already gone:", gone)) if part)  # fmt: skip
            if strays:
                return f"{destroyed}; destroyed {len(strays)} stray instance(s): {', '.join(strays)}", True
            return destroyed, False
        except Exception as exc:
            return f"epilog error {type(exc).__name__}: {exc}", True

    def _destroy_journaled(self, entry: Entry, attempts: int, pause_s: float) -> bool | None:
        """Destroy an entry's instance, by its UUID too (its id may have been made again for another job's
        instance): True when destroyed, False when gone already, None when still in use after ``attempts``."""
        self.fence.revoke(entry.gpu, entry.gi_id)  # its nodes root's first: no process of the job opens it again
        for attempt in range(attempts):
            try:
                self.backend.destroy(entry.gpu, entry.gi_id, entry.uuid)
                return True
            except NotFound:
                return False  # idempotent
            except InUse:
                if attempt < attempts - 1:
                    time.sleep(pause_s)  # the job's processes are still exiting
        return None

    def _remade(self, entry: Entry) -> bool:
        """Whether a newer entry names ``entry``'s GPU instance id: its instance was destroyed behind the
        agent's back and the id made again for another job. The UUID check alone would not tell where the
        driver gives the new instance the same UUID."""
        others = self.journal.holders(entry.gpu, entry.gi_id)
        return any(o.job != entry.job and o.created > entry.created for o in others)

    def _note_problem(self, problem: NodeProblem) -> None:
        """Count the problem for the node's field (:meth:`_publish` shows it, where the controller reads it)."""
        self.problems += 1
        self.last_problem = problem
        log.warning("%s%s: %s", f"job {problem.job} " if problem.job else "", problem.hook, problem.reason)

    def _publish(self) -> None:
        """The node's field as it stands now. Called outside the node's lock: a batch system slow to answer
        must not hold up the Prologs and Epilogs waiting for it. Publishes take turns, so that the field ends
        with the newest state, not with whichever send the batch system answered last."""
        with self._publishing:
            tag = AgentTag(self.started, self.reconciled, self.strays, self.problems, self.last_problem, self.mig_off)
            try:
                self.channel.set_node_tag(self.node, tag.text())
            except BatchError as exc:
                log.warning("could not publish the node's state: %s", exc)

    def _mig_off_now(self, gpu: int) -> bool:
        """Read every GPU's MIG mode again (an administrator may have switched one); is ``gpu``'s off?"""
        self.mig_off = tuple(g.index for g in self.backend.gpus() if not g.mig_enabled)
        return gpu in self.mig_off

    def _local_strays(self, gpu: int) -> list[str]:
        """Instances on ``gpu`` that no journal entry names: no job owns them (a crashed create). The
        journal is listed only when an instance id on the GPU is not among the entries the agent knows
        (:meth:`Journal.held_ids`), and each one's UUID read only when an id is not journaled there: an id
        made again after its journaled instance was destroyed behind our back, or after another writer
        removed an entry the agent still knows, is left to the reconcile, which lists and compares UUIDs."""
        ids = set(self.backend.instance_ids(gpu))
        if ids <= self.journal.held_ids(gpu):
            return []
        owned = self.journal.entries()  # read again: another writer may have journaled the others
        if ids <= {e.gi_id for e in owned if e.gpu == gpu}:
            return []
        uuids = {e.uuid for e in owned}
        return [self._destroy_stray(i) for i in self.backend.instances(gpu) if i.uuid not in uuids]

    def _destroy_stray(self, inst: MigInstance) -> str:
        try:
            self.fence.revoke(inst.gpu, inst.gi_id)
            self.backend.destroy(inst.gpu, inst.gi_id, inst.uuid)
        except (GpuBackendError, FenceError) as exc:
            return f"{inst.profile}@{inst.start} on GPU {inst.gpu} (not destroyed: {exc})"
        return f"{inst.profile}@{inst.start} on GPU {inst.gpu}"

    # --- reconcile ----------------------------------------------------------------------------
    def reconcile(self) -> list[str]:
        """Destroy every instance no live job of this node owns (asked through the batch system), keep
        the others, publish the result on the node. The strays, in words. The batch system is asked
        outside the node's lock, so an instance journaled after the question is kept: its job may have
        started since."""
        asked = self.clock()
        self.refence()  # first, and whether or not the batch system answers
        try:
            running, asked_about = self._live_here()
        except BatchError as exc:
            log.warning("reconcile skipped: the batch system did not answer (%s)", exc)
            return []
        unsent = {job: report for job, (report, _) in self.unsent.copy().items()}  # Prologs add to it meanwhile
        self._send_unsent(running, asked)
        with self.lock:
            self.journal.look_for_old_files()  # an earlier release's hook may have written one since
            adopted = False  # entries journaled before the fence, of jobs running here: their owner's now
            for entry in self.journal.entries():
                holder = running.get(job_of(entry.job))
                if entry.uid == OWNER_UNKNOWN and holder is not None and holder.user_id >= 0:
                    self._owned_by([entry], holder.user_id)
                    adopted = True
            strays = []
            for entry in self.journal.entries():
                job = job_of(entry.job)  # a multi-instance job's rank r: job#r
                if job in running or entry.created >= asked or (asked_about is not None and job not in asked_about):
                    continue  # alive, or journaled after the question (its job not asked about: the next time)
                with_job = f"job {entry.job}'s "
                found = self.backend.find(entry.uuid, entry.gpu)
                if found is not None:
                    strays.append(with_job + self._destroy_stray(found))
                self.journal.remove(entry.job)
                if valid_job_id(job_of(entry.job)):  # an earlier release journaled any id without a "/"
                    self._job_file(job_of(entry.job)).unlink(missing_ok=True)
            owned = {e.uuid for e in self.journal.entries()}
            gpus = self.backend.gpus()
            self.mig_off = tuple(g.index for g in gpus if not g.mig_enabled)
            if self.mig_off:
                log.warning("MIG mode is off on GPU(s) %s: no MIG job is placed there until an administrator "
                            "enables it (nvidia-smi -i N -mig 1)", ", ".join(map(str, self.mig_off)))  # fmt: skip
            reported = _reported_spots(running, unsent) if asked_about is None else {}  # only a listing takes back
            for gpu in gpus:
                if gpu.mig_enabled:
                    for inst in self.backend.instances(gpu.index):
                        if inst.uuid in owned or asked_about is not None:
                            continue  # owned, or made since the look: the next reconcile lists every job
                        if not self._take_back(inst, reported.get(inst.uuid)):
                            strays.append(self._destroy_stray(inst))
            self.reconciled, self.strays = self.clock(), len(strays)
            if strays:
                self._note_problem(NodeProblem("reconcile", "", f"destroyed {len(strays)} stray "
                                               f"instance(s): {', '.join(strays)}"))  # fmt: skip
        if adopted:
            self.refence()
        self._publish()
        return strays

    def refence(self) -> list[str]:
        """Every instance's device nodes as the journal says who holds what (at start and at each reconcile:
        after a restart, an instance destroyed behind the agent's back, a node made anew by someone else).
        What was changed, in words; a failure is a node problem, never an exception."""
        try:
            with self.lock:
                live = {(g.index, i.gi_id): i.uuid for g in self.backend.gpus() if g.mig_enabled
                        for i in self.backend.instances(g.index)}  # fmt: skip
                changed = self.fence.enforce(*holders(self.journal.entries(), live))
        except (FenceError, OSError) as exc:
            self._note_problem(NodeProblem("reconcile", "", f"could not enforce the instance fence: {exc}"))
            return []
        if changed:
            log.warning("fence: device nodes set back to the journal's holders: %s", "; ".join(changed))
        return changed

    def _live_here(self) -> tuple[dict[str, BatchJob], set[str] | None]:
        """The jobs running on this node among those the batch system answered about, and which those were
        (None: every job). Asked about: the journal's jobs and those whose report waits to be sent again. A
        listing of every job from each node's reconcile would cost the batch system a pass over its whole
        queue per node and interval. Every job is listed only when an instance here is not journaled: a
        running job's instance (its journal lost) is told from a stray by the job's report. A GPU that
        cannot be read fails the reconcile."""
        entries = self.journal.entries()
        owned = {e.uuid for e in entries}
        with self.lock:  # all GPU work takes turns, reads too (the emulated driver's calls are not thread-safe)
            gpus = [g.index for g in self.backend.gpus() if g.mig_enabled]
            unjournaled = any(i.uuid not in owned for g in gpus for i in self.backend.instances(g))
        if unjournaled:
            return {j.job_id: j for j in self.channel.jobs() if j.running and j.on(self.node)}, None
        answered = self.channel.jobs_named(sorted({job_of(e.job) for e in entries} | set(self.unsent)))
        running = {job: j for job, j in answered.items() if j is not None and j.running and j.on(self.node)}
        return running, set(answered)

    def _take_back(self, inst: MigInstance, reported: tuple[str, NodeReport, int] | None) -> bool:
        """Journal again an instance that a running job's report names but the journal does not (the journal
        was lost: a wiped directory, an operator's clean-up), rather than destroy it under the job. Only
        where the report names this very instance (GPU, id and UUID) and the job's rank has no other entry."""
        if reported is None:
            return False
        key, rank, uid = reported
        if (rank.gpu, rank.gi_id) != (inst.gpu, inst.gi_id) or self.journal.get(key) is not None:
            return False
        self.journal.add(Entry(key, inst.gpu, inst.gi_id, inst.profile, inst.start, inst.uuid, self.clock(), uid))
        detail = f"{inst.profile}@{inst.start} on GPU {inst.gpu}, named by job {job_of(key)}'s report but not " \
                 "in the journal: kept and journaled again"  # fmt: skip
        log.warning("reconcile: %s", detail)
        self._note_problem(NodeProblem("reconcile", job_of(key), detail))
        return True

    def _job_file(self, job_id: str) -> Path:
        """The job's file in job_dir; ValueError for what is not a job id (it would name another file)."""
        if not valid_job_id(job_id):
            raise ValueError(f"not a job id: {job_id!r}")
        return self.job_dir / job_id

    def _write_job_file(self, job_id: str, exports: list[str]) -> None:
        """``export NAME=value`` lines for the TaskProlog (node-local, read by the job's tasks). A temporary
        file of its own per write: the procs of one HTCondor cluster (12.0, 12.1) bind at once."""
        if not exports:
            return
        make_dir(self.job_dir, 0o755)  # an operator may have removed it since the start
        write_file(self._job_file(job_id), "".join(f"{line}\n" for line in exports), 0o644)
