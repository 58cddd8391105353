"""Start-up time of the command-line tools against a bare ``python -c pass``: median wall time of fresh
processes, and the ratio. Light commands must not pay for OR-Tools, matplotlib or the simulator."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StartupTime:
    command: str
    median_s: float
    min_s: float
    ratio: float  # median over python -c pass's median


def _median_wall(argv: list[str], runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        begin = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - begin)
    return statistics.median(times), min(times)


def bench_startup(runs: int = 7) -> list[StartupTime]:
    """Each command ``runs`` times in a fresh interpreter (this one), after one warm-up run each."""
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="mig-batch-startup-") as folder:
        script = Path(folder) / "job.sh"
        script.write_text("#!/bin/sh\ntrue\n")
        commands = {
            "python -c pass": [python, "-c", "pass"],
            "mig-batch --help": [python, "-m", "mig_batch.cli.main", "--help"],
            "mig-batch gpus": [python, "-m", "mig_batch.cli.main", "gpus"],
            "mig-batch translate --mem 18G": [python, "-m", "mig_batch.cli.main", "translate", "--mem", "18G"],
            "migsub --dry-run --gpu-mem 18G": [python, "-m", "mig_batch.cli.migsub", "--dry-run", "--gpu-mem", "18G",
                                               str(script)],
        }
        # warm the file cache once, and write the .pyc files an installed package has (pip compiles them):
        # under PYTHONDONTWRITEBYTECODE every run would compile the edited modules again (~1 ms each)
        writes_bytecode = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        for argv in commands.values():
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=writes_bytecode)
        measured = {name: _median_wall(argv, runs) for name, argv in commands.items()}
    base = measured["python -c pass"][0]
    return [StartupTime(name, median, least, median / base) for name, (median, least) in measured.items()]
