"""The HTCondor adapter's translations, without a pool: job ads to the seam's records, job ids to
constraints, and the generated policy text. The real pool is in test_htcondor_e2e.py."""

import math

import pytest

from mig_batch.batch.system import JobState
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


@pytest.mark.parametrize("version", ["$CondorVersion: 25.0.14 2026-08-01 BuildID: UW_Python_Wheel_Build $",
                                     "$CondorVersion: 25.14.1 2026-09-24 BuildID: UW_Python_Wheel_Build $"])
def test_the_tested_bindings_are_taken(version):
    check_bindings(version)


@pytest.mark.parametrize("version", ["$CondorVersion: 24.0.24 2026-07-01 BuildID: UW_Python_Wheel_Build $",
                                     "$CondorVersion: 26.0.1 2027-02-01 $", "no version here"])
def test_bindings_outside_the_tested_range_are_refused_with_what_would_do(version):
    with pytest.raises(HTCondorError, match=r"not a release mig_batch supports \(25\.0 or later, below 26\.0.*"
                                            r"pip install 'htcondor>=25\.0,<26'"):
        check_bindings(version)
