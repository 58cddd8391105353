"""Files and ids (issue 45, point 6): the node agent names files only by a batch system's job id, writes them
through a temporary file of its own (never through a symlink), starts only with directories no other user
can change; the store is owner-only and read-only commands never write another program's SQLite file."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import stat
import threading

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import Pin
from mig_batch.batch.tags import Placed, parse_tag, placed_tag
from mig_batch.cli.main import main
from mig_batch.config import SiteConfig
from mig_batch.node.agent import NO_DEVICE, NodeAgent
from mig_batch.node.journal import Journal
from mig_batch.safe_files import UnsafePath, untrusted_dir
from mig_batch.state import Store

TAG = "mig-batch:v1;req=4g.20gb"


@pytest.fixture
def site(tmp_path):
    return SiteConfig(state=tmp_path / "state.db", job_dir=tmp_path / "jobs", node_dir=tmp_path / "node",
                      nodes={"n1": ("A100-40GB", "A100-40GB")})  # fmt: skip


@pytest.fixture
def gpus(site, nvml_emu_creator):
    backend, _directory = nvml_emu_creator(list(site.nodes["n1"]), node="n1")
    return backend


@pytest.fixture
def batch():
    return FakeBatch(["n1"])


def agent(site, batch, gpus) -> NodeAgent:
    return NodeAgent("n1", gpus, Journal(site.node_dir / "journal"), batch, site.job_dir)


def decide(batch, gpu: int, job_id: str | None = None) -> str:
    """A job pinned to 4g.20gb@0 on ``gpu`` of n1, released and started (its Prolog next)."""
    job = batch.add(TAG, job_id=job_id)
    batch.pin_and_release([Pin(job, "n1", placed_tag(parse_tag(TAG), Placed("n1", gpu, "4g.20gb", 0)))])
    batch.start(job)
    return job


class Unreachable(FakeBatch):
    """A batch system that does not answer: the Prolog's error path, which writes the job's file anyway."""

    def job(self, job):
        from mig_batch.batch.system import BatchError

        raise BatchError("no answer")


@pytest.mark.parametrize("bad", ["../escaped", "../../escaped", "..", "7/../../escaped", "12.0.1", "", "7\n8"])
def test_an_id_that_is_no_job_id_names_no_file_in_prolog_or_epilog(site, gpus, tmp_path, bad):
    """A root write outside job_dir (the Prolog's error path writes the job's file) and a root unlink there
    (the Epilog removes the job's file first) are refused before the id names anything."""
    a = agent(site, Unreachable(["n1"]), gpus)
    victim = tmp_path / "escaped"
    result = a.prolog(bad)
    assert not victim.exists() and os.listdir(site.job_dir) == []
    assert result.exports == [f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"] and "not a job id" in result.problem
    victim.write_text("keep")
    detail = a.epilog(bad)
    assert victim.read_text() == "keep" and detail.startswith("refused: not a job id")


def test_slurm_and_htcondor_ids_still_bind(site, batch, gpus):
    a = agent(site, batch, gpus)
    for job_id, gpu in (("4242", 0), ("12.3", 1)):
        job = decide(batch, gpu, job_id)
        assert a.prolog(job).report.kind == "made"
        assert (site.job_dir / job).read_text().startswith("export CUDA_VISIBLE_DEVICES=MIG-")
        assert a.epilog(job).startswith("destroyed")
        assert not (site.job_dir / job).exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the Slurm agent's socket answers root only")
def test_the_slurm_agents_socket_refuses_an_id_that_is_no_job_id(site, batch, gpus, tmp_path):
    from mig_batch.node.service import AgentServer

    a = agent(site, batch, gpus)
    path = tmp_path / "agent.sock"
    server = AgentServer(path, a)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        for op in ("prolog", "epilog"):
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(10)
                s.connect(str(path))
                s.sendall(json.dumps({"op": op, "job": "../escaped"}).encode() + b"\n")
                answer = json.loads(s.makefile("rb").readline())
            assert answer == {"ok": False, "detail": "not a job id: '../escaped'"}, op
    finally:
        server.shutdown()
        server.server_close()
    assert not (tmp_path / "escaped").exists()


def test_the_job_file_is_never_written_through_a_symlink(site, batch, gpus, tmp_path):
    """A symlink at the old temporary name (``<id>.tmp``) or at the job's own name: the file it points to
    keeps its bytes and mode; the job gets a regular file of its own."""
    a = agent(site, batch, gpus)
    site.job_dir.mkdir(exist_ok=True)
    targets = {}
    for name in ("7.tmp", "8"):
        target = tmp_path / f"victim-{name}"
        target.write_text("root's secret")
        target.chmod(0o600)
        (site.job_dir / name).symlink_to(target)
        targets[name] = target
    first, second = decide(batch, 0, "7"), decide(batch, 1, "8")
    for job in (first, second):
        report = a.prolog(job).report
        path = site.job_dir / job
        assert not path.is_symlink() and f"CUDA_VISIBLE_DEVICES={report.uuid}" in path.read_text()
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    for target in targets.values():
        assert target.read_text() == "root's secret" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_two_procs_of_one_htcondor_cluster_bind_at_once_each_to_its_own_instance(site, batch, gpus):
    """12.0 and 12.1 once shared the temporary file 12.tmp: a write failed (the job's instance destroyed
    and the job requeued) or one job's file held the other's UUID."""
    a = agent(site, batch, gpus)
    jobs = [decide(batch, 0, "12.0"), decide(batch, 1, "12.1")]
    results = {}

    def prolog(job):
        results[job] = a.prolog(job)

    threads = [threading.Thread(target=prolog, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uuids = {job: results[job].report.uuid for job in jobs}
    assert all(results[job].report.kind == "made" for job in jobs), results
    rounds, start = 400, threading.Barrier(2, timeout=30)
    failures: list[str] = []

    def bind(job):
        for _ in range(rounds):
            try:
                start.wait()
            except threading.BrokenBarrierError:
                return  # the other one failed
            try:
                a._bind(job, results[job].exports)  # what the Prolog does outside the node's lock
            except OSError as exc:
                failures.append(f"{job}: {exc}")
                start.abort()  # its instance is gone: the round is over for both
                return
            text = (site.job_dir / job).read_text()
            if uuids[job] not in text:
                failures.append(f"{job}'s file: {text!r}")

    threads = [threading.Thread(target=bind, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    assert [e.uuid for e in a.journal.entries()] == [uuids["12.0"], uuids["12.1"]]  # neither destroyed
    assert [f for f in os.listdir(site.job_dir) if f not in jobs] == []  # no temporary file left


def test_a_job_dir_another_user_can_write_is_refused_at_the_agents_start(site, batch, gpus, tmp_path):
    site.job_dir.mkdir()
    site.job_dir.chmod(0o777)
    with pytest.raises(UnsafePath, match=f"{site.job_dir} is writable by group or others"):
        agent(site, batch, gpus)
    site.job_dir.chmod(0o755)
    link = tmp_path / "jobs-link"
    link.symlink_to(site.job_dir)
    with pytest.raises(UnsafePath, match="symbolic link"):
        NodeAgent("n1", gpus, Journal(site.node_dir / "journal"), batch, link)
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)  # a directory above: a user could rename ours away
    with pytest.raises(UnsafePath, match="open is writable"):
        Journal(tmp_path / "open" / "journal")
    assert untrusted_dir(site.job_dir) == ""
    agent(site, batch, gpus)  # as the site sets it: root's, 0755


def test_doctor_on_a_node_says_a_job_dir_another_user_can_write_is_unsafe(site, tmp_path):
    from mig_batch.cli.ops_commands import check_node_dirs

    site.job_dir.mkdir(mode=0o755)
    site.node_dir.mkdir(mode=0o700)
    assert check_node_dirs(site, "n1").ok
    site.job_dir.chmod(0o775)
    check = check_node_dirs(site, "n1")
    assert not check.ok and str(site.job_dir) in check.detail and "chmod" in check.fix


def test_the_store_is_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "state.db"
        store = Store(path)
        store.event("1", "running", node="n1")
        for name in (path, tmp_path / "state.db-wal", tmp_path / "state.db-shm"):
            assert stat.S_IMODE(name.stat().st_mode) == 0o600, name
        store.close()
        path.chmod(0o644)  # made by an earlier release
        Store(path).close()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def _foreign(path) -> str:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE accounts (name TEXT, balance REAL)")
    db.execute("INSERT INTO accounts VALUES ('alice', 10)")
    db.commit()
    db.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", [["status"], ["events"], ["offers"]])
@pytest.mark.parametrize("kind", ["sqlite", "text"])
def test_a_read_only_command_refuses_a_file_that_is_not_a_store_and_leaves_it_unchanged(tmp_path, capsys, command,
                                                                                        kind):  # fmt: skip
    path = tmp_path / "other.db"
    if kind == "sqlite":
        digest = _foreign(path)
    else:
        path.write_text("a site's notes\n" * 100)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    config = tmp_path / "site.yaml"
    config.write_text(f"state: {path}\nnodes:\n  n1: [A100-40GB]\n")
    assert main([*command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{path} is not a mig_batch store" in err and "expected the SQLite store mig-batchd writes" in err
    assert "Traceback" not in err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(os.listdir(tmp_path)) == ["other.db", "site.yaml"]


def test_a_read_only_command_reads_the_store_as_it_is(tmp_path, capsys):
    path = tmp_path / "state.db"
    store = Store(path)
    store.event("7", "running", node="n1")
    store.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    config = tmp_path / "site.yaml"
    config.write_text(f"state: {path}\nnodes:\n  n1: [A100-40GB]\n")
    assert main(["events", "--json", "--config", str(config)]) == 0
    assert [e["job"] for e in json.loads(capsys.readouterr().out)] == ["7"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_the_hooks_slow_path_runs_python_isolated(tmp_path):
    """Root's slow path must not put the working directory (or PYTHONPATH) on sys.path: ``-I`` (the compiled
    client's, run: tests/test_hooks_state.py, the slow path's command line)."""
    from mig_batch.mig.models import get_model
    from mig_batch.slurm.install import install

    dest = tmp_path / "etc"
    install(dest, "/usr/bin/python3", "/etc/c.yaml", str(tmp_path / "jobs"), str(tmp_path / "agent.sock"),
            [get_model("A100-80GB")], hook_client_kind="python")  # fmt: skip
    for op in ("prolog", "epilog"):
        text = (dest / f"mig-batch-{op}").read_text()
        assert text.count(f"/usr/bin/python3 -I -m mig_batch.slurm.hooks {op}") == 2, text
        assert " -m mig_batch" not in text.replace(" -I -m mig_batch", ""), text

