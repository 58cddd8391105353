"""`mig-batch bench controller` on a small burst: every job of each way completes, and the figures it
prints (jobs per second, CPU per job) are measured, not zero."""

import pytest
from harness.slurm_cluster import LocalCluster

from mig_batch.bench.controller import bench_controller, busy_cpu_s

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]


def test_the_burst_completes_each_way_and_is_timed_and_costed():
    before = busy_cpu_s()
    [runs] = bench_controller(jobs=24, gpus_per_node=4, nodes=2, modes=("noop", "mig", "slots"), prompt_slots=8)
    assert busy_cpu_s() > before
    assert [r.mode for r in runs] == ["noop", "mig", "slots"]
    for r in runs:
        assert r.completed == r.jobs == 24, r
        assert 0 < r.submit_s <= r.total_s and r.jobs_per_s > 0 and r.cpu_ms_per_job > 0, r
