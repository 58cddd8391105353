"""Every command, driven with bad input, answers with a message and exit status 2: never a traceback, never
the guard's "internal error" (which would mean an exception nobody turned into words).

Commands are discovered from the argparse parser: a new command without a row here fails
``test_every_command_has_a_bad_input_row``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from mig_batch.cli.daemons import batchd_main, htcondor_agent_main, slurm_agent_main
from mig_batch.cli.main import build_parser
from mig_batch.cli.main import main as mig_batch_main
from mig_batch.cli.migsub import main as migsub_main
from mig_batch.entry import INTERNAL

ENTRY_POINTS: dict[str, Callable[[list[str]], int]] = {
    "mig-batch": mig_batch_main, "migsub": migsub_main, "mig-batchd": batchd_main, "mig-batch-agent": slurm_agent_main,
    "mig-batch-htcondor-agent": htcondor_agent_main,
}  # fmt: skip

# (entry point, arguments, a piece of the message); {t} is a folder of prepared files (see `files`)
ROWS: list[tuple[str, list[str], str]] = [
    # gpus, profiles, configs, frag
    ("mig-batch", ["gpus", "extra"], "unrecognized arguments"),
    ("mig-batch", ["profiles", "V100"], "unknown GPU model 'V100'"),
    ("mig-batch", ["profiles"], "required: model"),
    ("mig-batch", ["configs", "V100"], "known models"),
    ("mig-batch", ["configs", "A100-40GB", "--profiles", "9g.99gb"], "9g.99gb"),
    ("mig-batch", ["frag", "A100-80GB", "--state", "zz"], "zz"),
    ("mig-batch", ["frag", "A100-80GB", "--state", "9g.90gb@0"], "9g.90gb"),
    ("mig-batch", ["frag", "A100-80GB", "--state", "111111111111"], "out of range"),
    ("mig-batch", ["frag", "V100", "--state", "0"], "unknown GPU model"),
    # translate
    ("mig-batch", ["node"], "required"),
    ("mig-batch", ["node", "probe", "--write-model", "{t}/afile"], "not a writable directory"),
    ("mig-batch", ["node", "probe", "--write-model", "{t}/none"], "not a writable directory"),
    ("mig-batch", ["translate"], "say what the job needs"),
    ("mig-batch", ["translate", "--mem", "lots"], "lots"),
    ("mig-batch", ["translate", "--mem=-5G"], "-5G"),
    ("mig-batch", ["translate", "--compute", "2.5"], "2.5"),
    ("mig-batch", ["translate", "--gpu", "V100", "--mem", "10G"], "unknown GPU model"),
    ("mig-batch", ["translate", "--gpu", "A30-24GB", "--mem", "500G"], "largest"),
    ("mig-batch", ["translate", "--gres", "mig:lots"], "lots"),
    ("mig-batch", ["translate", "--gres", "mig:3g.40gb:0"], "give at least 1"),
    ("mig-batch", ["translate", "--gres", "mig:20G", "--mem", "1G"], "cannot be combined"),
    ("mig-batch", ["translate", "--gpu", "A100-40GB", "--profile", "9g.1gb"], "9g.1gb"),
    # simulate
    ("mig-batch", ["simulate", "placement", "--gpu", "V100", "--runs", "1", "--out", "{t}/out"], "unknown GPU model"),
    ("mig-batch", ["simulate", "placement", "--runs", "0"], "--runs"),
    ("mig-batch", ["simulate", "placement", "--gpus", "-3", "--out", "{t}/out"], "--gpus"),
    ("mig-batch", ["simulate", "placement", "--runs", "1", "--out", "{t}/afile/sub"], "not a directory"),
    ("mig-batch", ["simulate", "placement", "--runs", "1", "--out", "{t}/afile"], "is a file"),
    ("mig-batch", ["simulate", "placement", "--runs", "1", "--workers", "0", "--out", "{t}/out"], "--workers"),
    ("mig-batch", ["simulate", "placement", "--max-demand", "9"], "--max-demand"),
    ("mig-batch", ["simulate", "placement", "--runs", "1", "--gpus", "2", "--policies", "nope", "--out", "{t}/out",
                   "--workers", "1"], "unknown placement policy"),
    ("mig-batch", ["simulate", "placement", "--runs", "1", "--gpus", "2", "--distributions", "nope", "--out",
                   "{t}/out", "--workers", "1"], "unknown distribution"),
    ("mig-batch", ["simulate", "placement", "--experiment", "grmu", "--trace-dir", "{t}/none", "--out", "{t}/out"],
     "--trace-dir"),
    ("mig-batch", ["simulate", "placement", "--experiment", "nope"], "invalid choice"),
    ("mig-batch", ["simulate", "atomize", "--gpus", "0"], "must be positive"),
    ("mig-batch", ["simulate", "atomize", "--grant-policy", "nope"], "--grant-policy"),
    ("mig-batch", ["simulate", "atomize", "--live-defrag", "maybe"], "--live-defrag"),
    ("mig-batch", ["simulate", "atomize", "--out", "{t}/afile/sub"], "not a directory"),
    ("mig-batch", ["simulate", "atomize", "--workload", "alibaba", "--trace-dir", "{t}/none", "--out", "{t}/out"],
     "none"),
    # plan
    ("mig-batch", ["plan", "{t}/missing.yaml"], "cannot read"),
    ("mig-batch", ["plan", "{t}/bad.yaml"], "not valid YAML"),
    ("mig-batch", ["plan", "{t}/empty.yaml"], "tasks"),
    ("mig-batch", ["plan", "{t}/huge_queue.yaml"], "at most 10,000"),
    ("mig-batch", ["plan", "{t}/queue.yaml", "--gpu", "V100"], "unknown GPU model"),
    ("mig-batch", ["plan", "{t}/queue.yaml", "--gpus", "0"], "--gpus"),
    ("mig-batch", ["plan", "{t}/queue.yaml", "--planner", "nope"], "invalid choice"),
    ("mig-batch", ["plan", "{t}/queue.yaml", "--out", "{t}/afile/sub"], "not a directory"),
    ("mig-batch", ["plan", "{t}"], "{t}"),
    # simulate flex
    ("mig-batch", ["simulate", "flex", "--traces-per-category", "0"], "--traces-per-category"),
    ("mig-batch", ["simulate", "flex", "--window", "0"], "--window"),
    ("mig-batch", ["simulate", "flex", "--slowdown", "2=fast"], "--slowdown"),
    ("mig-batch", ["simulate", "flex", "--contention", "0.5", "--out", "{t}/out"], "contention"),
    ("mig-batch", ["simulate", "flex", "--fig7-sizes", "halve"], "invalid choice"),
    ("mig-batch", ["simulate", "flex", "--quick", "--data-dir", "{t}/none", "--out", "{t}/out"], "philly_runtime"),
    ("mig-batch", ["simulate", "flex", "--quick", "--out", "{t}/afile"], "is a file"),
    # bench
    ("mig-batch", ["bench", "placement", "--sizes", "0"], "--sizes"),
    ("mig-batch", ["bench", "placement", "--sizes", "ten"], "--sizes"),
    ("mig-batch", ["bench", "placement", "--sizes", "10", "--gpu", "V100", "--decisions", "1"], "unknown GPU model"),
    ("mig-batch", ["bench", "placement", "--sizes", "10", "--policies", "nope", "--decisions", "1"], "nope"),
    ("mig-batch", ["bench", "planner", "--datasets", "0"], "--datasets"),
    ("mig-batch", ["bench", "planner", "--planners", "nope"], "unknown planner"),
    ("mig-batch", ["bench", "planner", "--workloads", "nope"], "unknown workload"),
    ("mig-batch", ["bench", "planner", "--workloads", "rodinia-a100", "--rodinia-dir", "{t}/none"], "none"),
    ("mig-batch", ["bench", "moldable", "--jobs", "0"], "--jobs"),
    ("mig-batch", ["bench", "moldable", "--load", "1.5"], "--load"),
    ("mig-batch", ["bench", "pass", "--sizes", "0"], "--sizes"),
    ("mig-batch", ["bench", "pass", "--jobs-per-gpu", "0"], "--jobs-per-gpu"),
    ("mig-batch", ["bench", "pass", "--passes", "0"], "--passes"),
    ("mig-batch", ["bench", "pass", "--churn", "-1"], "--churn"),
    ("mig-batch", ["bench", "controller", "--jobs", "0"], "--jobs"),
    ("mig-batch", ["bench", "controller", "--nodes", "100000"], "--nodes"),
    ("mig-batch", ["bench", "controller", "--rounds", "0"], "--rounds"),
    ("mig-batch", ["bench", "startup", "--runs", "0"], "--runs"),
    # slurm, status, offers, events, doctor
    ("mig-batch", ["slurm", "gen-lua", "--config", "{t}/missing.yaml"], "cannot read"),
    ("mig-batch", ["slurm", "gen-lua", "--config", "{t}/bad.yaml"], "not valid YAML"),
    ("mig-batch", ["slurm", "gen-lua", "--config", "{t}/unknown_setting.yaml"], "unknown setting"),
    ("mig-batch", ["slurm", "install", "{t}/afile/sub", "--config", "{t}/site.yaml"], "not a directory"),
    ("mig-batch", ["slurm", "install", "{t}/slurm", "--config", "{t}/site.yaml", "--python", "/nonexistent"],
     "not an executable file"),
    ("mig-batch", ["slurm", "install", "{t}/slurm", "--config", "{t}/site.yaml", "--python", "python3"],
     "absolute path"),
    ("mig-batch", ["slurm", "install", "{t}/slurm", "--config", "{t}/missing.yaml"], "cannot read"),
    ("mig-batch", ["slurm", "install", "{t}/slurm"], "--config"),
    ("mig-batch", ["slurm", "install", "{t}/slurm", "--config", "{t}/bad_slice_gres.yaml"], "slice_gres"),
    ("mig-batch", ["slurm", "nope"], "invalid choice"),
    ("mig-batch", ["htcondor", "install", "{t}/htc"], "--config"),
    ("mig-batch", ["htcondor", "install", "{t}/afile", "--config", "{t}/site.yaml"], "not a directory"),
    ("mig-batch", ["htcondor", "install", "{t}/htc", "--config", "{t}/missing.yaml"], "cannot read"),
    ("mig-batch", ["htcondor", "install", "{t}/htc", "--config", "{t}/empty.yaml"], "no nodes"),
    ("mig-batch", ["htcondor", "install", "{t}/htc", "--config", "{t}/bad_batch_system.yaml"], "batch_system"),
    ("mig-batch", ["htcondor", "install", "{t}/htc", "--config", "{t}/site.yaml", "--python", "python3"],
     "absolute path"),
    ("mig-batch", ["htcondor", "install", "{t}/htc", "--config", "{t}/site.yaml", "--controller", "a b;c"],
     "not an HTCondor identity"),
    ("mig-batch", ["htcondor", "nope"], "invalid choice"),
    ("mig-batch", ["status", "--config", "{t}/proc_state.yaml"], "/proc/nope/state.db"),
    ("mig-batch", ["status", "--config", "{t}/empty.yaml"], "no mig_batch store"),
    ("mig-batch", ["status", "--config", "{t}/missing.yaml"], "cannot read"),
    ("mig-batch", ["status", "--config", "{t}/bad_policy.yaml"], "policy"),
    ("mig-batch", ["status", "--config", "{t}/bad_nodes.yaml"], "unknown GPU model"),
    ("mig-batch", ["offers", "--config", "{t}/site.yaml", "--last", "0"], "--last"),
    ("mig-batch", ["offers", "--config", "{t}/proc_state.yaml"], "no mig_batch store"),
    ("mig-batch", ["events", "--config", "{t}/proc_state.yaml"], "no mig_batch store"),
    ("mig-batch", ["events", "--config", "{t}/missing.yaml"], "cannot read"),
    ("mig-batch", ["events", "--config", "{t}/site.yaml", "--since", "yesterday"], "accepted: an age"),
    ("mig-batch", ["events", "--config", "{t}/site.yaml", "--last", "0"], "--last"),
    ("mig-batch", ["doctor", "--role", "login"], "invalid choice"),
    ("mig-batch", ["doctor", "--config"], "expected one argument"),
    ("mig-batch", ["nope"], "invalid choice"),
    ("mig-batch", [], "required"),
    # simulate multi
    ("mig-batch", ["simulate", "multi", "--seeds", "0"], "--seeds must be at least 1"),
    ("mig-batch", ["simulate", "multi", "--per-slot", "0"], "--per-slot"),
    ("mig-batch", ["simulate", "multi", "--gpus-per-node", "1"], "give at least 2"),
    ("mig-batch", ["simulate", "multi", "--jobs", "many"], "invalid int value"),
    # translate --instances auto (Flex-MIG leaves)
    ("mig-batch", ["translate", "--mem", "25G", "--instances", "3"], "takes auto"),
    ("mig-batch", ["translate", "--profile", "1g.10gb", "--instances", "auto"], "a profile name asks for"),
    ("mig-batch", ["translate", "--gres", "mig:20G:2", "--instances", "auto"], "counts its own leaves"),
    # migsub
    ("migsub", ["--dry-run", "--gpu-compute", "5g", "--gpu-mem", "25G", "--instances", "auto", "{t}/job.sh"],
     "flex.leaf_requests"),
    ("migsub", ["--dry-run", "--mig", "1g.10gb", "--instances", "auto", "{t}/job.sh"], "a profile name"),
    ("migsub", ["--dry-run", "--gpu-mem", "10G", "--instances", "many", "{t}/job.sh"], "or auto"),
    ("migsub", ["--dry-run", "{t}/missing.sh"], "cannot read job script"),
    ("migsub", ["--dry-run", "--gpu-mem", "lots", "{t}/job.sh"], "lots"),
    ("migsub", ["--dry-run", "--gpu", "V100", "--gpu-mem", "10G", "{t}/job.sh"], "unknown GPU model"),
    ("migsub", ["--dry-run", "--moldable", "1g=2h,1g=3h", "{t}/job.sh"], "given twice"),
    ("migsub", ["--dry-run", "--moldable", "1g", "{t}/job.sh"], "needs a size and a time"),
    ("migsub", ["--dry-run", "--moldable", "1g=soon", "{t}/job.sh"], "duration"),
    ("migsub", ["--dry-run", "{t}/gres_job.sh"], "asks for GPUs too"),
    ("migsub", ["--dry-run", "--gpu-mem", "900G", "{t}/job.sh"], "no MIG profile"),
    ("migsub", ["--dry-run", "--atomize", "--gpu-mem", "10G", "{t}/job.sh"], "--checkpoint-dir"),
    ("migsub", ["--dry-run", "--mig", "1g.10gb", "--instances", "0", "{t}/job.sh"],
     "--instances: must be a whole number of at least 1, or auto; got '0'"),
    ("migsub", ["--dry-run", "--mig", "foo", "{t}/job.sh"], "--mig: 'foo' is not a MIG profile of A100-40GB, "),
    ("migsub", ["--dry-run", "--mig", "3g.40gb", "--gpu", "A100-40GB", "{t}/job.sh"],
     "'3g.40gb' is not a MIG profile of A100-40GB; they have 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, "
     "7g.40gb"),
    ("migsub", ["--dry-run", "--mig", "1g.10gb", "--instances", "two", "{t}/job.sh"], "whole number"),
    ("migsub", ["--dry-run", "--mig", "1g.10gb", "--instances", "4", "{t}/tasks3_job.sh"], "contradicts --instances 4"),
    ("migsub", ["--dry-run", "--moldable", "1g=60", "--instances", "2", "{t}/job.sh"], "exclude each other"),
    ("migsub", [], "required"),
    ("migsub", ["--backend", "pbs", "--gpu-mem", "10G", "{t}/job.sh"], "invalid choice"),
    ("migsub", ["--backend", "htcondor", "--dry-run", "{t}/condor_exe_job.sh"], "which migsub writes itself"),
    ("migsub", ["--backend", "htcondor", "--dry-run", "{t}/condor_bad_job.sh"], "is not '#CONDOR key = value'"),
    ("migsub", ["--backend", "htcondor", "--dry-run", "--atomize", "--checkpoint-dir", "{t}", "--gpu-mem", "10G",
                "{t}/job.sh"], "Slurm only"),
    # the daemons
    ("mig-batchd", ["--once", "--config", "{t}/wrong_slurm_bin.yaml"], "slurm_bin"),
    ("mig-batchd", ["--once", "--config", "{t}/proc_state.yaml"], "/proc/nope/state.db"),
    ("mig-batchd", ["--once", "--config", "{t}/missing.yaml"], "cannot read"),
    ("mig-batchd", ["--log-level", "LOUD"], "not a log level"),
    ("mig-batch-agent", ["--config", "{t}/missing.yaml"], "cannot read"),
    ("mig-batch-agent", ["--config", "{t}/unknown_setting.yaml"], "unknown setting"),
    ("mig-batch-agent", ["--config", "{t}/bad_multi_policy.yaml"], "multi_policy 'spread' is not one of mfi, flex-mig"),
    ("mig-batch-agent", ["--log-level", "LOUD"], "not a log level"),
    ("mig-batch-agent", ["--config", "{t}/nodes_list.yaml"], "nodes must map each GPU node's name"),
    ("mig-batch-agent", ["--config", "{t}/nested_models.yaml"], "nodes.gpu01 must be a list of GPU models"),
    ("mig-batch-agent", ["--config", "{t}/empty_state.yaml"], "state must be a path"),
    ("mig-batch-agent", ["--config", "{t}/job_dir_number.yaml"], "job_dir must be a path"),
    ("mig-batch-agent", ["--config", "{t}/nan_interval.yaml"], "poll_interval_s must be positive and finite"),
    ("mig-batch-agent", ["--config", "{t}/inf_reconcile.yaml"], "reconcile_interval_s must be positive and finite"),
    ("mig-batch-agent", ["--config", "{t}/fraction_count.yaml"], "atomize.max_failures must be a whole number"),
    ("mig-batch-agent", ["--config", "{t}/twice_nodes.yaml"], "the key 'nodes' is given twice"),
    ("mig-batch-agent", ["--config", "{t}/slurm_bin_list.yaml"], "slurm_bin must be text"),
    ("mig-batch-htcondor-agent", ["--config", "{t}/missing.yaml"], "cannot read"),
    ("mig-batch-htcondor-agent", ["--config", "{t}/bad_batch_system.yaml"], "batch_system"),
    ("mig-batch-htcondor-agent", ["--log-level", "LOUD"], "not a log level"),
]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """Inputs the rows refer to as {t}/..."""
    (tmp_path / "afile").write_text("a file where a folder is expected\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "bad.yaml").write_text("tasks: [unclosed\n")
    (tmp_path / "unknown_setting.yaml").write_text("colour: blue\n")
    (tmp_path / "bad_policy.yaml").write_text("policy: nope\n")
    (tmp_path / "bad_nodes.yaml").write_text("nodes: {gpu01: [V100]}\n")
    (tmp_path / "bad_batch_system.yaml").write_text("batch_system: pbs\nnodes: {gpu01: [A100-80GB]}\n")
    (tmp_path / "condor_exe_job.sh").write_text("#!/bin/sh\n#MIG --gpu-mem 10G\n#CONDOR executable = /bin/x\necho\n")
    (tmp_path / "condor_bad_job.sh").write_text("#!/bin/sh\n#MIG --gpu-mem 10G\n#CONDOR getenv\necho\n")
    (tmp_path / "bad_slice_gres.yaml").write_text("slice_gres: gres/MIG slices\n")
    (tmp_path / "proc_state.yaml").write_text("state: /proc/nope/state.db\n")
    (tmp_path / "site.yaml").write_text(f"state: {tmp_path}/state/state.db\nnodes: {{gpu01: [A100-80GB]}}\n")
    (tmp_path / "wrong_slurm_bin.yaml").write_text(
        f"state: {tmp_path}/state/state.db\nslurm_bin: {tmp_path}/no-slurm\nnodes: {{gpu01: [A100-80GB]}}\n"
    )
    (tmp_path / "queue.yaml").write_text("tasks:\n  - {name: a, times: {1: 100, 2: 60}}\n")
    (tmp_path / "huge_queue.yaml").write_text("tasks:\n  - {name: a, times: {1: 100}, count: 1000000}\n")
    (tmp_path / "job.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "tasks3_job.sh").write_text("#!/bin/sh\n#SBATCH --ntasks=3\necho hi\n")
    (tmp_path / "bad_multi_policy.yaml").write_text("multi_policy: spread\n")
    (tmp_path / "nodes_list.yaml").write_text("nodes: [gpu01]\n")
    (tmp_path / "nested_models.yaml").write_text("nodes: {gpu01: [[A100-80GB]]}\n")
    (tmp_path / "empty_state.yaml").write_text("state:\nnodes: {gpu01: [A100-80GB]}\n")
    (tmp_path / "job_dir_number.yaml").write_text("job_dir: 5\n")
    (tmp_path / "nan_interval.yaml").write_text("poll_interval_s: .nan\n")
    (tmp_path / "inf_reconcile.yaml").write_text("reconcile_interval_s: .inf\n")
    (tmp_path / "fraction_count.yaml").write_text("atomize: {max_failures: 2.7}\n")
    (tmp_path / "twice_nodes.yaml").write_text("nodes: {gpu01: [A100-80GB]}\nnodes: {gpu02: [A100-80GB]}\n")
    (tmp_path / "slurm_bin_list.yaml").write_text("slurm_bin: [/usr/bin]\n")
    (tmp_path / "gres_job.sh").write_text("#!/bin/sh\n#SBATCH --gres=gpu:1\n#MIG --gpu-mem 10G\necho hi\n")
    return tmp_path


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [path]
    return [leaf for a in subs for name, sub in a.choices.items() for leaf in leaf_commands(sub, (*path, name))]


def run(entry: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = ENTRY_POINTS[entry](argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    return code, captured.err + captured.out


@pytest.mark.parametrize(("entry", "argv", "expected"), ROWS, ids=[" ".join([r[0], *r[1]]) for r in ROWS])
def test_bad_input_gives_a_message_and_status_2(entry, argv, expected, files, capsys, monkeypatch):
    monkeypatch.delenv("MIG_BATCH_CONFIG", raising=False)
    monkeypatch.delenv("MIG_BATCH_DEBUG", raising=False)
    monkeypatch.chdir(files)
    argv = [a.replace("{t}", str(files)) for a in argv]
    code, text = run(entry, argv, capsys)
    assert "Traceback" not in text and INTERNAL not in text, text
    assert code == 2, f"exit status {code}:\n{text}"
    assert expected.replace("{t}", str(files)) in text, text


def test_there_are_at_least_60_rows():
    assert len(ROWS) >= 60


def test_every_command_has_a_bad_input_row():
    covered = {tuple(argv[: len(leaf)]) for entry, argv, _ in ROWS if entry == "mig-batch" for leaf in [argv]}
    missing = [" ".join(leaf) for leaf in leaf_commands(build_parser())
               if not any(c[: len(leaf)] == leaf for c in covered)]  # fmt: skip
    assert not missing, f"commands without a bad-input row: {missing}"
    assert {entry for entry, _, _ in ROWS} == set(ENTRY_POINTS)


@pytest.mark.parametrize("leaf", leaf_commands(build_parser()), ids=" ".join)
def test_every_command_refuses_an_unknown_option_and_numbers_that_are_not(leaf, capsys):
    code, text = run("mig-batch", [*leaf, "--no-such-option"], capsys)
    assert code == 2 and "Traceback" not in text
    parser = build_parser()
    for name in leaf:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    for action in parser._actions:
        if action.type in (int, float) and action.option_strings:
            code, text = run("mig-batch", [*leaf, action.option_strings[0], "many"], capsys)
            assert code == 2 and "invalid" in text and "Traceback" not in text, (action.option_strings, text)


def test_debug_shows_the_traceback(files, capsys):
    code, text = run("mig-batch", ["--debug", "profiles", "V100"], capsys)
    assert code == 2 and "Traceback" in text and "UnknownModelError" in text
    code, text = run("mig-batch", ["profiles", "V100", "--debug"], capsys)
    assert code == 2 and "Traceback" in text


@pytest.mark.parametrize(("config", "expected"), [
    ("nodes: {gpu01: [A100-81GB]}\n", "unknown GPU model 'A100-81GB'"),
    ("policy: foo\n", "policy 'foo' is not one of"),
    ("node: {gpu01: [A100-80GB]}\n", "unknown setting(s) node"),
])  # fmt: skip
def test_migsub_refuses_a_site_config_that_is_there_but_wrong(config, expected, files, capsys, monkeypatch):
    """Without it migsub would translate for every model, as if the site had none, and nobody would hear."""
    (files / "site_wrong.yaml").write_text(config)
    monkeypatch.setenv("MIG_BATCH_CONFIG", str(files / "site_wrong.yaml"))
    code, text = run("migsub", ["--dry-run", "--gpu-mem", "18G", str(files / "job.sh")], capsys)
    assert code == 2 and expected in text and "Traceback" not in text, text


def test_migsub_reads_a_script_that_is_not_utf8(files, capsys, monkeypatch):
    """sbatch takes any bytes: a Latin-1 comment must not stop migsub."""
    monkeypatch.delenv("MIG_BATCH_CONFIG", raising=False)
    (files / "latin1.sh").write_bytes(b"#!/bin/sh\n#MIG --gpu-mem 1G\n# caf\xe9\ntrue\n")
    code, text = run("migsub", ["--dry-run", str(files / "latin1.sh")], capsys)
    assert code == 0 and "--gres=mig:1024M" in text, text
