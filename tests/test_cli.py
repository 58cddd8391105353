"""The mig-batch command line: JSON output for scripts, clear errors with exit status 2."""

import json
import shutil
import subprocess
import sys

import pytest

from mig_batch.cli.main import main


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def run_error(capsys, *argv):
    assert main(list(argv)) == 2
    return capsys.readouterr().err


def test_gpus_lists_every_model(capsys):
    data = run_json(capsys, "gpus")
    assert {row["model"] for row in data} >= {"A30-24GB", "A100-40GB", "H100-80GB", "B200-180GB"}


def test_profiles(capsys):
    data = run_json(capsys, "profiles", "a100-40gb")
    assert data["model"] == "A100-40GB"
    three_g = next(p for p in data["profiles"] if p["name"] == "3g.20gb")
    assert three_g["starts"] == [0, 4] and three_g["memory_slices"] == 4


def test_profiles_human_output_has_the_placement_chart(capsys):
    assert main(["profiles", "A30-24GB"]) == 0
    out = capsys.readouterr().out
    assert "2g.12gb" in out and "[========][========]" in out


def test_translate_on_one_and_all_models(capsys):
    data = run_json(capsys, "translate", "--gpu", "A100-80GB", "--mem", "18G", "--compute", "0.3")
    assert data["results"][0]["profile"] == "3g.40gb"
    data = run_json(capsys, "translate", "--gres", "mig:30G")
    by_model = {r["model"]: r for r in data["results"]}
    assert by_model["H200-141GB"]["profile"] == "1g.35gb"
    assert by_model["A30-24GB"]["profile"] is None and "largest is 4g.24gb" in by_model["A30-24GB"]["error"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["translate", "--gpu", "A100-40GB", "--mem", "18"], "a unit is required"),
        (["translate", "--gpu", "A100-40GB", "--mem", "18Q"], "accepted: a number with a unit"),
        (["translate", "--gpu", "V100", "--mem", "8G"], "unknown GPU model 'V100'; known models: A100-40GB"),
        (["translate", "--gpu", "A100-40GB", "--mem", "64G"], "the largest is 7g.40gb"),
        (["translate", "--gpu", "A100-40GB"], "say what the job needs"),
        (["translate", "--gpu", "A30", "--profile", "3g.40gb"], "A30-24GB has no MIG profile 3g.40gb"),
        (["frag", "A100-40GB", "--state", "3g.20gb@2"], "allowed starts: 0, 4"),
        (["frag", "A100-40GB", "--state", "0,8"], "out of range"),
        (["configs", "A100-40GB", "--profiles", "9g.1gb"], "has no MIG profile '9g.1gb'"),
    ],
)
def test_errors_are_clear(capsys, argv, message):
    assert message in run_error(capsys, *argv)


def test_configs_counts(capsys):
    data = run_json(capsys, "configs", "A100-40GB")
    assert (data["reachable"], data["maximal"]) == (723, 78)


def test_frag_of_a_state(capsys):
    data = run_json(capsys, "frag", "A100-80GB", "--state", "2g.20gb@0,1g.10gb@5")
    assert (data["F"], data["F_partial"], data["CC"]) == (23, 16, 7)
    assert data["occupancy"] == "11000100"
    one_g = next(p for p in data["profiles"] if p["profile"] == "1g.20gb")
    assert one_g["free_starts"] == [2, 6] and one_g["delta_f"] == {"2": -6, "6": -9}
    same = run_json(capsys, "frag", "A100-80GB", "--state", "11000100")
    assert same["F"] == 23


def test_console_script_is_installed():
    exe = shutil.which("mig-batch") or str(__import__("pathlib").Path(sys.executable).parent / "mig-batch")
    out = subprocess.run(
        [exe, "translate", "--gpu", "H100-80GB", "--mem", "18G", "--json"], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out)["results"][0]["profile"] == "1g.20gb"


def test_the_readme_main_job_prints_its_ranking(tmp_path, capsys):
    """README command 1's render path (not --json), cut to two runs: it draws styled rows."""
    assert main(["simulate", "placement", "--runs", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mfi" in out and "on served demand" in out
