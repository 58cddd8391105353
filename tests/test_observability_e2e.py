"""Watching mig_batch on the cluster in a box: mig-batchd's metrics scraped during a burst show the jobs,
slices and passes, and the node agents' textfiles their hooks; slurmctld stopped for 60 s costs mig-batchd a
few log lines, ``mig-batch status`` marks the nodes stale, the metrics keep the last good pass; slurmctld back,
mig-batchd recovers and places again."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from harness.slurm_cluster import NODE_PATHS, LocalCluster, MigTestbed

from mig_batch.state import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]

JOB = "#!/bin/bash\n#SBATCH --output={out}/%j.out\nsleep {seconds}\n"
OUTAGE_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("observability")
    testbed = MigTestbed(root, nodes={"n1": ["A100-80GB"], "n2": ["A100-80GB"]}, reconcile_interval_s=3)
    testbed.start()
    (root / "out").mkdir()
    # the metrics: mig-batchd's endpoint, each agent's textfile in its node's /run/mig-batch
    testbed.port = free_port()
    config = yaml.safe_load(testbed.controller_config.read_text())
    testbed.controller_config.write_text(yaml.safe_dump({**config, "metrics_listen": f"127.0.0.1:{testbed.port}"}))
    nodes_config = yaml.safe_load(testbed.config_path.read_text())
    testbed.config_path.write_text(yaml.safe_dump({**nodes_config,
                                                   "metrics_textfile": f"{NODE_PATHS[1]}/mig_batch.prom"}))
    testbed.stop_controller()
    testbed.start_controller()
    for node in testbed.nodes:
        testbed.stop_agent(node)
        testbed.start_agent(node)
    yield testbed
    testbed.stop()


def scrape(bed) -> dict[str, float]:
    """Every sample, by its name and labels as written."""
    with urllib.request.urlopen(f"http://127.0.0.1:{bed.port}/metrics", timeout=10) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    assert text.endswith("# EOF\n")
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}  # fmt: skip


def total(samples: dict[str, float], name: str, having: str = "") -> float:
    return sum(v for k, v in samples.items() if k.split("{")[0] == name and having in k)


def status(bed) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "mig_batch.cli.main", "status", "--json", "--config",
                           str(bed.controller_config)], env=bed.env(), capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def submit(bed, n, seconds):
    script = bed.root / f"job-{seconds}.sh"
    script.write_text(JOB.format(out=bed.root / "out", seconds=seconds))
    return [bed.cluster.run("sbatch", "--parsable", "--gres=mig:1g.10gb", str(script)).stdout.strip()
            for _ in range(n)]  # fmt: skip


def wait_ended(bed, jobs, timeout=180):
    store = Store(bed.store_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = set(bed.cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split())
        if not queued & set(jobs) and all((d := store.decision(j)) is not None and d.state == "ended" for j in jobs):
            return
        time.sleep(1)
    raise AssertionError(f"jobs not ended after {timeout} s: {bed.cluster.run('squeue', check=False).stdout}")


def test_metrics_during_a_burst_show_the_jobs_slices_and_passes(bed):
    before = scrape(bed)
    jobs = submit(bed, 30, seconds=3)  # 14 instances fit at once (2 x 7 1g.10gb): the rest wait
    seen = {"waiting": 0.0, "used": 0.0, "running": 0.0}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(seen.values()):
        s = scrape(bed)
        seen["waiting"] = max(seen["waiting"], total(s, "mig_batch_jobs", 'state="held"') +
                              total(s, "mig_batch_jobs", 'state="pending"'))  # fmt: skip
        seen["used"] = max(seen["used"], total(s, "mig_batch_slices", 'state="used"'))
        seen["running"] = max(seen["running"], total(s, "mig_batch_jobs", 'state="running"'))
        time.sleep(0.3)
    assert all(seen.values()), seen
    assert seen["used"] <= 16 and seen["running"] <= 14
    wait_ended(bed, jobs)
    time.sleep(2)  # a pass after the last end; the counts are refreshed each second
    after = scrape(bed)
    print("burst metrics:", seen, {k: v for k, v in after.items() if "bucket" not in k})
    assert total(after, "mig_batch_decisions_total") - total(before, "mig_batch_decisions_total") >= 30
    assert total(after, "mig_batch_instances_created_total") - total(before, "mig_batch_instances_created_total") >= 30
    ok = 'result="ok"'
    assert total(after, "mig_batch_passes_total", ok) > total(before, "mig_batch_passes_total", ok)
    assert total(after, "mig_batch_pass_duration_seconds_count") > 0
    assert total(after, "mig_batch_slices", 'state="used"') == 0
    assert total(after, "mig_batch_slices", 'state="free"') == 16
    assert time.time() - after["mig_batch_last_good_pass_timestamp_seconds"] < 5
    # each agent's textfile: its prologs and epilogs, written within TEXTFILE_EVERY_S
    time.sleep(6)
    made = 0.0
    for node in bed.nodes:
        text = (bed.node_dir(node) / "run" / "mig_batch.prom").read_text()
        assert "# TYPE mig_batch_agent_hooks_total counter" in text
        lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        made += sum(float(v) for k, v in lines.items() if k.startswith("mig_batch_agent_hooks_total") and
                    'hook="prolog"' in k and 'outcome="made"' in k)  # fmt: skip
        assert float(lines[f'mig_batch_agent_reconciles_total{{node="{node}"}}']) >= 1
    assert made >= 30


def test_slurmctld_stopped_for_a_minute_costs_few_lines_marks_nodes_stale_and_recovers(bed):
    log = bed.root / "log" / "mig-batchd.log"
    conf = str(bed.cluster.conf)
    assert all(g["node_state"] == "fresh" for g in status(bed))
    last_good = scrape(bed)["mig_batch_last_good_pass_timestamp_seconds"]
    lines_before = len(log.read_text(errors="replace").splitlines())
    stopping = time.time()
    bed.cluster._stop("slurmctld")
    stopped = time.time()
    try:
        time.sleep(OUTAGE_S / 2)
        during = status(bed)
        s = scrape(bed)
        time.sleep(max(0.0, OUTAGE_S - (time.time() - stopped)))
    finally:
        bed.cluster._spawn("slurmctld", ["slurmctld", "-D", "-f", conf])
    bed.cluster._wait(lambda: "UP" in bed.cluster.run("scontrol", "ping", check=False).stdout, "slurmctld")
    restarted = time.time()
    outage_lines = log.read_text(errors="replace").splitlines()[lines_before:]
    print(f"mig-batchd's log during the {time.time() - stopped:.0f} s outage ({len(outage_lines)} lines):",
          *outage_lines, sep="\n  ")  # fmt: skip
    print("status during the outage:", [(g["node"], g["node_state"], g["free_slices"]) for g in during])
    print("metrics during the outage:", {k: v for k, v in s.items() if k.startswith(("mig_batch_pass",
          "mig_batch_last", "mig_batch_batch", "mig_batch_failing", "mig_batch_next"))})  # fmt: skip
    assert {g["node_state"] for g in during} == {"stale"} and all(g["free_slices"] is None for g in during)
    assert during[0]["failing_since"] is not None and during[0]["error"]
    # a failing Slurm command may take seconds to give up: a few passes in 30 s, each wait twice the last
    assert s["mig_batch_batch_system_up"] == 0 and s["mig_batch_failing_passes"] >= 1
    assert stopping - 2 <= s["mig_batch_last_good_pass_timestamp_seconds"] <= stopped + 1
    assert s["mig_batch_last_good_pass_timestamp_seconds"] >= last_good
    assert s["mig_batch_next_pass_delay_seconds"] >= 2 * 0.2 * s["mig_batch_failing_passes"]
    # mig-batchd's own: the line when Slurm stopped answering (and "back after" if a pass already got through);
    # the Slurm adapter adds one when it turns from libslurm to Slurm's commands for 60 s (slurm/commands.py)
    ours = [line for line in outage_lines if " mig-batchd " in line]
    assert 1 <= len(ours) <= 2 and len(outage_lines) <= 4, outage_lines
    assert "does not answer" in ours[0] and "Unable to contact" in ours[0]
    # back: within the backoff's cap a pass succeeds; jobs are placed again
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "back after" not in log.read_text(errors="replace"):
        time.sleep(1)
    recovered = time.time()
    print(f"recovered {recovered - restarted:.0f} s after slurmctld answered again")
    events = Store(bed.store_path).events(since=stopped - 1)
    kinds = [e["kind"] for e in events]
    assert kinds.count("batch-down") == 1 and kinds.count("batch-back") == 1, kinds
    jobs = submit(bed, 3, seconds=1)
    wait_ended(bed, jobs, timeout=90)
    assert {g["node_state"] for g in status(bed)} == {"fresh"}
    s = scrape(bed)
    assert s["mig_batch_batch_system_up"] == 1 and s["mig_batch_last_good_pass_timestamp_seconds"] > restarted
    events = subprocess.run([sys.executable, "-m", "mig_batch.cli.main", "events", "--config",
                             str(bed.controller_config), "--kind", "batch-back"], env=bed.env(),
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert events.returncode == 0 and "batch-back" in events.stdout, events
