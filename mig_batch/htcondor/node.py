"""The node agent on an HTCondor execute node: the batch-neutral :class:`~mig_batch.node.agent.NodeAgent`
with :class:`~mig_batch.htcondor.adapter.HTCondorBatch` as its channel, served to the job wrapper.

HTCondor runs the job wrapper (``USER_JOB_WRAPPER``, :mod:`mig_batch.htcondor.job_wrapper`) as the job's
user, never root, so the wrapper asks this root service over a Unix socket that any local user may
open. Who asks is decided by :mod:`mig_batch.htcondor.peers`, the socket is served by
:mod:`mig_batch.htcondor.server`; this module's :class:`SlotGuard` decides what a caller may ask:

- the caller must descend from a ``condor_starter`` of this node's startd, and the schedd must show the
  job the caller names running in exactly that slot (``RemoteHost``), so a job can ask only for itself;
- the caller's uid must be the job owner's (looked up in the caller's own root), when the owner has
  an account there (sites that run jobs as slot users skip this part);
- the slot and the uid of the prolog's caller are remembered in a root-only directory beside the
  journal (so across a restart of the agent too); a later prolog of that job from that slot under
  another uid is refused, and the epilog is taken only from that slot and that uid (an entry written
  by an earlier release, without a uid, takes no epilog: the reconcile sweeps that instance).

Instances are destroyed when the job leaves its slot: the wrapper asks at the job's exit and on the
signals HTCondor sends for ``condor_rm``, ``condor_hold`` and an eviction; whatever the wrapper cannot
report (SIGKILL, a dead wrapper) the agent's reconcile sweeps, every ``reconcile_interval_s``, from the
schedd's view of which managed jobs still run on this node. The reports reach the controller through
HTCondor: the job's ``MigBatchTag`` (the agent's identity is a queue superuser) and the node's
``MigBatchAgent`` machine attribute (a node-local file a startd cron job publishes).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mig_batch.htcondor.peers import Caller, CallerRefused, owner_uid
from mig_batch.node.journal import Journal
from mig_batch.safe_files import write_file

if TYPE_CHECKING:
    from mig_batch.htcondor.adapter import HTCondorBatch

log = logging.getLogger("mig-batch-agent")
RUNNING = 2  # JobStatus
STALE_SLOT_S = 600.0  # a remembered slot without a journal entry this old: its instance is long gone
SETTLE_COOLDOWN_S = 30.0  # a slot whose wait for the schedd ran out waits no more for this long
# a job's prologs within PROLOG_WINDOW_S: a rerun after an eviction needs one, a job looping prolog and epilog
# would make the node create and destroy instances under its lock without end
PROLOGS_PER_WINDOW, PROLOG_WINDOW_S = 3, 60.0


class SlotGuard:
    """Decides whether a caller may provision or destroy a job's instance (see the module's text)."""

    def __init__(self, batch: HTCondorBatch, node: str, local_name: str = "", settle_s: float = 10.0,
                 directory: Path | None = None, journal: Journal | None = None):  # fmt: skip
        self.batch, self.node, self.local_name, self.settle_s = batch, node, local_name, settle_s
        self.slots: dict[str, tuple[str, int]] = {}  # job -> the slot and uid that provisioned it
        # kept on disk too (root's, beside the journal): a restarted agent still takes the wrapper's epilog
        self.directory, self.journal = directory, journal
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        self._startd = ""
        self._settle_lock = threading.Lock()
        self._settling: set[str] = set()  # slots waiting on the schedd now
        self._quiet_until: dict[str, float] = {}  # slot -> no wait on the schedd before then
        self._prologs: dict[str, collections.deque[float]] = {}  # job -> when its latest prologs were asked

    def _remember(self, job: str, slot: str, uid: int) -> None:
        self.slots[job] = (slot, uid)
        if self.directory is None:
            return
        # drop those whose instance is gone (the sweep took it); not a fresh one, whose instance another
        # thread may be making right now (not journaled yet)
        stale = time.time() - STALE_SLOT_S
        for old in self.directory.iterdir():
            with contextlib.suppress(OSError):
                if self.journal is not None and self.journal.get(old.name) is None and old.stat().st_mtime < stale:
                    old.unlink()
        write_file(self.directory / job, f"{slot} {uid}\n", 0o600)

    def _recalled(self, job: str) -> tuple[str, int] | None:
        """The slot and uid that provisioned ``job``; None when unknown (or written without a uid)."""
        if job in self.slots or self.directory is None:
            return self.slots.get(job)
        try:
            slot, uid = (self.directory / job).read_text().split()
            return slot, int(uid)
        except (OSError, ValueError):
            return None

    def _forget(self, job: str) -> None:
        self.slots.pop(job, None)
        if self.directory is not None:
            (self.directory / job).unlink(missing_ok=True)

    def startd(self) -> str:
        """This node's startd name as HTCondor writes it in RemoteHost (``nodeb@migpool``)."""
        if not self._startd:
            for ad in self.batch._startds():
                if str(ad.get("MigBatchNodeName")) == self.node and "@" in str(ad.get("Name", "")):
                    self._startd = str(ad["Name"]).partition("@")[2]
                    break
        if not self._startd:
            raise CallerRefused(f"the collector knows no startd with MigBatchNodeName {self.node!r}")
        return self._startd

    @contextlib.contextmanager
    def _settle_window(self, slot: str) -> Iterator[float]:
        """How long this request may wait for the schedd: ``settle_s`` for one request of a slot at a
        time and not within SETTLE_COOLDOWN_S of a wait that ran out; else no wait (one look)."""
        now = time.monotonic()
        with self._settle_lock:
            allowed = slot not in self._settling and self._quiet_until.get(slot, 0.0) <= now
            if allowed:
                self._settling.add(slot)
        try:
            yield self.settle_s if allowed else 0.0
        finally:
            if allowed:
                with self._settle_lock:
                    self._settling.discard(slot)

    def check_prolog(self, caller: Caller, job: str) -> None:
        if caller.local_name != self.local_name:
            raise CallerRefused(f"caller in a slot of startd {caller.local_name or '(plain)'}, not of {self.node}")
        recalled = self._recalled(job)
        if recalled is not None and recalled[0] == caller.slot and recalled[1] != caller.uid:
            raise CallerRefused(f"job {job}'s instance was made for uid {recalled[1]}, not uid {caller.uid}")
        want = f"{caller.slot}@{self.startd()}"
        with self._settle_window(caller.slot) as settle_s:
            deadline = time.monotonic() + settle_s  # the schedd may record the start a moment later
            while True:
                ad = self._ad(job)
                if ad is None:
                    raise CallerRefused(f"no job {job} in the queue")
                if int(ad.get("JobStatus", 0)) == RUNNING and ad.get("RemoteHost") == want:
                    break
                if time.monotonic() >= deadline:
                    if settle_s:
                        with self._settle_lock:
                            self._quiet_until[caller.slot] = time.monotonic() + SETTLE_COOLDOWN_S
                    raise CallerRefused(f"job {job} is not running in {want} (status {ad.get('JobStatus')}, "
                                        f"RemoteHost {ad.get('RemoteHost')})")  # fmt: skip
                time.sleep(0.3)
        # counted per grant: a chain's job (one HTCondor job for all its subjobs) asks once per subjob, and only the
        # controller writes a new subjob number into the (protected) tag
        subjob = _tag_field(str(ad.get("MigBatchTag", "")), "subjob")
        self._count_prolog(job if subjob is None else f"{job}#{subjob}")
        expected = owner_uid(caller.pid, str(ad.get("Owner", "")))
        if expected is not None and expected != caller.uid:
            raise CallerRefused(f"caller uid {caller.uid} is not job {job}'s owner {ad.get('Owner')} ({expected})")
        self._remember(job, caller.slot, caller.uid)

    def _count_prolog(self, job: str) -> None:
        """Refuse a job's prolog (``job``: its id, or ``id#subjob`` for a chain's subjob) past PROLOGS_PER_WINDOW
        within PROLOG_WINDOW_S."""
        now = time.monotonic()
        with self._settle_lock:
            for old in [j for j, times in self._prologs.items() if times[-1] < now - PROLOG_WINDOW_S]:
                del self._prologs[old]  # forgotten once quiet: the table stays as small as the busy jobs
            times = self._prologs.setdefault(job, collections.deque(maxlen=PROLOGS_PER_WINDOW))
            if len(times) == PROLOGS_PER_WINDOW and times[0] > now - PROLOG_WINDOW_S:
                raise CallerRefused(f"job {job} asked for its instance {PROLOGS_PER_WINDOW} times within "
                                    f"{PROLOG_WINDOW_S:.0f} s")  # fmt: skip
            times.append(now)

    def check_epilog(self, caller: Caller, job: str) -> None:
        recalled = self._recalled(job)
        if caller.local_name != self.local_name or recalled is None or recalled[0] != caller.slot:
            raise CallerRefused(f"job {job}'s instance was not made for slot {caller.slot}; the reconcile "
                                "destroys it once the job left its slot")  # fmt: skip
        if recalled[1] != caller.uid:
            raise CallerRefused(f"job {job}'s instance was made for uid {recalled[1]}, not uid {caller.uid}")
        self._forget(job)

    def _ad(self, job: str) -> dict[str, Any] | None:
        with self.batch._call(f"read job {job}"):
            ads = self.batch.schedd.query(constraint=_job_constraint(job),
                                          projection=["JobStatus", "RemoteHost", "Owner", "MigBatchTag"])  # fmt: skip
        return self.batch._plain(ads[0]) if ads else None


RANK_PREFIX = "#rank "  # the agent's per-rank lines (``#rank R export NAME=value``), which Slurm's TaskProlog reads
SPOTS_VAR = "MIG_BATCH_SPOTS"  # every rank's MIG_BATCH_INSTANCE (node/gpu/profile@start), in rank order


def exports_env(lines: Sequence[str]) -> dict[str, str]:
    """``export NAME=value`` lines (the agent's job environment) as a mapping. A job over several instances
    also gets ``MIG_BATCH_SPOTS`` from its ``#rank`` lines: with ``MIG_BATCH_INSTANCES`` (their UUIDs) it is
    what the wrapper's ``--rank`` mode binds each rank process to (HTCondor has no TaskProlog)."""
    env = dict(line.removeprefix("export ").split("=", 1) for line in lines
               if line.startswith("export ") and "=" in line)  # fmt: skip
    spots: dict[int, str] = {}
    for line in lines:
        rank, sep, export = line.removeprefix(RANK_PREFIX).partition(" export MIG_BATCH_INSTANCE=")
        if line.startswith(RANK_PREFIX) and sep and rank.isdigit():
            spots[int(rank)] = export
    if spots:
        env[SPOTS_VAR] = ",".join(spots[r] for r in sorted(spots))
    return env


def _tag_field(tag: str, name: str) -> str | None:
    """One ``name=value`` field of a ``MigBatchTag``; None when it has none."""
    fields = dict(part.split("=", 1) for part in tag.split(";") if "=" in part)
    return fields.get(name)


def _job_constraint(job: str) -> str:
    from mig_batch.htcondor.adapter import _job_constraint as constraint

    return constraint(job)
