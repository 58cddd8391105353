"""PNG figures for ``simulate flex``: per-trace ratio boxes in the layout of Flex-MIG Fig. 7 and Fig. 8.

Each box is one policy pair's ratio ``a/b`` over traces; the legend names both policies of each pair and
the caption says what each policy is (``FLEX_POLICY_LABELS``, one entry per name of
``mig_batch.sim.flex.POLICIES``). Legends sit outside the panels. Imported only when a figure is written
(matplotlib is slow to import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

PANELS = (("mean_jct_s", "avg JCT"), ("mean_wait_s", "avg waiting time"), ("makespan_s", "makespan"),
          ("utilisation", "utilisation"))  # fmt: skip
FIG7_PAIRS = ("fm/dm", "fm/sm", "hybrid/fm", "hybrid/dm", "mbdyn/dm")
FIG8_PAIRS = ("fm/dm", "hybrid/fm", "hybrid/dm", "mbdyn/dm")
COLOURS = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#aa3377")
MIXES = ("small", "balanced", "large")

# The policies of mig_batch.sim.flex.POLICIES: name -> (full name, what it does); docs/flex.md "What is
# simulated" has the long form.
FLEX_POLICY_LABELS = {
    "fm": ("Flex-MIG", "fixed 1g leaves, a size-n job runs over n of them (one-to-many)"),
    "dm": ("Dynamic-MIG", "one instance per job, created on demand; drains a GPU to re-partition"),
    "sm": ("Static-MIG", "fixed 4g.20gb + 2g.10gb + 1g.10gb per GPU"),
    "mbdyn": ("mig_batch dynamic", "one instance per job at the MFI spot, never drains"),
    "hybrid": ("hybrid (ours)", "one-to-one as mbdyn when an instance fits now, else one-to-many"),
}


def pair_label(pair: str) -> str:
    """``fm/dm: Flex-MIG / Dynamic-MIG``."""
    a, b = pair.split("/")
    return f"{pair}: {FLEX_POLICY_LABELS[a][0]} / {FLEX_POLICY_LABELS[b][0]}"


def _caption(pairs: tuple[str, ...], extra: str) -> str:
    names = [n for n in FLEX_POLICY_LABELS if any(n in pair.split("/") for pair in pairs)]
    lines = [f"{n}: {FLEX_POLICY_LABELS[n][0]}, {FLEX_POLICY_LABELS[n][1]}" for n in names]
    return "\n".join([extra, *lines])


def _boxes(ax: Axes, groups: list[str], pairs: tuple[str, ...], values: dict[tuple[str, str], list[float]]) -> None:
    width = 0.8 / len(pairs)
    for p, (pair, colour) in enumerate(zip(pairs, COLOURS, strict=False)):
        data = [values.get((g, pair), []) for g in groups]
        positions = [i + (p - (len(pairs) - 1) / 2) * width for i in range(len(groups))]
        kept = [(pos, d) for pos, d in zip(positions, data, strict=True) if d]
        if not kept:
            continue
        box = ax.boxplot([d for _, d in kept], positions=[pos for pos, _ in kept], widths=width * 0.85,
                         patch_artist=True, showfliers=False, medianprops={"color": "black", "linewidth": 1.2},
                         manage_ticks=False)  # fmt: skip
        for patch in box["boxes"]:
            patch.set_facecolor(colour)
            patch.set_alpha(0.8)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _legend_cell(ax: Axes, pairs: tuple[str, ...], **kwargs: Any) -> None:
    """The pairs' legend in an axes of its own (no data there)."""
    handles = [Patch(facecolor=c, alpha=0.8, edgecolor="black") for c in COLOURS[: len(pairs)]]
    ax.axis("off")
    ax.legend(handles, [pair_label(p) for p in pairs], fontsize=8, title="ratio a/b (one value per trace)",
              title_fontsize=9, frameon=False, borderaxespad=0, **kwargs)  # fmt: skip


def _collect(group: dict[str, Any], metric: str, key_of: Any) -> dict[tuple[str, str], list[float]]:
    values: dict[tuple[str, str], list[float]] = {}
    for name, cell in group["categories"].items():
        for pair, by_metric in cell["ratios"].items():
            values.setdefault((key_of(name), pair), []).extend(by_metric[metric]["values"])
    return values


def figure_fig7(result: dict[str, Any]) -> Figure:
    """Training-only, sizes <= 4, FIFO: ratios per size mix for the four metrics (Flex-MIG Fig. 7), 2 x 2."""
    group = result["groups"]["fig7"]
    fig = plt.figure(figsize=(13, 8), layout="constrained")
    grid = fig.add_gridspec(2, 3, width_ratios=(1, 1, 0.62))
    for n, (metric, title) in enumerate(PANELS):
        ax = fig.add_subplot(grid[n // 2, n % 2])
        _boxes(ax, list(MIXES), FIG7_PAIRS, _collect(group, metric, lambda name: name.split("/")[1]))
        ax.set_title(f"{title} ratio", fontsize=10)
        ax.set_xlabel("size mix", fontsize=9)
    _legend_cell(fig.add_subplot(grid[:, 2]), FIG7_PAIRS, loc="upper left")
    n = result["setup"]["traces_per_category"]
    fig.suptitle(f"training only, sizes <= 4, FIFO, 2 x A100-40GB; {n} traces x 3 duration classes per box",
                 fontsize=11)  # fmt: skip
    fig.supxlabel(_caption(FIG7_PAIRS, "a/b below the dashed line at 1: a's value is lower than b's"),
                  fontsize=8, ha="left", x=0.01, multialignment="left")  # fmt: skip
    return fig


def plot_fig7(result: dict[str, Any], path: Path) -> Path:
    return _save(figure_fig7(result), path)


def figure_fig8(result: dict[str, Any]) -> Figure:
    """All 27 categories: makespan, wait and JCT ratios per size mix and job type (Flex-MIG Fig. 8)."""
    group = result["groups"]["all"]
    groups = [f"{mix}\n{kind}" for kind in ("train", "infer", "mixed") for mix in MIXES]
    fig = plt.figure(figsize=(13, 11), layout="constrained")
    grid = fig.add_gridspec(4, 1, height_ratios=(0.13, 1, 1, 1))
    _legend_cell(fig.add_subplot(grid[0]), FIG8_PAIRS, loc="center", ncol=len(FIG8_PAIRS))
    for row, (metric, title) in enumerate((PANELS[2], PANELS[1], PANELS[0]), start=1):
        ax = fig.add_subplot(grid[row])
        values = _collect(group, metric, lambda name: "{1}\n{2}".format(*name.split("/")))
        _boxes(ax, groups, FIG8_PAIRS, values)
        ax.set_ylabel(f"{title} ratio", fontsize=9)
    window = result["setup"]["params"]["window"]
    queue = "FIFO" if window == 1 else f"backfilling over {window} candidates"
    fig.suptitle(f"all categories, native sizes (training up to 8), {queue}, 2 x A100-40GB", fontsize=11)
    fig.supxlabel(_caption(FIG8_PAIRS, "groups: size mix and job type; a/b below the dashed line at 1: a's value "
                           "is lower than b's"), fontsize=8, ha="left", x=0.01, multialignment="left")  # fmt: skip
    return fig


def plot_fig8(result: dict[str, Any], path: Path) -> Path:
    return _save(figure_fig8(result), path)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
