"""Every command, driven with bad input, answers with a message and exit status 2: never a traceback, never
the guard's "internal error" (which would mean an exception nobody turned into words).

Commands are discovered from the argparse parser: a new command without a row here fails
``test_every_command_has_a_bad_input_row``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mig_batch.cli.daemons import batchd_main, htcondor_agent_main, slurm_agent_main
from mig_batch.cli.main import build_parser
from mig_batch.cli.main import main as mig_batch_main
from mig_batch.cli.migsub import main as migsub_main
from mig_batch.config import MAX_CONFIG_BYTES
from mig_batch.entry import INTERNAL
from mig_batch.mig.models import MAX_MODEL_BYTES, builtin_gpu_dir
from mig_batch.planner.queue_file import MAX_QUEUE_BYTES
from mig_batch.sim.traces import MAX_TRACE_BYTES
from mig_batch.yaml_text import YAMLError, load_yaml_file, shown

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
    ("mig-batch", ["simulate", "moldable", "--planners", "best"], "eft, far, auto, eft-today"),
    ("mig-batch", ["simulate", "moldable", "--loads", "-1"], "--loads"),
    ("mig-batch", ["simulate", "moldable", "--workloads", "nosuch"], "migdrl-mixscalinguniform"),
    ("mig-batch", ["simulate", "moldable", "--planners", "eft,auto", "--baseline", "far"], "--planners (eft, auto)"),
    ("mig-batch", ["simulate", "moldable", "--first-seed", "-1"], "--first-seed >= 0"),
    ("mig-batch", ["bench", "live-planner", "--gpus", "0"], "--gpus"),
    ("mig-batch", ["bench", "live-planner", "--planners", "best"], "eft, far, auto"),
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
    ("mig-batch", ["slurm", "uninstall", "{t}/none"], "give the directory `mig-batch slurm install` wrote into"),
    ("mig-batch", ["htcondor", "uninstall", "{t}/afile"], "give the directory `mig-batch htcondor install` wrote"),
    ("mig-batch", ["bench", "install-size", "--wheel", "{t}/afile"], "not a wheel file"),
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
    ("migsub", ["--backend", "htcondor", "--dry-run", "--atomize", "--checkpoint-dir", "/tmp/ck#1", "--gpu-mem", "10G",
                "{t}/job.sh"], "without '..', and hold only letters, digits and . _ / + - on HTCondor"),
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

D5000 = "9" * 5000  # a number of 5,000 digits (int() refuses over 4,300; float() makes it infinity)
LONG = "x" * 5000  # a value that messages must cut, not print whole

# Each cause of issue 48's trial, in every file kind and command that reads one: (entry point, arguments, what
# the message must say: what was wrong and what would be accepted, environment). {t}: the prepared files.
# The files: cfg_* site configs, q_* queue files, gpus_* folders of GPU model files, trace_* folders of
# trace CSVs, *_state.yaml configs whose state: is some other file.
CAUSE_ROWS: list[tuple[str, list[str], tuple[str, ...], dict[str, str]]] = [
    # a file that is not text (UTF-8)
    ("mig-batch", ["status", "--config", "{t}/cfg_binary.yaml"], ("cfg_binary.yaml: the mig_batch config is not "
     "text (UTF-8): byte 0x89 at line 1", "give a text file in UTF-8"), {}),
    ("mig-batchd", ["--once", "--config", "{t}/cfg_binary.yaml"], ("not text (UTF-8)", "give a text file"), {}),
    ("mig-batch", ["doctor", "--config", "{t}/cfg_binary.yaml"], ("not text (UTF-8)", "give a text file"), {}),
    ("mig-batch", ["doctor", "--role", "node", "--config", "{t}/cfg_bomb.yaml"], ("alias bomb",
     "give the values themselves"), {}),
    ("mig-batch-htcondor-agent", ["--config", "{t}/cfg_nul.yaml"], ("not text (UTF-8): a NUL byte at line 2",
     "give a text file"), {}),
    ("migsub", ["--dry-run", "--gpu-mem", "10G", "{t}/job.sh"], ("cfg_binary.yaml: the mig_batch config is not text",
     "give a text file in UTF-8"), {"MIG_BATCH_CONFIG": "{t}/cfg_binary.yaml"}),
    ("mig-batch", ["plan", "{t}/q_binary.yaml"], ("q_binary.yaml: a queue file is not text (UTF-8)",
     "give a text file"), {}),
    ("mig-batch", ["gpus"], ("bad.yaml: a GPU model file is not text (UTF-8)", "give a text file"),
     {"MIG_BATCH_GPU_DIRS": "{t}/gpus_binary"}),
    ("mig-batch", ["simulate", "placement", "--experiment", "grmu", "--trace-dir", "{t}/trace_binary", "--out",
                   "{t}/out"], ("openb_pod_list_default.csv: a trace file (CSV) is not text (UTF-8)",
                                "give a text file"), {}),
    ("mig-batch", ["simulate", "atomize", "--workload", "alibaba", "--trace-dir", "{t}/trace_binary", "--out",
                   "{t}/out"], ("not text (UTF-8)", "give a text file"), {}),
    ("mig-batch", ["bench", "planner", "--workloads", "rodinia-a100", "--rodinia-dir", "{t}/rodinia_binary"],
     ("3g_A100.csv: a Rodinia task-time file (CSV) is not text (UTF-8)", "give a text file"), {}),
    ("mig-batch", ["bench", "planner", "--workloads", "rodinia-a100", "--rodinia-dir", "{t}/rodinia_short"],
     ("3g_A100.csv:3: expected a benchmark name (prueba) and its times (t1, t2...)",), {}),
    # a YAML alias bomb: refused at once, not a MemoryError after 40 s
    ("mig-batch", ["slurm", "gen-lua", "--config", "{t}/cfg_bomb.yaml"], ("cfg_bomb.yaml: at line 7, column 4: its "
     "aliases (*name) expand this value to over 1,000,000 values", "give the values themselves"), {}),
    ("mig-batch-agent", ["--config", "{t}/cfg_bomb.yaml"], ("alias bomb", "give the values themselves"), {}),
    ("migsub", ["--dry-run", "--gpu-mem", "10G", "{t}/job.sh"], ("alias bomb", "give the values themselves"),
     {"MIG_BATCH_CONFIG": "{t}/cfg_bomb.yaml"}),
    ("mig-batch", ["plan", "{t}/q_bomb.yaml"], ("q_bomb.yaml: at line 7", "give the values themselves"), {}),
    ("mig-batch", ["profiles", "A30-24GB"], ("gpus_bomb/bad.yaml: at line 7", "give the values themselves"),
     {"MIG_BATCH_GPU_DIRS": "{t}/gpus_bomb"}),
    ("mig-batch", ["status", "--config", "{t}/cfg_loop.yaml"], ("refers to a value that contains it",
     "must not loop"), {}),
    # YAML syntax errors and keys given twice: one line naming the file, the line and the column
    ("mig-batchd", ["--once", "--config", "{t}/cfg_syntax.yaml"], ("cfg_syntax.yaml: not valid YAML at line 3, "
     "column 1: did not find expected ',' or ']' (while parsing a flow sequence at line 2, column 16)",), {}),
    ("mig-batch", ["htcondor", "install", "{t}/htc", "--config", "{t}/cfg_dup.yaml"], ("cfg_dup.yaml: at line 3, "
     "column 1: the key 'policy' is given twice", "give each key once"), {}),
    ("mig-batch", ["plan", "{t}/q_syntax.yaml"], ("q_syntax.yaml: not valid YAML at line 3, column 1",), {}),
    ("mig-batch", ["plan", "{t}/q_dup.yaml"], ("q_dup.yaml: at line 3, column 5: the key 'name' is given twice",
     "give each key once"), {}),
    ("mig-batch", ["translate", "--mem", "10G"], ("bad.yaml: not valid YAML at line 3, column 1",),
     {"MIG_BATCH_GPU_DIRS": "{t}/gpus_syntax"}),
    ("migsub", ["--dry-run", "--gpu-mem", "10G", "{t}/job.sh"], ("bad.yaml: at line 2, column 1: the key 'model' "
     "is given twice", "give each key once"), {"MIG_BATCH_GPU_DIRS": "{t}/gpus_dup"}),
    ("mig-batch", ["status"], ("not valid YAML at line 3",), {"MIG_BATCH_CONFIG": "{t}/cfg_syntax.yaml"}),
    # files over their kind's size limit: said before they are read
    ("mig-batch", ["events", "--config", "{t}/cfg_big.yaml"], (f"cfg_big.yaml: the mig_batch config is "
     f"{MAX_CONFIG_BYTES + 1:,} bytes", f"at most 2 MiB ({MAX_CONFIG_BYTES:,} bytes) is read"), {}),
    ("mig-batch", ["plan", "{t}/q_big.yaml"], (f"q_big.yaml: a queue file is {MAX_QUEUE_BYTES + 1:,} bytes",
     "at most 2 MiB"), {}),
    ("mig-batch", ["configs", "A30-24GB"], (f"gpus_big/bad.yaml: a GPU model file is {MAX_MODEL_BYTES + 1:,} bytes",
     f"at most 256 KiB ({MAX_MODEL_BYTES:,} bytes) is read"), {"MIG_BATCH_GPU_DIRS": "{t}/gpus_big"}),
    ("mig-batch", ["simulate", "placement", "--experiment", "grmu", "--trace-dir", "{t}/trace_big", "--out",
                   "{t}/out"], (f"openb_pod_list_default.csv: a trace file (CSV) is {MAX_TRACE_BYTES + 1:,} bytes",
                                "at most 64 MiB"), {}),
    ("mig-batch", ["status", "--config", "/dev/zero"], ("/dev/zero: the mig_batch config is over 2 MiB",
     "the most that is read"), {}),
    # numbers of thousands of digits, and values too long to print whole
    ("mig-batch", ["offers", "--config", "{t}/cfg_bignum.yaml"], ("cfg_bignum.yaml: at line 1, column 18: a whole "
     "number of 5,000 digits", "at most 100 are read"), {}),
    ("mig-batch", ["plan", "{t}/q_bignum.yaml"], ("a whole number of 5,000 digits", "at most 100 are read"), {}),
    ("mig-batch-agent", ["--config", "{t}/cfg_hex.yaml"], ("cfg_hex.yaml: at line 1, column 17: a whole number of 302 "
     "digits", "at most 100 are read"), {}),
    ("mig-batch", ["simulate", "atomize", "--workload", "alibaba", "--trace-dir", "{t}/trace_bignum", "--out",
                   "{t}/out"], ("openb_pod_list_default.csv:2: column num_gpu must be an integer",
                                "(text of 5,000 characters)"), {}),
    ("mig-batch", ["slurm", "install", "{t}/slurm", "--config", "{t}/cfg_long_policy.yaml"], ("policy 'xxxx",
     "(text of 5,000 characters) is not one of ff, rr"), {}),
    ("mig-batch-agent", ["--config", "{t}/cfg_long_model.yaml"], ("unknown GPU model 'xxx", "(text of 5,000 "
     "characters); known models: A100-40GB"), {}),
    ("mig-batch-agent", ["--config", "{t}/cfg_int_key.yaml"], ("unknown atomize setting(s) 1", "known: "), {}),
    ("mig-batch-agent", ["--config", "{t}/cfg_list.yaml"], ("expected a mapping of settings (setting: value lines)",
     "got ['policy'"), {}),
    ("mig-batch", ["plan", "{t}/q_name_list.yaml"], ("name must be text of at most 200 characters", "got [1, 2]"), {}),
    ("mig-batch", ["plan", "{t}/q_gpu_number.yaml"], ("gpu must be a GPU model's name, e.g. A100-40GB", "got 5"), {}),
    ("mig-batch", ["plan", "{t}/q_size_huge.yaml"], ("size 99999999", "must be a number of compute slices"), {}),
    ("mig-batch", ["plan", "{t}/queue.yaml", "--gpu", LONG], ("unknown GPU model 'xxx", "(text of 5,000 "
     "characters); known models"), {}),
    ("mig-batch", ["frag", "A30-24GB", "--state", "0"], ("field 'nvml_profile' must be one of 1_SLICE",
     "(text of 5,000 characters)"), {"MIG_BATCH_GPU_DIRS": "{t}/gpus_long_field"}),
    # trace files that are not the CSV a trace is
    ("mig-batch", ["simulate", "placement", "--experiment", "grmu", "--trace-dir", "{t}/trace_short", "--out",
                   "{t}/out"], ("openb_pod_list_default.csv:3: no value for column(s)", "one per column"), {}),
    ("mig-batch", ["simulate", "placement", "--experiment", "robust", "--trace-dir", "{t}/trace_wide_field", "--out",
                   "{t}/out"], ("not CSV as a trace is: field larger than field limit",), {}),
    # site folders of GPU models that do not exist
    ("mig-batch", ["gpus"], ("MIG_BATCH_GPU_DIRS names '{t}/none', which does not exist", "give folders of GPU "
     "model files (*.yaml), separated by ':'"), {"MIG_BATCH_GPU_DIRS": "{t}/none"}),
    ("migsub", ["--dry-run", "--gpu-mem", "10G", "{t}/job.sh"], ("MIG_BATCH_GPU_DIRS names '{t}/afile', which is a "
     "file", "give folders"), {"MIG_BATCH_GPU_DIRS": "{t}/afile"}),
    # a store that is not ours: refused, left as it was (also by mig-batchd, which writes)
    ("mig-batchd", ["--once", "--config", "{t}/sqlite_state.yaml"], ("other.db is not a mig_batch store (no "
     "mig_batch schema mark", "left as it was; expected the SQLite store mig-batchd writes"), {}),
    ("mig-batchd", ["--once", "--config", "{t}/text_state.yaml"], ("notes.txt is not a mig_batch store",
     "left as it was; expected the SQLite store"), {}),
    ("mig-batch", ["events", "--config", "{t}/sqlite_state.yaml"], ("is not a mig_batch store", "expected the "
     "SQLite store mig-batchd writes"), {}),
    # impossible requests: exit 2 naming the largest fit, never an empty table with exit 0
    ("mig-batch", ["translate", "--mem", "999T"], ("no MIG profile of A100-40GB, A100-80GB", "satisfies "
     "999.00 TiB GPU memory; the largest is 7g.180gb (174.60 GiB, 7/7 compute) on B200-180GB"), {}),
    ("mig-batch", ["translate", "--compute", "99g"], ("satisfies compute 99g", "the largest is 7g.180gb"), {}),
    ("mig-batch", ["translate", "--mem", "1000000T"], ("GPU memory '1000000T' is over 1 PiB, more than any GPU has",
     "accepted: a number with a unit"), {}),
    ("mig-batch", ["translate", "--mem", f"1{D5000}G"], ("cannot read GPU memory '1999", "(text of 5,002 characters)"
     "; accepted: a number with a unit"), {}),
    ("mig-batch", ["translate", "--compute", f"{D5000}g"], ("cannot read compute share '999", "accepted: a fraction "
     "of the GPU"), {}),
    ("mig-batch", ["translate", "--gres", f"mig:1g.10gb:{D5000}"], ("cannot read MIG request 'mig:1g.10gb:999",
     "accepted forms: mig:20G"), {}),
    ("mig-batch", ["translate", "--profile", "9g.1gb"], ("no GPU model here has a MIG profile 9g.1gb", "profiles are "
     "named like 3g.40gb"), {}),
    ("migsub", ["--dry-run", "--gpu-mem", "999T", "{t}/job.sh"], ("no MIG profile of", "the largest is 7g.180gb"), {}),
    ("migsub", ["--dry-run", "--moldable", f"1g={D5000}", "{t}/job.sh"], ("cannot read duration '999",
     "accepted: 90, 90s, 2.5m"), {}),
    ("migsub", ["--dry-run", "--gpu-mem", f"{D5000}G", "{t}/job.sh"], ("cannot read GPU memory '999",
     "accepted: a number with a unit"), {}),
    ("migsub", ["--dry-run", "--mig", LONG, "{t}/job.sh"], ("--mig: 'xxx", "(text of 5,000 characters) is not a MIG "
     "profile of A100-40GB"), {}),
    ("migsub", ["--dry-run", "--mig", "1g.10gb", "--instances", D5000, "{t}/job.sh"], ("--instances: must be a whole "
     "number of at least 1, or auto; got '999", "(text of 5,000 characters)"), {}),
    ("mig-batch", ["events", "--config", "{t}/site.yaml", "--since", LONG], ("cannot read 'xxx", "accepted: an age "
     "(90s, 10m, 1h, 2d) or a date-time"), {}),
    ("mig-batch", ["simulate", "placement", "--runs", "1", "--gpu", LONG, "--out", "{t}/out"], ("unknown GPU model "
     "'xxx", "known models: A100-40GB"), {}),
    ("mig-batch", ["simulate", "placement", "--runs", "1", "--policies", LONG, "--out", "{t}/out"], ("unknown "
     "placement policy 'xxx", "(text of 5,000 characters); known: ff, rr"), {}),
    ("mig-batch", ["frag", "A30-24GB", "--state", LONG], ("cannot read occupancy 'xxx", "give 4 characters of 0/1"),
     {}),
    ("mig-batch", ["frag", "A30-24GB", "--state", f"1g.6gb@{D5000}"], ("cannot read instance '1g.6gb@999",
     "write PROFILE@START, e.g. 3g.40gb@4"), {}),
    ("mig-batch", ["frag", "A30-24GB", "--state", f"0,{D5000[:4000]}"], ("memory slice(s) [999",
     "(a list of 1 item) out of range 0..3"), {}),
]  # fmt: skip


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
    cause_files(tmp_path)
    return tmp_path


BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # nine lines, 9**9 values
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
A30 = builtin_gpu_dir() / "a30-24gb.yaml"


def sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that takes no room (refused by its size before it is read)."""
    with path.open("wb") as f:
        f.truncate(size)


def cause_files(t: Path) -> None:
    """The files CAUSE_ROWS name."""
    (t / "cfg_binary.yaml").write_bytes(BINARY)
    (t / "cfg_nul.yaml").write_bytes(b"policy: mfi\nnodes: {\x00}\n")
    (t / "cfg_bomb.yaml").write_text(BOMB)
    (t / "cfg_loop.yaml").write_text("nodes: &n {gpu01: *n}\n")
    (t / "cfg_syntax.yaml").write_text("policy: mfi\nnodes: {gpu01: [A100-80GB\n")
    (t / "cfg_dup.yaml").write_text("policy: mfi\nnodes: {gpu01: [A100-80GB]}\npolicy: mfi\n")
    sparse(t / "cfg_big.yaml", MAX_CONFIG_BYTES + 1)
    (t / "cfg_bignum.yaml").write_text(f"poll_interval_s: {D5000}\n")
    (t / "cfg_hex.yaml").write_text(f"retention_days: 0x{'F' * 300}\n")  # math.isfinite() of it: OverflowError
    (t / "cfg_long_policy.yaml").write_text(f"policy: {LONG}\nnodes: {{gpu01: [A100-80GB]}}\n")
    (t / "cfg_long_model.yaml").write_text(f"nodes: {{gpu01: [{LONG}]}}\n")
    (t / "cfg_int_key.yaml").write_text("atomize: {1: 2}\n")
    (t / "cfg_list.yaml").write_text("- policy\n- mfi\n")
    (t / "q_binary.yaml").write_bytes(BINARY)
    (t / "q_bomb.yaml").write_text(BOMB)
    (t / "q_syntax.yaml").write_text("tasks:\n  - {name: a, times: {1: 100}\n")
    (t / "q_dup.yaml").write_text("tasks:\n  - name: a\n    name: b\n    times: {1: 100}\n")
    sparse(t / "q_big.yaml", MAX_QUEUE_BYTES + 1)
    (t / "q_bignum.yaml").write_text(f"tasks:\n  - {{name: a, times: {{1: {D5000}}}}}\n")
    (t / "q_name_list.yaml").write_text("tasks:\n  - {name: [1, 2], times: {1: 100}}\n")
    (t / "q_gpu_number.yaml").write_text("gpu: 5\ntasks:\n  - {name: a, times: {1: 100}}\n")
    (t / "q_size_huge.yaml").write_text("tasks:\n  - {name: a, times: {99999999: 100}}\n")
    for kind, write in {
        "binary": lambda p: p.write_bytes(BINARY), "bomb": lambda p: p.write_text(BOMB),
        "syntax": lambda p: p.write_text("model: X1\nprofiles: [\n"),
        "dup": lambda p: p.write_text("model: X1\nmodel: X2\n"), "big": lambda p: sparse(p, MAX_MODEL_BYTES + 1),
        "long_field": lambda p: p.write_text(A30.read_text().replace("model: A30-24GB", "model: A30-LONG", 1)
                                             .replace("nvml_profile: 1_SLICE\n", f"nvml_profile: {LONG}\n", 1)),
    }.items():  # fmt: skip
        (t / f"gpus_{kind}").mkdir()
        write(t / f"gpus_{kind}" / "bad.yaml")
    pods, nodes = "openb_pod_list_default.csv", "openb_node_list_gpu_node.csv"
    pod_head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time," \
               "scheduled_time\n"  # fmt: skip
    node_text = "sn,cpu_milli,memory_mib,gpu,model\nnode-1,96000,786432,8,A100\n"
    for kind, pod_text in {
        "binary": None, "big": None,
        "bignum": f"{pod_head}pod-1,1000,1024,{LONG.replace('x', '9')},1000,A100,LS,Running,0,100,0\n",
        "short": f"{pod_head}pod-1,1000,1024,1,1000,A100,LS,Running,0,100,0\npod-2,1000\n",
        "wide_field": f"{pod_head}pod-1,1000,1024,1,1000,A100,LS,Running,0,100,\"{'y' * 200_000}\"\n",
    }.items():  # fmt: skip
        folder = t / f"trace_{kind}"
        folder.mkdir()
        (folder / nodes).write_text(node_text)
        if kind == "binary":
            (folder / pods).write_bytes(BINARY)
        elif kind == "big":
            sparse(folder / pods, MAX_TRACE_BYTES + 1)
        else:
            (folder / pods).write_text(pod_text or "")
    for kind, data in {"binary": BINARY, "short": b"prueba,t1,t2\nBackprop,0.4,0.5\nbfs\n"}.items():
        (t / f"rodinia_{kind}").mkdir()
        (t / f"rodinia_{kind}" / "3g_A100.csv").write_bytes(data)
    other = t / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE accounts (name TEXT, balance REAL)")
    db.commit()
    db.close()
    (t / "sqlite_state.yaml").write_text(f"state: {other}\nnodes: {{gpu01: [A100-80GB]}}\n")
    (t / "notes.txt").write_text("a site's notes\n" * 100)
    (t / "text_state.yaml").write_text(f"state: {t}/notes.txt\nnodes: {{gpu01: [A100-80GB]}}\n")


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


@pytest.mark.parametrize(("entry", "argv", "expected", "env"), CAUSE_ROWS,
                         ids=[" ".join([r[0], *r[1]])[:100] for r in CAUSE_ROWS])  # fmt: skip
def test_each_cause_of_bad_input_is_refused_in_every_file_kind(entry, argv, expected, env, files, capsys,
                                                               monkeypatch):  # fmt: skip
    """Issue 48's causes: the message names the file (or option) and what was wrong, and what is accepted."""
    for name in ("MIG_BATCH_CONFIG", "MIG_BATCH_DEBUG", "MIG_BATCH_GPU_DIRS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value.replace("{t}", str(files)))
    monkeypatch.chdir(files)
    code, text = run(entry, [a.replace("{t}", str(files)) for a in argv], capsys)
    assert "Traceback" not in text and INTERNAL not in text, text
    assert code == 2, f"exit status {code}:\n{text}"
    said = [line for line in text.strip().splitlines() if not line.startswith(("usage:", " "))]  # argparse's usage
    assert len(said) == 1 and len(said[0]) < 600, f"not one short line:\n{text}"
    for piece in expected:
        assert piece.replace("{t}", str(files)) in text, text


def test_a_store_that_is_not_ours_is_left_byte_for_byte_and_mode_for_mode(files, capsys):
    """mig-batchd opens its store to write: a file at state: that is another program's must not even be
    chmod-ed, its journal mode changed or our tables added."""
    for name in ("other.db", "notes.txt"):
        path = files / name
        os.chmod(path, 0o644)
        before = path.read_bytes()
        config = files / f"{name}.yaml"
        config.write_text(f"state: {path}\nnodes: {{gpu01: [A100-80GB]}}\n")
        code, text = run("mig-batchd", ["--once", "--config", str(config)], capsys)
        assert code == 2 and "is not a mig_batch store" in text, text
        assert path.read_bytes() == before and stat.S_IMODE(path.stat().st_mode) == 0o644
        assert not [p for p in os.listdir(files) if p.startswith(f"{name}-")]  # no -wal, no -shm


def test_a_new_store_is_marked_as_ours_and_opened_again(tmp_path):
    """The other side of the mark: mig-batchd's own store (new, or an empty file) is accepted again."""
    from mig_batch.state import APPLICATION_ID, Store

    for path in (tmp_path / "new.db", tmp_path / "empty.db"):
        if path.name == "empty.db":
            path.touch()
        Store(path).close()
        assert sqlite3.connect(path).execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        Store(path).close()
        with Store.reading(path) as store:
            assert store.decision("1") is None


def test_an_alias_bomb_is_refused_in_well_under_a_second(tmp_path):
    """The bomb of CAUSE_ROWS took 36-41 s to fail with a MemoryError: now it costs what its lines cost."""
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    started = time.monotonic()
    with pytest.raises(YAMLError, match="alias bomb"):
        load_yaml_file(path, "a test file", 1 << 20)
    assert time.monotonic() - started < 1.0


def test_what_is_accepted_is_read_a_bom_crlf_and_a_pipe(tmp_path):
    """The other side of the refusals: UTF-8 with a byte-order mark and CRLF lines (a file saved on Windows)
    reads, a trace's first column keeps its name, and a config given through a pipe (``--config <(...)``)
    or as /dev/null (no settings) is read, not refused for not being a regular file."""
    from mig_batch.config import load_config
    from mig_batch.sim.traces import read_nodes

    (tmp_path / "nodes.csv").write_bytes(b"\xef\xbb\xbfsn,gpu\r\nnode-1,8\r\nnode-2,0\r\n")
    assert [(n.name, n.gpus) for n in read_nodes(tmp_path / "nodes.csv")] == [("node-1", 8)]
    (tmp_path / "site.yaml").write_bytes(b"\xef\xbb\xbfpolicy: mfi\r\nnodes: {gpu01: [A100-80GB]}\r\n# caf\xc3\xa9\r\n")
    assert load_config(tmp_path / "site.yaml").nodes == {"gpu01": ("A100-80GB",)}
    read, write = os.pipe()
    os.write(write, b"policy: mfi\nnodes: {gpu02: [A30-24GB]}\n")
    os.close(write)
    try:
        assert load_config(f"/dev/fd/{read}").nodes == {"gpu02": ("A30-24GB",)}
    finally:
        os.close(read)
    assert load_config("/dev/null").nodes == {}


def test_shown_cuts_long_values_and_keeps_short_ones():
    assert shown("spread") == "'spread'" and shown(2.7) == "2.7" and shown([1, 2]) == "[1, 2]"
    assert shown(LONG) == f"'{'x' * 27}...{'x' * 28}'... (text of 5,000 characters)"
    assert shown(list(range(1000))).endswith("... (a list of 1,000 items)") and len(shown(list(range(1000)))) < 100
    assert shown(10**5000) == "(a whole number of about 5,000 digits)"
    shared: list = ["x"] * 9
    for _ in range(12):  # 9**13 items, held in 13 lists: printed whole, this would never end
        shared = [shared] * 9
    assert len(shown(shared)) < 100


def test_there_are_at_least_60_rows():
    assert len(ROWS) >= 60
    assert len(CAUSE_ROWS) >= 40


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
