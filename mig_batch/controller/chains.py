"""Subjob chains in the controller (SJA on Slurm): offer gaps, grant subjobs, continue or end chains.

A chain (``migsub --atomize``) runs one batch job per subjob; the first job's id names it, and the
runner submits each next job (held, tagged ``chain=``) before its subjob exits.
  held chain job  -> gaps from the live view are offered; replies and the grant are recorded
  grant           -> decision + subjob row (window), then pin (node, admin comment, time limit) and release
  subjob ends 75  -> checkpointed, more to do: the next job is linked and waits for its grant
  subjob ends 0   -> the chain is done (a next job, if any, is cancelled)
  other endings   -> a failed subjob: the next job resumes from the last checkpoint, until
                     ``max_failures`` in a row; a cancelled job ends its chain
  requeued by the batch system after its start, or its node could not make its instance -> ended, no
                     failure counted; the chain goes on
  no next job     -> (the runner could not submit one) the ended job is requeued held instead; a
                     start of it that finds no Prolog's work exits 76 and is started again, not
                     counted as a failure (slurmd may skip the Prolog of a requeued job id)
The decisions themselves come from :mod:`mig_batch.atomize` (pure code, shared with the simulator).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from mig_batch.atomize.defrag import Steer, choose_spot, offer_groups
from mig_batch.atomize.gaps import Gap, cluster_gaps, start_in_gap
from mig_batch.atomize.profiles import MemoryProfile
from mig_batch.atomize.protocol import Chain, Reply, Round, negotiate
from mig_batch.atomize.samples import read_samples
from mig_batch.batch.states import DecisionState
from mig_batch.batch.system import BatchJob
from mig_batch.batch.tags import JobTag
from mig_batch.config import SiteConfig
from mig_batch.mig.models import get_model
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.timelines import GpuTimeline
from mig_batch.state import ChainRecord, Decision, Store, SubjobRecord
from mig_batch.subjob import EXIT_CONTINUE, EXIT_DONE, EXIT_NOT_PREPARED, SLURM_SIGNAL_MARGIN_S

log = logging.getLogger("mig-batchd")


def _place(chain: Chain, reply: Reply, offered: Gap, gaps: Sequence[Gap], taken: Mapping[int, int], *,
           timelines: list[GpuTimeline], now: float, eps: float, hysteresis: float) -> tuple[Gap, Reply]:  # fmt: skip
    return choose_spot(chain, reply, offered, gaps, timelines, taken, now, eps, hysteresis)


class ChainDriver:
    def __init__(self, config: SiteConfig, store: Store, view: Cluster):
        self.config, self.store, self.view = config, store, view
        self._history: dict[str, tuple[int, MemoryProfile]] = {}  # job -> (subjobs seen, profile)
        self._refused: dict[str, tuple[str, ...]] = {}  # job -> what its folder's last read refused, logged
        self._last_round: object = None

    def register(self, job: BatchJob, tag: JobTag, declared_mib: float) -> ChainRecord:
        a = tag.atomize
        assert a is not None
        self.store.add_chain(ChainRecord(job.job_id, a.checkpoint_dir, declared_mib, a.min_s, a.max_s, a.deadline,
                                         float(job.submit_time), "waiting", 0, 0, 0.0, None))  # fmt: skip
        record = self.store.chain(job.job_id)
        assert record is not None
        return record

    def history(self, record: ChainRecord, owner: int | None = None) -> MemoryProfile:
        """The chain's memory profile from its samples, read again only after a subjob ended. The folder is
        its owner's (``owner``: their uid, when known) and read as :mod:`mig_batch.atomize.samples` says: a
        hostile one costs only this chain its profile (it falls back to its declared memory), and what was
        refused is logged once, not every pass."""
        seen = self._history.get(record.job)
        if seen is None or seen[0] != record.subjobs:  # new samples only after a subjob ended
            samples = read_samples(record.checkpoint_dir, owner)
            if samples.refused and samples.refused != self._refused.get(record.job):
                log.warning("chain %s: memory samples under %s partly or not read: %s", record.job,
                            ascii(record.checkpoint_dir), "; ".join(samples.refused))  # fmt: skip
            if samples.refused:
                self._refused[record.job] = samples.refused
            else:
                self._refused.pop(record.job, None)
            seen = self._history[record.job] = (record.subjobs, samples.profile)
        return seen[1]

    def offer(self, waiting: list[tuple[BatchJob, JobTag, ChainRecord]], timelines: list[GpuTimeline],
              now: float, steers: Sequence[Steer] = (),
              admits: Callable[[BatchJob, str], bool] = lambda job, host: True,
              hosts: Mapping[str, frozenset[str]] | None = None) -> list[tuple[Decision, SubjobRecord]]:  # fmt: skip
        """One negotiation round: the gaps open now in ``timelines`` (every GPU's holds, the
        reservations included) are offered and may be granted; later ones are published only. The
        grants, recorded, for the caller to pin. A grant is made only where ``admits(job, host)`` (the
        controller's CPU room, taken by each grant): a chain chosen for a gap on a node this pass has
        filled waits for the next pass. ``hosts``: per job, the nodes it may run on (absent: any), so that
        a chain answers no gap elsewhere.

        With ``atomize.live_defrag`` each grant goes to the spot that keeps the most capacity free
        (:func:`~mig_batch.atomize.defrag.choose_spot`), and ``steers`` (windows kept for rigid jobs
        blocked by fragmentation) are closed to chains, except to those that have waited longer
        than ``defrag_max_hold_s`` (since their waiting job was submitted): these are offered first,
        without them."""
        cfg = self.config.atomize
        hosts = hosts or {}
        chains = [Chain(job.job_id, rec.declared_mib, self.history(rec, job.user_id if job.user_id >= 0 else None),
                        rec.min_s, rec.max_s, rec.submitted,
                        last_mib=rec.last_mib, attained=rec.attained, deadline=rec.deadline,
                        hosts=hosts.get(job.job_id))
                  for job, _, rec in waiting]  # fmt: skip
        waited = {job.job_id: now - float(job.submit_time) for job, _, _ in waiting}  # each subjob is a new job
        groups = offer_groups(chains, timelines, steers if cfg.live_defrag else (), waited, cfg.defrag_max_hold_s)
        round_ = Round(())
        for group, views in groups:
            if not group:
                continue
            place = None
            if cfg.live_defrag:
                place = partial(_place, timelines=views, now=now, eps=cfg.eps, hysteresis=cfg.hysteresis)
            gaps = cluster_gaps(views, now, cfg.offer_horizon_s)
            round_ = negotiate(gaps, group, now, cfg.eps, cfg.grant_policy, cfg.hysteresis, place)
            if round_.grants():
                break  # the other group is offered next pass, on gaps that know of these grants
        published = [(gap, replies, chosen) for gap, replies, chosen in round_.offers if replies or gap.opens > now]
        digest = [(g.gid, g.window, g.opens > now, [(r.job, r.interested, r.profile, r.reason) for r in rs])
                  for g, rs, _ in published]  # fmt: skip
        if not round_.grants() and digest == self._last_round:
            return []  # the same offers and answers as last pass: nothing new to record
        self._last_round = digest
        ids = self.store.record_round([
            ((g.host, g.gpu_index, g.model, g.profile, g.start, g.opens, g.closes),
             [(r.job, int(r.interested), r.profile, r.duration, r.bound_mib, r.basis, r.reason) for r in replies])
            for g, replies, _ in published
        ])  # fmt: skip
        return self._grant(round_, published, ids, waiting, now, admits)

    def _grant(self, round_: Round, published: list[tuple[Gap, tuple[Reply, ...], Reply | None]], ids: list[int],
               waiting: list[tuple[BatchJob, JobTag, ChainRecord]], now: float,
               admits: Callable[[BatchJob, str], bool]) -> list[tuple[Decision, SubjobRecord]]:  # fmt: skip
        """The round's grants taken in the view and recorded, each at its spot (a defrag move is an event)."""
        cfg = self.config.atomize
        tags = {job.job_id: (job, tag, rec) for job, tag, rec in waiting}
        grants = []
        for offer_id, (offered, _, chosen) in zip(ids, published, strict=True):
            gap = offered
            if chosen is None:
                continue
            gap, chosen = round_.spots.get(chosen.job, (gap, chosen))
            if chosen.profile is None:  # a reply that took no size is never chosen
                continue
            if gap.gid != offered.gid:
                self.store.event(chosen.job, "defrag-moved", offered=f"{offered.host}/{offered.gpu_index}",
                                 granted=f"{gap.host}/{gap.gpu_index}")  # fmt: skip
            gpu = self.view.gpus[gap.gid]
            start = start_in_gap(gap, chosen.profile, gpu.mask)
            if start is None:
                continue
            job, tag, rec = tags[chosen.job]
            if not admits(job, gap.host):
                continue
            profile = get_model(gap.model).profile(chosen.profile)
            self.view.allocate(gap.gid, chosen.job, profile.name, start)
            d = Decision(chosen.job, tag.text(), gap.host, gap.gpu_index, gap.model, profile.name, start,
                         DecisionState.DECIDED, f"sja-{cfg.grant_policy}")  # fmt: skip
            sub = SubjobRecord(chosen.job, rec.subjobs, offer_id, profile.name, profile.memory_slices,
                               float(profile.memory_mib), chosen.duration, now, *(None,) * 5)  # fmt: skip
            self.store.grant_subjob(d, sub)  # recorded before Slurm hears of it
            grants.append((d, sub))
        return grants

    def time_limit_min(self, window_s: float) -> int:
        """Slurm's limit (whole minutes) for a subjob: the runner enforces the window to the second and
        stops the job at window + grace; Slurm's USR1 (``SLURM_SIGNAL_MARGIN_S`` before its limit) and
        the limit itself come later still, as backstops."""
        return math.ceil((window_s + self.config.atomize.grace_s + SLURM_SIGNAL_MARGIN_S + 30) / 60)

    def interrupted(self, d: Decision, outcome: str = "requeued") -> ChainRecord | None:
        """A chain's started subjob was taken back: requeued by the batch system (``requeued``), or its node
        could not make its instance (``not-started``). Its open subjob ends, no failure counted (not the job's
        doing), and its chain waits for its next grant. The chain's record (None: ``d`` is no chain's)."""
        record = self.store.chain(d.job)
        if record is None:
            return None
        if self.store.open_subjob(d.job) is not None:  # already ended: a pass that stopped midway is done again
            self.store.end_subjob(d.job, None, outcome, "waiting")
            record = self.store.chain(d.job)
        return record

    def ended(self, d: Decision, job: BatchJob | None) -> bool:
        """A chain's subjob ended: record it; True when the chain goes on (the caller links its next job)."""
        record = self.store.chain(d.job)
        if record is None:
            return False
        if job is None:
            self.store.end_subjob(d.job, None, "lost", "failed")  # purged from Slurm before we saw it end
            return False
        status = job.exit_status
        if job.cancelled:
            self.store.end_subjob(d.job, status, "cancelled", "cancelled")
            return False
        if status == EXIT_DONE and job.outcome == "COMPLETED":
            self.store.end_subjob(d.job, status, "done", "done")
            return False
        if status == EXIT_CONTINUE:
            self.store.end_subjob(d.job, status, "continue", "waiting")
            return True
        if status == EXIT_NOT_PREPARED:  # not the job's fault: start it again, no failure counted
            self.store.end_subjob(d.job, status, "not-started", "waiting")
            return True
        gives_up = record.failures + 1 >= self.config.atomize.max_failures
        self.store.end_subjob(d.job, status, "failed", "failed" if gives_up else "waiting")
        return not gives_up
