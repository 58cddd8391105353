"""Jobs over several MIG instances (Flex-MIG's one-to-many) end to end on a real local Slurm: one node with
one A100-80GB (emulated libnvidia-ml), migsub and plain sbatch, job_submit.lua, mig-batchd, the Prolog
(all N instances), the TaskProlog (one instance per task by SLURM_LOCALID), srun and torchrun, the DDP example over
gloo, and the Epilog (all N destroyed)."""

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
from harness.slurm_cluster import LocalCluster, MigTestbed

from mig_batch.gpu import nvml_emu
from mig_batch.state import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "flex_ddp_gloo.py"
HAVE_TORCH = importlib.util.find_spec("torch") is not None

RANKS = """#!/bin/bash
#SBATCH --output={out}/%j.out
{directives}
echo "batch|$CUDA_VISIBLE_DEVICES|$MIG_BATCH_INSTANCES"
srun bash -c 'echo "rank|$SLURM_PROCID|$SLURM_LOCALID|$CUDA_VISIBLE_DEVICES|$(date +%s.%N)"; sleep {seconds}; \
echo "done|$SLURM_PROCID|$(date +%s.%N)"'
{ddp}
echo "end"
"""


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("flexbed")
    testbed = MigTestbed(root, nodes={"n1": ["A100-80GB"]})
    testbed.start()
    (root / "out").mkdir()
    yield testbed
    testbed.stop()


def script(bed, name, directives, seconds, ddp=""):
    """``ddp``: run the DDP example with "srun" (one task per rank) or "torchrun" (inside the batch step)."""
    launch = {"srun": f"srun {sys.executable} {EXAMPLE}", "torchrun": f"{sys.executable} -m torch.distributed.run "
              f'--standalone --nproc-per-node="$MIG_BATCH_INSTANCE_COUNT" {EXAMPLE}'}  # fmt: skip
    run_ddp = launch[ddp] if ddp and HAVE_TORCH else ""
    path = bed.root / f"{name}.sh"
    path.write_text(RANKS.format(out=bed.root / "out", directives=directives, seconds=seconds, ddp=run_ddp))
    return path


def squeue_state(bed, job):
    return bed.cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()


def wait_done(bed, jobs, timeout=240):
    deadline = time.monotonic() + timeout
    store = Store(bed.store_path)
    while time.monotonic() < deadline:
        queued = bed.cluster.run("squeue", "-h", "-o", "%i").stdout.split()
        if not set(queued) & set(jobs) and all(store.decision(j).state == "ended" for j in jobs):
            return
        time.sleep(0.5)
    raise AssertionError(f"jobs still queued after {timeout}s: {bed.cluster.run('squeue').stdout}")


def ranks_of(bed, job):
    """rank -> (local id, CUDA_VISIBLE_DEVICES, began, ended), the batch step's line, the DDP line."""
    lines = (bed.root / "out" / f"{job}.out").read_text().splitlines()
    began = {int(p[1]): (int(p[2]), p[3], float(p[4])) for p in (line.split("|") for line in lines)
             if p[0] == "rank"}  # fmt: skip
    ended = {int(p[1]): float(p[2]) for p in (line.split("|") for line in lines) if p[0] == "done"}
    batch = next(line for line in lines if line.startswith("batch|")).split("|")
    ddp = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("flex-ddp: ")]
    ranks = {r: (*began[r], ended[r]) for r in began}
    return ranks, batch, ddp


def test_three_jobs_over_seven_instances_side_by_side_then_a_held_one(bed):
    four = bed.migsub(str(script(bed, "four", "#MIG --mig 1g.10gb --instances 4", 12, ddp="srun"))).stdout.strip()
    two = bed.cluster.run("sbatch", "--parsable", "--gres=mig:1g.10gb:2",  # plain sbatch through job_submit.lua
                          str(script(bed, "two", "", 12, ddp="torchrun"))).stdout.strip()  # fmt: skip
    one = bed.migsub(str(script(bed, "one", "#MIG --mig 1g.10gb", 12))).stdout.strip()
    deadline = time.monotonic() + 60
    while not all(squeue_state(bed, j) == "RUNNING" for j in (four, two, one)):
        assert time.monotonic() < deadline, bed.cluster.run("squeue").stdout
        time.sleep(0.5)
    # the node's seven 1g.10gb slots are taken: another 4-instance job waits, held, with the reason
    late = bed.migsub(str(script(bed, "late", "#MIG --mig 1g.10gb --instances 4", 1))).stdout.strip()
    time.sleep(3)
    assert squeue_state(bed, late) == "PENDING"
    store = Store(bed.store_path)
    assert store.decision(late) is None
    reasons = [e["reason"] for e in store.events(job=late, kind="waiting")]
    assert reasons and "no node has room for 4 x 1g.10gb now" in reasons[-1] and "n1 has 0 free" in reasons[-1]

    wait_done(bed, [four, two, one, late])
    lives = {uuid: life for life in nvml_emu.lifetimes(bed.gpu_dir("n1")) for uuid in life.mig_uuids}
    seen, spans = [], []
    for job, n in ((four, 4), (two, 2), (one, 1), (late, 4)):
        ranks, batch, ddp = ranks_of(bed, job)
        assert sorted(ranks) == list(range(n)), f"job {job}: ranks {sorted(ranks)}"
        spots = store.spots(job) or [(store.decision(job).gpu, store.decision(job).profile, store.decision(job).start)]
        assert len(spots) == n
        for rank, (local, cvd, began, ended) in ranks.items():
            assert local == rank and cvd.startswith("MIG-") and "," not in cvd, f"job {job} rank {rank}: {cvd!r}"
            life = lives[cvd]
            assert (life.node, life.gpu, life.start) == ("n1", spots[rank][0], spots[rank][2]), f"job {job} rank {rank}"
            assert life.created <= began and ended <= life.destroyed
            seen.append(cvd)
            if job != late:
                spans.append((began, ended))
        if n > 1:
            assert batch[2].split(",") == [ranks[r][1] for r in range(n)]  # MIG_BATCH_INSTANCES in rank order
        assert batch[1] == ranks[0][1]  # the batch step has rank 0's instance
        if job in (four, two) and HAVE_TORCH:
            assert len(ddp) == 1, f"job {job} printed no DDP result"
            assert ddp[0]["world"] == n and ddp[0]["distinct"] and ddp[0]["one_mig_each"] and ddp[0]["equal"]
            assert sorted(ddp[0]["uuids"]) == sorted(r[1] for r in ranks.values())
    assert len(seen) == len(set(seen)) == 11  # every rank its own instance
    assert max(b for b, _ in spans) < min(e for _, e in spans), "the three jobs did not run side by side"
    for life in nvml_emu.lifetimes(bed.gpu_dir("n1")):
        assert life.destroyed is not None, f"{life} was never destroyed"
    assert nvml_emu.live_instances(bed.gpu_dir("n1")) == [] and store.instances() == []
    states = bed.cluster.node_states()
    assert all(s in ("idle", "mixed", "allocated", "planned") for s in states.values()), states
    assert "drain" not in (bed.root / "log" / "slurmctld.log").read_text().lower()


def test_impossible_and_contradictory_counts_are_refused_at_submission(bed):
    proc = bed.migsub(str(script(bed, "eight", "#MIG --mig 1g.10gb --instances 8", 1)), check=False)
    assert proc.returncode == 2 and "no node of this site holds 8 instances of 1g.10gb; the most is 7" in proc.stderr
    proc = bed.cluster.run("sbatch", "--gres=mig:1g.10gb:8", "--wrap", "true", check=False)
    assert proc.returncode != 0 and "no node of this site holds 8 instances of 1g.10gb; the most is 7" in proc.stderr
    proc = bed.cluster.run("sbatch", "--gres=mig:1g.10gb:0", "--wrap", "true", check=False)
    assert proc.returncode != 0 and "at least one instance" in proc.stderr
    proc = bed.cluster.run("sbatch", "-n", "3", "--gres=mig:1g.10gb:4", "--wrap", "true", check=False)
    assert proc.returncode != 0 and "--ntasks=3 contradicts 4 instances" in proc.stderr
    proc = bed.migsub(str(script(bed, "three", "#SBATCH --ntasks=3\n#MIG --mig 1g.10gb --instances 4", 1)),
                      check=False)  # fmt: skip
    assert proc.returncode == 2 and "contradicts --instances 4" in proc.stderr
    proc = bed.migsub(str(script(bed, "zero", "#MIG --mig 1g.10gb --instances 0", 1)), check=False)
    assert proc.returncode == 2 and "at least 1" in proc.stderr
