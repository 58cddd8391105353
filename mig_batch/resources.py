"""Files mig_batch reads at run time (GPU models, the job_submit.lua template, hook shims, snippets, units).

In a checkout they live at the top of the repository (etc/, plugins/, wrappers/); a built wheel maps them
into the package as ``mig_batch/_etc``, ``mig_batch/_plugins`` and ``mig_batch/_wrappers`` (pyproject's
force-include), so one lookup serves an editable install, a checkout and a regular install.
"""

from __future__ import annotations

from pathlib import Path

from mig_batch.errors import MigBatchError

PACKAGE_DIR = Path(__file__).resolve().parent
# top-level source folder -> its name inside an installed wheel
SHIPPED = {"etc": "_etc", "plugins": "_plugins", "wrappers": "_wrappers"}


class MissingResourceError(MigBatchError):
    """A file that ships with mig_batch is not where the install should have put it."""


def resource_path(*parts: str) -> Path:
    """The shipped file or folder ``parts`` (e.g. ``"plugins", "slurm", "job_submit.lua.in"``)."""
    top, *rest = parts
    if top not in SHIPPED:
        raise ValueError(f"{top!r} is not a shipped folder; shipped: {', '.join(SHIPPED)}")
    candidates = (PACKAGE_DIR / SHIPPED[top]).joinpath(*rest), PACKAGE_DIR.parent.joinpath(top, *rest)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise MissingResourceError(
        f"mig_batch's file {'/'.join(parts)} is missing (looked in {candidates[0]} and {candidates[1]}); "
        "reinstall mig_batch from its wheel or a full checkout"
    )
