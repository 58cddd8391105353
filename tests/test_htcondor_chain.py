"""Subjob chains on HTCondor without a pool: the schedd's tag and submit requirement for a chain (evaluated by the
ClassAd library), the seam's reading of a subjob that ended, migsub's submit description, and the job wrapper
keeping a subjob's window. The pool's behaviour is tests/test_htcondor_chain_e2e.py's."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from mig_batch.batch.system import JobState
from mig_batch.batch.tags import Atomize, parse_tag
from mig_batch.htcondor import attrs
from mig_batch.htcondor.adapter import HELD, IDLE, to_batch_job

DEADLINE = 1_800_000_000  # epoch seconds


def evaluate(expression: str, **job):
    classad2 = pytest.importorskip("classad2")
    ad = classad2.ClassAd(job)
    ad["Value"] = classad2.ExprTree(expression)
    value = ad.eval("Value")
    return None if isinstance(value, classad2.Value) else value


@pytest.mark.parametrize(("job", "fields"), [
    ({"MigCheckpointDir": "/a/ck", "MigSubjobMin": 3, "MigSubjobMax": 16}, ";atomize=1;ckpt=/a/ck;smin=3;smax=16"),
    ({"MigCheckpointDir": "/ck"}, ";atomize=1;ckpt=/ck;smin=60;smax=3600"),  # migsub's defaults
    ({"MigCheckpointDir": "/c", "MigDeadline": DEADLINE}, f";atomize=1;ckpt=/c;smin=60;smax=3600;deadline={DEADLINE}"),
    ({}, ""),  # no chain
])  # fmt: skip
def test_the_schedds_tag_carries_the_chains_fields_as_slurms_does(job, fields):
    tag = evaluate(attrs._tag_expression(), MigRequest="6144M", MigCompute="0.3", **job)
    assert tag == f"mig-batch:v1;req=6144M;compute=0.3{fields}"
    if fields:
        atomize = parse_tag(tag).atomize
        assert isinstance(atomize, Atomize) and atomize.checkpoint_dir == job["MigCheckpointDir"]
        assert atomize.min_s <= atomize.max_s


@pytest.mark.parametrize(("job", "accepted"), [
    ({"MigRequest": "20G"}, True),  # not a chain
    ({"MigRequest": "20G", "MigCheckpointDir": "/home/a/ck-1.x", "MigSubjobMin": 3, "MigSubjobMax": 16}, True),
    ({"MigRequest": "1g.10gb:1", "MigCheckpointDir": "/ck"}, True),
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck", "MigDeadline": 1800000000}, True),
    ({"MigRequest": "20G", "MigCheckpointDir": "ck"}, False),  # relative
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck;place=n1/0/7g.80gb@0"}, False),  # would add fields to the tag
    ({"MigRequest": "20G", "MigCheckpointDir": "/c k"}, False),
    ({"MigRequest": "20G", "MigCheckpointDir": "/shared/a/../b"}, False),  # '..': another folder than it seems
    ({"MigRequest": "20G", "MigCheckpointDir": "/shared/a..b/.x"}, True),
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck", "MigSubjobMin": 20, "MigSubjobMax": 10}, False),
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck", "MigSubjobMin": 0}, False),
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck", "MigSubjobMax": 2.5}, False),  # whole seconds only
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck", "MigSubjobMax": "16"}, False),
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck", "MigSubjobMin": 7200}, False),  # above the default longest
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck", "MigDeadline": "soon"}, False),
    ({"MigRequest": "20G", "MigCheckpointDir": "/ck", "MigMoldable": "1g:60"}, False),
    ({"MigRequest": "1g.10gb:2", "MigCheckpointDir": "/ck"}, False),  # one instance per subjob
    ({"MigCheckpointDir": "/ck"}, False),  # no request
    ({"MigRequest": "20G", "MigSubjobMax": 16}, False),  # chain settings without a folder
])  # fmt: skip
def test_the_schedd_takes_only_a_well_formed_chain(job, accepted):
    assert evaluate(attrs._chain_expression(), **job) is accepted


def test_the_schedd_holds_a_chains_subjob_that_did_not_finish_it():
    text = attrs.schedd_config("mig-batch@pool")
    assert "JOB_TRANSFORM_NAMES = $(JOB_TRANSFORM_NAMES) MigBatchClear MigBatchTag MigBatchChain" in text
    block = text.split("JOB_TRANSFORM_MigBatchChain @=end\n")[1].split("@end")[0]
    hold = next(line for line in block.splitlines() if "OnExitHold " in line).split("OnExitHold ", 1)[1]
    for exit_code, signalled, held in ((0, False, False), (75, False, True), (1, False, True), (None, True, True)):
        job = {"ExitBySignal": signalled, **({} if exit_code is None else {"ExitCode": exit_code})}
        assert evaluate(hold, **job) is held, job
    assert f'OnExitHoldReason "{attrs.CHAIN_HOLD_REASON}"' in block and "OnExitHoldSubCode 75" in block
    assert "SUBMIT_REQUIREMENT_MigBatchChain = " in text


def ad(**fields):
    return {"ClusterId": 7, "ProcId": 0, "MigBatchTag": "mig-batch:v1;req=6G;atomize=1;ckpt=/ck;smin=3;smax=16",
            **fields}  # fmt: skip


def test_a_subjob_held_by_the_chains_exit_policy_has_ended_until_the_controller_unpins_it():
    ended = dict(JobStatus=HELD, HoldReasonCode=3, HoldReasonSubCode=75, HoldReason=attrs.CHAIN_HOLD_REASON,
                 MigBatchNode="n1", ExitCode=75, NumJobStarts=3, MigBatchStarts=2,
                 MigBatchTag="mig-batch:v1;req=1g.10gb;atomize=1;ckpt=/c;smin=60;smax=3600")  # fmt: skip
    job = to_batch_job(ad(**ended))
    assert job.state is JobState.FINISHED and job.exit_status == 75 and not job.held_by_user
    assert to_batch_job(ad(**{**ended, "ExitCode": 0, "ExitBySignal": True, "ExitSignal": 9})).exit_status == 137
    # unpinned by the controller's requeue-hold: it waits, held, for the chain's next grant
    waiting = to_batch_job(ad(**{k: v for k, v in ended.items() if k != "MigBatchNode"}))
    assert waiting.state is JobState.HELD and not waiting.held_by_user
    # its owner's hold of a running subjob is theirs, whatever it exited with before
    users = to_batch_job(ad(**{**ended, "HoldReasonCode": 1, "HoldReasonSubCode": 0, "HoldReason": "via condor_hold"}))
    assert users.state is JobState.HELD and users.held_by_user
    # another policy hold of the job's own (periodic_hold) is not a subjob's end
    assert to_batch_job(ad(**{**ended, "HoldReasonSubCode": 0})).state is JobState.HELD
    # nor the same code and subcode by the owner's own policy: on a job that is no chain, or one not started
    # since its pin (its spot would be freed while it stays pinned, to start there again unseen)
    assert to_batch_job(ad(**{**ended, "MigBatchTag": "mig-batch:v1;req=1g.10gb"})).state is JobState.HELD
    assert to_batch_job(ad(**{**ended, "NumJobStarts": 2})).state is JobState.HELD
    assert to_batch_job(ad(**{k: v for k, v in ended.items() if k != "MigBatchStarts"})).state is JobState.HELD
    assert to_batch_job(ad(JobStatus=IDLE, MigBatchNode="n1")).state is JobState.PENDING  # released, to start


def test_migsub_writes_the_chains_attributes_in_whole_seconds(tmp_path, monkeypatch, capsys):
    from mig_batch.cli import migsub

    site = tmp_path / "site.yaml"
    site.write_text("nodes: {n1: [A100-80GB]}\n")
    monkeypatch.setenv("MIG_BATCH_CONFIG", str(site))
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\necho\n")
    argv = ["--backend", "htcondor", "--dry-run", "--json", "--atomize", "--checkpoint-dir", str(tmp_path / "ck"),
            "--gpu-mem", "6G", "--subjob-min", "2.5s", "--subjob-max", "16s"]  # fmt: skip
    assert migsub._run([*argv, str(job)]) == 0
    description = json.loads(capsys.readouterr().out)["htcondor"]
    assert description["MY.MigCheckpointDir"] == json.dumps(str(tmp_path / "ck"))
    assert (description["MY.MigSubjobMin"], description["MY.MigSubjobMax"]) == ("3", "16")
    assert "MY.MigDeadline" not in description
    job.write_text("#!/bin/sh\n#CONDOR +MigSubjobMax = 99999\necho\n")
    assert migsub._run([*argv, str(job)]) == 2
    assert "+MigSubjobMax is migsub's to write for --atomize" in capsys.readouterr().err


CHILD = """
import os, signal, sys, time
out = sys.argv[1]
def note(what):
    with open(out, "a") as f:
        f.write(f"{what} {time.time():.3f}\\n")
signal.signal(signal.SIGUSR1, lambda *_: note("usr1"))
if "stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: note("term"))
else:
    signal.signal(signal.SIGTERM, lambda *_: (note("term"), sys.exit(75)))
note("start")
while True:
    time.sleep(0.05)
"""


def run_wrapped(tmp_path, *flags: str, deadline_in: float, margin: float) -> tuple[int, list[tuple[str, float]], float]:
    """The wrapper's run_child over a shell that starts CHILD (a grandchild: the group gets the signals; the shell
    ignores SIGTERM as a job's shell that waits for its training would), in a process of its own (the wrapper sets
    signal handlers); its status, CHILD's notes and the deadline."""
    child, out = tmp_path / "child.py", tmp_path / "notes"
    child.write_text(CHILD)
    deadline = time.time() + deadline_in
    code = textwrap.dedent(f"""
        import os, sys
        from mig_batch.htcondor import job_wrapper as w
        w.SUBJOB_GRACE_S, w.SUBJOB_KILL_S = 0.3, 0.4
        status = w.run_child(["/bin/sh", "-c", 'trap "" TERM; "$0" "$@"; exit $?', sys.executable, "{child}", "{out}",
                              *{list(flags)!r}], {deadline!r}, {margin!r})
        print(os.waitstatus_to_exitcode(status))
    """)  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    notes = [(w, float(t)) for w, t in (line.split() for line in out.read_text().splitlines())]
    return int(proc.stdout.strip()), notes, deadline


def test_the_wrapper_warns_a_subjob_before_its_deadline_and_stops_it_after(tmp_path):
    status, notes, deadline = run_wrapped(tmp_path, deadline_in=1.0, margin=0.5)
    kinds = [w for w, _ in notes]
    assert kinds == ["start", "usr1", "term"] and status == 75, notes
    usr1, term = notes[1][1], notes[2][1]
    assert deadline - 0.5 <= usr1 < deadline - 0.2  # the warning: margin before the deadline (polled every 0.1 s)
    assert deadline + 0.3 <= term < deadline + 0.6  # SIGTERM after the grace


def test_the_wrapper_kills_a_subjob_that_outlives_its_grace(tmp_path):
    status, notes, _ = run_wrapped(tmp_path, "stubborn", deadline_in=0.6, margin=0.2)
    assert [w for w, _ in notes] == ["start", "usr1", "term"] and status == -9, notes


def test_the_wrapper_reads_the_chains_folder_from_the_tag():
    from mig_batch.htcondor.job_wrapper import tag_fields

    fields = tag_fields("mig-batch:v1;req=6G;atomize=1;ckpt=/home/a/ck;smin=3;smax=16;place=n1/0/1g.10gb@2;window=16")
    assert (fields["atomize"], fields["ckpt"], fields["window"]) == ("1", "/home/a/ck", "16")


class OneJob:
    """The schedd as the agent's guard reads it: job 7.0 running in slot1_1 of nodeb, with ``tag``."""

    def __init__(self, tag: str):
        self.tag = tag
        self.schedd = self

    def _startds(self):
        return [{"Name": "slot1@nodeb@pool", "MigBatchNodeName": "nodeb"}]

    def _call(self, what):
        import contextlib

        return contextlib.nullcontext()

    def query(self, constraint, projection):
        return [{"JobStatus": 2, "RemoteHost": "slot1_1@nodeb@pool", "Owner": "nobody-here", "MigBatchTag": self.tag}]

    def _plain(self, ad):
        return ad


def test_the_agent_counts_a_chains_prologs_per_grant():
    """One HTCondor job runs every subjob of its chain: a prolog per subjob is no loop. A new subjob number comes
    only with the controller's grant (the tag is protected); within one grant the limit holds as for any job."""
    from mig_batch.htcondor import node
    from mig_batch.htcondor.peers import Caller, CallerRefused

    chain = OneJob("mig-batch:v1;req=6G;atomize=1;ckpt=/c;smin=3;smax=16;place=nodeb/0/1g.10gb@0;window=16;subjob=0")
    guard = node.SlotGuard(chain, "nodeb", settle_s=0.0)
    caller = Caller(os.getpid(), os.getuid(), "slot1_1", "")
    for subjob in range(node.PROLOGS_PER_WINDOW + 2):  # more subjobs than prologs a job gets a minute
        chain.tag = chain.tag.rsplit("subjob=", 1)[0] + f"subjob={subjob}"
        guard.check_prolog(caller, "7.0")
    for _ in range(node.PROLOGS_PER_WINDOW - 1):
        guard.check_prolog(caller, "7.0")
    with pytest.raises(CallerRefused, match="times within"):  # the same grant asked again and again
        guard.check_prolog(caller, "7.0")
    plain = node.SlotGuard(OneJob("mig-batch:v1;req=6G;place=nodeb/0/1g.10gb@0"), "nodeb", settle_s=0.0)
    for _ in range(node.PROLOGS_PER_WINDOW):
        plain.check_prolog(caller, "7.0")
    with pytest.raises(CallerRefused, match="times within"):
        plain.check_prolog(caller, "7.0")


@pytest.mark.parametrize(("job", "starts"), [
    ({}, True),  # not mig_batch's: anywhere
    ({"MigBatchTag": "t"}, False),  # managed, not pinned
    ({"MigBatchTag": "t", "MigBatchNode": "nodea"}, True),  # pinned before this rule
    ({"MigBatchTag": "t", "MigBatchNode": "nodea", "MigBatchStarts": 0}, True),  # pinned, never started
    ({"MigBatchTag": "t", "MigBatchNode": "nodea", "MigBatchStarts": 2, "NumJobStarts": 2}, True),  # pinned again
    ({"MigBatchTag": "t", "MigBatchNode": "nodea", "MigBatchStarts": 2, "NumJobStarts": 3}, False),  # ran on it
    ({"MigBatchTag": "t", "MigBatchNode": "nodeb", "MigBatchStarts": 0}, False),  # another node's
])  # fmt: skip
def test_the_startd_starts_a_managed_job_on_its_node_once_per_pin(job, starts):
    policy = attrs.START_POLICY.replace("MY.MigBatchNodeName", '"nodea"').replace("TARGET.", "")
    assert evaluate(policy, **job) is starts


def test_the_schedd_freezes_the_request_and_chain_attributes_before_it_changes_the_job():
    """An expression could read one way to the submit requirements and another to the transform that builds the
    tag (it may test the tag the transform deletes): the first transform sets each to its value first."""
    text = attrs.schedd_config("root@x")
    block = text.split("JOB_TRANSFORM_MigBatchClear @=end\n")[1].split("@end")[0].splitlines()
    frozen = [line.split()[1] for line in block if line.split()[0] == "EVALSET"]
    assert frozen == [*attrs.REQUEST_ATTRS, *attrs.CHAIN_ATTRS]
    assert all(line.split() == ["EVALSET", a, a] for line, a in zip(block, frozen, strict=False))  # first, as is
