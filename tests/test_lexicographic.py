"""Our lexicographic placement policies (issue 20 point 4): hand-checked choices, brute force, properties."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement import clusters as placement_clusters

from mig_batch.mig.models import get_model
from mig_batch.mig.tables import tables_for
from mig_batch.placement.base import Placement, PlacementRequest
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.lexicographic import CRITERIA, Lexicographic, MixAware, dead_slices, expected_fill
from mig_batch.placement.policies import make_policy
from mig_batch.sim.engine import estimated_duration
from mig_batch.sim.workloads import Arrival

MODEL = "A100-40GB"  # 1g.5gb starts 0..6, 1g.10gb 0,2,4,6, 2g.10gb 0,2,4, 3g.20gb 0,4, 4g.20gb 0, 7g.40gb 0
GPU = get_model(MODEL)
BASE = [p.name for p in GPU.base_profiles]


def request(profile, now=None, end=None, job="r"):
    return PlacementRequest.single(job, MODEL, profile, now, end)


def six_small_on_gpu0():
    """GPU 0 holds 1g.5gb at 0..5 (slices 6 and 7 free), GPU 1 is empty."""
    cluster = Cluster.homogeneous(MODEL, 2)
    for start in range(6):
        cluster.allocate(0, f"s{start}", "1g.5gb", start)
    return cluster


def test_dead_slices_by_hand():
    dead = dead_slices(tables_for(MODEL))
    assert dead[0] == 0 and dead[0xFF] == 0
    assert dead[0x7F] == 1  # only slice 7 free: no profile starts there alone
    assert dead[0xBF] == 0  # only slice 6 free: 1g.5gb@6 uses it
    assert dead[0x3F] == 0  # 6 and 7 free: 1g.10gb@6
    assert dead[0x5F] == 1  # 5 and 7 free: 5 by 1g.5gb@5, 7 by nothing


def test_waste_first_and_fit_first_choose_differently():
    cluster = six_small_on_gpu0()
    # best fit: 1g.5gb@6 on GPU 0 leaves 1 slice, which becomes dead (slice 7)
    fit = Lexicographic(("left", "dead", "cc")).decide(cluster, request("1g.5gb"))
    assert (fit.gid, fit.start) == (0, 6)
    # waste first: any start but 6 on the empty GPU kills nothing; among those, the highest CC after
    waste = Lexicographic(("dead", "left", "cc")).decide(cluster, request("1g.5gb"))
    assert waste.gid == 1 and waste.start != 6
    cc_after = dict(tables_for(MODEL).cc_after[BASE.index("1g.5gb")][0])
    assert cc_after[waste.start] == max(cc for s, cc in cc_after.items() if s != 6)
    # a 1g.10gb fills GPU 0 exactly: every order agrees
    for order in (("left", "dead", "cc"), ("dead", "left", "cc"), ("df", "left")):
        assert Lexicographic(order).decide(cluster, request("1g.10gb")).gid == 0


def brute_force(cluster, profile, order, shares=None):
    """Every GPU and start, criteria computed directly from the masks; ties to the lowest GPU, start.
    ``ev`` uses the expected fill under ``shares`` (the profile shares the policy had learned)."""
    tables = tables_for(MODEL)
    dead = dead_slices(tables)
    fill = expected_fill(MODEL, shares or (1 / len(BASE),) * len(BASE))
    p = GPU.profile(profile)
    best = None
    for gpu in cluster.gpus:
        for start in p.starts:
            if p.window(start) & gpu.mask:
                continue
            after = gpu.mask | p.window(start)
            left = 8 - after.bit_count()
            values = {
                "new": int(gpu.mask == 0),
                "left": left,
                "dead": dead[after] - dead[gpu.mask],
                "cc": -tables.cc[after],
                "df": tables.frag["printed"][after] - tables.frag["printed"][gpu.mask],
                "ev": round(fill[gpu.mask] - p.memory_slices - fill[after], 6),
            }
            # the mask's key is its best start's key, so compare (key, gid, start) with start last
            candidate = (tuple(values[c] for c in order), gpu.gid, start)
            best = candidate if best is None or candidate < best else best
    return best


def clusters(max_gpus=10):
    return placement_clusters(max_gpus, MODEL)


ORDERS = [order for r in (1, 2, 3) for order in itertools.permutations(CRITERIA, r)]


@settings(max_examples=200, deadline=None)
@given(clusters(), st.sampled_from(BASE), st.sampled_from(ORDERS))
def test_lexicographic_equals_brute_force(cluster, profile, order):
    policy = Lexicographic(order)
    decision = policy.decide(cluster, request(profile))
    expected = brute_force(cluster, profile, order, policy.shares.get(MODEL))
    if expected is None:
        assert not isinstance(decision, Placement)
    else:
        assert isinstance(decision, Placement)
        assert (decision.gid, decision.start) == expected[1:]


@settings(max_examples=150, deadline=None)
@given(clusters(), st.lists(st.sampled_from(BASE), min_size=1, max_size=12), st.booleans(), st.integers(0, 3))
def test_mix_places_feasibly_and_deterministically(cluster, profiles, with_end, end_after):
    """Fed the same requests, two fresh policies decide the same; every placement fits where it lands."""
    runs = []
    for _ in range(2):
        state = Cluster.homogeneous(MODEL, len(cluster.gpus), gpus_per_host=4)
        for gpu in cluster.gpus:
            for job, (profile, start) in gpu.instances.items():
                state.allocate(gpu.gid, job, profile, start)
        policy = MixAware(end_after=end_after if with_end else None)
        decisions = []
        for i, profile in enumerate(profiles):
            end = i + 10 * (i % 3 + 1)
            req = PlacementRequest.single(f"j{i}", MODEL, profile, i, end) if with_end else request(profile)
            decision = policy.decide(state, req)
            if isinstance(decision, Placement):
                p = GPU.profile(profile)
                assert decision.start in p.starts and not p.window(decision.start) & state.gpus[decision.gid].mask
                state.allocate(decision.gid, f"j{i}", profile, decision.start)
            else:
                assert all(not tables_for(MODEL).free_starts[BASE.index(profile)][g.mask] for g in state.gpus)
            decisions.append(decision)
        runs.append(decisions)
    assert runs[0] == runs[1]


def test_mix_switches_order_with_the_share_of_whole_gpu_requests():
    cluster = six_small_on_gpu0()
    light = MixAware()
    assert light.decide(cluster, request("1g.5gb")).gid == 1  # no whole-GPU requests seen: waste first
    heavy = MixAware()
    for n in range(3):
        heavy.decide(cluster, request("7g.40gb", job=f"big{n}"))  # decide never changes the cluster
    assert heavy.decide(cluster, request("1g.5gb", job="small")).gid == 0  # 3 of 4 whole-GPU: keep GPU 1 empty


def test_mix_counts_a_job_decided_again_once():
    """mig-batchd decides a waiting job again at every pass: one blocked 7g job must not look like a mix
    of whole-GPU requests."""
    cluster = six_small_on_gpu0()
    mix = MixAware()
    for _ in range(50):
        mix.decide(cluster, request("7g.40gb", job="waiting"))
    for n in range(3):
        mix.decide(cluster, request("1g.5gb", job=f"small{n}"))
    assert mix.decide(cluster, request("1g.5gb", job="small3")).gid == 1  # 1 of 5 whole-GPU: waste first
    assert make_policy("mix", whole_share=0.9).describe()["whole_share"] == 0.9


def test_end_aware_tie_break_puts_jobs_that_end_together_on_one_gpu():
    cluster = Cluster.homogeneous(MODEL, 3)
    cluster.allocate(0, "a", "3g.20gb", 0)  # ends early
    cluster.allocate(1, "b", "3g.20gb", 4)  # ends late
    policy = Lexicographic(("left", "dead", "cc"), end_after=1)
    policy.gpu_end.update({0: 100, 1: 1000})
    # both GPUs are filled exactly by a 3g.20gb: tied on every criterion but the end
    assert policy.decide(cluster, request("3g.20gb", now=0, end=990)).gid == 1
    assert policy.decide(cluster, request("3g.20gb", now=0, end=90)).gid == 0
    assert Lexicographic(("left", "dead", "cc")).decide(cluster, request("3g.20gb", now=0, end=990)).gid == 0


def test_estimated_duration_is_an_upper_bound_within_3x_and_repeatable():
    for i in range(200):
        arrival = Arrival(f"pod{i}", 0, "1g.5gb", 1000 + i, 1)
        estimate = estimated_duration(arrival)
        assert arrival.duration <= estimate <= 3 * arrival.duration
        assert estimate == estimated_duration(arrival)


def test_robust_suite_runs_mix_by_default(tmp_path):
    from mig_batch.sim.robust import quick_setup

    assert "mix" in quick_setup(tmp_path).policies


def max_packing(profile, mask):
    """Most slices instances of ``profile`` alone can still cover on a GPU with ``mask`` (exhaustive)."""
    p = GPU.profile(profile)
    free = [s for s in p.starts if not p.window(s) & mask]
    return max(
        (p.memory_slices * len(chosen) for r in range(len(free) + 1) for chosen in itertools.combinations(free, r)
         if all(not p.window(a) & p.window(b) for a, b in itertools.combinations(chosen, 2))),
        default=0,
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(BASE), st.integers(0, 255))
def test_expected_fill_of_a_one_profile_mix_is_its_best_packing(profile, mask):
    """With every request of one profile, a GPU takes as many as fit, placed at the best starts."""
    shares = tuple(1.0 if name == profile else 0.0 for name in BASE)
    assert expected_fill(MODEL, shares)[mask] == max_packing(profile, mask)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=len(BASE), max_size=len(BASE)).filter(any), st.integers(0, 255))
def test_expected_fill_is_within_the_free_slices(weights, mask):
    fill = expected_fill(MODEL, tuple(w / sum(weights) for w in weights))
    assert 0 <= fill[mask] <= 8 - mask.bit_count() + 1e-9
    assert fill[0xFF] == 0
    fits = any(w and tables_for(MODEL).free_starts[k][mask] for k, w in enumerate(weights))
    assert (fill[mask] > 0) == fits


def test_mix_keeps_the_windows_the_recent_mix_asks_for():
    """Regression (issue 20 point 4): the fit-first ranking used to put a 1g.5gb on an empty GPU at start 4
    whatever the mix (no dead slice, most CC after), which blocks 3g.20gb@4. Under a mix of whole-GPU,
    3g.20gb and 1g.5gb requests it now takes a start below 4: a 3g.20gb@4 and more 1g.5gb still fit."""
    cluster = Cluster.homogeneous(MODEL, 1)
    old = MixAware(fit_order=("left", "dead", "cc"))
    new = MixAware()
    mix = ["7g.40gb"] * 6 + ["3g.20gb"] * 2 + ["1g.5gb"] * 2
    for policy in (old, new):
        for n in range(300):  # more than one re-estimate of the mix (every 256 jobs)
            policy.decide(cluster, request(mix[n % 10], job=f"j{n}"))  # decide never changes the cluster
    assert new.fit.shares[MODEL][BASE.index("3g.20gb")] == new.fit.shares[MODEL][BASE.index("1g.5gb")] == 0.2
    assert old.decide(cluster, request("1g.5gb", job="small")).start == 4
    placed = new.decide(cluster, request("1g.5gb", job="small"))
    assert placed.start < 4
    fill = expected_fill(MODEL, new.fit.shares[MODEL])
    window = GPU.profile("1g.5gb").window
    assert fill[window(placed.start)] > fill[window(4)]


def test_learned_mix_counts_a_job_decided_again_once():
    cluster = Cluster.homogeneous(MODEL, 1)
    policy = Lexicographic(("left", "ev"), refresh=1)
    for _ in range(50):
        policy.decide(cluster, request("7g.40gb", job="waiting"))
    policy.decide(cluster, request("1g.5gb", job="small"))
    shares = policy.shares[MODEL]
    assert shares[BASE.index("7g.40gb")] == shares[BASE.index("1g.5gb")]  # one job each (+1 pseudo-count)
    short = Lexicographic(("ev",), mix_window=2, refresh=1)
    for job in ("a", "b", "c", "a"):  # "a" left the window but is still remembered: not counted again
        short.decide(cluster, request("7g.40gb" if job == "a" else "1g.5gb", job=job))
    assert list(short.mix.values) == [((MODEL, BASE.index("1g.5gb")),)] * 2 and short.mix.new_jobs == 3
    assert make_policy("lex", order=("ev",), quantum=0.1).describe()["quantum"] == 0.1
