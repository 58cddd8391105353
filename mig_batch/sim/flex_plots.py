"""PNG figures for ``simulate flex``: per-trace ratio boxes in the layout of Flex-MIG Fig. 7 and Fig. 8.

Imported only when a figure is written (matplotlib is slow to import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

PANELS = (("mean_jct_s", "avg JCT"), ("mean_wait_s", "avg waiting time"), ("makespan_s", "makespan"),
          ("utilisation", "utilisation"))  # fmt: skip
FIG7_PAIRS = ("fm/dm", "fm/sm", "hybrid/fm", "hybrid/dm", "mbdyn/dm")
FIG8_PAIRS = ("fm/dm", "hybrid/fm", "hybrid/dm", "mbdyn/dm")
COLOURS = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#aa3377")
MIXES = ("small", "balanced", "large")


def _boxes(ax: Any, groups: list[str], pairs: tuple[str, ...], values: dict[tuple[str, str], list[float]]) -> None:
    width = 0.8 / len(pairs)
    for p, (pair, colour) in enumerate(zip(pairs, COLOURS, strict=False)):
        data = [values.get((g, pair), []) for g in groups]
        positions = [i + (p - (len(pairs) - 1) / 2) * width for i in range(len(groups))]
        kept = [(pos, d) for pos, d in zip(positions, data, strict=True) if d]
        if not kept:
            continue
        box = ax.boxplot([d for _, d in kept], positions=[pos for pos, _ in kept], widths=width * 0.85,
                         patch_artist=True, showfliers=False)  # fmt: skip
        for patch in box["boxes"]:
            patch.set_facecolor(colour)
            patch.set_alpha(0.75)
        ax.plot([], [], color=colour, linewidth=6, alpha=0.75, label=pair)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _collect(group: dict[str, Any], metric: str, key_of: Any) -> dict[tuple[str, str], list[float]]:
    values: dict[tuple[str, str], list[float]] = {}
    for name, cell in group["categories"].items():
        for pair, by_metric in cell["ratios"].items():
            values.setdefault((key_of(name), pair), []).extend(by_metric[metric]["values"])
    return values


def plot_fig7(result: dict[str, Any], path: Path) -> Path:
    """Training-only, sizes <= 4, FIFO: ratios per size mix for the four metrics (Flex-MIG Fig. 7)."""
    group = result["groups"]["fig7"]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.6))
    for ax, (metric, label) in zip(axes, PANELS, strict=True):
        _boxes(ax, list(MIXES), FIG7_PAIRS, _collect(group, metric, lambda name: name.split("/")[1]))
        ax.set_title(f"{label} ratio", fontsize=10)
    axes[0].legend(fontsize=7, loc="upper left")
    n = result["setup"]["traces_per_category"]
    fig.suptitle(f"training only, sizes <= 4, FIFO, 2 x A100-40GB; {n} traces x 3 duration classes per box "
                 "(below 1: the numerator is lower)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_fig8(result: dict[str, Any], path: Path) -> Path:
    """All 27 categories: makespan, wait and JCT ratios per size mix and job type (Flex-MIG Fig. 8)."""
    group = result["groups"]["all"]
    groups = [f"{mix}\n{kind}" for kind in ("train", "infer", "mixed") for mix in MIXES]
    fig, axes = plt.subplots(3, 1, figsize=(13, 9.5))
    for ax, (metric, label) in zip(axes, (PANELS[2], PANELS[1], PANELS[0]), strict=True):
        values = _collect(group, metric, lambda name: "{1}\n{2}".format(*name.split("/")))
        _boxes(ax, groups, FIG8_PAIRS, values)
        ax.set_ylabel(f"{label} ratio", fontsize=9)
    axes[0].legend(fontsize=7, loc="upper left", ncol=len(FIG8_PAIRS))
    window = result["setup"]["params"]["window"]
    queue = "FIFO" if window == 1 else f"backfilling over {window} candidates"
    fig.suptitle(f"all categories, native sizes (training up to 8), {queue}, 2 x A100-40GB", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
