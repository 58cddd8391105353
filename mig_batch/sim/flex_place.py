"""Our multi-instance placement (MFI, packs) against Flex-MIG's round robin, on a shared cluster.

A FIFO queue of jobs on ``nodes`` x ``gpus_per_node`` A100-80GB: multi-instance jobs (N of 1g.10gb,
N from Flex-MIG's sizes 2/4/6/8) mixed with one-instance jobs of large profiles (3g.40gb, 4g.40gb,
7g.80gb), which only a free enough GPU can take. One job arrives per slot; each runs a random number
of slots. Single-instance jobs are placed by MFI under both; only the multi-instance rule differs, so
the figures show what the rule does to the rest of the queue. Strict FIFO: the head blocks.

Pure: ``mig-batch simulate multi`` (mig_batch/cli/flex_commands.py) runs and prints it.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from mig_batch.placement.base import Placement, PlacementRequest
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.multi import MultiPlacement, MultiPolicy
from mig_batch.placement.policies import make_policy

MODEL = "A100-80GB"
LARGE = ("3g.40gb", "4g.40gb", "7g.80gb")
SIZES = (2, 4, 6, 8)


@dataclass(frozen=True)
class Job:
    name: str
    profile: str
    instances: int
    slots: int
    arrival: int


@dataclass(frozen=True)
class Outcome:
    policy: str
    seed: int
    makespan: int
    mean_wait: float
    mean_wait_large: float
    gpus_per_multi_job: float


def workload(seed: int, jobs: int, per_slot: float = 1.0, multi_share: float = 0.6) -> list[Job]:
    """``jobs`` jobs arriving ``per_slot`` per slot, a share ``multi_share`` of them multi-instance."""
    rng = random.Random(seed)
    out = []
    for n in range(jobs):
        arrival = int(n / per_slot)
        if rng.random() < multi_share:
            out.append(Job(f"j{n}", "1g.10gb", rng.choice(SIZES), rng.randint(3, 12), arrival))
        else:
            out.append(Job(f"j{n}", rng.choice(LARGE), 1, rng.randint(3, 12), arrival))
    return out


def run(policy: str, jobs: Sequence[Job], nodes: int = 4, gpus_per_node: int = 2, seed: int = 0) -> Outcome:
    """Replay ``jobs`` FIFO on ``nodes`` x ``gpus_per_node`` A100-80GB, multi-instance jobs placed by ``policy``."""
    cluster = Cluster.homogeneous(MODEL, nodes * gpus_per_node, gpus_per_node)
    multi, single = MultiPolicy(policy), make_policy("mfi")
    queue: list[Job] = []
    running: dict[str, tuple[int, list[str]]] = {}  # job -> (end slot, keys in the view)
    waits: dict[str, int] = {}
    spread: list[int] = []
    pending, slot = list(jobs), 0
    while pending or queue or running:
        for name in [n for n, (end, _) in running.items() if end <= slot]:
            for key in running.pop(name)[1]:
                cluster.release(key)
        while pending and pending[0].arrival <= slot:
            queue.append(pending.pop(0))
        while queue:
            job = queue[0]
            if job.instances > 1:
                choice = multi.decide(cluster, {MODEL: job.profile}, job.instances)
                if not isinstance(choice, MultiPlacement):
                    break
                keys = [f"{job.name}#{r}" for r in range(job.instances)]
                for key, spot in zip(keys, choice.spots, strict=True):
                    cluster.allocate(spot.gid, key, spot.profile, spot.start)
                spread.append(choice.gpus_used())
            else:
                one = single.decide(cluster, PlacementRequest(job.name, {MODEL: job.profile}))
                if not isinstance(one, Placement):
                    break
                cluster.allocate(one.gid, job.name, one.profile, one.start)
                keys = [job.name]
            queue.pop(0)
            waits[job.name] = slot - job.arrival
            running[job.name] = (slot + job.slots, keys)
        slot += 1
    large = [waits[j.name] for j in jobs if j.instances == 1]
    return Outcome(policy, seed, slot - 1, statistics.fmean(waits.values()), statistics.fmean(large) if large else 0.0,
                   statistics.fmean(spread) if spread else 0.0)  # fmt: skip


def compare(seeds: int, jobs: int, per_slot: float, nodes: int = 4, gpus_per_node: int = 2) -> list[Outcome]:
    """Both rules on the same ``seeds`` workloads: flex-mig then mfi for each seed. Refused when a node cannot
    hold the largest multi-instance job (it would wait for ever)."""
    from mig_batch.mig.tables import tables_for
    from mig_batch.placement.multi import max_per_gpu

    per_node = gpus_per_node * max_per_gpu(tables_for(MODEL), "1g.10gb")
    if per_node < max(SIZES):
        raise ValueError(f"--gpus-per-node {gpus_per_node}: a node then holds {per_node} x 1g.10gb, fewer than the "
                         f"largest job's {max(SIZES)}; give at least 2")  # fmt: skip
    out = []
    for seed in range(seeds):
        work = workload(seed, jobs, per_slot)
        out += [run(policy, work, nodes, gpus_per_node, seed) for policy in ("flex-mig", "mfi")]
    return out
