"""``auto``: within 5 % of the CP-SAT optimum on fixed generated batches, its budget honoured, its
decoder consistent with the timeline builder."""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.planner import auto
from mig_batch.planner.auto import Decoder, decode, plan_auto
from mig_batch.planner.exact import solve_exact
from mig_batch.planner.plan import check_plan, schedule
from mig_batch.planner.planners import make_plan
from mig_batch.planner.problem import gpu_scheme
from mig_batch.planner.workloads import WORKLOAD_TYPES, synthetic_dataset

A100 = gpu_scheme("A100-40GB")
UNBOUNDED_S = 600.0  # the evaluation limit ends the search (deterministic), not the clock


def gap_to_optimum(tasks) -> float:
    plan = plan_auto(A100, tasks, time_budget_s=UNBOUNDED_S)
    makespan = check_plan(A100, tasks, plan)
    result = solve_exact(A100, tasks, time_limit_s=120, incumbent=plan)
    assert result.optimal
    return (makespan / check_plan(A100, tasks, result.plan) - 1) * 100


# 6 tasks of every workload type, generator seeds 0..2 (the previous auto, 3,000 decodings without
# preferred slots, was 6.8 % off on goodscaling seed 2)
@pytest.mark.parametrize("kind", sorted(WORKLOAD_TYPES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_is_within_5_percent_of_the_optimum_on_small_batches(kind, seed):
    assert gap_to_optimum(synthetic_dataset(kind, 6, seed)) <= 5.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(WORKLOAD_TYPES))
def test_auto_is_within_5_percent_of_the_optimum_on_eight_task_batches(kind):
    # the first 8 tasks of dataset 1, as `mig-batch bench planner --gap-batch 8` cuts them
    assert gap_to_optimum(synthetic_dataset(kind, 100, seed=1)[:8]) <= 5.0


def test_auto_is_deterministic_for_a_seed_and_anytime():
    tasks = synthetic_dataset("goodscaling", 100, seed=2)[:8]
    first = plan_auto(A100, tasks, evaluations=1500, seed=3, time_budget_s=UNBOUNDED_S)
    again = plan_auto(A100, tasks, evaluations=1500, seed=3, time_budget_s=UNBOUNDED_S)
    assert first.events == again.events
    # the same seed with more evaluations follows the same path further: never worse
    longer = plan_auto(A100, tasks, evaluations=6000, seed=3, time_budget_s=UNBOUNDED_S)
    assert longer.makespan <= first.makespan + 1e-9


class FakeClock:
    """Advances ``step`` seconds at every reading."""

    def __init__(self, step: float) -> None:
        self.now, self.step, self.readings = 0.0, step, 0

    def __call__(self) -> float:
        self.now += self.step
        self.readings += 1
        return self.now


def test_the_time_budget_ends_the_search(monkeypatch):
    calls = 0
    run = Decoder.run

    def counted(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(auto.Decoder, "run", counted)
    tasks = synthetic_dataset("mixscalinguniform", 100, seed=0)[:10]
    clock = FakeClock(0.001)
    plan = plan_auto(A100, tasks, evaluations=10**7, time_budget_s=0.02, clock=clock)
    check_plan(A100, tasks, plan)
    # about 20 clock readings fit the budget; the search reads the clock every 32 decodings
    assert clock.readings <= 25 and calls <= 32 * clock.readings + 200
    assert plan.makespan <= min(make_plan(p, A100, tasks).makespan for p in ("far", "fixbest", "miso")) + 1e-9


def test_the_time_budget_holds_on_the_wall_clock_at_60_tasks():
    tasks = synthetic_dataset("widetimes", 100, seed=0)[:60]
    t0 = time.perf_counter()
    for name in ("far", "fixbest", "miso"):
        make_plan(name, A100, tasks)
    baselines = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = plan_auto(A100, tasks, evaluations=10**7, time_budget_s=0.3)
    elapsed = time.perf_counter() - t0
    check_plan(A100, tasks, plan)
    # budget + the baselines it always computes + slack for one decoding round and a shared machine
    assert elapsed <= 0.3 + 2 * baselines + 1.0


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(sorted(WORKLOAD_TYPES)),
    st.integers(0, 50),
    st.integers(1, 12),
    st.randoms(use_true_random=False),
)
def test_decoder_resumes_exactly_and_matches_the_timeline(kind, seed, n, rnd):
    tasks = synthetic_dataset(kind, n, seed)
    decoder = Decoder(A100, tasks)
    sizes = [rnd.choice(t.feasible_sizes()) for t in tasks]
    order = list(range(n))
    rnd.shuffle(order)
    prefs = [rnd.choice([-1, *decoder.by_size[sizes[i]]]) for i in range(n)]
    snaps: list = []
    full = decoder.run((sizes, order, prefs), snaps=snaps)
    assert len(snaps) == n
    position = rnd.randrange(n)
    assert decoder.run((sizes, order, prefs), position, snaps[position]) == full
    span, actions = decode(A100, tasks, sizes, order, prefs)
    assert span == full
    assert check_plan(A100, tasks, schedule(A100, tasks, actions)) == pytest.approx(full, abs=1e-9)
    if full > 0:
        assert decoder.run((sizes, order, prefs), cutoff=full * 0.999) == float("inf")
