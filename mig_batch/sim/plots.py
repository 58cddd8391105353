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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_snapshot(snapshot: dict[str, dict[str, dict[str, float]]], demand: float, path: Path) -> Path:
    """Grouped bars per distribution at one demand level (MFI Fig. 5)."""
    distributions = list(snapshot)
    policies = list(next(iter(snapshot.values())))
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    width = 0.8 / len(policies)
    for ax, (metric, label) in zip(axes, PANELS[:4], strict=True):
        for i, policy in enumerate(policies):
            xs = [d + i * width for d in range(len(distributions))]
            ax.bar(xs, [snapshot[d][policy][metric] for d in distributions], width, label=policy)
        ax.set_xticks([d + 0.4 - width / 2 for d in range(len(distributions))], distributions, fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"at {demand:.0%} demand", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    policies = list(per_policy)
    profiles = list(next(iter(per_policy.values()))["arrived_by_profile"])
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        xs = [p + i * width for p in range(len(profiles))]
        axes[2].bar(xs, [per_policy[policy]["acceptance_by_profile"][p] for p in profiles], width, label=policy)
    axes[2].set_xticks([p + 0.4 - width / 2 for p in range(len(profiles))], profiles, fontsize=8)
    axes[2].set_title("acceptance per profile (GRMU Fig. 11)", fontsize=10)
    axes[2].grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Alibaba 2023 trace, {gpus} x {result['setup']['model']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
