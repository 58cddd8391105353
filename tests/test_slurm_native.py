"""The per-job Slurm calls through libslurm (mig_batch.slurm.native) against a real local Slurm: they read and
write what Slurm's commands read and write, a refused pin is never released, and a site without the helper
(or with a broken one) gets Slurm's commands."""

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.slurm_cluster import LocalCluster, release_here, release_key

from mig_batch.batch.system import JobState, Pin
from mig_batch.slurm.commands import (
    ARRAY_UNIQUE,
    EVERY_TASK,
    FORMAT,
    JOB_HEAD,
    SQUEUE_ARGS,
    SlurmCli,
    SlurmError,
    fold_array_lines,
    parse_job_line,
    records,
)
from mig_batch.slurm.install import build_slurm_library
from mig_batch.slurm.native import SlurmApi, open_api


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    path, why = build_slurm_library(tmp_path_factory.mktemp("lib"))
    if path is None:
        pytest.skip(f"the Slurm API helper does not build here: {why}")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, library):
    if LocalCluster.available() is not None:
        pytest.skip(str(LocalCluster.available()))
    with LocalCluster(tmp_path_factory.mktemp("slurm"), nodes=("n1", "n2", "n3")) as running:
        yield running
        running.run("scancel", "--full", "-u", "root", check=False)


@pytest.fixture(scope="module")
def clis(cluster, library):
    """(commands only, through the helper), both against the local cluster."""
    env = cluster.env()
    return SlurmCli(env=env), SlurmCli(env=env, api=SlurmApi.load(str(library), env["SLURM_CONF"]))


def submit(cluster, tmp_path, *args: str, body: str = "sleep 300") -> str:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    return cluster.run("sbatch", "--parsable", "-o", "/dev/null", *args, str(script)).stdout.strip().split(";")[0]


def wait_for(clis, job: str, state: JobState, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (found := clis[0].job(job)) is None or found.state != state:
        assert time.monotonic() < deadline, f"job {job} never reached {state}: {found}"
        time.sleep(0.2)


def test_a_job_reads_the_same_through_libslurm_as_through_squeue(cluster, clis, tmp_path):
    commands, api = clis
    held = submit(cluster, tmp_path, "-H", "-t", "1-02:03:00", "-c", "2")
    cluster.run("scontrol", "update", f"jobid={held}", "admincomment=mig-batch:v1;gres=mig:1g.10gb é=x y")
    running = submit(cluster, tmp_path, "--comment=a user's words", "-t", "UNLIMITED")
    failed = submit(cluster, tmp_path, body="exit 3")
    done = submit(cluster, tmp_path, "-t", "2:30:00", body="true")
    array = submit(cluster, tmp_path, "-H", "--array=1-2")
    split = submit(cluster, tmp_path, "-H", "--array=1-4")
    cluster.run("scontrol", "update", f"jobid={split}_3", "timelimit=10")  # task 3 gets a record of its own
    later = submit(cluster, tmp_path, "-H", "--begin=now+1hour", f"--dependency=afterok:{running},afterany:{array}_*")
    noted = submit(cluster, tmp_path, "-H")
    cluster.run("scontrol", "update", f"jobid={noted}", "admincomment=a site's note | over\ntwo lines")
    wait_for(clis, running, JobState.RUNNING)
    for job in (failed, done):
        wait_for(clis, job, JobState.FINISHED)
    for job in (held, running, failed, done, array, f"{array}_1", later, noted, "999999"):
        assert api.job(job) == commands.job(job), job
    env = {**cluster.env(), "SLURM_TIME_FORMAT": "%s"}
    removed = release_key(release_here()) >= release_key("23.02")  # 23.02 removed --array-unique
    every_record = [EVERY_TASK] if removed else [ARRAY_UNIQUE]
    for job in (held, running, failed, done, array, split, later, noted):  # every record of the id (an array's too)
        squeue = subprocess.run(["squeue", *SQUEUE_ARGS, *every_record, "-O", FORMAT, "-j", job], env=env,
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        through_api = fold_array_lines(map(parse_job_line, records(api.api.job_lines(int(job)), JOB_HEAD)))
        by_squeue = fold_array_lines(map(parse_job_line, records(squeue, JOB_HEAD)))
        assert sorted(through_api, key=str) == sorted(by_squeue, key=str), job
        assert api.api.job_lines(int(job)).endswith("\x1e\n") and squeue.endswith("\x1e\n")  # squeue sorts them
    assert api.api.job_lines(999999) == ""
    named = [held, running, done, "999999"]  # the agents' journals hold Slurm's numeric SLURM_JOB_ID
    assert api.jobs_named(named) == commands.jobs_named(named) == {job: api.job(job) for job in named}
    assert api.jobs_named(named)["999999"] is None and api.jobs_named(named)[running].running
    assert api.job(held).admin_tag == "mig-batch:v1;gres=mig:1g.10gb é=x y"
    assert api.job(noted).admin_tag == commands.job(noted).admin_tag == "a site's note | over\ntwo lines"
    assert api.job(held).state == JobState.HELD and api.job(held).cpus == 2
    assert api.job(failed).exit_status == 3 and api.job("999999") is None
    assert api.job(later).not_before > time.time() + 3000
    assert [(a.job_id, a.array) for a in api.job(later).after] == [(running, ""), (f"{array}_*", array)]
    assert (api.job(array).array, api.job(array).array_tasks) == (array, (range(1, 3),))  # both pending, one record
    assert api.job(running).array == "" and api.job(running).array_tasks == ()
    tasks = {j.job_id: [t for r in j.array_tasks for t in r] for j in api.jobs() if j.array == split}
    assert sorted(tasks.values()) == [[1, 2, 4], [3]]  # apart, as squeue prints them (before 23.02: --array-unique)
    assert {j.job_id: j for j in commands.jobs()} == {j.job_id: j for j in api.jobs()}


def test_a_pin_and_its_release_are_one_rpc_and_a_refused_pin_is_never_released(cluster, clis, tmp_path):
    _, api = clis
    good, bad = (submit(cluster, tmp_path, "-H") for _ in range(2))
    failed = api.pin_and_release([Pin(good, "n2", "mig-batch:placed"), Pin(bad, "nosuchnode", "mig-batch:placed")])
    assert set(failed) == {bad} and "nosuchnode" not in failed[bad] and bad in failed[bad]
    wait_for(clis, good, JobState.RUNNING)
    job = api.job(good)
    assert (job.node, job.admin_tag) == ("n2", "mig-batch:placed")
    time.sleep(1)  # a scheduling pass later, the refused one is still held, its tag unwritten
    refused = api.job(bad)
    assert refused.state == JobState.HELD and refused.admin_tag == ""


def test_a_timed_pin_sets_the_limit_then_releases(cluster, clis, tmp_path):
    _, api = clis
    job = submit(cluster, tmp_path, "-H", "-t", "60")
    assert api.pin_and_release([Pin(job, "n3", "mig-batch:subjob", time_limit_min=7)]) == {}
    wait_for(clis, job, JobState.RUNNING)
    found = api.job(job)
    assert (found.node, found.time_limit_s, found.admin_tag) == ("n3", 7 * 60, "mig-batch:subjob")


def test_reports_and_releases_through_libslurm(cluster, clis, tmp_path):
    _, api = clis
    job = submit(cluster, tmp_path, "-H")
    api.set_job_tag(job, "mig-batch:report;uuid=MIG-1")
    assert api.job(job).admin_tag == "mig-batch:report;uuid=MIG-1"
    api.release([job])
    wait_for(clis, job, JobState.RUNNING)
    with pytest.raises(SlurmError, match="999999"):
        api.release(["999999"])
    with pytest.raises(SlurmError, match="999998"):
        api.set_job_tag("999998", "x")


def test_a_missing_or_foreign_library_means_slurms_commands_with_a_warning(tmp_path, caplog):
    foreign = tmp_path / "libforeign.so"
    foreign.write_bytes(b"\x7fELF not really")
    with caplog.at_level(logging.WARNING, logger="mig-batch"):
        assert open_api(str(tmp_path / "missing.so")) is None
        assert open_api(str(foreign)) is None
    assert open_api("") is None
    assert caplog.text.count("using Slurm's commands") == 2 and "mig-batch slurm install" in caplog.text


def test_a_host_without_slurm_headers_is_told_which_package_has_them(tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'x.c:18:10: fatal error: slurm/slurm.h: No such file or directory' >&2\nexit 1\n")
    cc.chmod(0o755)
    path, why = build_slurm_library(tmp_path, compiler=str(cc))
    assert path is None and "libslurm-dev" in why and "slurm-devel" in why
    assert not list(tmp_path.glob("*.so*")) and not list(tmp_path.glob(".*.new"))


def test_the_library_loads_once_per_process(library):
    conf = os.environ.get("SLURM_CONF", "")
    assert SlurmApi.load(str(library), conf) is SlurmApi.load(str(library), conf)


def test_a_slurm_conf_libslurm_cannot_read_is_a_warning_not_the_end_of_the_process(library, tmp_path):
    """libslurm exits the process it runs in when it cannot read slurm.conf: open_api tries it in a child. (In
    a fresh process: this one's libslurm has read its configuration already.)"""
    code = ("import logging, sys; from mig_batch.slurm.native import open_api; logging.basicConfig(); "
            "print('api:', open_api(sys.argv[1], {'SLURM_CONF': sys.argv[2]}))")  # fmt: skip
    broken = tmp_path / "broken-slurm.conf"
    broken.write_text("ClusterName=x\nNoSuchSetting=1\n")
    proc = subprocess.run([sys.executable, "-c", code, str(library), str(broken)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0 and "api: None" in proc.stdout, proc.stderr
    assert "broken-slurm.conf" in proc.stderr and "using Slurm's commands" in proc.stderr


def test_doctor_checks_the_library_the_config_names(cluster, library, tmp_path, monkeypatch):
    from mig_batch.cli.ops_commands import check_slurm_library
    from mig_batch.config import SiteConfig

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    unset = check_slurm_library(SiteConfig())
    assert unset.ok and "not set" in unset.detail
    missing = check_slurm_library(SiteConfig(slurm_library=str(tmp_path / "gone.so")))
    assert not missing.ok and "gone.so" in missing.detail and "mig-batch slurm install" in missing.fix
    good = check_slurm_library(SiteConfig(slurm_library=str(library)))
    assert good.ok and "reaches slurmctld" in good.detail and "built for Slurm " in good.detail


def test_every_job_reads_the_same_and_a_change_is_seen_at_once(cluster, clis, tmp_path):
    commands, api = clis
    job = submit(cluster, tmp_path, "-H")

    def by_id(jobs):
        return {j.job_id: j for j in jobs}

    for _ in range(5):  # the scheduler may change a job between the two reads: try again
        if by_id(api.jobs()) == by_id(commands.jobs()):
            break
        time.sleep(0.5)
    else:
        assert by_id(api.jobs()) == by_id(commands.jobs())
    cluster.run("scontrol", "update", f"jobid={job}", "admincomment=changed")  # likely within the same second
    assert by_id(api.jobs())[job].admin_tag == "changed"
    new = submit(cluster, tmp_path, "-H")
    assert new in by_id(api.jobs())
    raw = api.api
    for _ in range(10):  # a read with nothing changed since the last one: no records sent, none parsed
        _, stamp = raw.all_job_lines(0)
        time.sleep(1.1)
        if raw.all_job_lines(stamp) == (None, stamp):
            break
    else:
        pytest.fail("slurmctld never answered 'no change'")
    assert {j.job_id for j in api.jobs()} >= {job, new}  # and the list kept stays whole


def test_a_library_built_by_another_mig_batch_is_refused_by_name(tmp_path, caplog):
    import shutil

    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    source = tmp_path / "old.c"
    source.write_text("int mb_abi_version(void) { return 0; }\nint mb_job_lines(void) { return 0; }\n")
    old = tmp_path / "libold.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(old), str(source)], check=True)
    with caplog.at_level(logging.WARNING, logger="mig-batch"):
        assert open_api(str(old)) is None
    assert "built by another mig_batch" in caplog.text and "mig-batch slurm install" in caplog.text
