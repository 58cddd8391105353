"""``mig-batch doctor`` for both batch systems: the HTCondor checks (schedd policy, identity, startd, job
wrapper, wrapper socket) judged from what the pool says (no pool needed here: the facts are given), and a
missing or broken config refused as bad input (exit 2, the reason), whichever batch system it would name."""

import os
import socket
import stat

import pytest

from mig_batch.cli import ops_commands
from mig_batch.cli.main import main
from mig_batch.cli.ops_commands import (
    CondorFacts,
    check_identity,
    check_schedd_policy,
    check_startd,
    check_wrapper,
    check_wrapper_socket,
    is_superuser,
)
from mig_batch.config import SiteConfig
from mig_batch.htcondor.attrs import schedd_config
from mig_batch.htcondor.install import wrapper_text


def schedd_params(text: str) -> dict[str, str]:
    """What the schedd would report after reading ``text`` (each ``$(KEY)`` of a name list left as it is)."""
    params: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            params[key.strip()] = value.replace(f"$({key.strip()})", params.get(key.strip(), "")).strip(" ,")
    return {k: params.get(k, "") for k in ops_commands.SCHEDD_KEYS}


INSTALLED = schedd_params(schedd_config("mig-batch@pool.example", agents=["agent@pool.example"]))


def test_the_schedd_policy_passes_as_installed_and_names_what_is_missing():
    assert check_schedd_policy(CondorFacts(schedd=INSTALLED)).ok
    bare = {**INSTALLED, "JOB_TRANSFORM_NAMES": "SiteTransform", "PROTECTED_JOB_ATTRS": ""}
    check = check_schedd_policy(CondorFacts(schedd=bare))
    assert not check.ok and "JOB_TRANSFORM_NAMES lacks MigBatchClear, MigBatchTag" in check.detail
    assert "PROTECTED_JOB_ATTRS lacks MigBatchTag, MigBatchNode" in check.detail
    assert "mig-batch-schedd.conf" in check.fix
    unread = check_schedd_policy(CondorFacts(errors={"schedd": "HTCondorException: connection refused"}))
    assert not unread.ok and "connection refused" in unread.detail


@pytest.mark.parametrize("identity, superusers, ok", [
    ("mig-batch@pool.example", "root, condor, mig-batch@pool.example", True),
    ("root@pool.example", "root condor", True),
    ("alice@pool.example", "root, condor, mig-batch@pool.example", False),
    ("mig-batch@other.example", "mig-batch@pool.example", False),
])  # fmt: skip
def test_a_superuser_is_named_with_or_without_its_domain(identity, superusers, ok):
    assert is_superuser(identity, superusers) is ok


def test_identity_must_be_authorized_and_a_queue_superuser():
    good = CondorFacts(schedd=INSTALLED, identity="mig-batch@pool.example", authorized=True)
    assert check_identity(good, "controller").ok
    other = CondorFacts(schedd=INSTALLED, identity="alice@pool.example", authorized=True)
    check = check_identity(other, "node")
    assert not check.ok and "alice@pool.example is not in the schedd's QUEUE_SUPER_USERS" in check.detail
    assert "condor_qusers -add" in check.fix
    refused = CondorFacts(schedd=INSTALLED, identity="mig-batch@pool.example", authorized=False)
    assert "refuses WRITE" in check_identity(refused, "controller").detail
    assert not check_identity(CondorFacts(errors={"identity": "no token"}), "controller").ok


def site(tmp_path) -> SiteConfig:
    return SiteConfig(nodes={"nodea": ("A100-80GB",)}, batch_system="htcondor", agent_socket=tmp_path / "{node}.sock",
                      htcondor_agent_file=str(tmp_path / "{node}.ad"))  # fmt: skip


def startd(wrapper: str = "", cron: str = "MIGBATCH", agent: str = "mig-batch:agent;started=1") -> CondorFacts:
    return CondorFacts(startd={"USER_JOB_WRAPPER": wrapper, "STARTD_CRON_JOBLIST": f"OTHER {cron}"},
                       startd_ad={"Name": "slot1@nodea", "MigBatchNodeName": "nodea", "MigBatchAgent": agent,
                                  "CondorVersion": "$CondorVersion: 25.14.1 2026-09-24 BuildID: 1 $"})  # fmt: skip


def test_the_startd_runs_the_agents_cron_and_publishes_its_state(tmp_path):
    assert check_startd(startd(), "nodea", site(tmp_path)).ok
    assert "25.14.1" in check_startd(startd(), "nodea", site(tmp_path)).detail
    no_cron = check_startd(startd(cron=""), "nodea", site(tmp_path))
    assert not no_cron.ok and "MIGBATCH" in no_cron.detail
    silent = check_startd(startd(agent=""), "nodea", site(tmp_path))
    assert not silent.ok and str(tmp_path / "nodea.ad") in silent.detail
    missing = check_startd(CondorFacts(errors={"startd": 'no startd with MigBatchNodeName = "nodea"'}), "nodea",
                           site(tmp_path))  # fmt: skip
    assert not missing.ok and "no startd" in missing.detail


def test_the_job_wrapper_must_be_ours_executable_and_ask_the_sites_socket(tmp_path):
    sock = tmp_path / "nodea.sock"
    wrapper = tmp_path / "mig-batch-job-wrapper"
    wrapper.write_text(wrapper_text("/usr/bin/env", str(tmp_path / "{node}.sock")))
    wrapper.chmod(0o755)
    check = check_wrapper(startd(str(wrapper)), "nodea", sock)
    assert check.ok, check.detail
    assert not check_wrapper(startd(""), "nodea", sock).ok  # no USER_JOB_WRAPPER
    assert "asks" in check_wrapper(startd(str(wrapper)), "nodea", tmp_path / "elsewhere.sock").detail
    wrapper.chmod(0o644)
    assert "not an executable file" in check_wrapper(startd(str(wrapper)), "nodea", sock).detail
    wrapper.chmod(0o755)
    wrapper.write_text(wrapper_text("/no/such/python", str(sock)))
    assert "/no/such/python" in check_wrapper(startd(str(wrapper)), "nodea", sock).detail
    other = tmp_path / "site-wrapper"
    other.write_text("#!/bin/sh\nexec \"$@\"\n")
    other.chmod(0o755)
    assert "not mig_batch's job wrapper" in check_wrapper(startd(str(other)), "nodea", sock).detail


def test_the_wrapper_socket_is_open_to_job_users(tmp_path):
    path = tmp_path / "nodea.sock"
    assert not check_wrapper_socket(path).ok  # none yet: the agent is down
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        os.chmod(path, 0o600)
        closed = check_wrapper_socket(path)
        assert not closed.ok and "mode 600" in closed.detail
        os.chmod(path, 0o666)
        assert check_wrapper_socket(path).ok
        assert stat.S_ISSOCK(path.stat().st_mode)
    finally:
        server.close()
    path.unlink()
    path.write_text("")
    assert "not a socket" in check_wrapper_socket(path).detail


def test_an_htcondor_site_gets_the_htcondor_checks_with_the_pools_facts(tmp_path, monkeypatch, capsys):
    config = tmp_path / "site.yaml"
    config.write_text(f"batch_system: htcondor\nstate: {tmp_path / 'state.db'}\nnodes: {{nodea: [A100-80GB]}}\n")
    monkeypatch.setattr(ops_commands, "check_htcondor",
                        lambda config: ops_commands.Check("htcondor", True, "bindings 25.14.1; schedd 25.14.1"))
    monkeypatch.setattr(ops_commands, "condor_facts", lambda config, node: CondorFacts(
        schedd=INSTALLED, identity="alice@pool.example", authorized=True))  # fmt: skip
    code = main(["doctor", "--config", str(config), "--role", "controller"])
    out = capsys.readouterr().out
    assert code == 1
    assert "ok   schedd policy" in out and "FAIL identity: alice@pool.example is not in" in out
    assert "scontrol" not in out and "slurm" not in out.lower()


@pytest.mark.parametrize("text, says", [
    (None, "cannot read the mig_batch config"),
    ("batch_system: htcondor\nnodes: [\n", "not valid YAML"),
    ("batch_system: pbs\nnodes: {n1: [A100-80GB]}\n", "batch_system"),
    ("batch_system: htcondor\nnodes: {n1: [A100-80GB]}\nmetrics_listen: nope\n", "metrics_listen"),
])  # fmt: skip
def test_a_bad_or_missing_config_is_bad_input_not_a_failed_check(tmp_path, capsys, text, says):
    config = tmp_path / "site.yaml"
    if text is not None:
        config.write_text(text)
    for role in ("controller", "node"):
        assert main(["doctor", "--config", str(config), "--role", role]) == 2
        captured = capsys.readouterr()
        assert says in captured.err and "FAIL" not in captured.out and "Traceback" not in captured.err


# --- mig-batchd's passes and metrics, seen from the controller host (either batch system) ------------------


def test_doctor_says_how_mig_batchds_passes_go_from_its_health_file(tmp_path):
    import json

    from mig_batch.controller.health import Health, health_path

    config = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",)})
    assert ops_commands.check_passes(config, now=1000.0).ok  # no file: it has not run here yet
    h = Health(poll_interval_s=1.0)
    h.succeeded(990.0, [("n1", True, 980.0)])
    health_path(config.state).write_text(json.dumps(h.to_json(990.0)))
    going = ops_commands.check_passes(config, now=1000.0)
    assert going.ok and "last good pass 10 s ago" in going.detail
    h.failed(995.0, "squeue: Unable to contact slurm controller", batch=True)
    health_path(config.state).write_text(json.dumps(h.to_json(995.0)))
    failing = ops_commands.check_passes(config, now=1060.0)
    assert not failing.ok and "failed for 65 s" in failing.detail and "Unable to contact" in failing.detail
    h.succeeded(1000.0)
    health_path(config.state).write_text(json.dumps(h.to_json(1000.0)))
    gone = ops_commands.check_passes(config, now=1000.0 + 3600)
    assert not gone.ok and "not running" in gone.detail


def test_doctor_scrapes_the_metrics_endpoint_when_one_is_set(tmp_path):
    from mig_batch.controller.health import Health
    from mig_batch.controller.metrics import ControllerMetrics
    from mig_batch.controller.metrics_server import MetricsServer

    assert ops_commands.check_metrics(SiteConfig()) == []  # off: no check
    metrics = ControllerMetrics()
    metrics.publish(Health(1.0), None)
    server = MetricsServer("127.0.0.1", 0, metrics)
    server.start()
    port = server.server_address[1]
    try:
        [check] = ops_commands.check_metrics(SiteConfig(metrics_listen=f"127.0.0.1:{port}"))
        assert check.ok and f"127.0.0.1:{port}/metrics" in check.detail
    finally:
        server.shutdown()
        server.server_close()
    [down] = ops_commands.check_metrics(SiteConfig(metrics_listen=f"127.0.0.1:{port}"))
    assert not down.ok and "start mig-batchd" in down.fix


def test_bindings_that_cannot_ask_who_we_are_leave_identity_unchecked_not_failed():
    check = check_identity(CondorFacts(schedd=INSTALLED, can_ask=False), "controller")
    assert check.ok and "not checked" in check.detail and "condor_ping" in check.detail
