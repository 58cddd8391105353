"""The figures, read from the rendered matplotlib Figure (Agg), on small generated inputs.

Every figure: within a screen-sized box and not a thin strip; no panel without visible data; no legend
over a panel that holds data; every policy or scheduler name it shows explained, from the one mapping
of its kind, in its legend or caption. Lines drawn over each other keep their markers apart and the
panel says which coincide; the GRMU active-GPU plot is one small panel per policy.
"""

from __future__ import annotations

import math
import random
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.transforms import Bbox

from mig_batch.placement.policies import policy_names
from mig_batch.planner.gantt import figure_plan
from mig_batch.planner.planners import make_plan
from mig_batch.planner.problem import Task, gpu_scheme
from mig_batch.sim import flex
from mig_batch.sim.atomize import SCHEDULERS, run_atomize
from mig_batch.sim.atomize_workloads import AtomizeSetup
from mig_batch.sim.experiments import MfiSetup, at_demand, demand_checkpoints, run_mfi_experiment
from mig_batch.sim.flex_plots import FIG7_PAIRS, FIG8_PAIRS, FLEX_POLICY_LABELS, figure_fig7, figure_fig8
from mig_batch.sim.plots import (
    POLICY_LABELS,
    SCHEDULER_LABELS,
    coinciding,
    figure_atomize,
    figure_load_sweep,
    figure_robust,
    figure_snapshot,
    figure_trace,
)
from mig_batch.sim.trace_experiment import TraceSetup, run_trace_experiment

MAX_WIDTH_IN, MAX_HEIGHT_IN = 15.0, 16.0
MIN_FONT_PT = 6


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# --------------------------------------------------------------------------------------------- the properties


def rendered(fig: Figure):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _visible_data(ax, renderer) -> int:
    """How many artists of ``ax`` show data: lines with a point (not reference lines across the panel),
    patches and images with an area on screen, collections with a point."""
    count = 0
    for line in ax.get_lines():
        if line.get_transform() in (ax.get_yaxis_transform(), ax.get_xaxis_transform()):
            continue  # axhline / axvline: a reference, not data
        xy = line.get_xydata()
        if len(xy) and any(math.isfinite(x) and math.isfinite(y) for x, y in xy):
            count += 1
    for patch in ax.patches:
        if patch is ax.patch:
            continue
        box = patch.get_window_extent(renderer)
        if box.width >= 0.5 and box.height >= 0.5:
            count += 1
    count += sum(1 for image in ax.get_images() if isinstance(image, AxesImage))
    count += sum(1 for c in ax.collections if len(c.get_offsets()) or c.get_paths())
    return count


def data_axes(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.axison]


def legends(fig: Figure) -> list:
    return [*fig.legends, *(legend for ax in fig.axes for legend in ax.findobj(matplotlib.legend.Legend))]


def _area(a: Bbox, b: Bbox) -> float:
    inter = Bbox.intersection(a, b)
    return 0.0 if inter is None else inter.width * inter.height


def check_figure(fig: Figure) -> None:
    """The properties every figure has."""
    width, height = fig.get_size_inches()
    assert width <= MAX_WIDTH_IN and height <= MAX_HEIGHT_IN, (width, height)
    assert 0.5 <= width / height <= 2.2, f"a strip of {width:.1f} x {height:.1f} in"
    renderer = rendered(fig)
    for ax in data_axes(fig):
        assert _visible_data(ax, renderer), f"panel {ax.get_title()!r} shows nothing"
    for legend in legends(fig):
        box = legend.get_window_extent(renderer)
        for ax in data_axes(fig):
            assert _area(box, ax.get_window_extent(renderer)) < 1, f"a legend covers panel {ax.get_title()!r}"
    for text in fig.findobj(matplotlib.text.Text):
        if text.get_visible() and text.get_text().strip():
            assert text.get_fontsize() >= MIN_FONT_PT, text.get_text()


def all_text(fig: Figure) -> str:
    """Every text of the figure, wrapped lines joined."""
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_visible()]
    return re.sub(r"\s+", " ", " ".join(texts))


def legend_labels(fig: Figure) -> list[str]:
    return [re.sub(r"\s+", " ", t.get_text()) for legend in legends(fig) for t in legend.get_texts()]


def check_explained(fig: Figure, names, explanation: dict[str, str]) -> None:
    """Every name shown is explained as ``name: what it is`` somewhere in the figure."""
    text = all_text(fig)
    for name in names:
        assert name in explanation, f"{name} has no explanation"
        assert f"{name}: {explanation[name]}" in text, f"{name} is shown but not explained"


def policy_legend_names(fig: Figure) -> list[str]:
    """The policy names in the legends (the part before the colon; none without one)."""
    names = []
    for label in legend_labels(fig):
        name, colon, _ = label.partition(":")
        if colon and name in POLICY_LABELS:
            names.append(name)
        elif not colon and label in policy_names():
            names.append(label)
    return names


# --------------------------------------------------------------------------------------------- mappings


def test_every_registered_name_has_one_explanation():
    assert set(POLICY_LABELS) == set(policy_names())
    assert set(SCHEDULER_LABELS) == set(SCHEDULERS)
    assert set(FLEX_POLICY_LABELS) == set(flex.POLICIES)
    for pair in {*FIG7_PAIRS, *FIG8_PAIRS}:
        assert set(pair.split("/")) <= set(flex.POLICIES), pair


def test_coinciding_groups_equal_series_only():
    series = {"a": [1.0, 2.0], "b": [1.0, 2.0], "c": [1.0, 2.1], "d": [1.0, 2.1], "e": [0.0, 0.0]}
    assert coinciding(series) == [["a", "b"], ["c", "d"]]
    assert coinciding({"a": [1.0], "b": [2.0]}) == []


# --------------------------------------------------------------------------------------------- MFI figures


@pytest.fixture(scope="module")
def mfi_result():
    setup = MfiSetup(gpus=10, runs=2, policies=("mfi", "ff", "rr", "nvidia", "emfi", "mfi-partial"),
                     distributions=("uniform", "skew-big"), checkpoints=demand_checkpoints(1.0))  # fmt: skip
    return run_mfi_experiment(setup)


def test_load_sweep_is_a_grid_with_every_policy_explained(mfi_result):
    fig = figure_load_sweep(mfi_result, "uniform")
    check_figure(fig)
    shown = policy_legend_names(fig)
    assert shown == list(mfi_result["results"]["uniform"])  # one legend for the five panels
    check_explained(fig, shown, POLICY_LABELS)
    assert len(data_axes(fig)) == 5


def test_load_sweep_keeps_lines_drawn_over_each_other_visible(mfi_result):
    result = {**mfi_result, "results": {"uniform": dict(mfi_result["results"]["uniform"])}}
    per_policy = result["results"]["uniform"]
    per_policy["nvidia"] = per_policy["mfi"]  # the same numbers: the lines lie on top of each other
    fig = figure_load_sweep(result, "uniform")
    rendered(fig)
    for ax in data_axes(fig):
        assert "mfi = nvidia" in ax.get_title() or "the same for every policy" in ax.get_title(), ax.get_title()
        marked = {}
        for line in ax.get_lines():
            start, step = line.get_markevery()
            marked[line.get_label()] = set(range(start, len(line.get_xdata()), step))
        assert marked["mfi"] and marked["nvidia"] and not marked["mfi"] & marked["nvidia"]
        assert all(a is b or not marked[a] & marked[b] for a in marked for b in marked)


def test_snapshot_bars_with_their_legend_beside_them(mfi_result):
    fig = figure_snapshot(at_demand(mfi_result, 0.85), 0.85)
    check_figure(fig)
    check_explained(fig, policy_legend_names(fig), POLICY_LABELS)
    assert set(policy_legend_names(fig)) == set(mfi_result["results"]["uniform"])
    assert len(data_axes(fig)) == 4


# --------------------------------------------------------------------------------------------- GRMU figure


@pytest.fixture(scope="module")
def trace_result(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trace")
    rng = random.Random(3)
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time"
    pods = []
    for i in range(400):
        start = i * 1300
        pods.append(f"p{i},1000,1024,1,{rng.choice((100, 250, 500, 1000))},,LS,Running,{start},"
                    f"{start + rng.randint(3600, 40 * 3600)}")  # fmt: skip
    (folder / "openb_pod_list_default.csv").write_text("\n".join([header, *pods]) + "\n")
    nodes = "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,4,A100\nn1,1,1,4,A100\n"
    (folder / "openb_node_list_gpu_node.csv").write_text(nodes)
    setup = TraceSetup(trace_dir=folder, gpu_counts=(4,), policies=("nvidia", "bf-cc", "mcc", "grmu", "mfi", "mix"))
    return run_trace_experiment(setup)


def test_trace_figure_shows_active_gpus_one_panel_per_policy(trace_result):
    gpus = next(iter(trace_result["results"]))
    policies = list(trace_result["results"][gpus])
    fig = figure_trace(trace_result, gpus)
    check_figure(fig)
    check_explained(fig, policy_legend_names(fig), POLICY_LABELS)
    assert set(policy_legend_names(fig)) == set(policies)
    active = [ax for ax in data_axes(fig) if "active GPU-h" in ax.get_title()]
    assert [ax.get_title().split(":")[0] for ax in active] == policies
    for ax in active:  # the policy's hourly samples, its daily mean, at most the reference's daily mean
        assert len(ax.get_lines()) + len(ax.patches) <= 3


# --------------------------------------------------------------------------------------------- atomize


def test_atomize_drops_a_metric_that_is_zero_everywhere_and_says_so():
    result = run_atomize(AtomizeSetup(gpus=2, hours=3), [1, 2])
    assert all(m["wasted_h"] == 0 for m in result["mean"].values())  # no interruptions in this workload
    fig = figure_atomize(result)
    check_figure(fig)
    titles = [ax.get_title() for ax in data_axes(fig)]
    assert "wasted work (h)" not in titles and len(titles) == 5
    assert "not shown, 0 for every scheduler: wasted work (h)" in all_text(fig)
    names = [t.get_text() for ax in data_axes(fig) for t in ax.get_xticklabels()]
    assert set(names) == set(result["mean"])
    check_explained(fig, set(names), SCHEDULER_LABELS)


# --------------------------------------------------------------------------------------------- robustness


def test_robust_heat_map_explains_its_columns():
    policies = ["nvidia", "bf-cc", "mfi", "mix"]
    rng = random.Random(1)
    cells = []
    for name in ("trace default / 8", "trace default / 16", "fill uniform / 8"):
        verdict = {p: {"gap_pct": rng.uniform(0, 5), "starved": [], "outcome": "loss"} for p in policies}
        verdict["mix"] = {"gap_pct": 0.0, "starved": [], "outcome": "win"}
        cells.append({"name": name, "verdict": verdict})
    result = {"cells": cells, "setup": {"policies": policies, "tie_pct": 0.2, "starvation_reference": "nvidia"}}
    fig = figure_robust(result)
    check_figure(fig)
    columns = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert columns == policies
    check_explained(fig, columns, POLICY_LABELS)


# --------------------------------------------------------------------------------------------- flex


def flex_result(window: int = 1) -> dict:
    rng = random.Random(window)
    pairs = {*FIG7_PAIRS, *FIG8_PAIRS}

    def cell(kind: str) -> dict:
        ratios = {}
        for pair in pairs:
            if "sm" in pair.split("/") and kind != "infer":
                continue  # Static-MIG runs inference only in the all-categories group
            ratios[pair] = {m: {"values": [rng.uniform(0.7, 1.2) for _ in range(2)]}
                            for m in ("makespan_s", "mean_jct_s", "mean_wait_s", "utilisation")}  # fmt: skip
        return {"ratios": ratios}

    durations, mixes = ("short", "long"), ("small", "balanced", "large")
    fig7 = {f"{d}/{m}/train": cell("infer") for d in durations for m in mixes}
    every = {f"{d}/{m}/{k}": cell(k) for d in durations for m in mixes for k in ("train", "infer", "mixed")}
    return {"setup": {"traces_per_category": 2, "params": {"window": window}},
            "groups": {"fig7": {"categories": fig7}, "all": {"categories": every}}}  # fmt: skip


def check_flex_explained(fig: Figure, pairs) -> None:
    labels = legend_labels(fig)
    assert [label.split(":")[0] for label in labels] == list(pairs)
    text = all_text(fig)
    for pair in pairs:
        for name in pair.split("/"):
            full, what = FLEX_POLICY_LABELS[name]
            assert f"{name}: {full}, {what}" in text, name


@pytest.mark.parametrize("window", [1, 14])
def test_flex_figures_keep_legends_off_the_boxes(window):
    result = flex_result(window)
    for fig, pairs in ((figure_fig7(result), FIG7_PAIRS), (figure_fig8(result), FIG8_PAIRS)):
        check_figure(fig)
        check_flex_explained(fig, pairs)
        assert len(legends(fig)) == 1


# --------------------------------------------------------------------------------------------- Gantt


def test_gantt_legend_below_the_chart_names_the_grey_and_black_boxes():
    scheme = gpu_scheme("A100-40GB")
    tasks = [Task(f"t{i}", {1: 7.0 + i, 2: 2.4, 3: 2.0, 4: 1.2, 7: 1.3}) for i in range(5)]
    plan = make_plan("far", scheme, tasks)
    fig = figure_plan(scheme, tasks, plan, bound=plan.makespan * 0.9)
    check_figure(fig)
    labels = legend_labels(fig)
    assert "create an instance" in labels and "destroy an instance" in labels
    assert any(label.startswith("lower bound") for label in labels)
    assert any(isinstance(p, Rectangle) for p in fig.axes[0].patches)
    assert all(isinstance(h, Patch | Line2D) for h in fig.legends[0].legend_handles)
