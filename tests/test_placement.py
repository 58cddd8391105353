"""Placement policies: feasibility, MFI = brute-force minimum of ΔF, baseline semantics, the mask index."""

import copy
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.mig.models import get_model
from mig_batch.mig.scores import FragVariant, fragmentation_score
from mig_batch.mig.tables import tables_for
from mig_batch.placement.base import Placement, PlacementRequest, Rejection
from mig_batch.placement.cluster import Cluster, Gpu, PlacementConflict
from mig_batch.placement.policies import best_index_order, make_policy, policy_names

MODEL = "A100-80GB"
A100 = get_model(MODEL)
BASE = [p.name for p in A100.base_profiles]


@st.composite
def clusters(draw, max_gpus=12, model=MODEL):
    """A small cluster of ``model`` GPUs holding random feasible instances."""
    n = draw(st.integers(1, max_gpus))
    seed = draw(st.integers(0, 10**6))
    rng = random.Random(seed)
    cluster = Cluster.homogeneous(model, n, gpus_per_host=4)
    tables = cluster.tables[model]
    base = [p.name for p in get_model(model).base_profiles]
    for j in range(draw(st.integers(0, 4 * n))):
        gpu = cluster.gpus[rng.randrange(n)]
        k = rng.randrange(len(base))
        starts = tables.free_starts[k][gpu.mask]
        if starts:
            cluster.allocate(gpu.gid, f"pre{j}", base[k], rng.choice(starts))
    return cluster


def assert_feasible(cluster, decision, profile):
    gpu = cluster.gpus[decision.gid]
    p = cluster.models[gpu.model].profile(profile)
    assert decision.profile == profile
    assert decision.start in p.starts
    assert not p.window(decision.start) & gpu.mask
    assert (decision.host, decision.gpu_index) == (gpu.host, gpu.index)


@settings(max_examples=150)
@given(clusters(), st.sampled_from(BASE), st.sampled_from(policy_names()))
def test_no_policy_returns_an_infeasible_placement(cluster, profile, name):
    decision = make_policy(name).decide(cluster, PlacementRequest.single("x", MODEL, profile))
    if isinstance(decision, Placement):
        assert_feasible(cluster, decision, profile)
        cluster.allocate(decision.gid, "x", decision.profile, decision.start)  # and it really applies
    else:
        assert isinstance(decision, Rejection) and decision.reason


@settings(max_examples=150)
@given(clusters(), st.sampled_from(BASE), st.sampled_from(policy_names()), st.sets(st.integers(0, 7)))
def test_no_policy_places_on_a_fenced_gpu(cluster, profile, name, fenced):
    """mig-batchd fences the GPUs of down nodes and of GPUs with MIG mode off: no policy may choose one."""
    for gid in fenced & set(range(len(cluster.gpus))):
        cluster.fence(gid)
    decision = make_policy(name).decide(cluster, PlacementRequest.single("x", MODEL, profile))
    if isinstance(decision, Placement):
        assert decision.gid not in cluster.fenced


def brute_force_mfi(cluster, profile, variant):
    best = None
    p = A100.profile(profile)
    for gpu in cluster.gpus:  # every GPU, every start, F computed directly (MFI Alg. 2)
        before = fragmentation_score(A100, gpu.mask, variant)
        for start in p.starts:
            if p.window(start) & gpu.mask:
                continue
            delta = fragmentation_score(A100, gpu.mask | p.window(start), variant) - before
            candidate = (delta, gpu.gid, start)
            best = candidate if best is None or candidate < best else best
    return best


@settings(max_examples=200)
@given(clusters(), st.sampled_from(BASE), st.sampled_from(policy_names()), st.sets(st.integers(0, 11)))
def test_every_policy_decides_as_if_it_visited_every_mask(cluster, profile, name, fenced):
    """A request is refused at once when no unfenced GPU has a mask the policy would take; the same
    cluster claiming every mask present makes each policy visit them all, and it must decide the same."""
    for gid in fenced & set(range(len(cluster.gpus))):
        cluster.fence(gid)
    every_mask = copy.deepcopy(cluster)
    every_mask.present = {m: set(range(1 << cluster.models[m].memory_slices)) for m in cluster.models}
    request = PlacementRequest.single("x", MODEL, profile)
    assert make_policy(name).decide(cluster, request) == make_policy(name).decide(every_mask, request)


def test_a_request_no_gpu_can_host_visits_no_mask(monkeypatch):
    """A saturated cluster's queue is mostly requests that fit nowhere; each is refused without a look
    at the GPUs of each mask it could use (before: about a hundred looks per request)."""
    cluster = Cluster.homogeneous(MODEL, 64)
    for gpu in cluster.gpus:
        cluster.allocate(gpu.gid, f"full{gpu.gid}", "7g.80gb", 0)
    looks = []
    monkeypatch.setattr(cluster, "lowest_gpu", lambda model, mask: looks.append(mask))
    for name in ("mfi", "ff", "bf-bi", "wf-bi", "nvidia"):
        decision = make_policy(name).decide(cluster, PlacementRequest.single("x", MODEL, "1g.10gb"))
        assert decision == Rejection("no GPU can host the request"), name
    assert looks == []


@settings(max_examples=200)
@given(clusters(), st.sampled_from(BASE), st.sampled_from(list(FragVariant)))
def test_mfi_equals_brute_force_minimum(cluster, profile, variant):
    policy = make_policy("mfi" if variant is FragVariant.PRINTED else "mfi-partial")
    decision = policy.decide(cluster, PlacementRequest.single("x", MODEL, profile))
    expected = brute_force_mfi(cluster, profile, variant)
    if expected is None:
        assert isinstance(decision, Rejection)
    else:
        assert (decision.gid, decision.start) == expected[1:]


@settings(max_examples=150)
@given(clusters(), st.sampled_from(BASE))
def test_first_fit_is_mig_agnostic(cluster, profile):
    # MFI §VI: the first GPU with enough free slices, then its first free start; a GPU with enough
    # slices but no free start means rejection (their Fig. 3).
    size = A100.profile(profile).memory_slices
    decision = make_policy("ff").decide(cluster, PlacementRequest.single("x", MODEL, profile))
    chosen = next((g for g in cluster.gpus if 8 - g.mask.bit_count() >= size), None)
    if chosen is None:
        assert isinstance(decision, Rejection)
        return
    starts = [s for s in A100.profile(profile).starts if not A100.profile(profile).window(s) & chosen.mask]
    if starts:
        assert (decision.gid, decision.start) == (chosen.gid, starts[0])
    else:
        assert isinstance(decision, Rejection) and f"GPU {chosen.gid}" in decision.reason


def test_best_index_keeps_constrained_starts_free():
    tables = tables_for(MODEL)
    assert best_index_order(tables, tables.index("1g.10gb"))[0] == 6  # MFI §VI: 6 rather than 0
    assert best_index_order(tables, tables.index("2g.20gb")) == (4, 2, 0)
    assert best_index_order(tables, tables.index("3g.40gb")) == (4, 0)


def test_round_robin_moves_on():
    cluster = Cluster.homogeneous(MODEL, 3)
    rr = make_policy("rr")
    gids = []
    for j in range(4):
        d = rr.decide(cluster, PlacementRequest.single(f"j{j}", MODEL, "1g.10gb"))
        cluster.allocate(d.gid, f"j{j}", d.profile, d.start)
        gids.append(d.gid)
    assert gids == [0, 1, 2, 0]


def test_mcc_takes_the_gpu_with_highest_cc_after():
    cluster = Cluster.homogeneous(MODEL, 2)
    cluster.allocate(0, "a", "3g.40gb", 4)
    d = make_policy("mcc").decide(cluster, PlacementRequest.single("x", MODEL, "1g.10gb"))
    # on GPU 0 (left half free) the best start leaves CC 8; on the empty GPU 1 it leaves 18 - 4 = 14
    assert (d.gid, d.start) == (1, 6)


def test_unknown_policy_lists_known():
    with pytest.raises(ValueError, match="known: ff, rr"):
        make_policy("best")


def test_request_for_absent_model_is_rejected():
    cluster = Cluster.homogeneous(MODEL, 2)
    d = make_policy("mfi").decide(cluster, PlacementRequest.single("x", "H100-80GB", "1g.10gb"))
    assert isinstance(d, Rejection)


def test_heterogeneous_cluster_uses_each_models_profile():
    gpus = [Gpu(0, "a", 0, "A30-24GB"), Gpu(1, "b", 0, "H100-80GB")]
    cluster = Cluster(gpus)
    cluster.allocate(0, "full", "4g.24gb", 0)
    d = make_policy("mfi").decide(cluster, PlacementRequest("x", {"A30-24GB": "1g.6gb", "H100-80GB": "1g.10gb"}))
    assert (d.gid, d.model, d.profile) == (1, "H100-80GB", "1g.10gb")


@settings(max_examples=120)
@given(st.lists(st.tuples(st.sampled_from(["add", "release", "fence", "unfence"]), st.integers(0, 7),
                          st.integers(0, 5)), max_size=60))  # fmt: skip
def test_index_buckets_match_gpu_masks(ops):
    """Allocations and releases on fenced GPUs too (the controller fences nodes without idle CPUs while
    their jobs end): the buckets hold exactly the unfenced GPUs of each mask."""
    cluster = Cluster.homogeneous(MODEL, 8)
    jobs = []
    for j, (op, g, k) in enumerate(ops):
        gpu = cluster.gpus[g]
        starts = cluster.tables[MODEL].free_starts[k][gpu.mask]
        if op == "add" and starts:
            cluster.allocate(g, f"j{j}", BASE[k], starts[0])
            jobs.append(f"j{j}")
        elif op == "release" and jobs:
            cluster.release(jobs.pop(k % len(jobs)))
        elif op == "fence":
            cluster.fence(g)
        elif op == "unfence":
            cluster.unfence(g)
        for mask, bucket in cluster.occupied_masks(MODEL):
            assert bucket.members == {
                gpu.gid for gpu in cluster.gpus if gpu.mask == mask and gpu.gid not in cluster.fenced
            }
            assert bucket.lowest() == min(bucket.members)
        unfenced = {gpu.gid for gpu in cluster.gpus if gpu.gid not in cluster.fenced}
        assert {gid for _, bucket in cluster.occupied_masks(MODEL) for gid in bucket.members} == unfenced
        assert cluster.present[MODEL] == {cluster.gpus[gid].mask for gid in unfenced}


def test_conflicting_allocations_are_refused():
    cluster = Cluster.homogeneous(MODEL, 1)
    cluster.allocate(0, "a", "4g.40gb", 0)
    with pytest.raises(PlacementConflict):
        cluster.allocate(0, "b", "3g.40gb", 0)
    with pytest.raises(PlacementConflict):
        cluster.allocate(0, "a", "1g.10gb", 6)
    with pytest.raises(PlacementConflict):
        cluster.release("nobody")


def test_learning_policies_keep_their_settings():
    emfi, mecc = make_policy("emfi"), make_policy("mecc")
    assert (emfi.pack_ties, emfi.variant, emfi.window) == (True, FragVariant.PRINTED, None)
    assert mecc.window == 500
    cluster = Cluster.homogeneous(MODEL, 4)
    for j in range(3):
        mecc.decide(cluster, PlacementRequest.single(f"j{j}", MODEL, "1g.10gb"))
    assert mecc.profile_counts(MODEL) == {cluster.tables[MODEL].index("1g.10gb"): 3}


@pytest.mark.parametrize("name", ["emfi", "mecc"])
def test_learning_policies_count_a_job_decided_again_once(name):
    """A job that waits is decided again every pass: the learned mix is of jobs, not of tries."""
    policy = make_policy(name)
    cluster = Cluster.homogeneous(MODEL, 1)
    for _ in range(5):
        policy.decide(cluster, PlacementRequest.single("waits", MODEL, "7g.80gb"))
    policy.decide(cluster, PlacementRequest.single("other", MODEL, "1g.10gb"))
    index = cluster.tables[MODEL].index
    assert policy.profile_counts(MODEL) == {index("7g.80gb"): 1, index("1g.10gb"): 1}


def test_mecc_counts_only_its_window_of_jobs():
    mecc = make_policy("mecc", window=3)
    cluster = Cluster.homogeneous(MODEL, 1)
    for j, profile in enumerate(["7g.80gb", "7g.80gb", "1g.10gb", "1g.10gb", "2g.20gb"]):
        mecc.decide(cluster, PlacementRequest.single(f"j{j}", MODEL, profile))
    index = cluster.tables[MODEL].index
    assert mecc.profile_counts(MODEL) == {index("1g.10gb"): 2, index("2g.20gb"): 1}
