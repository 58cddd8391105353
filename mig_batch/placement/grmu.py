"""GRMU (GRMU §7): dual-basket pooling, intra-GPU defragmentation and inter-GPU consolidation.

- Pooling: GPUs start in a pool. Whole-GPU requests (7g) go to the *heavy* basket, capped at
  ``heavy_share`` of the GPUs; everything else to the *light* basket. Within a basket, first fit by
  GPU id with NVIDIA's default max-CC start; if nothing fits and the basket may grow, the pool's lowest
  GPU joins it. A GPU that becomes empty returns to the pool.
- Defragmentation (Alg. 4), after a rejected light request: the light GPU with the highest GRMU
  fragmentation value has its instances re-placed on a mock empty GPU with the default placement
  (largest first, then by current start). A rebuild with the GPU's current occupancy is dropped
  (it would only swap same-size instances); otherwise same-size instances are matched to the new
  starts so that only instances that really change start move.
- Consolidation (Alg. 5), every ``consolidation_interval`` time units (None: off, GRMU's trace
  setting): light GPUs holding one half-GPU instance (3g or 4g) are paired; the later one's
  instance moves onto the earlier, emptying a GPU.

Migration plans are returned, not executed: the simulator applies them, the live system will apply
them only to checkpointable jobs. Basket scans are O(GPUs in the basket), unlike the mask-indexed
policies.
"""

from __future__ import annotations

import math
from typing import Any

from mig_batch.mig.tables import ModelTables
from mig_batch.placement.base import (
    Migration,
    Outcome,
    PlacementRequest,
    Policy,
    Rejection,
    max_cc_choice,
    placement_on,
)
from mig_batch.placement.cluster import Cluster

HEAVY, LIGHT = "heavy", "light"


def grmu_fragmentation(tables: ModelTables, mask: int) -> float:
    """GRMU's Fragmentation(): for each profile that fits the free blocks, pack as many as possible
    (first free start each time) and add (free blocks left) / (profile size)."""
    model = tables.model
    free = model.memory_slices - mask.bit_count()
    score = 0.0
    for k, profile in enumerate(model.base_profiles):
        if profile.memory_slices > free:
            continue
        packed = mask
        while starts := tables.free_starts[k][packed]:
            packed |= profile.window(starts[0])
        score += (model.memory_slices - packed.bit_count()) / profile.memory_slices
    return score


def _fewest_moves(instances: dict[str, tuple[str, int]], targets: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """job -> (current start, target start): same-profile instances are interchangeable, so a job
    whose current start is one of its profile's targets stays there; the rest fill the others."""
    free = list(targets)
    target = {}
    for job, (profile, start) in instances.items():
        if (profile, start) in free:
            free.remove((profile, start))
            target[job] = (start, start)
    for job, (profile, start) in sorted(instances.items(), key=lambda item: item[1][1]):
        if job not in target:
            spot = next(s for s in free if s[0] == profile)
            free.remove(spot)
            target[job] = (start, spot[1])
    return target


class Grmu(Policy):
    name = "grmu"

    def __init__(self, heavy_share: float = 0.3, consolidation_interval: int | None = 50) -> None:
        if not 0 <= heavy_share <= 1 or (consolidation_interval is not None and consolidation_interval < 1):
            raise ValueError("heavy_share must be in [0, 1] and consolidation_interval at least 1 (or None: off)")
        self.heavy_share = heavy_share
        self.consolidation_interval = consolidation_interval
        self.basket: dict[int, str] = {}  # gid -> basket; GPUs not listed are in the pool

    # -- pooling -------------------------------------------------------------------------------
    def _return_empty(self, cluster: Cluster) -> None:
        for gid in [g for g in self.basket if not cluster.gpus[g].mask]:
            del self.basket[gid]

    def _basket_of(self, tables: ModelTables, profile: str) -> str:
        return HEAVY if tables.model.profile(profile).memory_slices == tables.model.memory_slices else LIGHT

    def decide(self, cluster: Cluster, request: PlacementRequest) -> Outcome:
        self._return_empty(cluster)
        for model, profile in request.profiles.items():
            tables = cluster.tables.get(model)
            if tables is None:
                continue
            k = tables.index(profile)
            basket = self._basket_of(tables, profile)
            for gid in sorted(g for g, b in self.basket.items() if b == basket and g not in cluster.fenced):
                choice = max_cc_choice(tables, k, cluster.gpus[gid].mask) if cluster.gpus[gid].model == model else None
                if choice is not None:
                    return placement_on(cluster, gid, profile, choice[1])
            same_model = [g for g in cluster.gpus if g.model == model]
            cap = math.floor(self.heavy_share * len(same_model)) if basket == HEAVY else len(same_model)
            size = sum(1 for g, b in self.basket.items() if b == basket and cluster.gpus[g].model == model)
            if size >= cap:
                continue
            pool = next((g.gid for g in same_model if g.gid not in self.basket and not g.mask
                         and g.gid not in cluster.fenced), None)  # fmt: skip
            if pool is not None:
                self.basket[pool] = basket
                choice = max_cc_choice(tables, k, 0)
                assert choice is not None  # any profile fits an empty GPU
                return placement_on(cluster, pool, profile, choice[1])
        return Rejection("no GPU in the basket can host the request and the basket may not grow")

    # -- defragmentation -------------------------------------------------------------------------
    def after_rejection(self, cluster: Cluster, request: PlacementRequest) -> list[Migration]:
        if all(
            self._basket_of(cluster.tables[model], profile) == HEAVY
            for model, profile in request.profiles.items()
            if model in cluster.tables
        ):
            return []  # heavy GPUs are whole: rearranging light ones cannot help a 7g request
        light = [cluster.gpus[g] for g, b in self.basket.items() if b == LIGHT and cluster.gpus[g].instances]
        if not light:
            return []
        worst = max(light, key=lambda g: (grmu_fragmentation(cluster.tables[g.model], g.mask), -g.gid))
        tables = cluster.tables[worst.model]
        order = sorted(
            worst.instances.items(),
            key=lambda item: (-tables.model.profile(item[1][0]).memory_slices, item[1][1]),
        )
        mock, targets = 0, []
        for _job, (profile, _start) in order:
            choice = max_cc_choice(tables, tables.index(profile), mock)
            if choice is None:
                return []  # the default placement cannot rebuild this GPU; leave it alone
            targets.append((profile, choice[1]))
            mock |= tables.window(profile, choice[1])
        if mock == worst.mask:
            return []  # same occupancy: the rebuild would only reshuffle same-size instances
        return [
            Migration(job, worst.gid, start, worst.gid, target)
            for job, (start, target) in _fewest_moves(worst.instances, targets).items()
            if target != start
        ]

    # -- consolidation ---------------------------------------------------------------------------
    def periodic(self, cluster: Cluster, step: int) -> list[Migration]:
        interval = self.consolidation_interval
        if interval is None or step == 0 or step % interval:
            return []
        halves = []
        for gid, basket in sorted(self.basket.items()):
            gpu = cluster.gpus[gid]
            if basket != LIGHT or len(gpu.instances) != 1:
                continue
            ((job, (profile, start)),) = gpu.instances.items()
            if 2 * cluster.models[gpu.model].profile(profile).memory_slices == cluster.models[gpu.model].memory_slices:
                halves.append((gid, job, profile, start))
        plan, used = [], set()
        for i, (gid_a, _job_a, _pa, _sa) in enumerate(halves):
            if gid_a in used:
                continue
            for gid_b, job_b, profile_b, start_b in halves[i + 1 :]:
                if gid_b in used or cluster.gpus[gid_b].model != cluster.gpus[gid_a].model:
                    continue
                tables = cluster.tables[cluster.gpus[gid_a].model]
                starts = tables.free_starts[tables.index(profile_b)][cluster.gpus[gid_a].mask]
                if starts:
                    plan.append(Migration(job_b, gid_b, start_b, gid_a, starts[0]))
                    used.update((gid_a, gid_b))
                    break
        return plan

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "heavy_share": self.heavy_share,
            "consolidation_interval": self.consolidation_interval,
        }
