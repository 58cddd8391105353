"""PNG figures for the placement experiments (MFI Fig. 4 and Fig. 5, GRMU Figs. 10-12, the robustness
heat-map) and for ``simulate atomize``.

Each ``figure_*`` builds a matplotlib Figure and each ``plot_*`` saves one; tests/test_plots.py reads the
figures. Every policy or scheduler name a figure shows is explained in its legend or caption from one
mapping: ``POLICY_LABELS`` for the placement policies (one entry per name of
``mig_batch.placement.policies``' registry, checked by the tests) and ``SCHEDULER_LABELS`` for the
atomize schedulers. A policy keeps its colour and marker in every figure.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from mig_batch.placement.policies import policy_names
from mig_batch.sim.atomize import SCHEDULERS

# What each placement policy does, in a few words (docs/placement.md "Policies" has the long form).
POLICY_LABELS = {
    "ff": "first fit on free slices, first start (MIG-agnostic)",
    "rr": "round robin on free slices, first start (MIG-agnostic)",
    "bf-bi": "best fit on free slices, best index (MIG-agnostic)",
    "wf-bi": "worst fit on free slices, best index (MIG-agnostic)",
    "mfi": "Minimum Fragmentation Increment, F as printed (MFI)",
    "nvidia": "first GPU that fits, NVIDIA's default start (GRMU's FF)",
    "bf-cc": "best fit, NVIDIA's default start (GRMU's BF)",
    "mcc": "max configuration capability CC (GRMU's MCC)",
    "mecc": "max expected CC, recent request mix (GRMU's MECC)",
    "hami": "first GPU that fits, HAMi's start",
    "emfi": "MFI with F weighted by the request mix (ours)",
    "mfi-partial": "MFI, F over partly free windows only",
    "mfi-pack": "MFI, ties to the fullest GPU (ours)",
    "grmu": "GRMU: heavy/light baskets, defragmentation",
    "lex": "lexicographic criteria (ours)",
    "mix": "dead slices, best fit, expected fill; order by the mix (ours)",
}

# The schedulers of mig_batch.sim.atomize.SCHEDULERS (its docstring has the long form).
SCHEDULER_LABELS = {
    "fifo-backfill": "FIFO with EASY backfill; training jobs one block",
    "moldable": "training jobs take the free size that finishes first",
    "moldable-eft": "moldable, earliest predicted finish (the controller's rule)",
    "sja": "subjob atomization: training jobs as checkpointed chains in gaps",
    "sja-defrag": "SJA with live defragmentation at checkpoints",
}

# Indexed like policy_names() (ff, rr, bf-bi, wf-bi, mfi, nvidia, bf-cc, mcc, mecc, hami, emfi, mfi-partial,
# mfi-pack, grmu, lex, mix): the MFI experiment's and the trace experiment's sets get distinct colours.
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#393b79", "#000000", "#17becf", "#b15928", "#0000cd", "#637939", "#1b9e77")  # fmt: skip
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p", "d", "8", "H", "+")
_DPI = 110
MAX_INCHES = (15.0, 12.0)  # width, height: a figure fits a screen at 110 dpi


def label(name: str, labels: dict[str, str] = POLICY_LABELS) -> str:
    """``name: what it is`` (the name alone where the mapping has no entry)."""
    return f"{name}: {labels[name]}" if name in labels else name


def policy_style(name: str) -> dict[str, Any]:
    """A fixed colour and marker per policy, from its place in the registry."""
    names = policy_names()
    i = names.index(name) if name in names else len(names) + sum(map(ord, name))
    return {"color": _COLOURS[i % len(_COLOURS)], "marker": _MARKERS[i % len(_MARKERS)]}


def coinciding(series: dict[str, Sequence[float]]) -> list[list[str]]:
    """Groups of two or more names whose series are equal point by point (drawn on top of each other)."""
    groups: list[list[str]] = []
    for name, ys in series.items():
        for group in groups:
            other = series[group[0]]
            if len(other) == len(ys) and np.allclose(other, ys, rtol=1e-9, atol=1e-12):
                group.append(name)
                break
        else:
            groups.append([name])
    return [g for g in groups if len(g) > 1]


def _same_note(series: dict[str, Sequence[float]]) -> str:
    groups = coinciding(series)
    if not groups:
        return ""
    if len(groups) == 1 and len(groups[0]) == len(series):
        return "\n(the same for every policy)"
    return "\n(the same: " + "; ".join(" = ".join(g) for g in groups) + ")"


def _lines(ax: Axes, xs: Sequence[float], series: dict[str, Sequence[float]], **kwargs: Any) -> None:
    """One line per policy with staggered markers, so lines drawn over each other stay visible.

    The first policy is drawn on top; each line's markers sit at x positions no other line marks.
    """
    n, k = len(xs), len(series)
    step = max(k, n // 6, 1)
    for i, (name, ys) in enumerate(series.items()):
        style = policy_style(name)
        ax.plot(xs, ys, color=style["color"], marker=style["marker"], markevery=(i * step // k, step),
                markersize=5, linewidth=1.4, zorder=3 + k - i, label=name, **kwargs)  # fmt: skip


def _legend_cell(ax: Axes, names: Sequence[str], labels: dict[str, str] = POLICY_LABELS, title: str = "policy",
                 extra: Sequence[tuple[Any, str]] = ()) -> None:  # fmt: skip
    """A legend in an axes of its own (no data there): each name with what it is."""
    handles: list[Any] = []
    for name in names:
        style = policy_style(name)
        handles.append(Line2D([], [], color=style["color"], marker=style["marker"], linewidth=1.4, markersize=6))
    texts = [_wrap(label(name, labels), 44) for name in names]
    ax.axis("off")
    legend = ax.legend(handles, texts, loc="upper left", fontsize=8, title=title, title_fontsize=9, frameon=False,
                       borderaxespad=0, alignment="left")  # fmt: skip
    if extra:
        ax.add_artist(legend)
        ax.legend([h for h, _ in extra], [t for _, t in extra], loc="lower left", fontsize=8, frameon=False,
                  borderaxespad=0)  # fmt: skip


def _wrap(text: str, width: int) -> str:
    return "\n   ".join(textwrap.wrap(text, width))


def _caption(fig: Figure, text: str) -> None:
    """Text under the panels (space for it is kept by the constrained layout)."""
    fig.supxlabel(text, fontsize=8, ha="left", x=0.01, multialignment="left")


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------- MFI Fig. 4 and 5

PANELS = (
    ("accepted", "allocated workloads"),
    ("acceptance_rate", "acceptance rate"),
    ("allocated_slices", "allocated memory slices"),
    ("active_gpus", "active GPUs"),
    ("mean_frag", "mean fragmentation score F"),
)


def figure_load_sweep(result: dict[str, Any], distribution: str) -> Figure:
    """Metrics against demand for one distribution (MFI Fig. 4): five panels and the legend in a 2 x 3 grid."""
    demand = [100 * c for c in result["setup"]["checkpoints"]]
    per_policy = result["results"][distribution]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.4), layout="constrained")
    for ax, (metric, title) in zip(axes.flat, PANELS, strict=False):
        series = {policy: metrics[metric]["mean"] for policy, metrics in per_policy.items()}
        _lines(ax, demand, series)
        ax.set_xlabel("GPU demand (% of capacity)", fontsize=9)
        ax.set_title(title + _same_note(series), fontsize=10)
        ax.grid(alpha=0.3)
    _legend_cell(axes.flat[-1], list(per_policy))
    setup = result["setup"]
    fig.suptitle(f"{distribution}: {setup['gpus']} x {setup['model']}, means of {setup['runs']} runs", fontsize=11)
    return fig


def plot_load_sweep(result: dict[str, Any], distribution: str, path: Path) -> Path:
    return _save(figure_load_sweep(result, distribution), path)


def _grouped_bars(ax: Axes, groups: Sequence[str], values: dict[str, list[float]], title: str) -> None:
    """One bar per policy within each group, policies side by side in their colours."""
    width = 0.8 / len(values)
    for i, (name, ys) in enumerate(values.items()):
        ax.bar([g + i * width for g in range(len(groups))], ys, width, label=name, color=policy_style(name)["color"])
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.set_axisbelow(True)


def figure_snapshot(snapshot: dict[str, dict[str, dict[str, float]]], demand: float) -> Figure:
    """Grouped bars per distribution at one demand level (MFI Fig. 5): four panels, the legend beside them."""
    distributions = list(snapshot)
    policies = list(next(iter(snapshot.values())))
    fig = plt.figure(figsize=(13, 7), layout="constrained")
    grid = fig.add_gridspec(2, 3, width_ratios=(1, 1, 0.75))
    for n, (metric, title) in enumerate(PANELS[:4]):
        ax = fig.add_subplot(grid[n // 2, n % 2])
        values = {p: [snapshot[d][p][metric] for d in distributions] for p in policies}
        _grouped_bars(ax, distributions, values, title)
    _legend_cell(fig.add_subplot(grid[:, 2]), policies)
    fig.suptitle(f"at {demand:.0%} demand (means)", fontsize=11)
    return fig


def plot_snapshot(snapshot: dict[str, dict[str, dict[str, float]]], demand: float, path: Path) -> Path:
    return _save(figure_snapshot(snapshot, demand), path)


# --------------------------------------------------------------------------------------------- GRMU figures


def _daily_means(hours: Sequence[float], values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Mean of the hourly samples of each day: the day edges and one mean per day."""
    day = np.floor(np.asarray(hours, dtype=float) / 24).astype(int)
    vals = np.asarray(values, dtype=float)
    days = np.unique(day)
    means = np.array([vals[day == d].mean() for d in days])
    return np.append(days, days[-1] + 1).astype(float), means


def figure_trace(result: dict[str, Any], gpus: str) -> Figure:
    """GRMU-style figure for one cluster size.

    Top: acceptance so far (GRMU Fig. 10), acceptance per profile (Fig. 11) and the legend. Below: active
    GPUs (Fig. 12) as small multiples, one panel per policy: its hourly samples lightly, its daily mean in
    bold, and the reference policy's daily mean dashed for comparison.
    """
    per_policy = result["results"][gpus]
    policies = list(per_policy)
    reference = result["setup"].get("starvation_reference", policies[0])
    reference = reference if reference in per_policy else policies[0]
    cols = max(1, (len(policies) + 1) // 2)
    fig = plt.figure(figsize=(min(MAX_INCHES[0], 3.4 * cols + 0.6), 10.5), layout="constrained")
    outer = fig.add_gridspec(2, 1, height_ratios=(1, 1.35))
    top = outer[0].subgridspec(1, 3, width_ratios=(1.25, 1.25, 1))
    acc = fig.add_subplot(top[0])
    series = {p: s["series"]["acceptance_rate"] for p, s in per_policy.items()}
    days = [h / 24 for h in next(iter(per_policy.values()))["series"]["hours"]]
    _lines(acc, days, series)
    acc.set_title("acceptance rate so far (GRMU Fig. 10)" + _same_note(series), fontsize=10)
    acc.set_xlabel("days", fontsize=9)
    acc.grid(alpha=0.3)
    bars = fig.add_subplot(top[1])
    profiles = list(next(iter(per_policy.values()))["arrived_by_profile"])
    values = {p: [s["acceptance_by_profile"][name] for name in profiles] for p, s in per_policy.items()}
    _grouped_bars(bars, profiles, values, "acceptance per profile (GRMU Fig. 11)")
    bars.tick_params(axis="x", labelrotation=30)
    light = Line2D([], [], color="grey", alpha=0.35, linewidth=0.8)
    bold = Line2D([], [], color="grey", linewidth=2)
    ref = Line2D([], [], color="black", linewidth=1, linestyle="--")
    extra = ((light, "active GPUs each hour"), (bold, "daily mean"), (ref, f"{reference}'s daily mean (reference)"))
    _legend_cell(fig.add_subplot(top[2]), policies, extra=extra)
    small = outer[1].subgridspec(2, cols)
    highest = max(max(s["series"]["active_gpus"], default=0) for s in per_policy.values()) or 1
    first: Axes | None = None
    ref_edges, ref_means = _daily_means(per_policy[reference]["series"]["hours"],
                                        per_policy[reference]["series"]["active_gpus"])  # fmt: skip
    for n, policy in enumerate(policies):
        ax = fig.add_subplot(small[n // cols, n % cols], sharex=first, sharey=first)
        first = first or ax
        s = per_policy[policy]
        colour = policy_style(policy)["color"]
        hours, active = s["series"]["hours"], s["series"]["active_gpus"]
        ax.plot([h / 24 for h in hours], active, color=colour, alpha=0.3, linewidth=0.6, drawstyle="steps-post")
        edges, means = _daily_means(hours, active)
        ax.stairs(means, edges, color=colour, linewidth=2, baseline=None)
        if policy != reference:
            ax.stairs(ref_means, ref_edges, color="black", linewidth=1, linestyle="--", baseline=None)
        ax.set_title(f"{policy}: {s['active_gpu_hours']:,.0f} active GPU-h", fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_ylim(0, highest * 1.08)
        if n // cols == 1 or n + cols >= len(policies):
            ax.set_xlabel("days", fontsize=9)
        if n % cols == 0:
            ax.set_ylabel("active GPUs", fontsize=9)
    fig.suptitle(f"Alibaba 2023 trace, {gpus} x {result['setup']['model']}; below: active GPUs per policy "
                 "(GRMU Fig. 12)", fontsize=11)  # fmt: skip
    return fig


def plot_trace(result: dict[str, Any], gpus: str, path: Path) -> Path:
    """GRMU-style figures for one cluster size: acceptance and active GPUs over time, acceptance per profile."""
    return _save(figure_trace(result, gpus), path)


# --------------------------------------------------------------------------------------------- atomize

ATOMIZE_PANELS = (
    ("mean_wait_h", "mean wait (h)"), ("p95_wait_h", "p95 wait (h)"),
    ("training_mean_jct_h", "training job completion (h)"), ("memory_util", "GPU memory in use (share)"),
    ("wasted_h", "wasted work (h)"), ("frag_delay_h", "fragmentation delay / job (h)"),
)  # fmt: skip
_SCHEDULER_COLOURS = ("#999999", "#6699cc", "#336699", "#cc6633", "#339966")  # indexed like SCHEDULERS


def figure_atomize(result: dict[str, Any]) -> Figure:
    """Bars per scheduler for the SJA comparison (means over seeds).

    A metric that is 0 for every scheduler gets no panel; the caption says so.
    """
    mean = result["mean"]
    schedulers = list(mean)
    shown = [(key, title) for key, title in ATOMIZE_PANELS if any(m[key] for m in mean.values())]
    zero = [title for key, title in ATOMIZE_PANELS if (key, title) not in shown]
    cols = min(3, max(1, len(shown)))
    rows = max(1, -(-len(shown) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.9 * cols + 0.4, 2.9 * rows + 1.6), layout="constrained",
                             squeeze=False)  # fmt: skip
    for ax, (key, title) in zip(axes.flat, shown, strict=False):
        colours = [_SCHEDULER_COLOURS[SCHEDULERS.index(s) % len(_SCHEDULER_COLOURS)] if s in SCHEDULERS
                   else "#777777" for s in schedulers]  # fmt: skip
        ax.bar(range(len(schedulers)), [m[key] for m in mean.values()], color=colours)
        ax.set_xticks(range(len(schedulers)), schedulers, fontsize=8, rotation=20)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.set_axisbelow(True)
    for ax in axes.flat[len(shown) :]:
        fig.delaxes(ax)
    lines = [label(s, SCHEDULER_LABELS) for s in schedulers]
    if zero:
        lines.append("not shown, 0 for every scheduler: " + ", ".join(zero))
    _caption(fig, "\n".join(lines))
    seeds = result["seeds"]
    seeds_text = f"{seeds[0]}-{seeds[-1]}" if list(seeds) == list(range(seeds[0], seeds[-1] + 1)) else str(seeds)
    fig.suptitle(f"{result.get('workload', 'synthetic')} workload, {result['setup']['gpus']} x "
                 f"{result['setup']['model']}, means of seeds {seeds_text}", fontsize=11)  # fmt: skip
    return fig


def plot_atomize(result: dict[str, Any], path: Path) -> Path:
    return _save(figure_atomize(result), path)


# --------------------------------------------------------------------------------------------- robustness


def figure_robust(result: dict[str, Any]) -> Figure:
    """Heat-map of each policy's gap to the best served demand, cell by cell; S marks starvation."""
    cells = result["cells"]
    policies = result["setup"]["policies"]
    gaps = [[cell["verdict"][p]["gap_pct"] for p in policies] for cell in cells]
    top = max(2.0, min(25.0, max(max(row) for row in gaps)))  # a colour scale that still shows 0.2 %
    height = min(MAX_INCHES[1] * 1.3, max(4.5, 0.2 * len(cells) + 1.2 + 0.16 * len(policies)))
    fig, ax = plt.subplots(figsize=(1.05 * len(policies) + 3.2, height), layout="constrained")
    image = ax.imshow(gaps, aspect="auto", cmap="Reds", vmin=0, vmax=top)
    for i, cell in enumerate(cells):
        for j, policy in enumerate(policies):
            verdict = cell["verdict"][policy]
            mark = " S" if verdict["starved"] else ""
            text = f"{verdict['gap_pct']:.1f}{mark}" if verdict["outcome"] != "win" else "best"
            ax.text(j, i, text, ha="center", va="center", fontsize=6,
                    color="white" if verdict["gap_pct"] > top * 0.6 else "black")  # fmt: skip
    ax.set_xticks(range(len(policies)), policies, fontsize=8)
    ax.set_yticks(range(len(cells)), [cell["name"] for cell in cells], fontsize=6)
    ax.xaxis.tick_top()
    fig.colorbar(image, ax=ax, label="% below the best served demand (no starvation)", shrink=0.6)
    setup = result["setup"]
    ax.set_title(f"gap to the best, tie within {setup['tie_pct']} %; S: starves a profile "
                 f"(< half {setup['starvation_reference']}'s rate)", fontsize=8, pad=8)  # fmt: skip
    _caption(fig, "\n".join(label(p) for p in policies))
    return fig


def plot_robust(result: dict[str, Any], path: Path) -> Path:
    return _save(figure_robust(result), path)
