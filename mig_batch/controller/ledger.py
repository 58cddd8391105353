"""The controller's view of the cluster: every GPU, and what holds each of its slices.

The view is a placement :class:`~mig_batch.placement.cluster.Cluster` rebuilt from the store at start and
kept in step with every decision; the policies decide on it. A job over several instances holds one key
per rank (``job``, ``job#1``, ...).
"""

from __future__ import annotations

from mig_batch.batch.tags import rank_key
from mig_batch.placement.cluster import Cluster, Gpu, PlacementConflict
from mig_batch.state import Decision, Store


def build_view(nodes: dict[str, tuple[str, ...]]) -> Cluster:
    gpus, gid = [], 0
    for node in sorted(nodes):
        for index, model in enumerate(nodes[node]):
            gpus.append(Gpu(gid, node, index, model))
            gid += 1
    return Cluster(gpus)


class ViewLedger:
    """The view, its GPUs by node, and the ranks of jobs over several instances."""

    def __init__(self, nodes: dict[str, tuple[str, ...]], store: Store):
        self.store = store
        self.view = build_view(nodes)
        self.gid = {(g.host, g.index): g.gid for g in self.view.gpus}
        self.gids_of: dict[str, list[int]] = {}  # node -> its GPUs in the view
        for g in self.view.gpus:
            self.gids_of.setdefault(g.host, []).append(g.gid)
        self.ranks: dict[str, int] = {}  # multi-instance job -> its instances in the view (job, job#1, ...)
        # job -> predicted seconds of its moldable instance (None: not moldable); forgotten when it is freed
        self.predicted: dict[str, float | None] = {}

    def model_at(self, node: str, gpu: int, default: str) -> str:
        """The model of ``node``'s GPU ``gpu`` in the inventory (``default`` where it is not there)."""
        gid = self.gid.get((node, gpu))
        return self.view.gpus[gid].model if gid is not None else default

    def occupy(self, d: Decision) -> None:
        """Hold a recorded decision's spots (every rank's) in the view."""
        spots = self.store.spots(d.job) or [(d.gpu, d.profile, d.start)]
        if len(spots) > 1:
            self.ranks[d.job] = len(spots)
        for rank, (gpu, profile, start) in enumerate(spots):
            gid = self.gid.get((d.node, gpu))
            if gid is None:
                self.store.event(d.job, "inventory-mismatch", node=d.node, gpu=gpu)
                continue
            key = rank_key(d.job, rank)
            if key in self.view.job_gpu:
                continue
            try:
                self.view.allocate(gid, key, profile, start)
            except PlacementConflict as exc:  # two records claim one slot: report, keep the first
                self.store.event(d.job, "view-conflict", error=str(exc))

    def take(self, job: str, spots: list[tuple[int, str, int]]) -> None:
        """Hold ``spots`` (gid, profile, start), one per rank, all or none."""
        taken = []
        try:
            for rank, (gid, profile, start) in enumerate(spots):
                self.view.allocate(gid, rank_key(job, rank), profile, start)
                taken.append(rank_key(job, rank))
        except PlacementConflict:
            for key in taken:
                self.view.release(key)
            raise
        if len(spots) > 1:
            self.ranks[job] = len(spots)

    def free(self, job: str) -> None:
        self.predicted.pop(job, None)  # a requeued job may get another size next time
        for rank in range(self.ranks.pop(job, 1)):
            if rank_key(job, rank) in self.view.job_gpu:
                self.view.release(rank_key(job, rank))

    def shut_node(self, node: str) -> list[int]:
        """Fence the node's GPUs that are not fenced; those GPUs."""
        gids = [gid for gid in self.gids_of[node] if gid not in self.view.fenced]
        for gid in gids:
            self.view.fence(gid)
        return gids
