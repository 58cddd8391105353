"""why_no_room: the words a waiting rigid job's owner reads, from the cluster view alone."""

from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.mig.geometry import free_starts
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.waiting import FRAGMENTED, NO_ROOM, OUT_OF_REACH, why_no_room

A100 = "A100-80GB"


def test_free_slices_at_no_start_the_profile_may_use_are_fragmented():
    cluster = Cluster.homogeneous(A100, 2)
    for gid in range(2):  # 1g.10gb at slice 0 and 4: 6 slices free, no 4g.40gb start (0 only) free
        cluster.allocate(gid, f"a{gid}", "1g.10gb", 0)
        cluster.allocate(gid, f"b{gid}", "1g.10gb", 4)
    assert why_no_room(cluster, {A100: "4g.40gb"}).startswith(f"{FRAGMENTED}: ")
    assert why_no_room(cluster, {A100: "7g.80gb"}).startswith(f"{NO_ROOM}: ")


def test_room_only_on_a_fenced_gpu_is_out_of_reach():
    cluster = Cluster.homogeneous(A100, 2)
    cluster.allocate(0, "a", "7g.80gb", 0)
    cluster.fence(1)
    assert why_no_room(cluster, {A100: "1g.10gb"}).startswith(f"{OUT_OF_REACH}: ")
    assert why_no_room(cluster, {"H100-80GB": "1g.10gb"}).startswith(f"{NO_ROOM}: no GPU here")


ALLOCATIONS = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]),
                                 st.integers(0, 6)), max_size=16)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(ALLOCATIONS, st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]))
def test_the_reason_agrees_with_the_masks(allocations, profile):
    """Whenever no GPU has a free start for the profile, the reason is fragmented exactly when some GPU has as
    many free memory slices as the profile needs."""
    cluster = Cluster.homogeneous(A100, 4)
    for i, (gid, name, start) in enumerate(allocations):
        p = cluster.models[A100].profile(name)
        if start in p.starts and not p.window(start) & cluster.gpus[gid].mask:
            cluster.allocate(gid, f"j{i}", name, start)
    p = cluster.models[A100].profile(profile)
    if any(free_starts(p, g.mask) for g in cluster.gpus):
        return  # it would be placed: no reason asked
    enough = any(8 - g.mask.bit_count() >= p.memory_slices for g in cluster.gpus)
    assert why_no_room(cluster, {A100: profile}).startswith(FRAGMENTED if enough else NO_ROOM)
