"""GRMU: dual-basket pooling, defragmentation and consolidation plans (GRMU §7)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.mig.tables import tables_for
from mig_batch.placement.base import (
    Migration,
    Placement,
    PlacementRequest,
    Rejection,
    apply_migrations,
    effective_plan,
)
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.grmu import Grmu, grmu_fragmentation
from mig_batch.placement.policies import make_policy

A100 = "A100-40GB"
LIGHT_PROFILES = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb")


def place(cluster, policy, job, profile):
    d = policy.decide(cluster, PlacementRequest.single(job, A100, profile))
    if isinstance(d, Placement):
        cluster.allocate(d.gid, job, d.profile, d.start)
    return d


def test_fragmentation_value_by_hand():
    tables = tables_for(A100)
    # empty GPU: every profile packs perfectly except 1g.5gb (7 fit, slice 7 left: 1/1) and
    # 3g.20gb/4g.20gb: 1g.10gb 4 fit (0), 2g.10gb 3 fit (2 left / 2 = 1), 3g 2 fit (0), 4g 1 fit
    # (4 left / 4 = 1), 7g (0): 1 + 1 + 1 = 3
    assert grmu_fragmentation(tables, 0) == 3
    # only slice 0 used: 1g.5gb 6 more (1 left at 7: 1); 1g.10gb at 2,4,6 (slice 1 left: 1/2);
    # 2g.10gb at 2,4 (1 and 6,7 left: 3/2); 3g at 4 (1,2,3 left: 3/4); 4g, 7g do not fit at all
    # (4g: 7 free >= 4, none placeable: 7/4); 7g needs 8 > 7 free: skipped
    assert grmu_fragmentation(tables, 0b1) == 1 + 0.5 + 1.5 + 0.75 + 7 / 4


def test_heavy_basket_is_capped():
    cluster = Cluster.homogeneous(A100, 10)
    grmu = Grmu(heavy_share=0.3)
    results = [place(cluster, grmu, f"h{i}", "7g.40gb") for i in range(4)]
    assert [isinstance(r, Placement) for r in results] == [True, True, True, False]
    assert place(cluster, grmu, "small", "1g.5gb").gid == 3  # light basket takes the next pool GPU


def test_light_requests_first_fit_with_default_start():
    cluster = Cluster.homogeneous(A100, 4)
    grmu = Grmu()
    a, b = place(cluster, grmu, "a", "1g.5gb"), place(cluster, grmu, "b", "1g.5gb")
    assert (a.gid, a.start, b.gid, b.start) == (0, 6, 0, 4)  # GRMU §5: blocks 6 then 4


def test_defragmentation_moves_the_survivor_to_the_max_cc_block():
    # GRMU §7: 1g.5gb at 6 then at 4; the one at 6 leaves; the one at 4 should move to 6.
    cluster = Cluster.homogeneous(A100, 1)
    grmu = Grmu()
    place(cluster, grmu, "a", "1g.5gb")
    place(cluster, grmu, "b", "1g.5gb")
    cluster.release("a")
    heavy = PlacementRequest.single("x", A100, "7g.40gb")
    assert grmu.after_rejection(cluster, heavy) == []  # only a rejected light request defragments
    plan = grmu.after_rejection(cluster, PlacementRequest.single("y", A100, "4g.20gb"))
    assert [(m.job, m.from_start, m.to_start) for m in plan] == [("b", 4, 6)]
    apply_migrations(cluster, plan)
    assert cluster.gpus[0].instances == {"b": ("1g.5gb", 6)}


def test_consolidation_pairs_half_empty_gpus():
    cluster = Cluster.homogeneous(A100, 3)
    grmu = Grmu(consolidation_interval=10)
    place(cluster, grmu, "a", "4g.20gb")  # GPU 0 at 0
    place(cluster, grmu, "b", "4g.20gb")  # GPU 0 is full for 4g (only start 0) -> GPU 1
    place(cluster, grmu, "c", "3g.20gb")  # GPU 0 at 4
    cluster.release("c")
    assert grmu.periodic(cluster, 5) == []  # not a consolidation slot
    plan = grmu.periodic(cluster, 10)
    assert [(m.job, m.from_gid, m.to_gid, m.to_start) for m in plan] == []  # 4g cannot join a 4g
    place(cluster, grmu, "d", "3g.20gb")  # GPU 0, start 4
    cluster.release("a")  # GPU 0 now holds only 3g at 4; GPU 1 only 4g at 0
    plan = grmu.periodic(cluster, 20)
    assert [(m.job, m.from_gid, m.to_gid, m.to_start) for m in plan] == [("b", 1, 0, 0)]
    apply_migrations(cluster, plan)
    assert cluster.gpus[1].mask == 0 and cluster.gpus[0].mask == 0xFF


def test_grmu_is_registered_and_rejects_with_a_reason():
    cluster = Cluster.homogeneous(A100, 1)
    grmu = make_policy("grmu")
    d = grmu.decide(cluster, PlacementRequest.single("x", A100, "7g.40gb"))
    assert isinstance(d, Rejection)  # floor(0.3 x 1) = 0 heavy GPUs allowed
    assert "basket" in d.reason


def test_same_size_swap_is_no_plan():
    # issue 20: 1g.5gb jobs at 6 and 4; the rebuild, ordered by current start, gives the one at 4 the
    # max-CC block 6 and the one at 6 block 4: occupancy unchanged, so it must not be a plan.
    cluster = Cluster.homogeneous(A100, 1)
    grmu = Grmu()
    place(cluster, grmu, "a", "1g.5gb")
    place(cluster, grmu, "b", "1g.5gb")
    assert cluster.gpus[0].instances == {"a": ("1g.5gb", 6), "b": ("1g.5gb", 4)}
    assert grmu.after_rejection(cluster, PlacementRequest.single("y", A100, "4g.20gb")) == []


def test_rebuild_moves_only_instances_that_change_start():
    # 1g.5gb at 6, 4 and 5. When the one at 5 leaves, the rebuild gives slots 6 and 4 again: no plan.
    # When the one at 6 leaves too, the survivor at 4 moves to 6, and it alone.
    cluster = Cluster.homogeneous(A100, 1)
    grmu = Grmu()
    for job in "abc":
        place(cluster, grmu, job, "1g.5gb")
    starts = {job: start for job, (_p, start) in cluster.gpus[0].instances.items()}
    cluster.release(next(j for j, s in starts.items() if s not in (6, 4)))
    assert grmu.after_rejection(cluster, PlacementRequest.single("y", A100, "4g.20gb")) == []
    cluster.release(next(j for j, s in starts.items() if s == 6))
    plan = grmu.after_rejection(cluster, PlacementRequest.single("y", A100, "4g.20gb"))
    assert [(m.from_start, m.to_start) for m in plan] == [(4, 6)]


def test_engine_counts_no_migration_for_a_swap():
    cluster = Cluster.homogeneous(A100, 2)
    cluster.allocate(0, "a", "1g.5gb", 6)
    cluster.allocate(1, "b", "1g.5gb", 6)
    swap = [Migration("a", 0, 6, 1, 6), Migration("b", 1, 6, 0, 6)]
    assert effective_plan(cluster, swap) == []
    stay = [Migration("a", 0, 6, 0, 6)]
    assert effective_plan(cluster, stay) == []
    real = [Migration("a", 0, 6, 0, 0)]
    assert effective_plan(cluster, real) == real


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(LIGHT_PROFILES)), min_size=1, max_size=40))
def test_every_defragmentation_move_changes_occupancy(steps):
    cluster = Cluster.homogeneous(A100, 2)
    grmu = Grmu()
    live: list[str] = []
    for i, (release, profile) in enumerate(steps):
        if release and live:
            cluster.release(live.pop(i % len(live)))
        elif isinstance(place(cluster, grmu, f"j{i}", profile), Placement):
            live.append(f"j{i}")
        plan = grmu.after_rejection(cluster, PlacementRequest.single("probe", A100, "4g.20gb"))
        if not plan:
            continue
        assert all((m.from_gid, m.from_start) != (m.to_gid, m.to_start) for m in plan)
        gid = plan[0].from_gid
        before = dict(cluster.gpus[gid].instances)
        mask_before = cluster.gpus[gid].mask
        apply_migrations(cluster, plan)
        assert cluster.gpus[gid].mask != mask_before  # a plan frees or shifts capacity
        moved = {m.job for m in plan}
        after = cluster.gpus[gid].instances
        assert {j: p for j, (p, _s) in after.items()} == {j: p for j, (p, _s) in before.items()}
        assert all(after[j][1] == before[j][1] for j in before if j not in moved)
