"""PNG figures for the placement experiments, in the layout of MFI Fig. 4 and Fig. 5."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

PANELS = (
    ("accepted", "allocated workloads"),
    ("acceptance_rate", "acceptance rate"),
    ("allocated_slices", "allocated memory slices"),
    ("active_gpus", "active GPUs"),
    ("mean_frag", "mean fragmentation score F"),
)


def plot_load_sweep(result: dict[str, Any], distribution: str, path: Path) -> Path:
    """Metrics against demand for one distribution (MFI Fig. 4)."""
    demand = [100 * c for c in result["setup"]["checkpoints"]]
    per_policy = result["results"][distribution]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
    for ax, (metric, label) in zip(axes, PANELS, strict=True):
        for policy, metrics in per_policy.items():
            ax.plot(demand, metrics[metric]["mean"], label=policy, linewidth=2 if policy.startswith("mfi") else 1.2)
        ax.set_xlabel("GPU demand (% of capacity)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    setup = result["setup"]
    fig.suptitle(f"{distribution}: {setup['gpus']} x {setup['model']}, {setup['runs']} runs", fontsize=11)
    return _save(fig, path)


def _grouped_bars(ax: Any, groups: list[str], values: dict[str, list[float]], title: str) -> None:
    """One bar per series within each group, series side by side."""
    width = 0.8 / len(values)
    for i, (label, ys) in enumerate(values.items()):
        ax.bar([g + i * width for g in range(len(groups))], ys, width, label=label)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], groups, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_snapshot(snapshot: dict[str, dict[str, dict[str, float]]], demand: float, path: Path) -> Path:
    """Grouped bars per distribution at one demand level (MFI Fig. 5)."""
    distributions = list(snapshot)
    policies = list(next(iter(snapshot.values())))
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    for ax, (metric, label) in zip(axes, PANELS[:4], strict=True):
        values = {p: [snapshot[d][p][metric] for d in distributions] for p in policies}
        _grouped_bars(ax, distributions, values, label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"at {demand:.0%} demand", fontsize=11)
    return _save(fig, path)


def plot_trace(result: dict[str, Any], gpus: str, path: Path) -> Path:
    """GRMU-style figures for one cluster size: acceptance and active GPUs over time, acceptance per profile."""
    per_policy = result["results"][gpus]
    fig, axes = plt.subplots(1, 3, figsize=(17, 3.8))
    for policy, summary in per_policy.items():
        series = summary["series"]
        days = [h / 24 for h in series["hours"]]
        width = 2 if policy.startswith(("mfi", "grmu")) else 1.1
        axes[0].plot(days, series["acceptance_rate"], label=policy, linewidth=width)
        axes[1].plot(days, series["active_gpus"], label=policy, linewidth=width)
    axes[0].set_title("acceptance rate so far (GRMU Fig. 10)", fontsize=10)
    axes[1].set_title("active GPUs, hourly (GRMU Fig. 12)", fontsize=10)
    for ax in axes[:2]:
        ax.set_xlabel("days")
        ax.grid(alpha=0.3)
    profiles = list(next(iter(per_policy.values()))["arrived_by_profile"])
    values = {p: [s["acceptance_by_profile"][name] for name in profiles] for p, s in per_policy.items()}
    _grouped_bars(axes[2], profiles, values, "acceptance per profile (GRMU Fig. 11)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Alibaba 2023 trace, {gpus} x {result['setup']['model']}", fontsize=11)
    return _save(fig, path)


def plot_atomize(result: dict[str, Any], path: Path) -> Path:
    """Bars per scheduler for the SJA comparison (means over seeds)."""
    panels = (("mean_wait_h", "mean wait (h)"), ("p95_wait_h", "p95 wait (h)"),
              ("training_mean_jct_h", "training job completion (h)"), ("memory_util", "GPU memory in use"),
              ("wasted_h", "wasted work (h)"), ("frag_delay_h", "fragmentation delay / job (h)"))  # fmt: skip
    mean = result["mean"]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2))
    for ax, (key, label) in zip(axes, panels, strict=True):
        colors = ["#999999", "#6699cc", "#336699", "#cc6633", "#339966"]
        ax.bar(list(mean), [m[key] for m in mean.values()], color=colors[: len(mean)])
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", labelsize=8, rotation=20)
    fig.suptitle(f"{result.get('workload', 'synthetic')} workload, {result['setup']['gpus']} x "
                 f"{result['setup']['model']}, seeds {result['seeds']}", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_robust(result: dict[str, Any], path: Path) -> Path:
    """Heat-map of each policy's gap to the best served demand, cell by cell; S marks starvation."""
    cells = result["cells"]
    policies = result["setup"]["policies"]
    gaps = [[cell["verdict"][p]["gap_pct"] for p in policies] for cell in cells]
    top = max(2.0, min(25.0, max(max(row) for row in gaps)))  # a colour scale that still shows 0.2 %
    fig, ax = plt.subplots(figsize=(1.1 * len(policies) + 3, 0.24 * len(cells) + 1.6))
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
                 f"(< half {setup['starvation_reference']}'s rate)", fontsize=8, pad=24)  # fmt: skip
    return _save(fig, path)
