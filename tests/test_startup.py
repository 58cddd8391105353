"""Light commands start without the heavy libraries: OR-Tools, matplotlib (and numpy/pandas behind them)
load only in the commands that use them. Timing lives in `mig-batch bench startup`, not in a test."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mig_batch.cli.main import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("matplotlib", "ortools", "numpy", "pandas")
PROBE = """
import contextlib, io, json, sys
from mig_batch.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)))
"""


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["gpus", "--json"], ["translate", "--mem", "18G", "--json"], ["profiles", "A30-24GB", "--json"],
     ["status", "--help"], ["slurm", "gen-lua", "--all-models"], ["plan", "--help"], ["bench", "planner", "--help"],
     ["events", "--help"], ["doctor", "--config", "/nonexistent.yaml"]],
    ids=" ".join,
)  # fmt: skip
def test_light_commands_do_not_import_heavy_libraries(argv):
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv], capture_output=True, text=True,
                         timeout=60, check=True).stdout  # fmt: skip
    assert json.loads(out.splitlines()[-1]) == [], f"mig-batch {' '.join(argv)} imported {out}"


def test_the_probe_does_see_heavy_imports():
    """The probe itself can fail: plotting a plan must load matplotlib."""
    code = PROBE.format(heavy=HEAVY).replace("main(sys.argv[1:])", "import mig_batch.planner.gantt")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "matplotlib" in json.loads(out.splitlines()[-1])


def test_the_command_table_matches_what_the_modules_register():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    registered = {choice.dest: choice.help for choice in sub._choices_actions}
    assert registered == {name: help_text for name, (_, help_text) in COMMANDS.items()}


PRINTS_NO_DATA = {"slurm gen-lua": "prints the Lua script itself", "slurm install": "writes files",
                  "htcondor install": "writes files", "slurm uninstall": "removes files",
                  "htcondor uninstall": "removes files"}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _leaves(child, (*path, name))


def test_every_command_that_prints_data_takes_json_and_the_readme_names_the_others():
    readme = (REPO / "README.md").read_text()
    for name, parser in _leaves(build_parser(None)):
        options = {o for a in parser._actions for o in a.option_strings}
        if name in PRINTS_NO_DATA:
            assert f"`{name}`" in readme, f"README should say why `{name}` has no --json"
        else:
            assert "--json" in options, f"mig-batch {name} prints data but takes no --json"


# --- the light commands start without rich, PyYAML (GPU models cached), traceback, shutil, typing -----

LAZY = ("rich", "yaml", "traceback", "shutil", "typing", "mig_batch.mig.geometry", "mig_batch.mig.configs",
        "mig_batch.config")  # fmt: skip
MIGSUB_PROBE = PROBE.replace("from mig_batch.cli.main import main", "from mig_batch.cli.migsub import main")


def probe(code: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60,
                         check=True, env=env).stdout  # fmt: skip
    return json.loads(out.splitlines()[-1])


LIGHT = [["--help"], ["gpus"], ["translate", "--mem", "18G"], ["gpus", "--json"]]


@pytest.mark.parametrize("argv", LIGHT, ids=" ".join)
def test_light_commands_off_a_terminal_do_not_import_rich_or_yaml(argv):
    probe(PROBE.format(heavy=()), argv)  # fills the GPU model cache
    assert probe(PROBE.format(heavy=LAZY), argv) == []


def test_migsub_dry_run_off_a_terminal_imports_neither(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    argv = ["--dry-run", "--gpu-mem", "18G", str(script)]
    probe(MIGSUB_PROBE.format(heavy=()), argv)
    lazy = tuple(m for m in LAZY if m != "mig_batch.config")  # it looks for the site config (none here)
    assert probe(MIGSUB_PROBE.format(heavy=lazy), argv) == []


def test_the_lazy_probe_can_fail():
    """A terminal (forced) gets rich; a cold cache (switched off) gets PyYAML: the probe sees both."""
    import os

    forced = {**os.environ, "FORCE_COLOR": "1"}
    assert "rich" in probe(PROBE.format(heavy=LAZY), ["translate", "--mem", "18G"], forced)
    no_cache = {**os.environ, "MIG_BATCH_CACHE_DIR": ""}
    assert "yaml" in probe(PROBE.format(heavy=LAZY), ["gpus"], no_cache)
