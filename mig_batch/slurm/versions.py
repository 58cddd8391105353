"""Which Slurm releases mig_batch is tested on, and the release a site runs (from ``scontrol show config``)."""

from __future__ import annotations

import re

# the releases the end-to-end tests run on (docs/slurm.md, "Slurm versions"): 22.05 the whole suite, 24.11 and
# 26.05 the end-to-end subset of tests/test_slurm_releases.py; a release is MAJOR.MINOR
TESTED_RELEASES = ("22.05", "24.11", "26.05")
_VERSION_LINE = re.compile(r"^SLURM_VERSION\s*=\s*(\S+)\s*$", re.MULTILINE)
_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.|$)")


def version_in(show_config: str) -> str | None:
    """The ``SLURM_VERSION`` that ``scontrol show config`` reports (None where it says none)."""
    found = _VERSION_LINE.search(show_config)
    return found.group(1) if found else None


def release_of(version: str) -> str | None:
    """``22.05.8`` -> ``22.05``; None for a text that is not a Slurm version."""
    found = _RELEASE.match(version)
    return f"{int(found.group(1)):02d}.{int(found.group(2)):02d}" if found else None


def release_note(version: str | None) -> str:
    """What a sysadmin should know of ``version``: tested here, or not (and which releases are)."""
    tested = ", ".join(TESTED_RELEASES)
    if version is None:
        return f"its version is not reported (mig_batch is tested on Slurm {tested})"
    if release_of(version) in TESTED_RELEASES:
        return f"Slurm {version}, a release mig_batch is tested on"
    return f"Slurm {version}, not a release mig_batch is tested on (tested: {tested}; see docs/slurm.md)"
