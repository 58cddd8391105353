"""``mig-batch bench controller``: a burst of jobs on the real local Slurm, placed by the controller.

The burst is submitted (held by job_submit.lua) before the controller starts; then controller passes
run in this process until every job is placed. Reported: jobs placed per second end to end (Slurm
commands included), the pass (decision-loop) times, and the placement decision alone per job.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mig_batch.config import load_config
from mig_batch.controller.daemon import Controller
from mig_batch.slurm.commands import SlurmCli
from mig_batch.slurm.local_cluster import MigTestbed
from mig_batch.state import Store


@dataclass(frozen=True)
class ControllerBench:
    jobs: int
    gpus: int
    submit_s: float
    place_s: float
    passes: int
    pass_ms_p50: float
    pass_ms_max: float
    decide_us_p50: float
    placed: int

    @property
    def jobs_per_s(self) -> float:
        return self.placed / self.place_s if self.place_s else 0.0


def bench_controller(jobs: int = 1000, gpus_per_node: int = 48, nodes: int = 3, policy: str = "mfi") -> ControllerBench:
    root = Path(tempfile.mkdtemp(prefix="mig-batch-bench-"))
    bed = MigTestbed(root, nodes={f"n{i + 1}": ["A100-80GB"] * gpus_per_node for i in range(nodes)}, policy=policy)
    bed.start()
    try:
        bed.stop_controller()  # this process drives the passes, to time them
        script = root / "job.sh"
        script.write_text("#!/bin/sh\ntrue\n")
        t0 = time.perf_counter()
        for _ in range(jobs):
            bed.cluster.run("sbatch", "--parsable", "--gres=mig:1g.10gb", "-o", "/dev/null", str(script))
        submit_s = time.perf_counter() - t0
        config = load_config(bed.config_path)
        controller = Controller(config, Store(config.state), SlurmCli(env=bed.env()))
        decide_s: list[float] = []
        original = controller.policy.decide

        def timed(view, request):
            d0 = time.perf_counter()
            out = original(view, request)
            decide_s.append(time.perf_counter() - d0)
            return out

        controller.policy.decide = timed  # type: ignore[method-assign]
        passes, placed = [], 0
        t0 = time.perf_counter()
        while placed < jobs and time.perf_counter() - t0 < 600:
            stats = controller.step()
            passes.append(stats.seconds)
            placed += stats.placed
            if not stats.placed:
                time.sleep(0.1)
        place_s = time.perf_counter() - t0
        return ControllerBench(jobs, nodes * gpus_per_node, submit_s, place_s, len(passes),
                               statistics.median(passes) * 1e3, max(passes) * 1e3,
                               statistics.median(decide_s) * 1e6 if decide_s else 0.0, placed)  # fmt: skip
    finally:
        bed.cluster.run("scancel", "--full", "-u", "root", check=False)
        bed.stop()
