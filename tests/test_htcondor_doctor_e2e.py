"""``mig-batch doctor`` on a real HTCondor pool (tests/harness/htcondor_testbed.py): the controller's checks
(the bindings and daemons with their versions, the schedd's policy as the schedd reports it, mig-batchd's
identity a queue superuser, the store) and a node's (its startd, job wrapper, agent and wrapper socket, GPUs)
pass on a pool set up as docs/htcondor.md says; a node whose agent is down fails with what to fix."""

import json
import subprocess
import sys
import time

import pytest
from harness.htcondor_pool import LocalPool

WHY_NOT = LocalPool.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    from harness.htcondor_testbed import HTCondorTestbed

    bed = HTCondorTestbed(tmp_path_factory.mktemp("htcondor-doctor"))
    try:
        bed.start()
        yield bed
    finally:
        bed.stop()


def doctor(bed, *args, node=None):
    env = {**bed.pool.client_env(bed.pool.controller), **(bed.gpu_env(node) if node else {})}
    env.pop("CONDOR_CONFIG", None)  # doctor reads the site config's htcondor_config
    proc = subprocess.run([sys.executable, "-m", "mig_batch.cli.main", "doctor", "--config", str(bed.config_path),
                           "--json", *args, *(["--role", "node", "--node", node] if node else [])],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)}


def test_the_controllers_checks_pass_and_name_the_versions_and_identity(bed):
    deadline = time.monotonic() + 30
    while not bed.store_path.exists() and time.monotonic() < deadline:  # mig-batchd makes it at start
        time.sleep(0.5)
    code, checks = doctor(bed, "--role", "controller")
    print(json.dumps(checks, indent=1))
    assert code == 0, checks
    assert list(checks) == ["config", "htcondor", "schedd policy", "identity", "store", "passes"]
    assert "bindings 25." in checks["htcondor"]["detail"] or "bindings 24." in checks["htcondor"]["detail"]
    assert "schedd " in checks["htcondor"]["detail"]
    assert f"{bed.pool.controller}@" in checks["identity"]["detail"]


def test_a_nodes_checks_pass_and_fail_with_a_fix_when_its_agent_is_down(bed):
    deadline = time.monotonic() + 30  # the startd cron publishes the agent's file every 5 s
    while True:
        code, checks = doctor(bed, node="nodea")
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    print(json.dumps(checks, indent=1))
    assert code == 0, checks
    for name in ("startd", "job wrapper", "agent", "wrapper socket", "gpu backend", "mig mode"):
        assert checks[name]["ok"], checks[name]
    assert "nodea.sock" in checks["job wrapper"]["detail"]
    bed.stop_agent("nodeb")
    code, checks = doctor(bed, node="nodeb")
    assert code == 1
    assert not checks["agent"]["ok"] and not checks["wrapper socket"]["ok"]
    assert "mig-batch-htcondor-agent" in checks["wrapper socket"]["fix"]
    assert checks["job wrapper"]["ok"] and checks["schedd policy"]["ok"]
