"""The robustness suite: cell judging and a fast end-to-end run of ``--experiment robust --quick``."""

import json
from pathlib import Path

from mig_batch.cli.main import main
from mig_batch.sim.robust import TIE_PCT, judge_cell, summarise, trace_variants

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time"


def test_judging_wins_ties_losses_and_starvation():
    per_policy = {
        "top": {"served": 100.0, "starved": []},
        "close": {"served": 100.0 - TIE_PCT / 2, "starved": []},
        "far": {"served": 90.0, "starved": []},
        "greedy": {"served": 120.0, "starved": ["7g.40gb"]},  # serves most by starving: not the yardstick
    }
    verdict = judge_cell(per_policy)
    assert {p: v["outcome"] for p, v in verdict.items()} == {
        "top": "tie", "close": "tie", "far": "loss", "greedy": "loss"
    }  # fmt: skip
    assert verdict["far"]["gap_pct"] == 10.0 and verdict["greedy"]["gap_pct"] == 0.0
    del per_policy["close"]
    assert judge_cell(per_policy)["top"]["outcome"] == "win"
    cells = [{"name": "c", "results": per_policy, "verdict": judge_cell(per_policy)}]
    summary = summarise(cells, list(per_policy))
    assert summary["far"]["worst_gap_pct"] == 10.0 and summary["far"]["losses"] == 1
    assert summary["greedy"]["starved_cells"] == 1 and summary["top"]["wins"] == 1


def write_variants(folder: Path) -> Path:
    """A default trace, a cpu variant with other pods, and a multigpu variant without time columns that
    adds only multi-GPU pods (so it is the default trace again once they are dropped)."""
    default = [
        f"p{i},1000,1024,1,{1000 if i % 4 == 0 else (i * 263) % 700 + 1},,LS,Running,{i * 900},{i * 900 + 9000}"
        for i in range(150)
    ]
    cpu = [f"q{i},1000,1024,{i % 2},{(i * 131) % 1000 + 1},,LS,Running,{i * 600},{i * 600 + 5000}" for i in range(150)]
    multigpu = [",".join(row.split(",")[:5]) for row in default] + ["m0,1000,1024,4,1000", "m1,1000,1024,2,1000"]
    (folder / "openb_pod_list_default.csv").write_text("\n".join([HEADER, *default]) + "\n")
    (folder / "openb_pod_list_cpu050.csv").write_text("\n".join([HEADER, *cpu]) + "\n")
    (folder / "openb_pod_list_multigpu20.csv").write_text(
        "\n".join(["name,cpu_milli,memory_mib,num_gpu,gpu_milli", *multigpu]) + "\n"
    )
    (folder / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,8,T4\nn1,1,1,8,T4\n"
    )
    return folder


def test_quick_suite_end_to_end(tmp_path, capsys):
    trace = write_variants(tmp_path)
    assert trace_variants(trace) == ["default", "cpu050", "multigpu20"]
    out = tmp_path / "out"
    code = main(["simulate", "placement", "--experiment", "robust", "--quick", "--trace-dir", str(trace),
                 "--policies", "mfi,bf-cc,grmu", "--workers", "1", "--out", str(out), "--json"])  # fmt: skip
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    setup = result["setup"]
    assert setup["aliases"] == {"multigpu20": "default"} and setup["variants"] == ["default", "cpu050"]
    assert setup["policies"] == ["mfi", "bf-cc", "grmu", "nvidia"]  # the starvation reference joins
    assert len(result["cells"]) == (2 + 4) * 2  # (trace variants + fill mixes) x (8, 16 GPUs)
    for cell in result["cells"]:
        fair = [v for v in cell["verdict"].values() if not v["starved"]]
        assert min(v["gap_pct"] for v in fair) == 0  # the best non-starving policy defines the cell
        for policy, verdict in cell["verdict"].items():
            served = cell["results"][policy]["served"]
            assert served > 0 and (verdict["outcome"] != "loss") == (
                verdict["gap_pct"] <= TIE_PCT and not verdict["starved"]
            )
    for summary in result["summary"].values():
        assert summary["wins"] + summary["ties"] + summary["losses"] == len(result["cells"])
    assert (out / "robust_heatmap.png").stat().st_size > 0
    assert json.loads((out / "robust.json").read_text())["summary"] == result["summary"]
