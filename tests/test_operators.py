"""What operators see: node problems (a prolog that could not place a job, an epilog that could not destroy,
strays) reach the controller's events and ``mig-batch events``; ``mig-batch doctor`` names what is broken.
Over the fake batch system and emulated GPUs; Slurm's ``scontrol`` is a script printing a config excerpt."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.tags import parse_agent_tag
from mig_batch.cli.main import main
from mig_batch.cli.ops_commands import check_hooks, since_epoch
from mig_batch.config import SiteConfig
from mig_batch.controller.daemon import Controller
from mig_batch.gpu import nvml_emu
from mig_batch.gpu.base import GpuBackendError
from mig_batch.gpu.nvml import NvmlNode
from mig_batch.mig.models import get_model
from mig_batch.node import hook_client
from mig_batch.node.agent import NodeAgent
from mig_batch.node.journal import Journal
from mig_batch.node.service import AgentServer
from mig_batch.slurm.install import install
from mig_batch.state import Store

RIGID = "mig-batch:v1;req=4g.20gb"


@pytest.fixture
def site(tmp_path) -> SiteConfig:
    config = SiteConfig(state=tmp_path / "state.db", job_dir=tmp_path / "jobs", node_dir=tmp_path / "node",
                        agent_socket=tmp_path / "agent.sock", nodes={"n1": ("A100-40GB", "A100-40GB")},
                        path=str(tmp_path / "site.yaml"))  # fmt: skip
    Path(config.path).write_text(
        f"state: {config.state}\njob_dir: {config.job_dir}\nnode_dir: {config.node_dir}\n"
        f"agent_socket: {config.agent_socket}\nnodes: {{n1: [A100-40GB, A100-40GB]}}\n"
    )
    return config


@pytest.fixture
def gpus(site, nvml_emu_creator) -> tuple[NvmlNode, Path]:
    """n1's GPUs through NVML on the emulated libnvidia-ml, and the emulated node's directory."""
    return nvml_emu_creator(list(site.nodes["n1"]), node="n1")


@pytest.fixture
def batch() -> FakeBatch:
    return FakeBatch(["n1"])


def node_agent(config: SiteConfig, batch: FakeBatch, backend: NvmlNode) -> NodeAgent:
    return NodeAgent("n1", backend, Journal(config.node_dir / "journal"), batch, config.job_dir)


def released(controller: Controller, batch: FakeBatch) -> str:
    """A job the controller decided, pinned and released, started by the batch system (its prolog next)."""
    job = batch.add(RIGID)
    assert controller.step().placed == 1
    batch.start(job)
    return job


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def events(config: SiteConfig, capsys, *options: str) -> tuple[int, str]:
    return run_cli(capsys, ["events", "--config", config.path, *options])


def test_an_unwritable_journal_reaches_the_events_of_the_job_with_the_reason(site, batch, gpus, capsys, monkeypatch):
    controller = Controller(site, Store(site.state), batch)
    job = released(controller, batch)
    a = node_agent(site, batch, gpus[0])

    def full(self, record):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(Journal, "_append", full)  # the entry cannot be written once the instance is made
    assert a.prolog(job).report.kind == "requeue"
    assert all(gpus[0].instances(g) == [] for g in (0, 1))  # not left as a stray
    controller.step()
    code, out = events(site, capsys, "--job", job)
    assert code == 0
    assert "node-problem" in out and "No space left on device" in out and "n1" in out, out
    code, out = events(site, capsys, "--job", job, "--kind", "node-problem", "--json")
    [problem] = json.loads(out)
    assert (problem["job"], problem["node"], problem["hook"]) == (job, "n1", "prolog")
    assert "journal" in problem["reason"]
    requeued = Store(site.state).events(job=job, kind="requeued")
    assert requeued and requeued[-1]["node"] == "n1" and "No space left on device" in requeued[-1]["reason"]


def test_events_of_a_kind_never_recorded_name_the_kinds_there_are(site, batch, capsys):
    controller = Controller(site, Store(site.state), batch)
    released(controller, batch)
    code, out = events(site, capsys, "--kind", "decide")
    assert code == 0 and "no event of kind 'decide' was ever recorded here; the store holds decided" in out, out
    code, out = events(site, capsys, "--kind", "decided")
    assert code == 0 and "was ever recorded" not in out
    code, out = events(site, capsys, "--kind", "decide", "--json")
    assert code == 0 and json.loads(out) == []


def test_a_journal_folder_that_is_a_file_reaches_the_events_too(site, batch, gpus, capsys):
    controller = Controller(site, Store(site.state), batch)
    job = released(controller, batch)
    a = node_agent(site, batch, gpus[0])
    journal = site.node_dir / "journal"
    shutil.rmtree(journal)
    journal.write_text("a file where the journal folder should be\n")
    a.prolog(job)
    controller.step()
    code, out = events(site, capsys, "--job", job, "--kind", "node-problem")
    assert code == 0 and "NotADirectoryError" in out and "journal" in out, out


def test_a_failed_prolog_is_a_warning_in_the_nodes_syslog_with_the_job_id(site, batch, gpus, monkeypatch):
    controller = Controller(site, Store(site.state), batch)
    job = released(controller, batch)
    server = AgentServer(site.agent_socket, node_agent(site, batch, FailingGpu()))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    logged: list[tuple[int, str]] = []
    monkeypatch.setattr(hook_client.syslog, "openlog", lambda *args: None)
    monkeypatch.setattr(hook_client.syslog, "syslog", lambda level, text: logged.append((level, text)))
    try:
        assert hook_client.main(["hook_client.py", "prolog", job, str(site.agent_socket)]) == 0
    finally:
        server.shutdown()
        server.server_close()
    [(level, text)] = logged
    assert level == hook_client.syslog.LOG_WARNING
    assert text.startswith(f"job {job}: ") and "NVML: Unknown Error" in text


class FailingGpu(NvmlNode):
    """A GPU backend whose create fails as NVML does when the driver is in a bad state."""

    def create(self, gpu: int, profile: str, start: int):
        raise GpuBackendError("NVML: Unknown Error")


def test_a_gpu_backend_error_reaches_the_events_even_when_the_job_ended_before_a_pass(site, batch, gpus, capsys):
    controller = Controller(site, Store(site.state), batch)
    job = released(controller, batch)
    node_agent(site, batch, FailingGpu()).prolog(job)
    batch.finish(job, exit_status=1, outcome="FAILED")  # quick: no pass saw it running
    controller.step()
    code, out = events(site, capsys, "--job", job, "--kind", "node-problem")
    assert code == 0 and "NVML: Unknown Error" in out and "n1" in out, out


def test_an_epilog_that_cannot_destroy_reaches_the_events_once(site, batch, gpus, capsys):
    controller = Controller(site, Store(site.state), batch)
    job = released(controller, batch)
    backend, directory = gpus
    a = node_agent(site, batch, backend)
    a.prolog(job)
    controller.step()
    nvml_emu.attach(directory, Journal(site.node_dir / "journal").get(job).uuid, os.getpid())  # still held
    batch.finish(job)
    detail = a.epilog(job, attempts=1)
    assert "still in use" in detail
    assert parse_agent_tag(batch.nodes()[0].agent_tag).problems == 1
    controller.step()
    Controller(site, Store(site.state), batch).step()  # a restarted controller does not record it again
    found = Store(site.state).events(kind="node-problem")
    assert [(e["job"], e["node"], e["hook"]) for e in found] == [(job, "n1", "epilog")]
    assert "still in use" in found[0]["reason"]
    code, out = events(site, capsys, "--node", "n1", "--kind", "node-problem")
    assert code == 0 and job in out and "still in use" in out


def test_strays_a_reconcile_destroyed_reach_the_events_of_the_node(site, batch, gpus, capsys):
    controller = Controller(site, Store(site.state), batch)
    gpus[0].create(0, "1g.5gb", 6)  # no job owns it
    assert len(node_agent(site, batch, gpus[0]).reconcile()) == 1
    controller.step()
    code, out = events(site, capsys, "--node", "n1", "--since", "1h", "--json")
    [stray] = [e for e in json.loads(out) if e["kind"] == "node-problem"]
    assert stray["hook"] == "reconcile" and stray["job"] is None and "1g.5gb@6" in stray["reason"]
    code, out = events(site, capsys, "--node", "n2")
    assert code == 0 and "no events" in out


def test_since_reads_ages_and_dates_and_refuses_the_rest(site, capsys):
    assert since_epoch("2h", now=lambda: 10_000.0) == 10_000.0 - 7200
    assert since_epoch("90s", now=lambda: 100.0) == 10.0
    assert since_epoch("2024-05-01") > 0
    Store(site.state).close()
    code, out = events(site, capsys, "--since", "yesterday")
    assert code == 2 and "accepted: an age" in out


# --- doctor -------------------------------------------------------------------------------------


def show_config(slurm_dir: Path, prolog: str | None = None) -> str:
    """An excerpt of ``scontrol show config`` naming the hooks installed in ``slurm_dir``."""
    return (f"Configuration data as of 2024-05-01T12:00:00\nEpilog                  = {slurm_dir}/mig-batch-epilog\n"
            f"JobSubmitPlugins        = lua\nProlog                  = {prolog or slurm_dir / 'mig-batch-prolog'}\n"
            f"SLURM_CONF              = {slurm_dir}/slurm.conf\n"
            f"TaskProlog              = {slurm_dir}/mig-batch-taskprolog\n")  # fmt: skip


@pytest.fixture
def installed(site, tmp_path) -> Path:
    """The shims and job_submit.lua installed in a folder, and a fake Slurm whose scontrol prints their paths."""
    slurm_dir = tmp_path / "etc-slurm"
    install(slurm_dir, sys.executable, site.path, str(site.job_dir), str(site.agent_socket), [get_model("A100-40GB")])
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "config.txt").write_text(show_config(slurm_dir))
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\ncat {bin_dir}/config.txt\n")
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")
    for name in ("scontrol", "squeue"):
        (bin_dir / name).chmod(0o755)
    with open(site.path, "a") as f:
        f.write(f"slurm_bin: {bin_dir}\n")
    return slurm_dir


@pytest.fixture
def agent_up(site, batch, gpus):
    server = AgentServer(site.agent_socket, node_agent(site, batch, gpus[0]))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield
    server.shutdown()
    server.server_close()


def doctor(site: SiteConfig, capsys, *options: str) -> tuple[int, str]:
    return run_cli(capsys, ["doctor", "--config", site.path, *options])


def fenced_on(site: SiteConfig, gpu_dir: Path) -> None:
    """The site's fence over the emulated node's capabilities, /proc/devices and /dev/nvidia-caps."""
    with open(site.path, "a") as f:
        f.write(f"fence: {{capabilities: {gpu_dir}/capabilities, devices: {gpu_dir}/nvidia-caps, "
                f"proc_devices: {gpu_dir}/devices}}\n")


def test_doctor_passes_a_node_set_up_right(site, installed, agent_up, gpus, capsys):
    fenced_on(site, gpus[1])
    code, out = doctor(site, capsys, "--node", "n1")
    assert code == 0 and "FAIL" not in out, out
    for name in ("config", "slurm", "Prolog", "Epilog", "TaskProlog", "agent", "gpu backend", "mig mode",
                 "instance fence"):
        assert f"ok   {name}:" in out, (name, out)


def test_doctor_names_a_broken_prolog_path_and_says_what_to_fix(site, installed, agent_up, capsys, tmp_path):
    (installed.parent / "slurm-bin" / "config.txt").write_text(show_config(installed, f"{tmp_path}/moved/prolog"))
    code, out = doctor(site, capsys, "--node", "n1")
    assert code == 1
    assert f"FAIL Prolog: {tmp_path}/moved/prolog does not exist" in out, out
    assert "fix: run `mig-batch slurm install" in out and "ok   Epilog:" in out


def test_doctor_flags_a_prolog_that_is_not_executable_or_not_ours(installed, tmp_path):
    prolog = installed / "mig-batch-prolog"
    prolog.chmod(0o644)
    [check] = [c for c in check_hooks(show_config(installed)) if c.name == "Prolog"]
    assert not check.ok and "not executable" in check.detail
    other = tmp_path / "site-prolog"
    other.write_text("#!/bin/sh\nexit 0\n")
    other.chmod(0o755)
    [check] = [c for c in check_hooks(show_config(installed, str(other))) if c.name == "Prolog"]
    assert not check.ok and "is not mig_batch's mig-batch-prolog" in check.detail
    prolog.chmod(0o755)
    [check] = [c for c in check_hooks(show_config(installed)) if c.name == "Prolog"]
    assert check.ok


@pytest.mark.parametrize("kind", ["direct", "c", "python"])
def test_doctor_names_a_hook_client_or_python_that_moved(site, tmp_path, kind):
    """A shim runs the hook client (the compiled one, or a Python and hook_client.py) and the slow path's
    Python: each that no longer exists is named."""
    slurm_dir = tmp_path / f"etc-{kind}"
    python = tmp_path / "venv" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    install(slurm_dir, str(python), site.path, str(site.job_dir), str(site.agent_socket), [get_model("A100-40GB")],
            hook_client_kind=kind)  # fmt: skip
    [check] = [c for c in check_hooks(show_config(slurm_dir)) if c.name == "Prolog"]
    assert check.ok, check.detail
    python.unlink()  # the venv moved
    [check] = [c for c in check_hooks(show_config(slurm_dir)) if c.name == "Prolog"]
    assert not check.ok and f"runs {python}, which does not exist" in check.detail
    if kind == "c":
        python.symlink_to(sys.executable)
        binary = slurm_dir / "mig-batch-hook"
        binary.write_text("#!/bin/sh\necho 'GLIBC_2.34 not found' >&2\nexit 1\n")  # built for another node
        [check] = [c for c in check_hooks(show_config(slurm_dir)) if c.name == "Prolog"]
        assert not check.ok and f"{binary} cannot run here (exit 1: GLIBC_2.34 not found)" in check.detail
        binary.unlink()
        [check] = [c for c in check_hooks(show_config(slurm_dir)) if c.name == "Prolog"]
        assert not check.ok and f"runs {binary}, which does not exist" in check.detail
    if kind == "direct":  # the compiled client is the hook: it must run here, or every job start fails
        python.symlink_to(sys.executable)
        prolog, binary = slurm_dir / "mig-batch-prolog", slurm_dir / "mig-batch-hook"
        [check] = [c for c in check_hooks(show_config(slurm_dir), site) if c.name == "Prolog"]
        assert check.ok, check.detail  # the site's socket and job_dir are the ones compiled in
        moved = dataclasses.replace(site, agent_socket=tmp_path / "elsewhere.sock")
        [check] = [c for c in check_hooks(show_config(slurm_dir), moved) if c.name == "Prolog"]
        assert not check.ok and f"has socket={site.agent_socket} compiled in" in check.detail
        misnamed = show_config(slurm_dir, str(slurm_dir / "mig-batch-epilog"))  # Prolog= the epilog
        [check] = [c for c in check_hooks(misnamed) if c.name == "Prolog"]
        assert not check.ok and "runs as the hook its name holds (epilog), not as the prolog" in check.detail
        binary.write_bytes(b"\x7fELF" + bytes(60))  # built for another kind of node
        [check] = [c for c in check_hooks(show_config(slurm_dir)) if c.name == "Prolog"]
        assert not check.ok and f"{prolog} cannot run here" in check.detail and "every job start fails" in check.detail
        binary.unlink()
        [check] = [c for c in check_hooks(show_config(slurm_dir)) if c.name == "Prolog"]
        assert not check.ok and f"{prolog} does not exist" in check.detail


def test_doctor_on_a_node_without_agent_or_slurm_fails_with_fixes(site, gpus, capsys, tmp_path):
    with open(site.path, "a") as f:
        f.write(f"slurm_bin: {tmp_path}/no-slurm\n")
    code, out = doctor(site, capsys, "--node", "n1", "--json")
    checks = {c["name"]: c for c in json.loads(out)}
    assert code == 1
    assert not checks["slurm"]["ok"] and "slurm_bin" in checks["slurm"]["fix"]
    assert not checks["agent"]["ok"] and "mig-batch-agent" in checks["agent"]["fix"]
    assert checks["gpu backend"]["ok"] and checks["mig mode"]["ok"]


def test_doctor_checks_the_controllers_store_and_job_submit(site, installed, capsys):
    code, out = doctor(site, capsys, "--role", "controller")
    assert code == 0 and "ok   store:" in out and "ok   job_submit.lua:" in out, out
    (installed / "job_submit.lua").unlink()
    code, out = doctor(site, capsys, "--role", "controller")
    assert code == 1 and f"FAIL job_submit.lua: {installed}/job_submit.lua does not exist" in out


@pytest.mark.parametrize(("params", "said", "advised"), [
    ("(null)", "batch_sched_delay is 3 s: a MIG job may wait up to 3 s", True),
    ("sched_interval=2,batch_sched_delay=5", "batch_sched_delay is 5 s", True),
    ("batch_sched_delay=-2", "batch_sched_delay is 3 s", True),  # slurmctld takes its default for it
    ("batch_sched_delay=5,batch_sched_delay=1", "batch_sched_delay is 5 s", True),  # the first one counts
    ("Batch_Sched_Delay=1s", "batch_sched_delay=1: a released MIG job starts", False),  # any case; atoi
    ("batch_sched_delay=x", "batch_sched_delay=0: a released MIG job starts", False),  # atoi("x") is 0
    ("batch_sched_delay=1,default_queue_depth=200", "batch_sched_delay=1: a released MIG job starts", False),
    ("batch_sched_delay=0", "batch_sched_delay=0: a released MIG job starts", False),
])  # fmt: skip
def test_doctor_advises_a_batch_sched_delay_that_starts_a_released_job_soon(site, installed, capsys, params, said,
                                                                           advised):  # fmt: skip
    config = installed.parent / "slurm-bin" / "config.txt"
    config.write_text(config.read_text() + f"SchedulerParameters     = {params}\n")
    code, out = doctor(site, capsys, "--role", "controller")
    assert code == 0 and f"ok   scheduler: {said}" in out, out
    assert ("add batch_sched_delay=1 to SchedulerParameters" in out) == advised


def test_doctor_refuses_an_unreadable_config_as_bad_input(tmp_path, capsys):
    code = main(["doctor", "--config", str(tmp_path / "missing.yaml")])
    captured = capsys.readouterr()
    assert code == 2 and "cannot read the mig_batch config" in captured.err and "missing.yaml" in captured.err
    assert "FAIL" not in captured.out and "Traceback" not in captured.err
