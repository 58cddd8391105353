"""Why a rigid request fits no GPU now, in words its owner reads: pure, over the cluster view."""

from __future__ import annotations

from collections.abc import Mapping

from mig_batch.mig.geometry import free_starts
from mig_batch.placement.cluster import Cluster

FRAGMENTED = "fragmented"
NO_ROOM = "no room"
OUT_OF_REACH = "out of reach"


def why_no_room(cluster: Cluster, profiles: Mapping[str, str]) -> str:
    """Why a request of ``profiles`` (GPU model -> profile) fits no placeable GPU of ``cluster``: a GPU that
    could take it is fenced (outside the job's reach: its partitions, a node without free CPUs, down, MIG off);
    or GPUs have enough free slices but not at a start the profile may use (fragmented); or none has enough
    free (no room). Starts with one of the three keywords; the text does not change while the cause holds."""
    wanted = {model: profile for model, profile in profiles.items() if model in cluster.models}
    named = ", ".join(sorted(set(wanted.values()))) or ", ".join(sorted(set(profiles.values())))
    if not wanted:
        return f"{NO_ROOM}: no GPU here is of a model it fits ({named})"
    for gid in cluster.fenced:
        gpu = cluster.gpus[gid]
        if gpu.model in wanted and free_starts(cluster.models[gpu.model].profile(wanted[gpu.model]), gpu.mask):
            return (f"{OUT_OF_REACH}: a GPU with room for {named} is on a node it cannot use now (outside its "
                    "partitions, without free CPUs, down, or with MIG off)")  # fmt: skip
    for model, profile in wanted.items():
        size, total = cluster.models[model].profile(profile).memory_slices, cluster.models[model].memory_slices
        if any(total - mask.bit_count() >= size for mask, _ in cluster.occupied_masks(model)):
            return (f"{FRAGMENTED}: GPUs have enough free memory slices for {named}, but none at a start it may "
                    "use; it starts when jobs end or are moved")  # fmt: skip
    return f"{NO_ROOM}: every GPU that could hold {named} is busy; it starts when jobs end"
