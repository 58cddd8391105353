"""Jobs over several MIG instances (Flex-MIG's one-to-many) end to end on the real HTCondor pool: one node with
one A100-80GB (emulated libnvidia-ml), migsub and a plain submit file with ``+MigRequest = "1g.10gb:2"``, the
schedd's policy, mig-batchd's multi-instance placement, the job wrapper and the node's root agent (all N
instances or none), one process per rank bound to its own instance by the wrapper's ``--rank`` mode, and
every instance destroyed when the job leaves its slot. One testbed for the module
(tests/harness/htcondor_testbed.py).

Each rank opens its instance's capability device nodes as CUDA would (the emulated node's ``cuda-open``): the
agent's fence gave all N to the job's owner."""

import re
import time

import pytest
from harness.htcondor_pool import LocalPool

from mig_batch.gpu import nvml_emu
from mig_batch.state import Store

WHY_NOT = LocalPool.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

NODE = "nodea"
# One process per instance, as mpirun or torchrun would start them: each gets its local rank and runs
# through "$MIG_BATCH_BIND" --rank, which binds it to that rank's instance.
RANKS = """#!/bin/sh
{directives}
export MIG_BATCH_NVML_EMU_DIR={gpu}
echo "job|$CUDA_VISIBLE_DEVICES|$MIG_BATCH_INSTANCES|$MIG_BATCH_SPOTS"
r=0
while [ $r -lt "${{MIG_BATCH_INSTANCE_COUNT:-1}}" ]; do
  LOCAL_RANK=$r "$MIG_BATCH_BIND" --rank /bin/sh -c 'echo "rank|$MIG_BATCH_RANK|$CUDA_VISIBLE_DEVICES|\
$MIG_BATCH_INSTANCE|$(date +%s.%N)"; sh {gpu}/cuda-open >/dev/null; echo "open|$MIG_BATCH_RANK|$?"; \
sleep {seconds}; echo "done|$MIG_BATCH_RANK|$(date +%s.%N)"' &
  r=$((r + 1))
done
wait
echo "end"
"""
PLAIN = """executable = {script}
output = {name}.out
error = {name}.err
should_transfer_files = NO
+MigRequest = "{request}"
queue
"""


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    from harness.htcondor_testbed import HTCondorTestbed

    bed = HTCondorTestbed(tmp_path_factory.mktemp("htcondor-flex"), nodes={NODE: ["A100-80GB"]})
    started = time.monotonic()
    try:
        bed.start()
        print(f"\ntestbed up in {time.monotonic() - started:.1f}s: pool {bed.pool.timings}")
        yield bed
    finally:
        bed.stop()


def script(bed, name, directives, seconds):
    path = bed.pool.shared / f"{name}.sh"
    path.write_text(RANKS.format(directives=directives, gpu=bed.gpu_dir(NODE), seconds=seconds))
    path.chmod(0o755)
    return path


def migsub(bed, path, *args):
    out = bed.migsub(path, *args).stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+\.0", out), out
    return out


def plain_submit(bed, name, request, path=None, check=True):
    """condor_submit of a plain submit file by the job's owner: the job id, or the finished process."""
    (bed.pool.shared / f"{name}.sub").write_text(PLAIN.format(script=path, name=name, request=request))
    proc = bed.pool.run("condor_submit", f"{name}.sub", user=bed.pool.user, cwd=str(bed.pool.shared), check=check)
    if not check:
        return proc
    return re.search(r"submitted to cluster (\d+)", proc.stdout).group(1) + ".0"


def output_of(bed, job, name):
    """The job's output: migsub names it <script>.<cluster>.out, the plain submit file <name>.out."""
    for path in (bed.pool.shared / f"{name}.sh.{job.split('.')[0]}.out", bed.pool.shared / f"{name}.out"):
        if path.exists():
            return path.read_text()
    return ""


def ranks_of(text):
    """rank -> (CUDA_VISIBLE_DEVICES, MIG_BATCH_INSTANCE, began, cuda-open's status, ended); the job's own line."""
    rows = [line.split("|") for line in text.splitlines()]
    began = {int(r[1]): (r[2], r[3], float(r[4])) for r in rows if r[0] == "rank"}
    opened = {int(r[1]): int(r[2]) for r in rows if r[0] == "open"}
    ended = {int(r[1]): float(r[2]) for r in rows if r[0] == "done"}
    job = next(r for r in rows if r[0] == "job")
    return {r: (*began[r], opened.get(r), ended.get(r)) for r in began}, job


def decided(bed, job):
    with Store.reading(bed.store_path) as store:
        return store.decision(job)


def wait_for(what, timeout=90.0, pause=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(pause)
    raise AssertionError(f"not within {timeout}s: {what.__doc__ or what}")


def test_a_four_a_two_and_a_one_instance_job_side_by_side_each_rank_on_its_own_decided_instance(bed):
    four = migsub(bed, script(bed, "four", "#MIG --mig 1g.10gb --instances 4", 12))
    two = plain_submit(bed, "two", "1g.10gb:2", script(bed, "two", "", 12))  # the count in +MigRequest
    one = migsub(bed, script(bed, "one", "#MIG --mig 1g.10gb", 12))
    names = {four: "four", two: "two", one: "one"}
    counts = {four: 4, two: 2, one: 1}

    def all_ranks_began():
        return all(len(ranks_of(output_of(bed, j, n))[0]) == counts[j] if "job|" in output_of(bed, j, n) else False
                   for j, n in names.items())  # fmt: skip

    wait_for(all_ranks_began, 120)
    # the A100's seven 1g.10gb slots are taken: another 4-instance job waits, unplaced, and its owner reads why
    late = migsub(bed, script(bed, "late", "#MIG --mig 1g.10gb --instances 4", 1))
    names[late], counts[late] = "late", 4
    tag = wait_for(lambda: "waits=" in (t := bed.pool.run("condor_q", late, "-af", "MigBatchTag",
                                                           user=bed.pool.user).stdout) and t, 30)  # fmt: skip
    assert decided(bed, late) is None
    assert "no node has room for 4 x 1g.10gb now" in tag and "nodea has 0 free" in tag, tag
    wait_for(lambda: all((d := decided(bed, j)) is not None and d.state == "ended" for j in names), 180)

    lives = {uuid: life for life in nvml_emu.lifetimes(bed.gpu_dir(NODE)) for uuid in life.mig_uuids}
    seen, spans = [], []
    with Store.reading(bed.store_path) as store:
        for job, n in counts.items():
            text = output_of(bed, job, names[job])
            assert text.rstrip().endswith("end"), f"job {job}: {text}"
            ranks, line = ranks_of(text)
            assert sorted(ranks) == list(range(n)), f"job {job}: ranks {sorted(ranks)}"
            d = store.decision(job)
            spots = store.spots(job) or [(d.gpu, d.profile, d.start)]
            assert len(spots) == n and d.node == NODE
            for rank, (cvd, instance, began, opened, ended) in ranks.items():
                assert cvd.startswith("MIG-") and "," not in cvd, f"job {job} rank {rank}: {cvd!r}"
                life = lives[cvd]
                gpu, profile, start = spots[rank]
                assert (life.node, life.gpu, life.profile, life.start) == (NODE, gpu, profile, start), (job, rank)
                assert instance == f"{NODE}/{gpu}/{profile}@{start}", (job, rank, instance)
                assert opened == 0, f"job {job} rank {rank} could not open its own instance"
                assert life.created <= began and ended <= life.destroyed, f"job {job} rank {rank} outside its instance"
                seen.append(cvd)
                if job != late:
                    spans.append((began, ended))
            assert line[1] == ranks[0][0]  # the job's own process: rank 0's instance
            if n > 1:  # every UUID and every spot, in rank order
                assert line[2].split(",") == [ranks[r][0] for r in range(n)]
                assert line[3].split(",") == [ranks[r][1] for r in range(n)]
            assert store.count_decisions(job) == 1
        assert store.instances() == []
    assert len(seen) == len(set(seen)) == 11, "every rank its own instance"
    assert max(b for b, _ in spans) < min(e for _, e in spans), "the three jobs did not run side by side"
    # no leak: every instance destroyed, nothing left on the GPU
    for life in nvml_emu.lifetimes(bed.gpu_dir(NODE)):
        assert life.destroyed is not None, f"{life} was never destroyed"
    wait_for(lambda: nvml_emu.live_instances(bed.gpu_dir(NODE)) == [], 30)


def test_counts_the_agent_cannot_serve_are_refused_at_submission(bed):
    path = script(bed, "refused", "", 0)
    for request, says in (("1g.10gb:0", "give at least one instance"),
                          ("1g.10gb:", "give at least one instance"),
                          ("9g.90gb:2", "fits no MIG profile of A100-80GB")):  # fmt: skip
        proc = plain_submit(bed, "refused", request, path, check=False)
        assert proc.returncode != 0 and says in proc.stdout + proc.stderr, (request, proc.stdout + proc.stderr)
    proc = bed.migsub(script(bed, "eight", "#MIG --mig 1g.10gb --instances 8", 0), check=False)
    assert proc.returncode == 2 and "no node of this site holds 8 instances of 1g.10gb; the most is 7" in proc.stderr
    # the schedd has no inventory: a count no node holds is taken, and waits unpinned with the controller's reason
    eight = plain_submit(bed, "eight", "1g.10gb:8", path)
    tag = wait_for(lambda: "waits=" in (t := bed.pool.run("condor_q", eight, "-af", "MigBatchTag",
                                                           user=bed.pool.user).stdout) and t, 30)  # fmt: skip
    print(f"\n{eight}: {tag.strip()}")
    assert decided(bed, eight) is None and "8 x 1g.10gb" in tag, tag
    assert bed.pool.run("condor_q", eight, "-af", "MigBatchNode").stdout.strip() == "undefined"
    bed.pool.run("condor_rm", eight, user=bed.pool.user)
    assert nvml_emu.live_instances(bed.gpu_dir(NODE)) == []
