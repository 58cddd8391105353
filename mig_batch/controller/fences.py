"""Which GPUs of the view may take a placement now, and why not.

A node's GPUs are fenced while the batch system reports it down (until its agent has reconciled since),
while it has no CPU to give (a job pinned there would wait while another node idles), and while it is
outside the partitions of the job being decided or refused that job's pins lately; a GPU is fenced while
its agent finds MIG mode off. Only what changes is fenced or unfenced: this runs for each placement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from typing import TypeVar

from mig_batch.batch.system import BatchJob, JobState, NodeStatus
from mig_batch.batch.tags import AgentTag, parse_agent_tag
from mig_batch.controller.ledger import ViewLedger
from mig_batch.controller.snapshot import FitKey, PassSnapshot
from mig_batch.state import MIG_OFF, NODE_PROBLEM, Store

Decided = TypeVar("Decided")
log = logging.getLogger("mig-batchd")


class PinRefusals:
    """Nodes that refused a job's pin ``PIN_TRIES`` times in a row are not tried for it for a while."""

    def __init__(self) -> None:
        # job -> node -> [refused pins in a row, when the node is tried again]
        self.by_job: dict[str, dict[str, list[float]]] = {}

    def forget_gone(self, jobs: Container[str]) -> None:
        for gone in [j for j in self.by_job if j not in jobs]:
            del self.by_job[gone]

    def nodes(self, job: str, now: float) -> frozenset[str]:
        """The nodes not tried for ``job`` now."""
        return frozenset(n for n, (_, until) in self.by_job.get(job, {}).items() if until > now)


class Fences:
    def __init__(self, inventory: dict[str, tuple[str, ...]], store: Store, ledger: ViewLedger,
                 refusals: PinRefusals):  # fmt: skip
        self.inventory, self.store, self.ledger, self.refusals = inventory, store, ledger, refusals
        self.view = ledger.view
        self.down_since: dict[str, float] = {}  # fenced nodes: when the batch system reported them down
        self.mig_off: dict[str, tuple[int, ...]] = {}  # per node, the GPUs its agent found with MIG mode off
        self._problems_seen: dict[str, str] | None = None  # node -> the key of its agent's last problem recorded
        self.room: dict[str, int] = {}  # node -> CPUs idle and not promised to a released job (when known)
        self._fenced_hosts: set[str] = set()  # nodes whose GPUs are fenced now (down, or no CPU to give)
        self._fenced_off: set[int] = set()  # GPUs fenced now for their MIG mode off
        self.overflow = False  # every node is full: jobs go where the fewest wait for CPUs (see apply)
        self.balanced_out = False  # ... and that fences some node that has GPU room
        # when every node is full, nodes with less room than this are fenced; None: less than the most
        self._floor: float | None = None
        self.outside: frozenset[str] = frozenset()  # nodes outside the reach of the job being decided
        self._snapshot: PassSnapshot | None = None

    # -- what the batch system says of the nodes ------------------------------------------------------

    def watch(self, nodes: tuple[NodeStatus, ...], now: float) -> None:
        """Mark the nodes the batch system reports down; unmark one once its agent has reconciled since
        (its stray instances are gone, its slices known again). ``measure`` applies the fences."""
        for node in nodes:
            if node.node not in self.inventory:
                continue
            agent = parse_agent_tag(node.agent_tag)
            if agent is not None and agent.problem is not None:
                self._record_node_problem(node.node, agent)
            if agent is not None and agent.mig_off != self.mig_off.get(node.node, ()):
                self.mig_off[node.node] = agent.mig_off
                self.store.event(None, MIG_OFF, node=node.node, gpus=list(agent.mig_off))
                if agent.mig_off:
                    log.warning("node %s: MIG mode is off on GPU(s) %s; nothing is placed there", node.node,
                                ", ".join(map(str, agent.mig_off)))  # fmt: skip
            if not node.up:
                if node.node not in self.down_since:
                    self.down_since[node.node] = now
                    self.store.event(None, "node-down", node=node.node)
            elif node.node in self.down_since and agent is not None \
                    and agent.reconciled >= self.down_since[node.node]:  # fmt: skip
                del self.down_since[node.node]
                self.store.event(None, "node-back", node=node.node, strays=agent.strays)

    def _record_node_problem(self, node: str, agent: AgentTag) -> None:
        """The agent's last problem as a ``node-problem`` event, once: keyed by the agent's start and
        problem count (a restart of the controller finds the key in the store)."""
        key = f"{agent.started:.3f}/{agent.problems}"
        if self._problems_seen is None:  # every node's, in one query, when the first problem is seen
            self._problems_seen = {n: e.get("key", "") for n, e in self.store.newest_node_events(NODE_PROBLEM).items()}
        if self._problems_seen.get(node) == key:
            return
        self._problems_seen[node] = key
        problem = agent.problem
        assert problem is not None
        self.store.event(problem.job or None, NODE_PROBLEM, node=node, hook=problem.hook, reason=problem.reason,
                         key=key)  # fmt: skip
        log.warning("node %s %s%s: %s", node, problem.hook, f" job {problem.job}" if problem.job else "",
                    problem.reason)  # fmt: skip

    def measure(self, snapshot: PassSnapshot) -> None:
        """CPUs each node can still give a job now: idle, less those of jobs released to it and not yet
        started. A job pinned to a node without them waits there while another node idles, so such
        nodes take no placement this pass (unless every node is full: see ``apply``)."""
        self._snapshot = snapshot
        self.room = {n.node: n.cpus_idle for n in snapshot.nodes
                     if n.cpus_idle is not None and n.node in self.inventory}  # fmt: skip
        self.outside = frozenset()
        job_gpu = self.view.job_gpu
        for job in snapshot.jobs.values():
            if job.state is JobState.PENDING and job.managed and job.job_id in job_gpu:
                node = self.view.gpus[job_gpu[job.job_id]].host
                if node in self.room:
                    self.room[node] -= job.cpus
        self._floor = None
        self.apply()

    # -- room ------------------------------------------------------------------------------------------

    def use_room(self, node: str, cpus: int) -> None:
        if node in self.room:
            self.room[node] -= cpus
            if self.room[node] <= 0 or self.overflow:  # overflowing, the nodes with the most room change
                self.apply()

    def take_room(self, job: BatchJob, node: str, now: float) -> bool:
        """Whether ``node`` may take ``job`` in this pass, its CPUs then taken: one of its partitions, and not
        a node this pass has filled unless every node is full (the job then waits for a CPU wherever it goes)."""
        if node in self.outside_of_job(job, now):
            return False
        if not self.overflow and self.room.get(node, 1) <= 0:
            return False
        self.use_room(node, job.cpus)
        return True

    def up_nodes(self) -> set[str]:
        """The nodes with a GPU that may take a placement now."""
        fenced = self.view.fenced
        return {node for node, gids in self.ledger.gids_of.items() if any(g not in fenced for g in gids)}

    # -- a job's reach -----------------------------------------------------------------------------------

    def outside_of_job(self, job: BatchJob, now: float) -> frozenset[str]:
        """The nodes ``job`` may not go to now: outside its partitions, or refusing its pins lately."""
        assert self._snapshot is not None, "measure() first"
        outside = self._snapshot.outside_partitions(job.partitions)
        return outside | self.refusals.nodes(job.job_id, now) if job.job_id in self.refusals.by_job else outside

    def partition_problem(self, job: BatchJob) -> str | None:
        """Why no node of the inventory can take the job (None: one of its partitions has one)."""
        assert self._snapshot is not None, "measure() first"
        if not job.partitions or len(self._snapshot.outside_partitions(job.partitions)) < len(self.inventory):
            return None
        return f"none of mig_batch's nodes is in its partition(s) {','.join(job.partitions)}"

    def barred(self, outside: frozenset[str]) -> frozenset[int]:
        """The GPUs a job may not have later either, for its reservation: on the nodes ``outside`` its reach
        or down, and those with MIG mode off (a node's lack of CPUs passes)."""
        hosts = outside | set(self.down_since)
        return frozenset(gid for host in hosts for gid in self.ledger.gids_of.get(host, ())) | self._fenced_off

    @contextmanager
    def confinement(self, now: float) -> Iterator[Callable[[BatchJob], frozenset[str]]]:
        """``confine(job)`` fences the nodes outside ``job``'s reach while it is decided (and returns them);
        on leaving, that fence is lifted."""

        def confine(job: BatchJob) -> frozenset[str]:
            self._set_outside(self.outside_of_job(job, now))
            return self.outside

        try:
            yield confine
        finally:
            self._set_outside(frozenset())

    def _set_outside(self, outside: frozenset[str]) -> None:
        if outside != self.outside:
            self.outside = outside
            self.apply()

    # -- the fences ----------------------------------------------------------------------------------------

    def apply(self) -> None:
        """Fence the GPUs of nodes that are down or have no CPU to give, and of GPUs with MIG mode off.
        When every node is full, a job pinned now waits for a CPU on its node: it goes to the nodes with
        the most room (the fewest CPUs already promised beyond their idle ones), so that no node piles up
        jobs while another's CPUs free; ``where_it_fits`` tries nodes with less room when MIG fits on none."""
        up = set(self.room) - set(self.down_since) - self.outside
        full = {n for n in up if self.room[n] <= 0}
        self.overflow = bool(up) and full == up
        self.balanced_out = False
        if self.overflow:
            floor = max(self.room[n] for n in up) if self._floor is None else self._floor
            full = {n for n in up if self.room[n] < floor}
            self.balanced_out = bool(full)
        hosts = set(self.down_since) | full | self.outside
        gid = self.ledger.gid
        off = {gid[(host, index)] for host, indexes in self.mig_off.items() for index in indexes
               if (host, index) in gid}  # fmt: skip
        changed = {g for host in hosts ^ self._fenced_hosts for g in self.ledger.gids_of.get(host, ())}
        for g in changed | (off ^ self._fenced_off):  # only what changed
            fenced = g in off or self.view.gpus[g].host in hosts
            (self.view.fence if fenced else self.view.unfence)(g)  # both idempotent
        self._fenced_hosts, self._fenced_off = hosts, off

    def open_every_node_with_room(self) -> None:
        """Lift the balancing fence: every node that is up and has room takes placements (the planners
        weigh GPU time on every node)."""
        if self.balanced_out:
            self._floor = -float("inf")
            self.apply()

    def where_it_fits(self, decide: Callable[[], Decided], placed: type, request: FitKey) -> Decided:
        """``decide()`` on the view; when every node is full and MIG fits on none of the nodes with the most
        room, ``decide()`` on the nodes with the most room where MIG fits (the job then waits for a CPU
        there): a binary search over the up nodes' room, as a node's fit does not change with the floor and
        a lower floor only adds nodes. A ``request`` (profiles, instances, reach) that fits on no up node is
        not tried there again this pass: a saturated cluster's long queue would otherwise open and close
        every GPU's fence for each job."""
        decision = decide()
        assert self._snapshot is not None, "measure() first"
        fits_nowhere = self._snapshot.fits_nowhere
        if not self.balanced_out or isinstance(decision, placed) or request in fits_nowhere:
            return decision
        up = set(self.room) - set(self.down_since) - self.outside
        most = max(self.room[n] for n in up)
        floors = sorted({self.room[n] for n in up if self.room[n] < most}, reverse=True)

        def at(floor: float) -> Decided:
            self._floor = floor
            self.apply()
            return decide()

        try:
            decision = at(floors[-1])  # every node that is up
            if not isinstance(decision, placed):
                fits_nowhere.add(request)
                return decision
            low, high = 0, len(floors) - 1  # MIG fits at floors[high]; find the highest floor where it does
            while low < high:
                middle = (low + high) // 2
                tried = at(floors[middle])
                if isinstance(tried, placed):
                    high, decision = middle, tried
                else:
                    low = middle + 1
            return decision
        finally:
            self._floor = None
            self.apply()
