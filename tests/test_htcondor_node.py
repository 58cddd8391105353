"""HTCondor's execute-node side and submission without a pool: the schedd's size check evaluated by the
ClassAd library against the request parser, the job wrapper against a stand-in agent, the slot guard,
the installer and migsub's submit description. The real pool is in test_htcondor_node_e2e.py."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.htcondor.attrs import _fits_expression, largest_profile_text, schedd_config
from mig_batch.htcondor.install import install, wrapper_text
from mig_batch.htcondor.node import SlotGuard, exports_env
from mig_batch.htcondor.peers import Caller, CallerRefused, find_caller
from mig_batch.mig.models import get_model
from mig_batch.request import RequestError, parse_gres

classad2 = pytest.importorskip("classad2")
SITE = [get_model("A100-80GB"), get_model("H100-80GB")]
LARGEST = max(m.largest_profile.memory_mib for m in SITE)


def fits(spec: str | None, models=SITE) -> bool:
    ad = classad2.ClassAd()
    if spec is not None:
        ad["MigRequest"] = spec
    ad["Fits"] = classad2.ExprTree(_fits_expression(models))
    value = ad.eval("Fits")
    assert isinstance(value, bool), f"{spec!r}: {value!r}"  # never undefined or error: the schedd would refuse
    return value


UNITS = ["M", "MiB", "MB", "m", "G", "GiB", "GB", "gib", "gb", "T", "TiB", "TB"]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200_000), st.sampled_from(["", ".5", ".25", ".125"]), st.sampled_from(UNITS))
def test_the_schedd_size_check_agrees_with_the_request_parser(number, fraction, unit):
    spec = f"{number}{fraction}{unit}"
    try:
        request = parse_gres(f"mig:{spec}")
    except RequestError:  # a PiB or more: refused by the parser, and by the schedd as larger than any profile
        assert not fits(spec), spec
        return
    assert fits(spec) == (request.memory_mib <= LARGEST), spec


@pytest.mark.parametrize("slices", range(1, 10))
def test_compute_slices_fit_up_to_the_largest_profile(slices):
    assert fits(f"{slices}g") == (slices <= 7)


def test_profile_names_fit_when_a_site_model_has_them():
    for model in SITE:
        for profile in model.profiles:
            assert fits(profile.name) and fits(profile.name.upper())
    assert not fits("9g.90gb") and not fits("4g.20gb")
    a30 = [get_model("A30-24GB")]
    assert fits("4g.24gb", a30) and not fits("7g.80gb", a30) and not fits("4g.24gb")
    assert fits(None) and fits("anything-else")  # not a size: the controller's to refuse


def test_the_refusal_names_the_largest_profile_of_the_site():
    assert largest_profile_text(SITE).startswith("7g.80gb on ")
    a30 = [get_model("A30-24GB")]
    assert largest_profile_text(a30).startswith("4g.24gb on A30-24GB")
    text = schedd_config("migctl", a30, ["agent@x"])
    assert "SUBMIT_REQUIREMENT_MigBatchFits_REASON" in text and "4g.24gb on A30-24GB" in text
    assert "QUEUE_SUPER_USERS = $(QUEUE_SUPER_USERS), migctl, agent@x" in text
    assert "MigBatchFits" not in schedd_config("migctl")  # no models, no size check


# --- the job wrapper, against a stand-in agent -------------------------------------------------


class FakeAgent:
    """Answers the wrapper like the agent would, and records what it was asked."""

    def __init__(self, path: Path, env: dict, ok: bool = True):
        self.asked: list[tuple[str, str, float]] = []
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(path))
        self.server.listen()
        self.env, self.ok = env, ok
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.answer(conn.makefile().readline()))

    def answer(self, line: str) -> bytes:
        request = json.loads(line)
        self.asked.append((request["op"], request["job"], time.time()))
        env = self.env if request["op"] == "prolog" else {}
        return json.dumps({"ok": self.ok, "detail": "stand-in", "env": env}).encode() + b"\n"


def wrapper(tmp_path, job_ad: str, command: list[str], **popen):
    path = tmp_path / "wrapper"
    path.write_text(wrapper_text(sys.executable, str(tmp_path / "{node}.sock")))
    path.chmod(0o755)
    (tmp_path / "job.ad").write_text(job_ad)
    (tmp_path / "machine.ad").write_text('MigBatchNodeName = "nodeb"\n')
    env = {"PATH": os.environ["PATH"], "_CONDOR_JOB_AD": str(tmp_path / "job.ad"),
           "_CONDOR_MACHINE_AD": str(tmp_path / "machine.ad"),
           "_CONDOR_WRAPPER_ERROR_FILE": str(tmp_path / "wrapper.err"), "CUDA_VISIBLE_DEVICES": "10000"}  # fmt: skip
    return subprocess.Popen([str(path), *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)  # fmt: skip


MANAGED = 'ClusterId = 12\nProcId = 0\nMigBatchTag = "mig-batch:v1;req=20G;place=nodeb/0/3g.40gb@4"\n'


def test_the_wrapper_exports_the_agents_instance_and_asks_to_destroy_it_after_the_job(tmp_path):
    agent = FakeAgent(tmp_path / "nodeb.sock", {"CUDA_VISIBLE_DEVICES": "MIG-abc", "MIG_BATCH_INSTANCE": "x"})
    proc = wrapper(tmp_path, MANAGED, ["/bin/sh", "-c", "echo $CUDA_VISIBLE_DEVICES $MIG_BATCH_INSTANCE; exit 3"])
    out, _ = proc.communicate(timeout=30)
    ended = time.time()
    assert (out.strip(), proc.returncode) == ("MIG-abc x", 3)  # the job's own status
    assert [(op, job) for op, job, _ in agent.asked] == [("prolog", "12.0"), ("epilog", "12.0")]
    assert agent.asked[1][2] <= ended


MULTI = {"CUDA_VISIBLE_DEVICES": "MIG-a", "MIG_BATCH_INSTANCE": "nodeb/0/1g.10gb@6",
         "MIG_BATCH_INSTANCES": "MIG-a,MIG-b,MIG-c", "MIG_BATCH_INSTANCE_COUNT": "3",
         "MIG_BATCH_SPOTS": "nodeb/0/1g.10gb@6,nodeb/0/1g.10gb@5,nodeb/1/1g.10gb@6"}  # fmt: skip
RANKS = """for r in 0 1 2; do LOCAL_RANK=$r "$MIG_BATCH_BIND" --rank sh -c \
'echo "$LOCAL_RANK $MIG_BATCH_RANK $CUDA_VISIBLE_DEVICES $MIG_BATCH_INSTANCE"'; done
echo "job $CUDA_VISIBLE_DEVICES $MIG_BATCH_INSTANCE_COUNT"
"""


def test_each_rank_process_of_a_job_over_several_instances_binds_to_its_own(tmp_path):
    agent = FakeAgent(tmp_path / "nodeb.sock", MULTI)
    proc = wrapper(tmp_path, MANAGED, ["/bin/sh", "-c", RANKS])
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["0 0 MIG-a nodeb/0/1g.10gb@6", "1 1 MIG-b nodeb/0/1g.10gb@5",
                                "2 2 MIG-c nodeb/1/1g.10gb@6", "job MIG-a 3"]  # fmt: skip
    assert [op for op, _, _ in agent.asked] == ["prolog", "epilog"]  # the rank processes asked nobody


@pytest.mark.parametrize("env, says", [
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "2"}, "ok MIG-c"), ({"MPI_LOCALRANKID": "1"}, "ok MIG-b"),
    ({"MIG_BATCH_RANK": "0"}, "ok MIG-a"), ({"LOCAL_RANK": "1", "MIG_BATCH_RANK": "0"}, "ok MIG-b"),
    ({"LOCAL_RANK": "3"}, "LOCAL_RANK=3 is not a rank of this job's 3 MIG instance(s)"),
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK=x is not a rank"), ({}, "no local rank in the environment"),
])  # fmt: skip
def test_the_rank_mode_reads_the_launchers_local_rank_and_refuses_what_is_no_rank(tmp_path, env, says):
    path = tmp_path / "wrapper"
    path.write_text(wrapper_text(sys.executable, str(tmp_path / "{node}.sock")))
    path.chmod(0o755)
    proc = subprocess.run([str(path), "--rank", "/bin/sh", "-c", "echo ok $CUDA_VISIBLE_DEVICES"],
                          env={"PATH": os.environ["PATH"], **MULTI, **env}, capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert says in proc.stdout + proc.stderr
    assert proc.returncode == (0 if says.startswith("ok") else 2)


def test_the_rank_mode_of_a_job_of_one_instance_runs_rank_0_on_it(tmp_path):
    path = tmp_path / "wrapper"
    path.write_text(wrapper_text(sys.executable, str(tmp_path / "{node}.sock")))
    path.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "MIG-a", "MIG_BATCH_INSTANCE": "n/0/1g.10gb@6"}
    ran = [subprocess.run([str(path), "--rank", "/bin/sh", "-c", "echo $CUDA_VISIBLE_DEVICES $MIG_BATCH_INSTANCE"],
                          env={**env, "LOCAL_RANK": rank}, capture_output=True, text=True, timeout=30)
           for rank in ("0", "1")]  # fmt: skip
    assert (ran[0].returncode, ran[0].stdout.strip()) == (0, "MIG-a n/0/1g.10gb@6")
    assert ran[1].returncode == 2 and "not a rank of this job's 1 MIG instance(s)" in ran[1].stderr


def test_the_wrapper_passes_signals_on_and_still_asks_for_the_epilog(tmp_path):
    agent = FakeAgent(tmp_path / "nodeb.sock", {"CUDA_VISIBLE_DEVICES": "MIG-abc"})
    proc = wrapper(tmp_path, MANAGED, ["/bin/sh", "-c", "echo started; sleep 30"])
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGTERM)  # what the starter sends for condor_rm, condor_hold, an eviction
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGTERM
    assert [op for op, _, _ in agent.asked] == ["prolog", "epilog"]


def test_an_unmanaged_job_runs_as_is_without_asking(tmp_path):
    agent = FakeAgent(tmp_path / "nodeb.sock", {})
    proc = wrapper(tmp_path, "ClusterId = 3\nProcId = 0\n", ["/bin/sh", "-c", "echo $CUDA_VISIBLE_DEVICES"])
    assert proc.communicate(timeout=30)[0].strip() == "10000" and agent.asked == []


def test_without_an_instance_the_job_never_runs_and_waits_for_the_requeue(tmp_path):
    agent = FakeAgent(tmp_path / "nodeb.sock", {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, ok=False)
    marker = tmp_path / "ran"
    proc = wrapper(tmp_path, MANAGED, ["/bin/sh", "-c", f"touch {marker}"])
    deadline = time.monotonic() + 10
    while not agent.asked and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert proc.poll() is None  # waiting for mig-batchd's requeue (a hold: SIGTERM)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert proc.returncode == 143 and not marker.exists()


def test_a_refusal_holds_the_job_through_the_wrapper_error_file(tmp_path):
    class Refusing(FakeAgent):
        def serve(self):
            conn, _ = self.server.accept()
            with conn:
                conn.makefile().readline()
                conn.sendall(b'{"ok": false, "detail": "refused: not your slot", "env": {}}\n')

    Refusing(tmp_path / "nodeb.sock", {})
    proc = wrapper(tmp_path, MANAGED, ["/bin/true"])
    proc.wait(timeout=30)
    assert proc.returncode == 1 and "refused: not your slot" in (tmp_path / "wrapper.err").read_text()


def test_a_job_killed_by_sigkill_leaves_the_wrapper_killed_by_sigkill_without_a_traceback(tmp_path):
    agent = FakeAgent(tmp_path / "nodeb.sock", {"CUDA_VISIBLE_DEVICES": "MIG-abc"})
    proc = wrapper(tmp_path, MANAGED, ["/bin/sh", "-c", "kill -9 $$"])
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL and "Traceback" not in err
    assert [op for op, _, _ in agent.asked] == ["prolog", "epilog"]


def test_an_unmanaged_job_that_cannot_run_is_reported_without_a_traceback(tmp_path):
    proc = wrapper(tmp_path, "ClusterId = 3\nProcId = 0\n", [str(tmp_path / "no-such-program")])
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 127 and "cannot run" in err and "Traceback" not in err


@pytest.mark.parametrize("reply", [b"not json\n", b"[1, 2]\n", b'"ok"\n'])
def test_a_malformed_agent_reply_counts_as_an_unreachable_agent(tmp_path, monkeypatch, reply):
    from mig_batch.htcondor import job_wrapper

    class Garbled(FakeAgent):
        def answer(self, line: str) -> bytes:
            self.asked.append(("?", "?", time.time()))
            return reply

    agent = Garbled(tmp_path / "a.sock", {})
    monkeypatch.setattr(job_wrapper, "AGENT_RETRY_S", 0.3)
    monkeypatch.setattr(job_wrapper.time, "sleep", lambda s: None)
    answer = job_wrapper.ask_patiently(str(tmp_path / "a.sock"), "prolog", "12.0")
    assert answer["ok"] is False and answer["detail"].startswith("node agent unreachable")
    assert len(agent.asked) >= 2  # retried, as for an agent that is down


# --- the agent's slot guard ----------------------------------------------------------------------


class FakeBatch:
    def __init__(self, ads):
        self.ads = ads

    def _startds(self):
        return [{"Name": "slot1@nodeb@pool", "MigBatchNodeName": "nodeb"}]

    def _call(self, what):
        import contextlib

        return contextlib.nullcontext()

    @property
    def schedd(self):
        return self

    def query(self, constraint, projection):
        cluster = constraint.split()[2]
        return [self.ads[cluster]] if cluster in self.ads else []

    def _plain(self, ad):
        return ad


def test_the_guard_lets_a_job_ask_only_from_its_own_slot_of_its_own_node():
    batch = FakeBatch({"7": {"JobStatus": 2, "RemoteHost": "slot1_2@nodeb@pool", "Owner": "nobody-here"},
                       "8": {"JobStatus": 1, "Owner": "x"}})  # fmt: skip
    guard = SlotGuard(batch, "nodeb", local_name="NODEB", settle_s=0.0)
    mine = Caller(os.getpid(), os.getuid(), "slot1_2", "NODEB")
    guard.check_prolog(mine, "7.0")
    for caller, job, why in [(Caller(1, 0, "slot1_1", "NODEB"), "7.0", "not running in slot1_1@nodeb@pool"),
                             (Caller(1, 0, "slot1_2", ""), "7.0", "not of nodeb"),
                             (mine, "8.0", "not running"), (mine, "9.0", "no job 9.0")]:  # fmt: skip
        with pytest.raises(CallerRefused, match=why):
            guard.check_prolog(caller, job)
    with pytest.raises(CallerRefused, match="not made for slot slot1_1"):
        guard.check_epilog(Caller(1, 0, "slot1_1", "NODEB"), "7.0")
    guard.check_epilog(mine, "7.0")
    with pytest.raises(CallerRefused):
        guard.check_epilog(mine, "7.0")  # once


def test_the_guard_compares_the_callers_uid_with_the_owners(tmp_path):
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    batch = FakeBatch({"7": {"JobStatus": 2, "RemoteHost": "slot1_1@nodeb@pool", "Owner": me}})
    guard = SlotGuard(batch, "nodeb", settle_s=0.0)
    with pytest.raises(CallerRefused, match="is not job 7.0's owner"):
        guard.check_prolog(Caller(os.getpid(), os.getuid() + 1, "slot1_1", ""), "7.0")
    guard.check_prolog(Caller(os.getpid(), os.getuid(), "slot1_1", ""), "7.0")


def test_a_process_outside_any_slot_is_no_caller():
    with pytest.raises(CallerRefused, match="no condor_starter"):
        find_caller(os.getpid(), os.getuid())


def test_the_agents_exports_become_the_jobs_environment():
    assert exports_env(["export CUDA_VISIBLE_DEVICES=MIG-1", "export A=b=c"]) == {"CUDA_VISIBLE_DEVICES": "MIG-1",
                                                                                  "A": "b=c"}  # fmt: skip


# --- the installer and migsub ---------------------------------------------------------------------


def test_install_writes_the_policy_the_wrapper_and_the_unit(tmp_path):
    written = install(tmp_path, SITE, "migctl@site", [], "/usr/bin/python3", "/run/mig-batch/agent.sock",
                      "/run/mig-batch/htcondor-agent.ad")  # fmt: skip
    names = {p.name for p in written}
    assert names == {"mig-batch-schedd.conf", "mig-batch-execute.conf", "mig-batch-job-wrapper",
                     "mig-batch-htcondor-agent.service"}  # fmt: skip
    execute = (tmp_path / "mig-batch-execute.conf").read_text()
    assert "USER_JOB_WRAPPER = /usr/local/libexec/mig-batch/mig-batch-job-wrapper" in execute
    assert 'MigBatchNodeName = "$(HOSTNAME)"' in execute
    assert "SUBMIT_REQUIREMENT_MigBatchFits" in (tmp_path / "mig-batch-schedd.conf").read_text()
    text = (tmp_path / "mig-batch-job-wrapper").read_text()
    assert text.startswith("#!/usr/bin/python3 -IS\n") and "SOCKET = '/run/mig-batch/agent.sock'" in text
    compile(text, "wrapper", "exec")
    assert os.access(tmp_path / "mig-batch-job-wrapper", os.X_OK)


def test_migsub_writes_the_request_as_the_attributes_the_schedd_turns_into_the_tag(tmp_path):
    from mig_batch.cli.migsub import JobSpec, condor_description

    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\necho\n")
    job.chmod(0o755)
    rigid = condor_description(JobSpec(job, ["a b"], {"gpu_mem": "18G", "gpu_compute": "0.3", "gpu": "a100-80gb"}),
                               ["#CONDOR request_memory = 64M"])  # fmt: skip
    assert rigid["executable"] == str(job) and rigid["arguments"] == "\"'a b'\""
    assert (rigid["MY.MigRequest"], rigid["MY.MigCompute"], rigid["MY.MigModel"]) == ('"18432M"', '"0.3"',
                                                                                      '"A100-80GB"')  # fmt: skip
    assert rigid["request_memory"] == "64M"
    moldable = condor_description(JobSpec(job, [], {"moldable": "1g=300,3g.40gb=110"}), [])
    assert (moldable["MY.MigRequest"], moldable["MY.MigMoldable"]) == ('"1g"', '"1g:300,3g.40gb:110"')
    assert "MY.MigCompute" not in moldable and "arguments" not in moldable


def test_migsub_takes_the_flag_then_the_site_config_then_the_one_batch_system_found(tmp_path, monkeypatch):
    from mig_batch.cli import migsub

    site = tmp_path / "site.yaml"
    site.write_text("nodes: {n1: [A100-80GB]}\n")
    monkeypatch.setenv("MIG_BATCH_CONFIG", str(site))
    found = {"sbatch": True, "schedd": True}
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/sbatch" if found["sbatch"] else None)
    monkeypatch.setattr(migsub, "schedd_reachable", lambda: found["schedd"])
    with pytest.raises(migsub.DirectiveError, match="both Slurm"):
        migsub.choose_backend(None)
    assert migsub.choose_backend("slurm") == "slurm"
    found["sbatch"] = False
    assert migsub.choose_backend(None) == "htcondor"
    found.update(sbatch=True, schedd=False)
    assert migsub.choose_backend(None) == "slurm"
    found["sbatch"] = False
    with pytest.raises(migsub.DirectiveError, match="no batch system found"):
        migsub.choose_backend(None)
    site.write_text("batch_system: htcondor\nnodes: {n1: [A100-80GB]}\n")
    assert migsub.choose_backend(None) == "htcondor" and migsub.choose_backend("slurm") == "slurm"


def test_without_a_client_config_no_schedd_is_reachable(monkeypatch, tmp_path):
    from mig_batch.cli import migsub

    monkeypatch.delenv("CONDOR_CONFIG", raising=False)
    monkeypatch.setattr(migsub, "Path", lambda p: tmp_path / "absent")
    assert migsub.schedd_reachable() is False


def test_a_restarted_agent_still_knows_which_slot_may_end_an_instance(tmp_path):
    from mig_batch.node.journal import Entry, Journal

    journal = Journal(tmp_path / "journal")
    batch = FakeBatch({"7": {"JobStatus": 2, "RemoteHost": "slot1_2@nodeb@pool", "Owner": "nobody-here"},
                       "8": {"JobStatus": 2, "RemoteHost": "slot1_3@nodeb@pool", "Owner": "nobody-here"}})  # fmt: skip
    first = SlotGuard(batch, "nodeb", settle_s=0.0, directory=tmp_path / "slots", journal=journal)
    first.check_prolog(Caller(os.getpid(), os.getuid(), "slot1_2", ""), "7.0")
    journal.add(Entry("7.0", 0, 1, "1g.10gb", 0, "MIG-x", 0.0))
    restarted = SlotGuard(batch, "nodeb", settle_s=0.0, directory=tmp_path / "slots", journal=journal)
    with pytest.raises(CallerRefused):
        restarted.check_epilog(Caller(1, 0, "slot1_3", ""), "7.0")
    with pytest.raises(CallerRefused, match="made for uid"):
        restarted.check_epilog(Caller(1, os.getuid() + 1, "slot1_2", ""), "7.0")  # its slot, another uid
    restarted.check_epilog(Caller(1, os.getuid(), "slot1_2", ""), "7.0")
    assert not (tmp_path / "slots" / "7.0").exists()
    # a job whose instance the sweep took (no journal entry) leaves no file behind for long; one whose
    # instance is being made right now (not journaled yet) keeps its file
    first.check_prolog(Caller(os.getpid(), os.getuid(), "slot1_2", ""), "7.0")
    journal.remove("7.0")
    first.check_prolog(Caller(os.getpid(), os.getuid(), "slot1_3", ""), "8.0")
    assert sorted(p.name for p in (tmp_path / "slots").iterdir()) == ["7.0", "8.0"]
    old = time.time() - 3600
    os.utime(tmp_path / "slots" / "7.0", (old, old))
    first.check_prolog(Caller(os.getpid(), os.getuid(), "slot1_3", ""), "8.0")
    assert sorted(p.name for p in (tmp_path / "slots").iterdir()) == ["8.0"]


@pytest.mark.parametrize("spec, moldable, accepted", [
    (None, None, True), ("20G", None, True), ("3g.40gb", None, True), ("mig:3g.40gb", None, True),
    ("1g.10gb:1", None, True), ("1g.10gb:4", None, True), ("20G:2", None, True), ("2g:3", None, True),
    ("1g.10gb:0", None, False), ("1g.10gb:00", None, False), ("1g.10gb:", None, False),
    ("20G", "1g:300,3g:110", True), ("20G:1", "1g:300,3g:110", True), ("20G:2", "1g:300,3g:110", False),
])  # fmt: skip
def test_the_schedd_takes_a_count_of_instances_but_not_none_nor_with_moldable(spec, moldable, accepted):
    from mig_batch.htcondor.attrs import INSTANCES

    ad = classad2.ClassAd()
    if spec is not None:
        ad["MigRequest"] = spec
    if moldable is not None:
        ad["MigMoldable"] = moldable
    ad["Count"] = classad2.ExprTree(INSTANCES)
    assert ad.eval("Count") is accepted


@pytest.mark.parametrize("spec, fit", [
    ("1g.10gb:4", True), ("7g.80gb:2", True), ("20G:3", True), ("2g:7", True), ("9g.90gb:2", False),
    ("500G:2", False), ("8g:2", False),
])  # fmt: skip
def test_the_size_check_reads_the_request_without_its_count(spec, fit):
    assert fits(spec) is fit


def test_the_agents_rank_lines_become_the_spots_and_never_names_of_variables():
    lines = ["export CUDA_VISIBLE_DEVICES=MIG-a", "export MIG_BATCH_INSTANCE=n/0/1g.10gb@6",
             "export MIG_BATCH_INSTANCES=MIG-a,MIG-b", "export MIG_BATCH_INSTANCE_COUNT=2",
             "#rank 0 export CUDA_VISIBLE_DEVICES=MIG-a", "#rank 0 export MIG_BATCH_INSTANCE=n/0/1g.10gb@6",
             "#rank 1 export CUDA_VISIBLE_DEVICES=MIG-b",
             "#rank 1 export MIG_BATCH_INSTANCE=n/0/1g.10gb@5"]  # fmt: skip
    assert exports_env(lines) == {"CUDA_VISIBLE_DEVICES": "MIG-a", "MIG_BATCH_INSTANCE": "n/0/1g.10gb@6",
                                  "MIG_BATCH_INSTANCES": "MIG-a,MIG-b", "MIG_BATCH_INSTANCE_COUNT": "2",
                                  "MIG_BATCH_SPOTS": "n/0/1g.10gb@6,n/0/1g.10gb@5"}  # fmt: skip
    assert exports_env(lines[:2]) == {"CUDA_VISIBLE_DEVICES": "MIG-a", "MIG_BATCH_INSTANCE": "n/0/1g.10gb@6"}


def test_migsub_submits_a_job_over_several_instances_to_htcondor_as_one_count(tmp_path, monkeypatch, capsys):
    from mig_batch.cli import migsub

    site = tmp_path / "site.yaml"
    site.write_text("nodes: {n1: [A100-80GB]}\n")
    monkeypatch.setenv("MIG_BATCH_CONFIG", str(site))
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n#SBATCH --ntasks=3\necho\n")  # Slurm's task count: not HTCondor's to read

    def description(*args: str) -> dict:
        assert migsub._run(["--backend", "htcondor", "--dry-run", "--json", *args, str(job)]) == 0
        return json.loads(capsys.readouterr().out)["htcondor"]

    assert description("--mig", "1g.10gb", "--instances", "4")["MY.MigRequest"] == '"1g.10gb:4"'
    assert description("--gpu-mem", "5G", "--instances", "2")["MY.MigRequest"] == '"5120M:2"'
    assert description("--gres=mig:1g.10gb:3")["MY.MigRequest"] == '"1g.10gb:3"'
    assert description("--mig", "1g.10gb")["MY.MigRequest"] == '"1g.10gb"'
    # more than a node of the site holds: refused at submission, as on Slurm
    assert migsub._run(["--backend", "htcondor", "--dry-run", "--mig", "1g.10gb", "--instances", "8", str(job)]) == 2
    assert "no node of this site holds 8 instances of 1g.10gb; the most is 7 (on n1)" in capsys.readouterr().err
    # Flex-MIG's finer request over leaves, where the site allows it: the leaves' count, and the model where
    # another has the same leaf in another count (1g.10gb: 9,933 MiB on an A100-80GB, 9,984 on an H100-80GB)
    site.write_text("nodes: {n1: [A100-80GB], n2: [H100-80GB]}\nflex: {leaf_requests: true}\n")
    leaves = description("--gpu-mem", "19900M", "--instances", "auto")
    assert (leaves["MY.MigRequest"], leaves.get("MY.MigModel")) == ('"1g.10gb:2"', '"H100-80GB"')
    leaves = description("--gpu-compute", "5g", "--gpu-mem", "25G", "--instances", "auto")
    assert (leaves["MY.MigRequest"], leaves.get("MY.MigModel")) == ('"1g.10gb:5"', None)


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_torchrun_starts_one_process_per_instance_each_bound_through_the_wrapper(tmp_path):
    """The line docs/htcondor.md gives: torchrun --no-python "$MIG_BATCH_BIND" --rank CMD."""
    path = tmp_path / "wrapper"
    path.write_text(wrapper_text(sys.executable, str(tmp_path / "{node}.sock")))
    path.chmod(0o755)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node=3", "--no-python", str(path), "--rank",
                           "/bin/sh", "-c", "echo \"rank $LOCAL_RANK $CUDA_VISIBLE_DEVICES $MIG_BATCH_INSTANCE\""],
                          env={"PATH": os.environ["PATH"], **MULTI}, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 MIG-a nodeb/0/1g.10gb@6", "rank 1 MIG-b nodeb/0/1g.10gb@5", "rank 2 MIG-c nodeb/1/1g.10gb@6"]
