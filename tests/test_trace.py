"""The Alibaba 2023 trace as MIG requests (GRMU §8.1) and the time-replay experiment."""

import json
from collections import Counter
from pathlib import Path

import pytest

from mig_batch.cli.main import main
from mig_batch.mig.models import get_model
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.policies import make_policy
from mig_batch.sim.engine import run_timeline
from mig_batch.sim.trace_experiment import TraceSetup, run_trace_experiment, trace_cluster
from mig_batch.sim.traces import (
    TraceError,
    TraceNode,
    TracePod,
    drop_arrival_outliers,
    map_pods_to_profiles,
    profile_values,
    read_nodes,
    read_pods,
    trace_arrivals,
)
from mig_batch.sim.verdict import ranked, starved_profiles

A100_40 = get_model("A100-40GB")
TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-2023"


def pod(name: str, gpus: int, milli: int, created: int, deleted: int) -> TracePod:
    return TracePod(name, gpus, milli, created, deleted)


def test_profile_values_are_compute_plus_memory_over_the_largest():
    values = profile_values(A100_40)
    assert values["7g.40gb"] == 1.0
    assert values["1g.5gb"] == pytest.approx(2 / 15)
    assert values["3g.20gb"] == pytest.approx(7 / 15)
    assert "1g.5gb+me" not in values


def test_mapping_picks_the_closest_profile_and_drops_multi_gpu_pods():
    pods = [
        pod("cpu-only", 0, 0, 10, 20),  # g = 0 -> closest is 1g.5gb (2/15)
        pod("tie", 1, 500, 10, 20),  # 0.5 is 1/30 from 3g.20gb (7/15) and 4g.20gb (8/15): smaller wins
        pod("more", 1, 520, 10, 20),  # 0.52 -> 4g.20gb
        pod("third", 1, 300, 10, 20),  # 0.3 -> 2g.10gb (4/15 = 0.267)
        pod("whole", 1, 1000, 10, 20),  # 1.0 -> 7g.40gb
        pod("two", 2, 1000, 10, 20),  # g = 2 > 1: dropped
    ]
    mapped = {p.name: profile for p, profile in map_pods_to_profiles(pods, A100_40)}
    assert mapped == {"cpu-only": "1g.5gb", "tie": "3g.20gb", "more": "4g.20gb", "third": "2g.10gb", "whole": "7g.40gb"}


def test_iqr_rule_drops_arrival_outliers():
    times = [100, 101, 102, 103, 104, 105, 106, 107, 0, 1000]
    pods = [pod(f"p{i}", 1, 1000, t, t + 5) for i, t in enumerate(times)]
    kept = {p.creation for p in drop_arrival_outliers(pods)}
    assert kept == set(range(100, 108))  # Q1 = 100.25, Q3 = 106.75: 0 and 1000 are outside 1.5 IQR


def test_arrivals_are_time_ordered_from_zero():
    pods = [pod("b", 1, 1000, 50, 80), pod("a", 1, 300, 40, 40), pod("c", 1, 1000, 45, 100)]
    arrivals = trace_arrivals(pods, A100_40)
    assert [(a.job, a.slot, a.duration) for a in arrivals] == [("a", 0, 1), ("c", 5, 55), ("b", 10, 30)]


def write_trace(folder: Path, pods: list[str], nodes: list[str]) -> Path:
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time"
    (folder / "openb_pod_list_default.csv").write_text("\n".join([header, *pods]) + "\n")
    (folder / "openb_node_list_gpu_node.csv").write_text("\n".join(["sn,cpu_milli,memory_mib,gpu,model", *nodes]))
    return folder


def test_reading_errors_name_file_line_and_column(tmp_path):
    write_trace(tmp_path, ["p0,1,1,1,abc,,LS,Running,0,10"], ["n0,1,1,2,T4"])
    with pytest.raises(TraceError, match=r"openb_pod_list_default.csv:2: column gpu_milli must be an integer"):
        read_pods(tmp_path / "openb_pod_list_default.csv")
    (tmp_path / "bad.csv").write_text("sn,model\nn0,T4\n")
    with pytest.raises(TraceError, match="missing column"):
        read_nodes(tmp_path / "bad.csv")
    with pytest.raises(TraceError, match="cannot read trace file"):
        read_pods(tmp_path / "absent.csv")


def test_trace_cluster_cuts_hosts_in_file_order():
    nodes = [TraceNode("n0", 2), TraceNode("n1", 8), TraceNode("n2", 4)]
    cluster = trace_cluster(nodes, "A100-40GB", 5)
    assert [(g.host, g.index) for g in cluster.gpus] == [("n0", 0), ("n0", 1), ("n1", 0), ("n1", 1), ("n1", 2)]
    assert len(trace_cluster(nodes, "A100-40GB", None).gpus) == 14


def test_timeline_samples_and_counts_are_consistent():
    pods = [pod(f"p{i}", 1, (i * 137) % 1000 + 1, i * 600, i * 600 + 5000 + (i * 911) % 20000) for i in range(300)]
    arrivals = trace_arrivals(pods, A100_40)
    cluster = Cluster.homogeneous("A100-40GB", 4)
    timeline = run_timeline(cluster, make_policy("mfi"), "A100-40GB", arrivals, 3600)
    assert timeline.arrived == 300 == sum(timeline.arrived_by_profile.values())
    assert 0 < timeline.accepted < 300  # 4 GPUs are too few: some rejections, some placements
    assert timeline.accepted == sum(timeline.accepted_by_profile.values())
    times = [s.time for s in timeline.samples]
    assert times == list(range(0, 3600 * len(times), 3600)) and times[-1] >= arrivals[-1].slot
    assert all(0 <= s.active_gpus <= 4 and s.accepted <= s.arrived for s in timeline.samples)
    assert [s.accepted for s in timeline.samples] == sorted(s.accepted for s in timeline.samples)


def test_cli_grmu_experiment_on_a_small_trace(tmp_path, capsys):
    rows = [f"p{i},1000,1024,1,{(i * 263) % 1000 + 1},,LS,Running,{i * 900},{i * 900 + 7200}" for i in range(120)]
    trace = write_trace(tmp_path, rows, ["n0,64000,1,2,T4", "n1,64000,1,4,V100"])
    out = tmp_path / "out"
    code = main(
        ["simulate", "placement", "--experiment", "grmu", "--trace-dir", str(trace), "--gpus", "2,all",
         "--policies", "nvidia,mcc,grmu,mfi", "--workers", "1", "--out", str(out), "--json"]
    )  # fmt: skip
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["results"]) == {"2", "6"}
    for per_policy in result["results"].values():
        assert set(per_policy) == {"nvidia", "mcc", "grmu", "mfi"}
        for summary in per_policy.values():
            assert summary["arrived"] == 120
            assert 0 < summary["active_gpu_hours_normalized"] <= 1
    assert (out / "grmu_2_gpus.png").stat().st_size > 0


def test_cli_grmu_experiment_without_the_trace_says_where_to_point(tmp_path, capsys):
    code = main(["simulate", "placement", "--experiment", "grmu", "--trace-dir", str(tmp_path)])
    assert code != 0
    assert "--trace-dir" in capsys.readouterr().err


@pytest.mark.skipif(not TRACE_DIR.is_dir(), reason="Alibaba 2023 trace not under ../shared/data")
def test_real_trace_maps_as_grmu_reports():
    arrivals = trace_arrivals(read_pods(TRACE_DIR / "openb_pod_list_default.csv"), A100_40)
    assert len(arrivals) == 8063  # GRMU: "3,168 accepted out of 8,063 MIG-enabled VMs"
    counts = Counter(a.profile for a in arrivals)
    assert counts.most_common(1)[0][0] == "7g.40gb"  # GRMU Fig. 5: 7g.40gb dominates
    assert sum(read_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv")[i].gpus for i in range(1213)) == 6212


def test_cli_atomize_on_trace_windows(tmp_path, capsys):
    qos = ("LS", "BE")
    rows = [f"p{i:03d},1000,1024,1,{(i * 263) % 1000 + 1},,{qos[i % 2]},Running,{i * 300},"
            f"{i * 300 + 600 + i * 97 % 9000}" for i in range(150)]  # fmt: skip
    trace = write_trace(tmp_path, rows, ["n0,64000,1,2,T4"])
    out = tmp_path / "out"
    code = main(["simulate", "atomize", "--workload", "alibaba", "--trace-dir", str(trace), "--gpus", "2",
                 "--trace-jobs", "40", "--seeds", "2", "--load", "0.9", "--out", str(out), "--json"])  # fmt: skip
    assert code == 0
    mean = json.loads(capsys.readouterr().out)
    assert set(mean) == {"fifo-backfill", "moldable", "moldable-eft", "sja"}
    saved = json.loads((out / "atomize.json").read_text())
    assert saved["workload"] == "alibaba-2023"
    assert [w["offered_load"] for w in saved["workloads"]] == pytest.approx([0.9, 0.9])
    assert all(m["finished"] == 40 for m in mean.values())
    assert (out / "atomize.png").stat().st_size > 0


def test_a_policy_that_refuses_whole_gpus_is_marked_starved_and_ranked_last(tmp_path):
    # every third pod asks for a whole GPU; GRMU with no heavy basket can never place one
    rows = [
        f"p{i},1000,1024,1,{1000 if i % 3 == 0 else (i * 263) % 400 + 1},,LS,Running,{i * 900},{i * 900 + 7200}"
        for i in range(120)
    ]
    trace = write_trace(tmp_path, rows, ["n0,64000,1,4,T4"])
    setup = TraceSetup(
        trace_dir=trace, gpu_counts=(4,), policies=("mfi", "grmu"), policy_options={"grmu": {"heavy_share": 0.0}}
    )
    per_policy = run_trace_experiment(setup)["results"]["4"]
    assert set(per_policy) == {"mfi", "grmu", "nvidia"}  # the starvation reference is always run
    assert per_policy["grmu"]["acceptance_by_profile"]["7g.40gb"] == 0
    assert per_policy["grmu"]["starved"] == ["7g.40gb"]
    assert per_policy["nvidia"]["starved"] == []
    assert ranked(per_policy)[-1] == "grmu"
    for summary in per_policy.values():  # served slice-hours: 2 h per accepted pod x its slices
        assert summary["served"] > 0 and summary["served"] % 2 == 0


def test_starvation_is_judged_against_half_the_reference_rate():
    reference = {"7g.40gb": 0.8, "1g.5gb": 1.0}
    assert starved_profiles({"7g.40gb": 0.41, "1g.5gb": 1.0}, reference) == []
    assert starved_profiles({"7g.40gb": 0.39, "1g.5gb": 1.0}, reference) == ["7g.40gb"]
    per_policy = {
        "counts": {"served": 90.0, "accepted": 500, "starved": ["7g.40gb"]},
        "serves": {"served": 100.0, "accepted": 300, "starved": []},
        "less": {"served": 95.0, "accepted": 400, "starved": []},
    }
    assert ranked(per_policy) == ["serves", "less", "counts"]
