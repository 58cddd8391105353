"""One job over several MIG instances of one node (Flex-MIG's "one-to-many"): the node and all N
(GPU, start) spots in one decision. All of a job's instances are on GPUs of one model (a profile's
slices differ between models), so a node with several models is one candidate per model.

Two policies, both pure (they read the cluster, never change it; the caller allocates every spot or
none):

- ``flex-mig``: Flex-MIG's rule as the baseline. The instances go round-robin over the node's GPUs,
  starting after the GPU the previous decision started on, each at the lowest free start.
- ``mfi``: ours. N greedy steps of MFI (Alg. 2): each step takes the (GPU, start) of the node whose
  fragmentation score F rises least, as if the earlier steps' instances were there already; the node
  whose N steps raise F least in total wins (ties: the lowest node name). F rises least next to
  instances already there, so this packs: it fills partly used GPUs before it opens an empty one, and
  keeps whole GPUs free for the large profiles (docs/flex.md measures how often it packs).

The paper's profile rule (1g.10gb for one instance, the smallest leaf for N >= 2) is
:func:`flex_mig_profile`; a request that names its size keeps its own translation under both policies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mig_batch.mig.models import GpuModel
from mig_batch.mig.scores import FragVariant
from mig_batch.mig.tables import ModelTables, tables_for
from mig_batch.placement.cluster import Cluster

MULTI_POLICIES = ("mfi", "flex-mig")


@dataclass(frozen=True)
class Spot:
    """One instance of a multi-instance job: rank -> (GPU id in the cluster, profile, start)."""

    gid: int
    gpu_index: int
    profile: str
    start: int


@dataclass(frozen=True)
class MultiPlacement:
    host: str
    model: str
    spots: tuple[Spot, ...]  # in rank order
    delta_f: int = 0  # total rise of F over the node's GPUs

    def gpus_used(self) -> int:
        return len({s.gid for s in self.spots})


@dataclass(frozen=True)
class MultiRejection:
    reason: str


def max_per_gpu(tables: ModelTables, profile: str) -> int:
    """How many instances of ``profile`` one empty GPU holds (lowest free start first: the MIG
    geometry's starts are aligned, so this greedy fill is the maximum)."""
    k, mask, count = tables.index(profile), 0, 0
    while tables.free_starts[k][mask]:
        mask |= tables.window(profile, min(tables.free_starts[k][mask]))
        count += 1
    return count


def node_capacity(models: Sequence[str], profiles: Mapping[str, str]) -> int:
    """Instances of the request one empty node with GPUs ``models`` holds (``profiles``: model -> profile).
    One job's instances are all of one model (a mixed-model node counts its best model's GPUs only)."""
    per_model: dict[str, int] = {}
    for m in models:
        if m in profiles:
            per_model[m] = per_model.get(m, 0) + max_per_gpu(tables_for(m), profiles[m])
    return max(per_model.values(), default=0)


def flex_mig_profile(model: GpuModel, instances: int) -> str:
    """Flex-MIG's leaf for a job with ``instances`` instances: 1g.10gb for one (where the model has it),
    else the smallest profile (fewest memory slices, then least memory)."""
    names = {p.name for p in model.base_profiles}
    if instances == 1 and "1g.10gb" in names:
        return "1g.10gb"
    return min(model.base_profiles, key=lambda p: (p.memory_slices, p.compute_slices, p.memory_mib, p.name)).name


def _free(tables: ModelTables, profile: str, mask: int) -> tuple[int, ...]:
    return tuple(tables.free_starts[tables.index(profile)][mask])


@dataclass
class MultiPolicy:
    """Places multi-instance jobs; ``flex-mig`` keeps its round-robin pointer per node across decisions."""

    name: str = "mfi"
    variant: FragVariant = FragVariant.PRINTED
    _next_gpu: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in MULTI_POLICIES:
            raise ValueError(f"multi-instance policy {self.name!r} is not one of {', '.join(MULTI_POLICIES)}")

    def decide(self, cluster: Cluster, profiles: Mapping[str, str], instances: int) -> MultiPlacement | MultiRejection:
        """The node and ``instances`` spots, all on one node; or why none fits now."""
        if instances < 1:
            return MultiRejection(f"a job needs at least one instance, asked for {instances}")
        # One job's instances share one model: a profile's slices (and the node's report) are per model,
        # so a mixed-model node is several candidate groups, one per model.
        groups: dict[tuple[str, str], list[int]] = {}
        for gpu in cluster.gpus:
            if gpu.model in profiles and gpu.gid not in cluster.fenced:
                groups.setdefault((gpu.host, gpu.model), []).append(gpu.gid)
        mixed = {host for host, _ in groups if sum(h == host for h, _ in groups) > 1}
        best: MultiPlacement | None = None
        room: list[str] = []
        for host, model in sorted(groups):
            plan = self._on_node(cluster, host, groups[host, model], profiles, instances)
            if isinstance(plan, int):
                room.append(f"{host}{f' ({model})' if host in mixed else ''} has {plan} free")
                continue
            if self.name == "flex-mig":  # the baseline takes the first node that fits
                best = plan
                break
            if best is None or plan.delta_f < best.delta_f:
                best = plan
        if best is None:
            where = "; ".join(room) if room else "no usable GPU of a fitting model"
            wanted = ", ".join(sorted(set(profiles.values())))
            return MultiRejection(f"no node has room for {instances} x {wanted} now ({where})")
        if self.name == "flex-mig":
            gids = groups[best.host, best.model]
            self._next_gpu[best.host] = (gids.index(best.spots[0].gid) + 1) % len(gids)
        return best

    def _on_node(self, cluster: Cluster, host: str, gids: list[int], profiles: Mapping[str, str],
                 instances: int) -> MultiPlacement | int:  # fmt: skip
        """The spots on ``gids`` (one node, one model), or how many instances fit there now when fewer
        than asked."""
        masks = {gid: cluster.gpus[gid].mask for gid in gids}
        spots: list[Spot] = []
        delta_total = 0
        turn = self._next_gpu.get(host, 0) % len(gids)
        for _ in range(instances):
            choice = self._round_robin(cluster, gids, masks, profiles, turn) if self.name == "flex-mig" else \
                self._least_increase(cluster, gids, masks, profiles)  # fmt: skip
            if choice is None:
                return len(spots)
            gid, start, delta = choice
            gpu = cluster.gpus[gid]
            profile = profiles[gpu.model]
            masks[gid] |= cluster.tables[gpu.model].window(profile, start)
            spots.append(Spot(gid, gpu.index, profile, start))
            delta_total += delta
            turn = (gids.index(gid) + 1) % len(gids)
        return MultiPlacement(host, cluster.gpus[spots[0].gid].model, tuple(spots), delta_total)

    def _delta(self, tables: ModelTables, profile: str, mask: int, start: int) -> int:
        frag = tables.frag[self.variant]
        return frag[mask | tables.window(profile, start)] - frag[mask]

    def _least_increase(self, cluster: Cluster, gids: list[int], masks: dict[int, int],
                        profiles: Mapping[str, str]) -> tuple[int, int, int] | None:  # fmt: skip
        best = None
        for gid in gids:
            tables = cluster.tables[cluster.gpus[gid].model]
            profile = profiles[cluster.gpus[gid].model]
            for start in _free(tables, profile, masks[gid]):
                key = (self._delta(tables, profile, masks[gid], start), gid, start)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[1], best[2], best[0])

    def _round_robin(self, cluster: Cluster, gids: list[int], masks: dict[int, int], profiles: Mapping[str, str],
                     turn: int) -> tuple[int, int, int] | None:  # fmt: skip
        for step in range(len(gids)):
            gid = gids[(turn + step) % len(gids)]
            tables = cluster.tables[cluster.gpus[gid].model]
            profile = profiles[cluster.gpus[gid].model]
            free = _free(tables, profile, masks[gid])
            if free:
                start = min(free)
                return gid, start, self._delta(tables, profile, masks[gid], start)
        return None
