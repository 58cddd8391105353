"""The HTCondor adapter's translations, without a pool: job ads to the seam's records, job ids to
constraints, and the generated policy text. The real pool is in test_htcondor_e2e.py."""

import math
from pathlib import Path

import pytest

from mig_batch.batch.system import JobState
from mig_batch.htcondor import versions
from mig_batch.htcondor.adapter import HTCondorError, _job_constraint, check_bindings, job_state, to_batch_job
from mig_batch.htcondor.attrs import START_POLICY, execute_config, node_config, schedd_config


def ad(**fields):
    base = {"ClusterId": 7, "ProcId": 0, "JobStatus": 1, "QDate": 1000, "MigBatchTag": "mig-batch:v1;req=20G"}
    return {**base, **fields}


@pytest.mark.parametrize(("status", "state"), [(1, JobState.PENDING), (2, JobState.RUNNING), (3, JobState.FINISHED),
                                               (4, JobState.FINISHED), (5, JobState.HELD), (6, JobState.RUNNING),
                                               (7, JobState.RUNNING)])  # fmt: skip
def test_every_job_status_has_a_seam_state(status, state):
    assert job_state(status) is state


def test_a_running_job_names_its_node_by_mig_batch_node_name():
    job = to_batch_job(ad(JobStatus=2, RemoteHost="slot1_2@nodeb@migpool", JobCurrentStartDate=2000,
                          AllowedExecuteDuration=600), {"nodeb@migpool": "nodeb"})  # fmt: skip
    assert (job.job_id, job.state, job.node) == ("7.0", JobState.RUNNING, "nodeb")
    assert (job.start_time, job.end_time, job.time_limit_s) == (2000.0, 2600.0, 600.0)
    assert job.managed and job.submit_time == 1000.0


def test_a_managed_job_waits_as_held_until_pinned_whatever_htcondor_calls_it():
    # idle without a pin: START lets it match no node, so for the controller it waits like a held job
    assert to_batch_job(ad(JobStatus=1)).state is JobState.HELD
    assert to_batch_job(ad(JobStatus=1, MigBatchNode="nodeb")).state is JobState.PENDING
    assert to_batch_job(ad(JobStatus=1, MigBatchTag=None)).state is JobState.PENDING  # not managed
    assert to_batch_job(ad(JobStatus=2, RemoteHost="slot1_1@x")).state is JobState.RUNNING


def test_an_unknown_startd_is_named_as_htcondor_names_it():
    assert to_batch_job(ad(JobStatus=2, RemoteHost="slot1_1@elsewhere")).node == "elsewhere"


def test_finished_jobs_carry_exit_status_and_outcome():
    done = to_batch_job(ad(JobStatus=4, ExitCode=3, LastRemoteHost="slot1_1@migpool"))
    assert (done.state, done.exit_status, done.outcome, done.node) == (JobState.FINISHED, 3, "FAILED", "migpool")
    killed = to_batch_job(ad(JobStatus=4, ExitBySignal=True, ExitSignal=9))
    assert (killed.exit_status, killed.outcome) == (137, "FAILED")
    removed = to_batch_job(ad(JobStatus=3))
    assert removed.cancelled


def test_held_jobs_say_why_and_pending_ones_have_no_start():
    held = to_batch_job(ad(JobStatus=5, HoldReason="by the controller", JobCurrentStartDate=2000))
    assert held.held and held.reason == "by the controller" and held.start_time == 0.0
    assert to_batch_job(ad(MigBatchNode="n", LastRejMatchReason="no match found")).reason == "no match found"
    assert to_batch_job(ad(JobStatus=2, LastRejMatchReason="no match found")).reason == ""
    assert to_batch_job(ad(MigBatchTag=None)).admin_tag == ""
    assert to_batch_job(ad()).time_limit_s == math.inf
    assert to_batch_job(ad(LastRejMatchReason="no match found")).reason == "no match found"  # held, but idle
    assert to_batch_job(ad(LastRejMatchReason="no match found ")).reason == "no match found"  # 23.9's, stripped


@pytest.mark.parametrize("bad", ["", "7.x", "abc", "7.0; true", "\u0663.0"])
def test_job_ids_that_are_not_cluster_proc_are_refused(bad):
    with pytest.raises(HTCondorError, match="not an HTCondor job id"):
        _job_constraint(bad)


def test_job_constraint_names_cluster_and_proc():
    assert _job_constraint("12.3") == "ClusterId == 12 && ProcId == 3"
    assert _job_constraint("12") == "ClusterId == 12 && ProcId == 0"


def test_policy_text_pins_managed_jobs_and_protects_the_placement():
    assert "MigBatchTag =?= undefined" in START_POLICY and "MigBatchNode =?= MY.MigBatchNodeName" in START_POLICY
    assert f"START = ($(START)) && ({START_POLICY})" in execute_config()
    assert node_config("nodeb", "/run/x.ad", "NODEB.") == (
        'NODEB.MigBatchNodeName = "nodeb"\nNODEB.STARTD_CRON_MIGBATCH_ARGS = /run/x.ad\n'
    )
    assert "PROTECTED_JOB_ATTRS = $(PROTECTED_JOB_ATTRS) MigBatchTag MigBatchNode" in schedd_config("migctl")


def test_undefined_values_in_a_job_ad_are_dropped_not_printed_as_numbers():
    classad2 = pytest.importorskip("classad2")
    from mig_batch.htcondor.adapter import HTCondorBatch

    job_ad = classad2.ClassAd(ad(JobStatus=1))
    job_ad["MigBatchTag"] = classad2.ExprTree("undefined")  # what a projection returns for a dropped attribute
    job_ad["RemoteHost"] = classad2.ExprTree("undefined")
    job = to_batch_job(HTCondorBatch()._plain(job_ad))
    assert (job.admin_tag, job.node, job.state) == ("", "", JobState.PENDING)


def test_a_machine_that_cannot_run_the_pool_is_told_why(tmp_path, monkeypatch):
    from harness.htcondor_pool import Image, LocalPool

    monkeypatch.setenv("PATH", str(tmp_path))  # no debootstrap
    why = LocalPool.available(Image(cache=tmp_path / "empty"))
    assert why is not None and any(w in why for w in ("needs root", "no htcondor2", "no HTCondor image"))


def test_a_hold_that_is_not_the_controllers_is_the_users():
    ours = to_batch_job(ad(JobStatus=5, HoldReason="mig-batch: requeued: its node n2 is down"))
    owners = to_batch_job(ad(JobStatus=5, HoldReason="via condor_hold (by user ciuser)"))
    released = to_batch_job(ad(JobStatus=1))  # released by its owner, unpinned: waits for the controller
    assert ours.held and not ours.held_by_user
    assert owners.held and owners.held_by_user
    assert released.held and not released.held_by_user


def condor_version(version: str) -> str:
    """``htcondor2.version()``'s text for a release"""
    return f"$CondorVersion: {version} 2026-09-24 BuildID: UW_Python_Wheel_Build $"


@pytest.mark.parametrize("version", ["24.0.24", "24.12.24", "25.0.14", "25.14.1"])
def test_the_supported_bindings_are_taken(version):
    check_bindings(condor_version(version))


@pytest.mark.parametrize("text", [condor_version("23.10.29"), condor_version("26.0.1"), "no version here"])
def test_bindings_outside_the_range_are_refused_with_what_would_do(text):
    with pytest.raises(HTCondorError, match=r"not a release mig_batch supports \(24\.0 or later, below 26\.0.*"
                                            r"pip install 'htcondor>=24\.0,<26'"):  # fmt: skip
        check_bindings(text)


def test_the_refusal_names_the_version_found():
    with pytest.raises(HTCondorError, match=r"bindings 23\.10\.29 are not"):
        check_bindings(condor_version("23.10.29"))


@pytest.mark.parametrize(("version", "says"), [
    ("24.0.24", "a release mig_batch is tested with"),
    ("25.14.1", "a release mig_batch is tested with"),
    ("25.11.0", "in the supported range but not tested (tested: 24.0, "),
    ("23.10.29", "which mig_batch refuses (it takes htcondor>=24.0,<26)"),
    (None, "no known version"),
])  # fmt: skip
def test_doctor_notes_say_whether_the_bindings_are_supported_and_tested(version, says):
    assert says in versions.bindings_note(version)


def test_doctor_notes_say_whether_the_daemons_are_tested():
    assert versions.daemons_note("25.14.1", "schedd") == "schedd 25.14.1, a release mig_batch is tested against"
    assert versions.daemons_note("23.9.6") == "daemons 23.9.6, a release mig_batch is tested against"
    assert "24.0.5, not a release mig_batch is tested against (tested: 23.9, 25.14;" in versions.daemons_note("24.0.5")
    assert versions.version_in("$CondorVersion: 23.9.6 2024-07-04 BuildID: Debian-23.9.6+dfsg-2 $") == "23.9.6"


def test_the_extra_declares_the_range_the_adapter_takes():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["htcondor"] == [versions.BINDINGS_RANGE]


def fake_bindings(version: str, collector_error: str = ""):
    """An htcondor2 stand-in: its version text, and a collector that answers with a 25.14.1 pool or fails."""
    import types

    class Collector:
        def query(self, ad_type, projection=()):
            if collector_error:
                raise RuntimeError(collector_error)
            return [{"Name": ad_type, "CondorVersion": "$CondorVersion: 25.14.1 2026-09-24 BuildID: 1 $"}]

        def locate(self, daemon_type):
            return {"Name": daemon_type}

    schedd = {"JOB_TRANSFORM_NAMES": "MigBatchClear MigBatchTag", "SUBMIT_REQUIREMENT_NAMES": "MigBatchRequest",
              "QUEUE_SUPER_USERS": "root, condor, mig-batch@pool", "PROTECTED_JOB_ATTRS": "MigBatchTag MigBatchNode"}
    return types.SimpleNamespace(version=lambda: f"$CondorVersion: {version} 2026-09-24 BuildID: 1 $",
                                 reload_config=lambda: None, Collector=Collector,
                                 AdType=types.SimpleNamespace(Collector="collector", Schedd="schedd"),
                                 DaemonType=types.SimpleNamespace(Schedd="schedd"), RemoteParam=lambda ad: schedd,
                                 ping=lambda ad, authz: {"MyRemoteUserName": "mig-batch@pool",
                                                         "AuthorizationSucceeded": True})  # fmt: skip


@pytest.mark.parametrize(("version", "collector_error", "ok", "says"), [
    ("24.0.24", "", True, "bindings 24.0.24, a release mig_batch is tested with; collector 25.14.1, a release "
                          "mig_batch is tested against; schedd 25.14.1, a release mig_batch is tested against"),
    ("23.10.29", "", False, "bindings 23.10.29, which mig_batch refuses (it takes htcondor>=24.0,<26)"),
    ("25.0.14", "Unable to determine collector host.", False, "bindings 25.0.14, a release mig_batch is tested with; "
                                                               "the collector does not answer: RuntimeError: Unable"),
])  # fmt: skip
def test_doctor_names_the_htcondor_it_finds(tmp_path, monkeypatch, capsys, version, collector_error, ok, says):
    import json
    import sys

    from mig_batch.cli.main import main

    config = tmp_path / "site.yaml"
    config.write_text(f"batch_system: htcondor\nnodes: {{gpu1: [A100-80GB]}}\nstate: {tmp_path / 'state.db'}\n"
                      f"htcondor_config: {tmp_path / 'condor_config'}\n")  # fmt: skip
    monkeypatch.setitem(sys.modules, "htcondor2", fake_bindings(version, collector_error))
    monkeypatch.setenv("CONDOR_CONFIG", "/dev/null")  # doctor sets it to htcondor_config; monkeypatch restores it
    code = main(["doctor", "--config", str(config), "--role", "controller", "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["htcondor"]["ok"] is ok and checks["htcondor"]["detail"].startswith(says), checks["htcondor"]
    pool = ["schedd policy", "identity"] if ok else []  # asked only of a pool that answers
    assert code == (0 if ok else 1) and list(checks) == ["config", "htcondor", *pool, "store", "passes"]
    if not ok and "refuses" in says:
        assert "pip install 'htcondor>=24.0,<26'" in checks["htcondor"]["fix"]
