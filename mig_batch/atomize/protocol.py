"""The SJA negotiation (§3.5, §3.9): an offer, each chain's reply, the policy's grant.

* **answer**: a chain (an atomizable job) maps an offered gap to the smallest profile inside it that
  covers its memory bound over the subjob's duration (risk eps), with hysteresis: it shrinks below
  its last subjob's capacity only when that frees at least ``hysteresis`` of it. It declines a gap
  shorter than its minimum subjob, or one in which no profile is large enough, and says why.
* **grant**: among the interested replies to one offer, the configured policy picks one:
  ``efficiency`` fills the most of the gap (slices x seconds), ``fairness`` serves the chain with
  the least attained service (slice-seconds), ``deadline`` is earliest-deadline-first.
  Ties go to the earlier submission. A chain holds at most one grant at a time.

Pure code, shared by the live controller and ``mig-batch simulate atomize``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mig_batch.atomize.gaps import Gap, fits_in
from mig_batch.atomize.profiles import MemoryProfile
from mig_batch.mig.models import Profile, get_model

GRANT_POLICIES = ("efficiency", "fairness", "deadline")


@dataclass(frozen=True)
class Chain:
    """What the scheduler knows of one atomizable job when it answers offers."""

    job: str
    declared_mib: float  # the job's own peak estimate: used until its history is long enough
    history: MemoryProfile
    min_subjob_s: float
    max_subjob_s: float
    submitted: float
    remaining_s: float | None = None  # predicted work left, when the job says
    last_mib: float | None = None  # capacity of its previous subjob (hysteresis)
    attained: float = 0.0  # slice-seconds of service so far (fairness)
    deadline: float | None = None  # absolute time the job would like to finish by (EDF)
    hosts: frozenset[str] | None = None  # the nodes it may run on (its batch system's partitions); None: any


@dataclass(frozen=True)
class Reply:
    job: str
    interested: bool
    reason: str
    profile: str | None = None
    duration: float = 0.0
    bound_mib: float = 0.0
    basis: str = ""  # "history" (order-statistic bound) or "declared" (not enough history)


def memory_bound(chain: Chain, duration: float, eps: float) -> tuple[float, str]:
    bound = chain.history.peak_bound(duration, eps)
    return (bound, "history") if bound is not None else (chain.declared_mib, "declared")


def answer(chain: Chain, gap: Gap, eps: float, hysteresis: float = 0.25) -> Reply:
    if chain.hosts is not None and gap.host not in chain.hosts:
        return Reply(chain.job, False, f"node {gap.host} is not one the job may run on now (outside its "
                                       "partitions, refusing its pins, or it ran there just before)")  # fmt: skip
    offered = min(gap.length, chain.max_subjob_s)
    needed = chain.remaining_s if chain.remaining_s is not None else math.inf
    duration = min(offered, needed)
    if offered < chain.min_subjob_s and offered < needed:  # a short last piece is fine, a short gap is not
        return Reply(chain.job, False, f"the gap's {duration:.0f} s is shorter than the job's minimum subjob "
                                       f"({chain.min_subjob_s:.0f} s)")  # fmt: skip
    bound, basis = memory_bound(chain, duration, eps)
    model = get_model(gap.model)
    inside = [p for p in model.base_profiles if fits_in(p, gap.window)]
    covering = sorted((p for p in inside if p.memory_mib >= bound), key=lambda p: (p.memory_mib, p.compute_slices))
    if not covering:
        largest = max((p.memory_mib for p in inside), default=0)
        return Reply(chain.job, False, f"needs {bound:.0f} MiB ({basis}); the largest profile in the gap has "
                                       f"{largest} MiB", bound_mib=bound, basis=basis)  # fmt: skip
    chosen = _with_hysteresis(covering, chain.last_mib, hysteresis)
    return Reply(chain.job, True, "fits", chosen.name, duration, bound, basis)


def _with_hysteresis(covering: Sequence[Profile], last_mib: float | None, hysteresis: float) -> Profile:
    smallest = covering[0]
    if last_mib is None or smallest.memory_mib >= last_mib:
        return smallest
    if (last_mib - smallest.memory_mib) / last_mib >= hysteresis:
        return smallest  # a worthwhile shrink
    return next((p for p in covering if p.memory_mib >= last_mib), smallest)  # keep the previous size


def grant(gap: Gap, replies: Iterable[Reply], chains: dict[str, Chain], policy: str) -> Reply | None:
    if policy not in GRANT_POLICIES:
        raise ValueError(f"grant policy {policy!r} is not one of {', '.join(GRANT_POLICIES)}")
    interested = [r for r in replies if r.interested]
    if not interested:
        return None
    model = get_model(gap.model)

    def area(r: Reply) -> float:
        return model.profile(r.profile).memory_slices * r.duration if r.profile else 0.0

    def key(r: Reply) -> tuple:
        c = chains[r.job]
        if policy == "efficiency":
            return (-area(r), c.submitted, c.job)
        if policy == "fairness":
            return (c.attained, c.submitted, c.job)
        return (c.deadline if c.deadline is not None else math.inf, c.submitted, c.job)

    return min(interested, key=key)


@dataclass(frozen=True)
class Round:
    """One offer round: per offered gap, every chain's reply and the grant (if any)."""

    offers: tuple[tuple[Gap, tuple[Reply, ...], Reply | None], ...]
    spots: Mapping[str, tuple[Gap, Reply]] = field(default_factory=dict)  # job -> where a grant moved to

    def grants(self) -> list[tuple[Gap, Reply]]:
        """Each grant as (the gap it is placed in, the reply): the offered gap, or the spot it moved to."""
        return [self.spots.get(g.job, (gap, g)) for gap, _, g in self.offers if g is not None]


# (chain, its reply, the offered gap, every gap, slices granted so far per GPU) -> (gap, reply) it goes to
SpotChooser = Callable[[Chain, Reply, Gap, Sequence[Gap], Mapping[int, int]], tuple[Gap, Reply]]


def negotiate(gaps: Sequence[Gap], chains: Sequence[Chain], now: float, eps: float, policy: str,
              hysteresis: float = 0.25, place: SpotChooser | None = None) -> Round:  # fmt: skip
    """Offer each gap open now to every chain not yet granted in this round; grant per policy.

    A gap is granted at most once per round and a later gap overlapping a granted one is skipped;
    what is left of them is offered in the next round, from gaps re-derived after the grant.
    ``place`` (live defragmentation, :mod:`mig_batch.atomize.defrag`) may move a grant to another
    open spot; the policy still decides which chain is served and with which profile.
    """
    by_job = {c.job: c for c in chains}
    granted: set[str] = set()
    taken: dict[int, int] = {}  # gid -> slices granted this round
    spots: dict[str, tuple[Gap, Reply]] = {}
    rounds = []
    for gap in gaps:
        if gap.opens > now:
            rounds.append((gap, (), None))  # published for information; answered when it opens
            continue
        free = gap.window & ~taken.get(gap.gid, 0)
        if free != gap.window:
            continue
        replies = tuple(answer(c, gap, eps, hysteresis) for c in chains if c.job not in granted)
        chosen = grant(gap, replies, by_job, policy)
        if chosen is not None:
            granted.add(chosen.job)
            spot = gap
            if place is not None:
                spot, moved = place(by_job[chosen.job], chosen, gap, gaps, taken)
                if spot is not gap:
                    spots[chosen.job] = (spot, moved)
            taken[spot.gid] = taken.get(spot.gid, 0) | spot.window
        rounds.append((gap, replies, chosen))
    return Round(tuple(rounds), spots)
