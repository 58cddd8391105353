"""The type check's set-up (docs/development.md, "Type checking"): mypy strict on the seam, the adapters, the
controller and the node agent; CI runs it; each adapter is bound to ``type[BatchSystem]`` so that mypy checks
it against the protocol. mypy itself runs in CI (the README's test command), not here."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRICT = ["mig_batch/batch", "mig_batch/controller", "mig_batch/node", "mig_batch/slurm", "mig_batch/htcondor",
          "mig_batch/state.py", "mig_batch/factory.py", "mig_batch/cli/daemons.py"]


def test_mypy_is_strict_on_the_seam_the_adapters_the_controller_and_the_node_agent():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mypy = pyproject["tool"]["mypy"]
    assert mypy["strict"] is True
    assert sorted(mypy["files"]) == sorted(STRICT)
    assert any(dep.startswith("mypy") for dep in pyproject["project"]["optional-dependencies"]["test"])


def test_ci_runs_the_readme_test_command_with_mypy_after_ruff():
    readme = (ROOT / "README.md").read_text().splitlines()
    command = next(line for line in readme if line.startswith("rm -rf dist &&"))
    assert (ROOT / ".ci" / "run").read_text().rstrip("\n").splitlines()[-1] == command
    assert ".venv/bin/ruff check . && .venv/bin/mypy && " in command


def test_each_adapter_is_bound_to_the_batch_system_protocol_for_the_check():
    from mig_batch.batch import fake
    from mig_batch.htcondor import adapter
    from mig_batch.slurm import commands

    assert commands._SEAM_CHECK is commands.SlurmCli
    assert adapter._SEAM_CHECK is adapter.HTCondorBatch
    assert fake._SEAM_CHECK is fake.FakeBatch
