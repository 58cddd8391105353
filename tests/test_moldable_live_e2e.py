"""The live batch planner on a real local Slurm (``moldable.planner: auto``): a batch of moldable jobs queued
behind a whole-GPU job is planned together; each job runs in the size, on the GPU and slot its plan gave it,
in the plan's order; and each job that ends before its prediction (every one here: they sleep 1 s against
predictions of 8 s and more) has the rest planned again, sooner.

One node, one A100-80GB (emulated libnvidia-ml); the plans are mig-batchd's ``moldable-plan`` events."""

import itertools
import time

import pytest
from harness.slurm_cluster import LocalCluster, MigTestbed

from mig_batch.state import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]

JOB = """#!/bin/bash
#SBATCH --output={out}/%j.out
{directives}
echo "$SLURM_JOB_ID|$CUDA_VISIBLE_DEVICES|$(date +%s.%N)"
sleep {seconds}
"""


def test_a_batch_of_moldable_jobs_runs_as_planned_and_is_planned_again_when_one_ends_early(tmp_path):
    bed = MigTestbed(tmp_path, nodes={"n1": ["A100-80GB"]}, moldable={"planner": "auto"})
    with bed:
        out = tmp_path / "out"
        out.mkdir()

        def submit(name, directives, seconds):
            script = tmp_path / f"{name}.sh"
            script.write_text(JOB.format(out=out, directives=directives, seconds=seconds))
            return bed.migsub(str(script)).stdout.strip()

        blocker = submit("blocker", "#SBATCH --time=1\n#MIG --mig 7g.80gb", 4)
        deadline = time.monotonic() + 60
        while bed.cluster.run("squeue", "-h", "-j", blocker, "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, bed.cluster.run("squeue").stdout
            time.sleep(0.2)
        # seconds per size as their owners predict them; each job ends after 1 s
        sizes = ["1g=60,3g=15,7g=8", "1g=50,3g=14,7g=9", "1g=70,3g=16,7g=8", "1g=40,3g=12,7g=10"]
        jobs = [submit(f"mold{i}", f"#MIG --moldable {s}", 1) for i, s in enumerate(sizes)]
        store = Store(bed.store_path)
        deadline = time.monotonic() + 120
        while any((d := store.decision(j)) is None or d.state != "ended" for j in jobs):
            assert time.monotonic() < deadline, (bed.cluster.run("squeue").stdout, store.events(kind="moldable-plan"))
            time.sleep(0.3)
        plans = store.events(kind="moldable-plan")
        assert len(plans) >= 2 and all(p["planner"] == "auto" for p in plans), plans
        # every job ran as the plan it was started from placed it (size, GPU, slot), marked as the planner's
        started_from = {}
        for job in jobs:
            decided = store.events(job=job, kind="decided")[0]
            plan = [p for p in plans if p["time"] <= decided["time"]][-1]
            (step,) = [s for s in plan["steps"] if s["job"] == job]
            assert step["now"], (job, step, plan["time"])
            d = store.decision(job)
            assert (d.profile, d.gpu, d.start, d.policy) == (step["profile"], step["gpu"], step["slot"],
                                                             "moldable-auto"), (d, step)  # fmt: skip
            started_from[job] = plan
        # in the plan's order: a job planned to start later never began before one planned earlier (same plan)
        began = {}
        for job in jobs:
            line = next(x for x in (out / f"{job}.out").read_text().splitlines() if x.startswith(f"{job}|"))
            began[job] = float(line.split("|")[2])
        first_plan = plans[0]
        order = sorted((s["start"], s["job"]) for s in first_plan["steps"])
        for (start_a, a), (start_b, b) in itertools.pairwise(order):
            if start_b > start_a + 1.0:
                assert began[a] <= began[b], (order, began)
        # planned again, sooner: some job's start moved earlier once a job ended before its prediction
        moved = [(s["job"], s["start"], later["time"]) for p, later in itertools.pairwise(plans)
                 for s in later["steps"] for t in p["steps"] if s["job"] == t["job"] and s["start"] < t["start"] - 2]
        assert moved, plans
        assert store.instances() == []
