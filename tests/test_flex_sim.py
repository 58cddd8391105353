"""``simulate flex``: each policy on tiny hand-checked traces, invariants over random traces, a --quick run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mig_batch.cli.main import main as mig_batch_main
from mig_batch.mig.models import get_model
from mig_batch.sim.flex import (
    A100_CREATE_S,
    A100_DESTROY_S,
    FlexParams,
    FlexSimError,
    lower_bound_makespan,
    one_to_one_profile,
    simulate,
)
from mig_batch.sim.flex_workloads import (
    Category,
    FlexJob,
    FlexWorkloadError,
    generate_trace,
    size_counts,
    window_sample,
)

PHILLY = Path(__file__).resolve().parents[2] / "shared" / "data" / "philly" / "philly_runtime.csv"
A100_40 = get_model("A100-40GB")
NO_FACTORS = FlexParams(contention=1.0, multi_slowdown=1.0)


def by_id(result):
    return {j.job_id: j for j in result.jobs}


def test_one_to_one_profiles_follow_the_paper():
    assert [one_to_one_profile(A100_40, s).name for s in (1, 2, 4, 6, 8)] == [
        "1g.5gb", "2g.10gb", "4g.20gb", "7g.40gb", "7g.40gb"]  # fmt: skip


def test_fm_spreads_an_8_leaf_job_round_robin_and_queues_the_next_until_leaves_free():
    params = FlexParams(contention=1.06, multi_slowdown=1.05)
    jobs = [FlexJob(0, 8, "train", 1000.0), FlexJob(1, 8, "train", 1000.0), FlexJob(2, 6, "train", 500.0)]
    result = simulate("fm", jobs, params)
    done = by_id(result)
    run = 1000.0 * 1.06 * 1.05  # contention and one-to-many slowdown, no set-up (leaves are fixed)
    assert done[0].start == 0 and done[0].end == pytest.approx(run)
    held = [s for s in result.segments if s.job_id == 0]
    assert len(held) == 8 and sorted(sum(s.gpu == g for s in held) for g in (0, 1)) == [4, 4]
    # 14 leaves: after the first 8, job 1 (8) cannot start, and FIFO keeps job 2 (6) behind it
    assert done[1].start == pytest.approx(run) and done[2].start == pytest.approx(run)
    assert result.reconfigurations == 0 and result.drains == 0
    one = simulate("fm", [FlexJob(0, 1, "train", 100.0)], params)
    assert one.jobs[0].end == pytest.approx(106.0)  # size 1: one-to-one on the 1g.10gb leaf, no slowdown
    assert one.segments[0].mask == A100_40.profile("1g.10gb").window(6)


def test_fm_backfilling_window_lets_a_smaller_job_pass_the_blocked_head():
    jobs = [FlexJob(0, 8, "train", 1000.0), FlexJob(1, 8, "train", 1000.0), FlexJob(2, 6, "train", 500.0)]
    done = by_id(simulate("fm", jobs, FlexParams(contention=1.0, multi_slowdown=1.0, window=2)))
    assert done[2].start == 0 and done[1].start == pytest.approx(1000.0)


def test_dm_drains_a_training_gpu_when_the_tree_blocks_and_never_an_inference_one():
    params = FlexParams(gpus=1, contention=1.0, drain_penalty_s=60.0)
    create_1, create_4 = A100_CREATE_S[1], A100_CREATE_S[4]
    jobs = [FlexJob(0, 1, "train", 1000.0), FlexJob(1, 4, "train", 500.0)]
    result = simulate("dm", jobs, params)
    done = by_id(result)
    # job 0 takes 1g.5gb@0; 4g.20gb may only start at 0, so job 1 drains the GPU: repacked, job 0 moves
    assert result.drains == 1 and done[1].start == 0
    moved = sorted({(s.mask, s.start) for s in result.segments if s.job_id == 0})
    assert moved[0][0] == 1 and moved[1][0] != 1  # first at slice 0, then elsewhere
    assert done[0].end == pytest.approx(create_1 + 1000.0 + 60.0 + create_1)
    assert done[1].end == pytest.approx(A100_DESTROY_S[1] + create_4 + 500.0)
    serving = [FlexJob(0, 1, "infer", 1000.0), FlexJob(1, 4, "train", 500.0)]
    kept = simulate("dm", serving, params)
    assert kept.drains == 0 and by_id(kept)[1].start == pytest.approx(by_id(kept)[0].end)


def test_dm_reuses_an_idle_instance_without_reconfiguring():
    jobs = [FlexJob(0, 2, "train", 100.0), FlexJob(1, 2, "train", 100.0), FlexJob(2, 2, "train", 100.0),
            FlexJob(3, 2, "train", 100.0)]  # fmt: skip
    result = simulate("dm", jobs, FlexParams(gpus=1, contention=1.0))
    assert result.created == 3 and result.reconfigurations == 3  # three 2g.10gb fit; the fourth reuses one
    done = by_id(result)
    assert done[3].start == pytest.approx(min(done[k].end for k in range(3)))


def test_sm_hands_out_the_smallest_larger_idle_instance_and_it_runs_faster():
    params = FlexParams(gpus=1, contention=1.0, larger_exponent=0.5)
    jobs = [FlexJob(k, 1, "train", 100.0) for k in range(4)]
    done = by_id(simulate("sm", jobs, params))
    assert done[0].end == pytest.approx(100.0)  # its own 1g.10gb
    assert done[1].end == pytest.approx(100.0 * (1 / 2) ** 0.5)  # 2g.10gb
    assert done[2].end == pytest.approx(100.0 * (1 / 4) ** 0.5)  # 4g.20gb
    assert done[3].start == pytest.approx(done[2].end)  # nothing idle: waits for the first instance back
    with pytest.raises(FlexSimError, match="sizes 1..4"):
        simulate("sm", [FlexJob(0, 8, "train", 1.0)], params)


def test_mbdyn_waits_for_a_one_to_one_spot_and_hybrid_goes_one_to_many():
    params = FlexParams(gpus=2, contention=1.0, multi_slowdown=1.1)
    jobs = [FlexJob(0, 4, "train", 1000.0), FlexJob(1, 4, "train", 1000.0), FlexJob(2, 4, "train", 500.0)]
    ours = simulate("mbdyn", jobs, params)
    first_end = min(by_id(ours)[k].end for k in (0, 1))
    assert ours.drains == 0 and by_id(ours)[2].start == pytest.approx(first_end)  # 4g.20gb only at slice 0
    hybrid = simulate("hybrid", jobs, params)
    job = by_id(hybrid)[2]
    assert job.start == 0 and job.mode == "one-to-many" and job.exec_s == pytest.approx(550.0)
    leaves = [s for s in hybrid.segments if s.job_id == 2]
    assert len(leaves) == 4 and all(s.mask.bit_count() == 1 and s.mask < 1 << 7 for s in leaves)
    assert hybrid.metrics()["makespan_s"] < ours.metrics()["makespan_s"]
    # MFI keeps a lone 1g.5gb off slice 0, the only start of 4g.20gb
    alone = simulate("mbdyn", [FlexJob(0, 1, "train", 1000.0)], params)
    assert not alone.segments[0].mask & A100_40.profile("4g.20gb").window(0)


def test_external_fragmentation_delay_counts_a_head_blocked_by_where_the_room_is():
    # two GPUs, each with a busy 4g.20gb: 3 + 3 free compute slices, a size-4 job fits neither
    jobs = [FlexJob(0, 4, "train", 100.0), FlexJob(1, 4, "train", 300.0), FlexJob(2, 4, "train", 10.0)]
    done = by_id(simulate("dm", jobs, FlexParams(contention=1.0)))
    assert done[2].frag_delay_s == pytest.approx(done[2].start)
    assert done[2].frag_delay_s > 99
    fm = by_id(simulate("fm", jobs, FlexParams(contention=1.0)))
    assert fm[2].frag_delay_s == 0 and fm[2].start == 0  # 14 leaves hold 4 + 4 + 4


def test_workload_counts_are_table_2_doubled_and_mixed_is_one_of_each():
    assert sum(n for *_, n in size_counts("small", "train")) == 62
    assert sum(n for *_, n in size_counts("large", "train")) == 64
    assert sum(n for *_, n in size_counts("balanced", "infer")) == 60
    assert sum(n for *_, n in size_counts("small", "mixed")) == 31 + 28
    assert {s for s, *_ in size_counts("large", "train", max_size=4)} == {1, 2, 4}
    assert sum(n for *_, n in size_counts("large", "train", 4, "drop")) == 40
    with pytest.raises(FlexWorkloadError):
        size_counts("huge", "train")


def test_traces_draw_work_inside_the_duration_window():
    sample = [float(x) for x in range(0, 9000, 7)]
    jobs = generate_trace(Category("medium", "balanced", "mixed"), sample, seed=3)
    assert all(1800 <= j.work_s < 3600 for j in jobs) and {j.kind for j in jobs} == {"train", "infer"}
    assert jobs != generate_trace(Category("medium", "balanced", "mixed"), sample, seed=4)
    with pytest.raises(FlexWorkloadError, match="no job between"):
        window_sample([1.0, 2.0], "long")


def _no_slice_held_twice(result) -> None:
    segs = sorted(result.segments, key=lambda s: s.start)
    for i, a in enumerate(segs):
        for b in segs[i + 1 :]:
            if b.start >= a.end:
                continue
            if a.gpu == b.gpu and a.job_id != b.job_id and a.end > b.start:
                assert not a.mask & b.mask, (a, b)


job_strategy = st.builds(
    lambda size, kind, work, submit: (size, kind, work, submit),
    st.sampled_from([1, 2, 4, 6, 8]),
    st.sampled_from(["train", "infer"]),
    st.floats(10, 5000),
    st.sampled_from([0.0, 0.0, 50.0, 700.0]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(job_strategy, min_size=1, max_size=14),
    st.sampled_from(["fm", "dm", "sm", "mbdyn", "hybrid"]),
    st.integers(1, 2),
    st.sampled_from([1, 3]),
)
def test_invariants_hold_on_random_traces(shapes, policy, gpus, window):
    if policy == "sm":
        shapes = [(min(s, 4), k, w, t) for s, k, w, t in shapes]
    if gpus == 1 and policy in ("fm", "hybrid"):
        shapes = [(min(s, 7), k, w, t) for s, k, w, t in shapes]
    jobs = [FlexJob(i, s, k, w, t) for i, (s, k, w, t) in enumerate(shapes)]
    params = FlexParams(gpus=gpus, window=window)
    result = simulate(policy, jobs, params)
    assert sorted(j.job_id for j in result.jobs) == [j.job_id for j in jobs]  # every job finishes, once
    assert all(r.start >= r.submit and r.end > r.start for r in result.jobs)
    _no_slice_held_twice(result)
    metrics = result.metrics()
    assert metrics["makespan_s"] >= lower_bound_makespan(jobs, params) - 1e-6
    assert 0 < metrics["utilisation"] <= 1 + 1e-9
    if policy in ("fm", "hybrid"):
        assert metrics["mean_frag_delay_s"] == 0 or policy == "hybrid"
    if policy != "dm":
        assert result.drains == 0


def test_bad_parameters_are_refused():
    with pytest.raises(FlexSimError, match="window"):
        FlexParams(window=0)
    with pytest.raises(FlexSimError, match="exponent"):
        FlexParams(larger_exponent=2)
    with pytest.raises(FlexSimError, match="unknown"):
        simulate("nope", [FlexJob(0, 1, "train", 1.0)], NO_FACTORS)


@pytest.mark.skipif(not PHILLY.is_file(), reason="Philly run-time sample not under ../shared/data")
def test_quick_cli_run_writes_numbers_consistent_with_its_csv(tmp_path, capsys):
    out = tmp_path / "flex"
    code = mig_batch_main(["simulate", "flex", "--quick", "--data-dir", str(PHILLY.parents[1]), "--out", str(out)])
    assert code == 0
    assert "fm/dm" in capsys.readouterr().out
    result = json.loads((out / "flex.json").read_text())
    assert (out / "flex_fig7.png").stat().st_size > 10_000 and (out / "flex_fig8.png").stat().st_size > 10_000
    rows = list(csv.DictReader((out / "flex.csv").open()))
    cell = result["groups"]["fig7"]["categories"]["short/large/train"]
    fm = [float(r["makespan_s"]) for r in rows if r["group"] == "fig7" and r["category"] == "short/large/train"
          and r["policy"] == "fm"]  # fmt: skip
    dm = [float(r["makespan_s"]) for r in rows if r["group"] == "fig7" and r["category"] == "short/large/train"
          and r["policy"] == "dm"]  # fmt: skip
    assert len(fm) == 2
    expected = sum(a / b for a, b in zip(fm, dm, strict=True)) / 2
    assert cell["ratios"]["fm/dm"]["makespan_s"]["mean"] == pytest.approx(expected)
    assert "sm" not in result["groups"]["all"]["categories"]["short/large/train"]["mean"]  # size 8 does not fit SM
