"""Gantt chart of a plan: compute slices across, time up, as in MIG-DRL's figures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as patches
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from mig_batch.planner.plan import Plan
from mig_batch.planner.problem import GpuScheme, Task


def figure_plan(scheme: GpuScheme, tasks: Sequence[Task], plan: Plan, bound: float | None = None) -> Figure:
    """Runs as coloured boxes named by task; reconfigurations grey (create) and black (destroy); the legend,
    below the chart, says so."""
    fig, ax = plt.subplots(figsize=(6, 7.4), layout="constrained")
    colours = [c for i, c in enumerate(plt.cm.tab20.colors) if i not in (14, 15)]  # its greys read as a create
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
    handles: list[Any] = [patches.Patch(facecolor="grey", alpha=0.8, label="create an instance"),
                          patches.Patch(facecolor="black", alpha=0.8, label="destroy an instance")]  # fmt: skip
    if bound:
        handles.append(ax.axhline(bound, color="red", linewidth=1, label=f"lower bound on the makespan {bound:.2f} s"))
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=min(2, len(handles)),
               frameon=False)  # fmt: skip
    ax.set_xlim(0, scheme.slices)
    ax.set_ylim(0, plan.makespan * 1.03 or 1)
    ax.set_xlabel("compute slice")
    ax.set_ylabel("time (s)")
    ax.set_title(f"{plan.planner} on {plan.gpu}: makespan {plan.makespan:.2f} s", fontsize=10)
    return fig


def plot_plan(scheme: GpuScheme, tasks: Sequence[Task], plan: Plan, path: Path, bound: float | None = None) -> Path:
    fig = figure_plan(scheme, tasks, plan, bound)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
