"""Gantt chart of a plan: compute slices across, time up, as in MIG-DRL's figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as patches
import matplotlib.pyplot as plt

from mig_batch.planner.plan import Plan
from mig_batch.planner.problem import GpuScheme, Task


def plot_plan(scheme: GpuScheme, tasks: Sequence[Task], plan: Plan, path: Path, bound: float | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(6, 7))
    colours = plt.cm.tab20.colors
    for e in plan.events:
        if e.kind == "run":
            ax.add_patch(
                patches.Rectangle(
                    (e.start, e.begin),
                    e.size,
                    e.end - e.begin,
                    alpha=0.6,
                    facecolor=colours[e.task % len(colours)],
                    edgecolor="black",
                )
            )
            if e.end - e.begin > plan.makespan / 40:
                ax.text(
                    e.start + e.size / 2,
                    (e.begin + e.end) / 2,
                    tasks[e.task].name,
                    ha="center",
                    va="center",
                    fontsize=6,
                )
        else:
            ax.add_patch(
                patches.Rectangle(
                    (e.start, e.begin),
                    e.size,
                    e.end - e.begin,
                    facecolor="grey" if e.kind == "create" else "black",
                    alpha=0.8,
                )
            )
    if bound:
        ax.axhline(bound, color="red", linewidth=1, label=f"lower bound {bound:.2f}")
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xlim(0, scheme.slices)
    ax.set_ylim(0, plan.makespan * 1.03 or 1)
    ax.set_xlabel("compute slice")
    ax.set_ylabel("time (s)")
    ax.set_title(f"{plan.planner} on {plan.gpu}: makespan {plan.makespan:.2f} s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
