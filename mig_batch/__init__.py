"""mig_batch: dynamic NVIDIA MIG for batch clusters (Slurm, HTCondor)."""

from __future__ import annotations


def version() -> str:
    """The installed distribution's version (a checkout without metadata says so)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mig-batch")
    except PackageNotFoundError:
        return "unknown (not installed)"
