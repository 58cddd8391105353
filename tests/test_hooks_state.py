"""The node agent (Prolog/Epilog work, reconcile) over the fake batch system and NVML on the emulated
libnvidia-ml, and the state store on a real SQLite file."""

import os
import signal
import socket
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import BatchError, JobState, Pin
from mig_batch.batch.tags import NodeReport, Placed, parse_agent_tag, parse_report, parse_tag, placed_tag
from mig_batch.config import ConfigError, SiteConfig, load_config
from mig_batch.gpu.nvml import NvmlNode
from mig_batch.node import hook_client
from mig_batch.node.agent import NodeAgent
from mig_batch.node.journal import Journal
from mig_batch.node.service import AgentServer, serve
from mig_batch.state import APPLICATION_ID, SCHEMA_VERSION, Decision, InstanceRecord, StateError, Store

TAG = "mig-batch:v1;req=4g.20gb"


@pytest.fixture
def site(tmp_path):
    return SiteConfig(state=tmp_path / "state.db", job_dir=tmp_path / "jobs", node_dir=tmp_path / "node",
                      nodes={"n1": ("A100-40GB", "A100-40GB")})  # fmt: skip


@pytest.fixture
def gpus(site, nvml_emu_creator):
    """n1's GPUs through NVML, on the emulated libnvidia-ml."""
    backend, _directory = nvml_emu_creator(list(site.nodes["n1"]), node="n1")
    return backend


@pytest.fixture
def batch():
    return FakeBatch(["n1"])


def agent(config, batch, gpus):
    return NodeAgent("n1", gpus, Journal(config.node_dir / "journal"), batch, config.job_dir)


def decide(batch, gpu, profile, start, request=TAG, node="n1"):
    """A job the controller pinned and released, started by the batch system (its Prolog comes next)."""
    job = batch.add(request)
    batch.pin_and_release([Pin(job, node, placed_tag(parse_tag(request), Placed(node, gpu, profile, start)))])
    batch.start(job)
    return job


def test_prolog_creates_the_decided_instance_reports_it_and_epilog_destroys_it_once(site, batch, gpus):
    a = agent(site, batch, gpus)
    job = decide(batch, 1, "4g.20gb", 0)
    a.prolog(job)
    node = gpus
    [inst] = node.instances(1)
    assert (inst.profile, inst.start) == ("4g.20gb", 0)
    assert (site.job_dir / job).read_text().startswith(f"export CUDA_VISIBLE_DEVICES={inst.uuid}\n")
    assert parse_report(batch.job(job).admin_tag) == NodeReport("made", 1, "4g.20gb", 0, inst.gi_id, inst.uuid)
    a.prolog(job)  # a second run (requeue on the same node) reuses the instance
    assert node.instances(1) == [inst]
    a.epilog(job)
    a.epilog(job)  # idempotent
    assert node.instances(1) == [] and not (site.job_dir / job).exists()
    assert Journal(site.node_dir / "journal").entries() == []


class FlakyBatch(FakeBatch):
    """A batch system that does not take the next ``fail`` job tag updates, or answer the next ``blind``
    reads of one job."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.fail = self.blind = 0

    def set_job_tag(self, job, admin_tag):
        if self.fail:
            self.fail -= 1
            raise BatchError("slurmctld did not answer")
        super().set_job_tag(job, admin_tag)

    def job(self, job):
        if self.blind:
            self.blind -= 1
            raise BatchError("slurmctld did not answer")
        return super().job(job)


@pytest.mark.parametrize("lost", ["report", "read"])
def test_a_report_slurm_did_not_take_is_sent_again_at_the_next_reconcile(site, gpus, lost):
    """A report lost on the way (a requeue the node asked for left the job running unbound to its end)."""
    batch = FlakyBatch(["n1"])
    a = agent(site, batch, gpus)
    job = decide(batch, 0, "7g.40gb", 0)
    if lost == "report":
        batch.fail = 1  # the instance is made; its report is not taken
    else:
        batch.blind = 2  # the decision's read and the one after that failure: the node asks for a requeue
    a.prolog(job)
    assert parse_report(batch.job(job).admin_tag) is None and job in a.unsent
    sent = a.unsent[job][0]
    a.reconcile()
    assert parse_report(batch.job(job).admin_tag) == sent and not a.unsent
    assert sent.kind == ("made" if lost == "report" else "requeue")


class SlowAnswers(FakeBatch):
    """Once ``slow`` is set, the next answer (a job or the listing) is given as it was when asked, but only
    once ``answer`` is set."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.slow = False
        self.asked, self.answer = threading.Event(), threading.Event()

    def _late(self, answer):
        if self.slow:
            self.slow = False
            self.asked.set()
            self.answer.wait(10)
        return answer

    def jobs(self):
        return self._late(super().jobs())

    def job(self, job):
        return self._late(super().job(job))


@pytest.mark.parametrize("question", ["its journal's jobs", "every job"])
def test_a_reconcile_asks_the_batch_system_outside_the_nodes_lock_and_keeps_what_started_meanwhile(site, gpus,
                                                                                                   question):
    """A slow slurmctld must not hold up the Prologs (the lock was held across the question), and a job
    provisioned while the question was out is not in the answer: its instance is not a stray."""
    batch = SlowAnswers(["n1"])
    a = agent(site, batch, gpus)
    a.prolog(decide(batch, 0, "1g.5gb", 0))  # a job the reconcile asks about
    if question == "every job":
        gpus.create(0, "1g.5gb", 6)  # not journaled: the reconcile lists every job (and destroys this one)
    batch.slow = True
    sweep = threading.Thread(target=a.reconcile)
    sweep.start()
    assert batch.asked.wait(10)
    job = decide(batch, 1, "1g.5gb", 0)
    done = threading.Thread(target=a.prolog, args=(job,))
    done.start()
    done.join(5)
    prolog_waited = done.is_alive()
    batch.answer.set()
    sweep.join(10)
    done.join(10)
    assert not prolog_waited, "the Prolog waited for the reconcile's question to the batch system"
    assert [i.uuid for i in gpus.instances(1)] == [a.journal.get(job).uuid] and len(gpus.instances(0)) == 1


class CountingBatch(FakeBatch):
    """Counts the listings of every job and records the jobs asked about one at a time; ``on_ask`` runs at
    the next question about one job."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.listings, self.asked, self.on_ask = 0, [], None

    def jobs(self):
        self.listings += 1
        return super().jobs()

    def job(self, job):
        self.asked.append(job)
        if self.on_ask is not None:
            self.on_ask, on_ask = None, self.on_ask
            on_ask()
        return super().job(job)


def test_a_reconcile_asks_about_the_journals_jobs_and_lists_every_job_only_for_an_unjournaled_instance(site, gpus):
    """Every node's reconcile listing the whole queue would cost the batch system a pass over it per node and
    interval: only the jobs the node journaled are asked about, unless an instance here is not journaled."""
    batch = CountingBatch(["n1"])
    a = agent(site, batch, gpus)
    live, gone = decide(batch, 1, "4g.20gb", 0), decide(batch, 0, "1g.5gb", 0)
    a.prolog(live)
    a.prolog(gone)
    batch.finish(gone)  # its Epilog never ran
    for _ in range(50):
        batch.add("not a MIG job")
    batch.asked.clear()
    [stray] = a.reconcile()
    assert f"job {gone}'s" in stray and batch.listings == 0 and sorted(batch.asked) == sorted([live, gone])
    gpus.create(0, "1g.5gb", 6)  # made behind mig_batch's back
    assert len(a.reconcile()) == 1 and batch.listings == 1 and gpus.instances(0) == []
    assert len(gpus.instances(1)) == 1


@pytest.mark.parametrize("question", ["its journal's jobs", "every job"])
def test_every_gpu_call_of_a_reconcile_is_made_under_the_nodes_lock(site, gpus, question):
    """The agent's GPU calls take turns (a Prolog's thread creates while the sweep's thread looks): a hang of
    the emulated driver, whose calls are not thread-safe, showed a read made outside the lock."""
    batch = CountingBatch(["n1"])
    a = agent(site, batch, gpus)
    a.prolog(decide(batch, 1, "4g.20gb", 0))
    if question == "every job":
        gpus.create(0, "1g.5gb", 6)
    calls = []

    class Watched:
        def __getattr__(self, name):
            call = getattr(gpus, name)
            return lambda *args, **kwargs: calls.append((name, a.lock._mutex.locked())) or call(*args, **kwargs)

    a.backend = Watched()
    a.reconcile()
    assert calls and all(held for _, held in calls), calls
    assert batch.listings == (question == "every job")


def test_an_instance_made_after_the_reconciles_look_is_left_to_the_next_reconcile(site, gpus):
    """Its job was not among those asked about (it may have started since): the next reconcile lists every job
    and destroys it when no running job's report names it."""
    batch = CountingBatch(["n1"])
    a = agent(site, batch, gpus)
    a.prolog(decide(batch, 1, "4g.20gb", 0))
    batch.on_ask = lambda: gpus.create(0, "1g.5gb", 6)  # between the look at the GPUs and the node's lock
    assert a.reconcile() == [] and len(gpus.instances(0)) == 1
    assert len(a.reconcile()) == 1 and gpus.instances(0) == [] and batch.listings == 1


def test_an_entry_journaled_after_the_reconciles_look_is_kept_though_dated_before_it(site, gpus):
    """Another writer (a Prolog's thread, a hook's fallback) stamps its entry before the reconcile's question and
    writes it after the reconcile read the journal: its job was not asked about, so its instance is kept, and
    the next reconcile asks."""
    from mig_batch.node.journal import Entry

    batch = CountingBatch(["n1"])
    a = agent(site, batch, gpus)
    a.prolog(decide(batch, 1, "4g.20gb", 0))

    def journaled_late():
        inst = gpus.create(0, "1g.5gb", 0)
        Journal(site.node_dir / "journal").add(Entry("77", 0, inst.gi_id, "1g.5gb", 0, inst.uuid, 1.0))

    batch.on_ask = journaled_late
    assert a.reconcile() == [] and len(gpus.instances(0)) == 1
    [stray] = a.reconcile()  # job 77 is unknown to the batch system
    assert stray.startswith("job 77's") and gpus.instances(0) == []


def test_a_question_the_batch_system_does_not_answer_skips_the_reconcile_and_destroys_nothing(site, gpus):
    """Its jobs may still run: nothing is destroyed, the reports waiting to be sent wait on, and the next
    reconcile goes on."""
    batch = FlakyBatch(["n1"])
    a = agent(site, batch, gpus)
    ended, running = decide(batch, 1, "4g.20gb", 0), decide(batch, 0, "1g.5gb", 0)
    a.prolog(ended)
    batch.fail = 1  # its report is not taken
    a.prolog(running)
    batch.finish(ended)  # its Epilog never ran
    batch.blind = 1  # the first question is not answered: the rest are not asked
    assert a.reconcile() == [] and len(gpus.instances(1)) == len(gpus.instances(0)) == 1 and running in a.unsent
    [stray] = a.reconcile()
    assert stray.startswith(f"job {ended}'s") and gpus.instances(1) == [] and len(gpus.instances(0)) == 1
    assert not a.unsent and parse_report(batch.job(running).admin_tag) is not None


def test_an_epilog_destroys_the_strays_on_its_jobs_gpu_and_leaves_other_gpus_to_the_reconcile(site, batch, gpus):
    a = agent(site, batch, gpus)
    kept, done = decide(batch, 1, "1g.5gb", 0), decide(batch, 1, "1g.5gb", 1)
    a.prolog(kept)
    a.prolog(done)
    assert a.epilog(done) == "destroyed 1g.5gb@1 on GPU 1"  # no stray: the instance ids were enough
    stray, elsewhere = gpus.create(1, "1g.5gb", 6), gpus.create(0, "1g.5gb", 6)  # made behind the agent's back
    done = decide(batch, 1, "2g.10gb", 2)
    a.prolog(done)
    detail = a.epilog(done)
    assert detail == "destroyed 2g.10gb@2 on GPU 1; destroyed 1 stray instance(s): 1g.5gb@6 on GPU 1", detail
    assert [i.uuid for i in gpus.instances(1)] == [Journal(site.node_dir / "journal").get(kept).uuid]
    assert gpus.instances(0) == [elsewhere] and stray.uuid not in {i.uuid for i in gpus.instances(1)}


def test_an_epilog_keeps_what_another_writer_journaled(site, batch, gpus, monkeypatch):
    """The epilog's stray check answers from the entries the agent knows (its own, and those it read with
    its last look at the journal); an instance another writer journaled (a hook's in-process fallback) is
    kept."""
    from mig_batch.node.journal import Entry

    a = agent(site, batch, gpus)
    kept, done = decide(batch, 1, "1g.5gb", 0), decide(batch, 1, "1g.5gb", 1)
    a.prolog(kept)
    a.prolog(done)
    listings = []
    entries = Journal.entries
    monkeypatch.setattr(Journal, "entries", lambda self: listings.append(1) or entries(self))
    assert a.epilog(done) == "destroyed 1g.5gb@1 on GPU 1"
    assert listings == []  # every instance on GPU 1 was one the agent journaled: no listing
    theirs = gpus.create(1, "1g.5gb", 6)  # made and journaled by another writer on this node
    Journal(site.node_dir / "journal").add(Entry("99", 1, theirs.gi_id, "1g.5gb", 6, theirs.uuid, 1.0))
    done = decide(batch, 1, "2g.10gb", 2)
    a.prolog(done)
    assert a.epilog(done) == "destroyed 2g.10gb@2 on GPU 1"  # not a stray: the journal has its entry
    assert {i.uuid for i in gpus.instances(1)} == {theirs.uuid, a.journal.get(kept).uuid}


def test_an_entry_another_writer_removed_is_not_held_and_a_stray_on_its_id_goes_at_the_next_epilog(site, batch, gpus):
    """A hook's in-process fallback ran a job's Epilog (the agent did not answer in time); the agent's own
    run of that Epilog reads the removal and finds nothing, so an unjournaled instance that reuses its id
    is a stray to the next Epilog on the GPU."""
    a = agent(site, batch, gpus)
    kept, gone = decide(batch, 1, "1g.5gb", 0), decide(batch, 1, "1g.5gb", 1)
    a.prolog(kept)
    a.prolog(gone)
    gone_id = a.journal.get(gone).gi_id
    fallback = NodeAgent("n1", gpus, Journal(site.node_dir / "journal"), batch, site.job_dir)
    assert fallback.epilog(gone) == "destroyed 1g.5gb@1 on GPU 1"
    assert a.epilog(gone) == "nothing to destroy"  # the agent's run of the same Epilog, late
    stray = gpus.create(1, "1g.5gb", 1)  # a crashed create: made, never journaled
    assert stray.gi_id == gone_id  # the id the agent knew for the removed entry
    done = decide(batch, 1, "2g.10gb", 2)
    a.prolog(done)
    assert a.epilog(done) == "destroyed 2g.10gb@2 on GPU 1; destroyed 1 stray instance(s): 1g.5gb@1 on GPU 1"


def test_a_fallbacks_instance_not_yet_journaled_is_kept_by_the_agents_sweep(site, batch, gpus):
    """A hook's in-process fallback (the agent did not answer in time) makes its job's instance while the agent
    sweeps the node. Made and not yet journaled, the instance would be a stray to the sweep: the node's GPU
    work has one holder at a time across processes, so the sweep waits for the journal entry."""
    a = agent(site, batch, gpus)
    job = decide(batch, 0, "1g.5gb", 0)
    fallback = agent(site, batch, gpus)  # its own journal and lock file descriptors, as another process has
    swept: list[list[str]] = []

    class Made:
        """The fallback's NVML: the agent's sweep starts right after the instance is made."""

        def __getattr__(self, name):
            return getattr(gpus, name)

        def create(self, *args):
            inst = gpus.create(*args)
            sweep = threading.Thread(target=lambda: swept.append(a.reconcile()))
            sweep.start()
            sweep.join(0.5)  # waits on the node's lock while this Prolog holds it
            self.sweep = sweep
            return inst

    fallback.backend = made = Made()
    result = fallback.prolog(job)
    made.sweep.join(10)
    assert result.report.kind == "made" and swept == [[]]
    assert [i.uuid for i in gpus.instances(0)] == [result.report.uuid] == [a.journal.get(job).uuid]


def test_a_fallback_that_the_agent_keeps_waiting_reports_a_requeue_and_leaves_the_epilog_to_it(site, batch, gpus):
    """The agent holds the node's GPU work past the fallback's wait (stuck in the driver, say): the fallback's
    Prolog has its job requeued in time, its Epilog leaves the instance to the agent; neither raises."""
    from mig_batch.node.lock import LOCK_NAME, NodeLock

    a = agent(site, batch, gpus)
    done = decide(batch, 0, "1g.5gb", 0)
    a.prolog(done)
    job = decide(batch, 0, "1g.5gb", 1)
    fallback = NodeAgent("n1", gpus, Journal(site.node_dir / "journal"), batch, site.job_dir, lock_wait_s=0.2)
    with NodeLock(site.node_dir / "journal" / LOCK_NAME):  # the agent, as another process holds it
        result = fallback.prolog(job)
        detail = fallback.epilog(done)
    assert result.report.kind == "requeue" and "held by another process" in result.report.reason
    assert parse_report(batch.job(job).admin_tag).kind == "requeue" and gpus.instances(0)[0].start == 0
    assert "left to the agent" in detail and a.journal.get(done) is not None
    assert a.epilog(done) == "destroyed 1g.5gb@0 on GPU 0" and gpus.instances(0) == []


def test_the_node_lock_follows_its_file_when_it_is_removed_and_made_again(tmp_path):
    """A process that opened the lock file before it was removed (an operator cleaning the directory) must
    not lock the removed file while another process locks the new one."""
    from mig_batch.node.lock import NodeBusy, NodeLock

    early = NodeLock(tmp_path / "gpus.lock", wait_s=0.2)
    with early:
        pass
    (tmp_path / "gpus.lock").unlink()
    with NodeLock(tmp_path / "gpus.lock"), pytest.raises(NodeBusy), early:
        pass
    with early:  # free again
        pass


@pytest.mark.parametrize("uuids", ["new", "repeated"])
def test_an_epilog_leaves_another_jobs_instance_that_took_its_instances_id(site, batch, gpus, monkeypatch, uuids):
    """The job's instance was destroyed behind the agent's back (an operator's ``nvidia-smi mig -dgi``) and
    another job's instance was made at the same spot, with the same GPU instance id: the Epilog leaves that
    one alone and says its own was gone. It tells by the UUID, and by the newer journal entry for a driver
    that gives the new instance the old one's UUID ("repeated")."""
    from mig_batch.node.journal import Entry

    if uuids == "repeated":
        monkeypatch.setattr(NvmlNode, "_is_instance", staticmethod(lambda gpu, gi_id, uuid: True))
    a = agent(site, batch, gpus)
    job = decide(batch, 1, "1g.5gb", 3)
    a.prolog(job)
    mine = a.journal.get(job)
    gpus.destroy(1, mine.gi_id)
    theirs = gpus.create(1, "1g.5gb", 3)
    assert theirs.gi_id == mine.gi_id and theirs.uuid != mine.uuid
    journaled = mine.created + 1  # made after the job's own instance
    Journal(site.node_dir / "journal").add(Entry("99", 1, theirs.gi_id, "1g.5gb", 3, theirs.uuid, journaled))
    detail = a.epilog(job)
    assert gpus.instances(1) == [theirs] and a.journal.get(job) is None
    assert detail == "already gone: 1g.5gb@3 on GPU 1"
    assert a.epilog("99") == "destroyed 1g.5gb@3 on GPU 1" and gpus.instances(1) == []


def test_stale_decision_falls_back_to_mfi_on_the_node_and_says_so(site, batch, gpus):
    node = gpus
    node.create(1, "1g.5gb", 2)  # someone else holds part of the decided spot
    job = decide(batch, 1, "4g.20gb", 0)
    agent(site, batch, gpus).prolog(job)
    assert [(i.profile, i.start) for i in node.instances(0)] == [("4g.20gb", 0)]  # the free GPU, by MFI
    report = parse_report(batch.job(job).admin_tag)
    assert (report.kind, report.gpu, report.profile, report.start) == ("replaced", 0, "4g.20gb", 0)


def test_prolog_that_cannot_place_asks_for_a_requeue_and_does_not_fail(site, batch, gpus):
    node = gpus
    node.create(0, "7g.40gb", 0)
    node.create(1, "4g.20gb", 0)
    job = decide(batch, 1, "4g.20gb", 0)
    result = agent(site, batch, gpus).prolog(job)  # returns normally: a failing prolog would drain the node
    assert result.report.kind == "requeue" and "nothing fits on n1" in result.problem
    assert parse_report(batch.job(job).admin_tag).kind == "requeue"
    assert "NoDevFiles" in (site.job_dir / job).read_text()


def test_a_job_whose_environment_cannot_be_written_gets_no_instance_and_a_requeue(site, batch, gpus):
    """The job's file is where the TaskProlog finds CUDA_VISIBLE_DEVICES: without it the job would run on
    whatever device CUDA finds first, so its instance is destroyed and the controller asked to requeue it."""
    a = agent(site, batch, gpus)  # the agent starts only with a job_dir (see test_files_and_ids.py)
    site.job_dir.rmdir()
    site.job_dir.write_text("not a directory")  # every write below it fails
    job = decide(batch, 1, "4g.20gb", 0)
    result = a.prolog(job)  # returns normally: a failing prolog would drain the node
    assert result.report.kind == "requeue" and "not a directory" in result.problem
    assert parse_report(batch.job(job).admin_tag).kind == "requeue"
    assert gpus.instances(1) == [] and Journal(site.node_dir / "journal").entries() == []


def test_a_job_released_without_a_placement_is_refused_not_guessed(site, batch, gpus):
    job = batch.add(TAG)
    batch.release([job])
    batch._set(job, state=JobState.RUNNING)
    result = agent(site, batch, gpus).prolog(job)
    assert result.report.kind == "requeue" and gpus.instances(0) == []


def test_unmanaged_jobs_are_left_alone(site, batch, gpus):
    a = agent(site, batch, gpus)
    job = batch.add("plain user comment")
    a.prolog(job)
    a.prolog("999")  # unknown to the batch system
    a.epilog(job)
    assert gpus.instances(0) == []


def test_reconcile_destroys_what_no_live_job_owns_and_keeps_the_rest(site, batch, gpus):
    a = agent(site, batch, gpus)
    live, gone = decide(batch, 1, "4g.20gb", 0), decide(batch, 0, "1g.5gb", 0)
    a.prolog(live)
    a.prolog(gone)
    batch.finish(gone)  # its Epilog never ran (the agent was down)
    gpus.create(0, "1g.5gb", 6)  # made behind mig_batch's back
    strays = a.reconcile()
    assert len(strays) == 2 and any(f"job {gone}'s" in s for s in strays)
    node = gpus
    assert [(i.profile, i.start) for i in node.instances(1)] == [("4g.20gb", 0)] and node.instances(0) == []
    tag = parse_agent_tag(batch.nodes()[0].agent_tag)
    assert tag is not None and tag.strays == 2 and tag.reconciled >= a.started


def test_a_lost_journal_does_not_cost_a_running_job_its_instance(site, batch, gpus):
    """The journal removed while a job runs (a wiped directory, an operator's clean-up), the agent restarted:
    its reconcile journals the running job's instance again from the job's report instead of destroying
    it as a stray, and the job's Epilog destroys it. An ended job's instance is still a stray."""
    a = agent(site, batch, gpus)
    live, gone = decide(batch, 1, "4g.20gb", 0), decide(batch, 0, "1g.5gb", 0)
    a.prolog(live)
    a.prolog(gone)
    batch.finish(gone)  # its Epilog never ran
    [kept] = gpus.instances(1)
    (site.node_dir / "journal" / "entries.log").unlink()
    restarted = agent(site, batch, gpus)
    strays = restarted.reconcile()
    assert len(strays) == 1 and "on GPU 0" in strays[0] and gpus.instances(0) == []
    assert gpus.instances(1) == [kept]
    [entry] = Journal(site.node_dir / "journal").entries()
    assert (entry.job, entry.gpu, entry.gi_id, entry.uuid) == (live, 1, kept.gi_id, kept.uuid)
    tag = parse_agent_tag(batch.nodes()[0].agent_tag)
    assert tag is not None and tag.problems == 2  # the instance taken back and the stray destroyed
    restarted.epilog(live)
    assert gpus.instances(1) == []


def test_a_report_that_names_another_instance_is_not_taken_back(site, batch, gpus):
    """An unjournaled instance whose UUID a running job's report names, but with another GPU instance id, is a
    stray all the same."""
    a = agent(site, batch, gpus)
    job = decide(batch, 1, "4g.20gb", 0)
    a.prolog(job)
    [inst] = gpus.instances(1)
    report = parse_report(batch.job(job).admin_tag)
    batch.set_job_tag(job, batch.job(job).admin_tag.replace(f"/{inst.gi_id}/{inst.uuid}",
                                                            f"/{inst.gi_id + 1}/{inst.uuid}"))  # fmt: skip
    assert parse_report(batch.job(job).admin_tag) != report
    (site.node_dir / "journal" / "entries.log").unlink()
    assert len(agent(site, batch, gpus).reconcile()) == 1 and gpus.instances(1) == []


def test_a_rank_the_journal_holds_is_not_taken_back_for_another_instance(site, batch, gpus):
    """The job's rank is journaled with its own instance: an unjournaled instance its report names (a report
    rewritten by hand, say) is a stray, and the journaled one is kept."""
    a = agent(site, batch, gpus)
    job = decide(batch, 1, "4g.20gb", 0)
    a.prolog(job)
    [mine] = gpus.instances(1)
    other = gpus.create(0, "1g.5gb", 0)
    batch.set_job_tag(job, batch.job(job).admin_tag.replace(f"node=made:1/4g.20gb@0/{mine.gi_id}/{mine.uuid}",
                                                            f"node=made:0/1g.5gb@0/{other.gi_id}/{other.uuid}"))
    assert parse_report(batch.job(job).admin_tag).uuid == other.uuid
    assert len(a.reconcile()) == 1 and gpus.instances(0) == [] and gpus.instances(1) == [mine]


def test_a_report_not_yet_in_the_jobs_record_is_enough_to_take_an_instance_back(site, gpus):
    """The Prolog's report was not taken (it waits in the agent) and the journal is lost: the reconcile sends
    the report and journals the instance again from it."""
    batch = FlakyBatch(["n1"])
    a = agent(site, batch, gpus)
    job = decide(batch, 1, "4g.20gb", 0)
    batch.fail = 1  # the report is not taken
    a.prolog(job)
    assert job in a.unsent and parse_report(batch.job(job).admin_tag) is None
    (site.node_dir / "journal" / "entries.log").unlink()
    assert a.reconcile() == [] and len(gpus.instances(1)) == 1
    assert [e.job for e in Journal(site.node_dir / "journal").entries()] == [job]
    assert parse_report(batch.job(job).admin_tag) is not None


def test_the_nodes_field_ends_with_the_newest_state_when_two_publishes_overlap(site, batch, gpus):
    """Two sweeps publish at once (each sends outside the node's lock), the first one's send slow to be
    answered: the node's field ends with the newer state, not with whichever send arrived last."""
    a = agent(site, batch, gpus)
    sending, go_on = threading.Event(), threading.Event()
    set_node_tag = batch.set_node_tag

    def slow_first(node, tag):
        if not sending.is_set():
            sending.set()
            go_on.wait(10)
        set_node_tag(node, tag)

    batch.set_node_tag = slow_first
    first = threading.Thread(target=a.reconcile)
    first.start()
    assert sending.wait(10)
    gpus.create(0, "1g.5gb", 0)  # a stray for the second sweep
    second = threading.Thread(target=a.reconcile)
    second.start()
    second.join(0.5)
    go_on.set()
    first.join(10)
    second.join(10)
    assert gpus.instances(0) == [] and parse_agent_tag(batch.nodes()[0].agent_tag).strays == 1


def test_a_failing_backend_becomes_a_requeue_report(site, batch, gpus):
    class Broken(NvmlNode):  # n1's GPUs (the gpus fixture serves them), whose create fails
        def create(self, gpu, profile, start):
            raise RuntimeError("NVML: unknown error")

    a = NodeAgent("n1", Broken(), Journal(site.node_dir / "journal"), batch, site.job_dir)
    job = decide(batch, 1, "4g.20gb", 0)
    result = a.prolog(job)
    assert result.report.kind == "requeue" and "unknown error" in result.problem
    assert parse_report(batch.job(job).admin_tag).kind == "requeue"


def test_store_refuses_a_newer_schema_and_keeps_decisions(tmp_path):
    path = tmp_path / "s.db"
    store = Store(path)
    store.record_decision(Decision("1", TAG, "n1", 0, "A100-40GB", "4g.20gb", 0, "decided", "mfi"))
    store.set_state("1", "released")
    store.close()
    assert Store(path).decision("1").state == "released"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(StateError, match="schema 99"):
        Store(path)


def test_config_errors_name_the_setting(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy: best\n")
    with pytest.raises(ConfigError, match="policy 'best' is not one of"):
        load_config(path)
    path.write_text("nodes: {n1: [A200]}\n")
    with pytest.raises(ConfigError, match="nodes.n1"):
        load_config(path)
    path.write_text("colour: red\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(path)
    path.write_text("atomize: {live_defrag: 'yes please'}\n")
    with pytest.raises(ConfigError, match="atomize.live_defrag must be true or false"):
        load_config(path)
    for section in ("atomize", "flex", "moldable"):
        path.write_text(f"{section}: 5\n")  # a section that is not a mapping is the user's error, not ours
        with pytest.raises(ConfigError, match=f"{section} must be a mapping"):
            load_config(path)
    path.write_text("atomize: {defrag_max_steered: -1}\n")
    with pytest.raises(ConfigError, match="defrag_max_steered must be 0 or more"):
        load_config(path)
    path.write_text("atomize: {live_defrag: true, defrag_max_hold_s: 600}\n")
    assert load_config(path).atomize.live_defrag and load_config(path).atomize.defrag_max_hold_s == 600


def test_a_chain_runs_its_subjobs_as_linked_slurm_jobs(site):
    from mig_batch.batch.tags import parse_tag
    from mig_batch.state import ChainRecord, SubjobRecord

    store = Store(site.state)
    store.add_chain(ChainRecord("10", "/ckpt", 1000.0, 60, 600, None, 0.0, "waiting", 0, 0, 0.0, None))
    later = "mig-batch:v1;req=1g.5gb;atomize=1;ckpt=/ckpt;smin=60;smax=600;chain=10"
    assert parse_tag(later).atomize.chain == "10" and parse_tag(later).text() == later
    store.link_job("11", "10")
    assert store.chain("11").job == "10" and store.chain_jobs("10") == ["10", "11"]
    d = Decision("11", later, "n1", 0, "A100-40GB", "1g.5gb", 6, "decided", "sja-efficiency")
    store.grant_subjob(d, SubjobRecord("11", 0, None, "1g.5gb", 1, 4864.0, 300.0, 0.0, *(None,) * 5))
    assert store.chain("10").state == "granted"  # the chain's row, not a new one
    started = store.start_subjob("11", 5000.0)  # job 11 started
    assert started is not None and started.job == "10" and started.deadline == pytest.approx(started.started_at + 300)
    store.end_subjob("11", 75, "continue", "waiting")
    assert [s.outcome for s in store.subjobs("10")] == ["continue"] == [s.outcome for s in store.subjobs("11")]
    assert store.chain("10").subjobs == 1 and store.chain("999") is None


def schema_2_store(tmp_path):
    """A store as schema 2 left it, made before the store's mark (application_id): no chain_jobs, no
    decision_spots."""
    path = tmp_path / "old.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE chain_jobs")
    db.execute("DROP TABLE decision_spots")
    db.execute("PRAGMA user_version=2")
    db.execute("PRAGMA application_id=0")
    db.commit()
    db.close()
    return path


def test_a_schema_2_store_gains_chain_links(tmp_path):
    path = schema_2_store(tmp_path)
    store = Store(path)
    assert store.chain_jobs("1") == []
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert sqlite3.connect(path).execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID  # marked now


def test_a_reader_does_not_migrate_an_older_store(tmp_path):
    """`mig-batch status` run between installing a new version and restarting mig-batchd must leave the
    store to the running (older) mig-batchd; the daemon's own open migrates it."""
    path = schema_2_store(tmp_path)
    with pytest.raises(StateError, match="restart mig-batchd with this version first"):
        Store(path, create=False)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2
    Store(path).close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_jobs_newest_event_of_a_kind_is_read_through_an_index_also_in_a_store_made_before_it(tmp_path):
    """mig-batchd reads a requeued job's newest ``running`` event each pass: without the index SQLite reads
    back through every event. A store of the same version made before the index gains it at mig-batchd's
    next open; a reader adds nothing."""
    path = tmp_path / "state.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("DROP INDEX events_job")
    db.commit()
    Store(path, create=False).close()
    assert db.execute("SELECT name FROM sqlite_master WHERE name='events_job'").fetchall() == []
    store = Store(path)
    store.event("7", "running", node="n1")
    sql: list[str] = []
    store.db.set_trace_callback(sql.append)
    assert store.events(job="7", kind="running", last=1)[0]["node"] == "n1"
    store.db.set_trace_callback(None)
    plan = " ".join(str(row) for row in store.db.execute("EXPLAIN QUERY PLAN " + sql[-1]))
    assert "USING INDEX events_job" in plan or "USING COVERING INDEX events_job" in plan, plan


def test_forgetting_a_jobs_instances_removes_every_rank_of_it_only_through_the_primary_key(tmp_path):
    """mig-batchd forgets an ended job's instances each pass; a scan of every instance cost 1 ms a job with
    18,000 running. Keys that share the job's digits (``4``, ``42``, ``420``, ``42$``) are other jobs'."""
    store = Store(tmp_path / "state.db")
    for job in ("4", "420", "42$", "43#1"):
        store.record_instance(InstanceRecord(job, "n1", 0, "1g.10gb", 0, 1, f"MIG-{job}"))
    store.record_instances([InstanceRecord("42", "n1", gpu, "1g.10gb", 0, 1, f"MIG-42-{gpu}") for gpu in range(12)])
    assert {r.job for r in store.instances()} >= {"42", "42#1", "42#11"}
    sql: list[str] = []
    store.db.set_trace_callback(sql.append)
    store.forget_instance("42")
    store.db.set_trace_callback(None)
    assert sorted(r.job for r in store.instances()) == sorted(["4", "420", "42$", "43#1"])
    delete = next(s for s in sql if s.startswith("DELETE FROM instances"))
    plan = " ".join(str(row) for row in store.db.execute("EXPLAIN QUERY PLAN " + delete))
    assert "SCAN" not in plan and "sqlite_autoindex_instances_1" in plan, plan


@pytest.fixture(scope="module", params=["python", "c"])
def hook_client_command(request, tmp_path_factory) -> list[str]:
    """The hook client the Prolog and Epilog shims run: the standard-library Python one, or the C one
    compiled as `mig-batch slurm install` compiles it."""
    if request.param == "python":
        return [sys.executable, "-I", "-S", hook_client.__file__]
    from mig_batch.slurm.install import build_hook_client

    binary, why = build_hook_client(tmp_path_factory.mktemp("hook"))
    assert binary is not None, why
    return [str(binary)]


def test_the_hook_client_asks_the_agent_and_takes_the_slow_path_once_the_agent_is_gone(
    site, batch, tmp_path, gpus, hook_client_command
):
    sock = tmp_path / "agent.sock"
    server = AgentServer(sock, agent(site, batch, gpus))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    job = decide(batch, 1, "4g.20gb", 0)
    slow = tmp_path / "slow-path-ran"
    client = hook_client_command
    fallback = ["sh", "-c", f"echo $0 >> {slow}"]
    for bad in ("", "1; rm", '1"}', "1" * 65):  # not a job id: nothing asked, nothing run, still exit 0
        subprocess.run([*client, "prolog", bad, str(sock), *fallback], check=True, timeout=30)
    subprocess.run([*client, "prolog", job, str(sock), *fallback], check=True, timeout=30)
    [inst] = gpus.instances(1)
    assert parse_report(batch.job(job).admin_tag).uuid == inst.uuid and not slow.exists()
    server.shutdown()
    server.server_close()
    subprocess.run([*client, "epilog", job, str(sock), *fallback], check=True, timeout=30)
    assert slow.read_text() == "sh\n"


def test_the_hook_client_takes_a_long_answer_whole_and_the_slow_path_only_without_one(tmp_path, hook_client_command):
    """An answer longer than any buffer is still an answer (no slow path: the work would be done twice);
    an agent that accepts and closes, or goes away before reading, is no answer (slow path)."""
    import socket

    sock_path, slow = tmp_path / "a.sock", tmp_path / "slow-path-ran"

    def agent_that(behaviour):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock_path.unlink(missing_ok=True)
        listener.bind(str(sock_path))
        listener.listen(1)

        def serve():
            conn, _ = listener.accept()
            if behaviour == "long":
                conn.recv(4096)
                conn.sendall(b'{"ok": true, "detail": "' + b"x" * 200_000 + b'"}\n')
            conn.close()  # "close": accepted, closed without reading or answering
            listener.close()

        threading.Thread(target=serve, daemon=True).start()

    for behaviour, expect_slow in (("long", False), ("close", True)):
        slow.unlink(missing_ok=True)
        agent_that(behaviour)
        subprocess.run([*hook_client_command, "prolog", "5", str(sock_path), "sh", "-c", f"echo ran > {slow}"],
                       check=True, timeout=30)  # fmt: skip
        assert slow.exists() == expect_slow, behaviour


def logging_python(tmp_path, what: str):
    """A fake Python that appends ``what`` (shell words) to a file: (the file, the fake)."""
    calls, python = tmp_path / "calls", tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho {what} >> {calls}\n")
    python.chmod(0o755)
    return calls, python


def test_a_c_client_that_cannot_run_on_the_node_hands_over_to_the_python_one(tmp_path):
    """The Prolog shim with the compiled client: it runs it; when it cannot run (here: a binary of another
    kind), the shim runs the Python client with the same arguments. A fake Python logs how it was called."""
    from mig_batch.mig.models import get_model
    from mig_batch.slurm.install import install

    calls, python = logging_python(tmp_path, '"$@"')
    dest = tmp_path / "etc"
    _, which = install(dest, str(python), "/etc/c.yaml", str(tmp_path / "jobs"), str(tmp_path / "no-agent.sock"),
                       [get_model("A100-80GB")], hook_client_kind="c")  # fmt: skip
    assert "(C, run by shell shims" in which

    def prolog() -> str:
        calls.unlink(missing_ok=True)
        subprocess.run([str(dest / "mig-batch-prolog")], env={"SLURM_JOB_ID": "5"}, check=True, timeout=30)
        return calls.read_text()

    assert prolog() == "-I -m mig_batch.slurm.hooks prolog\n"  # the C client found no agent: its slow path
    (dest / "mig-batch-hook").write_bytes(b"\x7fELF garbage")  # not a binary this node can run
    assert prolog() == f"-I -S {hook_client.__file__} prolog 5 {tmp_path / 'no-agent.sock'} {python} -I -m " \
                       "mig_batch.slurm.hooks prolog\n"  # fmt: skip


def test_the_compiled_client_installed_as_the_hooks_takes_the_slow_path_with_the_sites_config(tmp_path):
    """Installed direct, the compiled client is the Prolog and Epilog (by name, no shell): with no agent it runs
    the slow path with the compiled-in Python and config. Installing shims over it later replaces the links,
    never writing through them into the binary."""
    from mig_batch.mig.models import get_model
    from mig_batch.slurm.install import install

    calls, python = logging_python(tmp_path, '"$MIG_BATCH_CONFIG $@"')
    dest = tmp_path / "etc"
    _, which = install(dest, str(python), "/etc/c d.yaml", str(tmp_path / "jobs"), str(tmp_path / "no-agent.sock"),
                       [get_model("A100-80GB")], hook_client_kind="direct")  # fmt: skip
    assert "installed as the Prolog, Epilog and TaskProlog" in which
    assert (dest / "mig-batch-prolog").resolve() == (dest / "mig-batch-hook").resolve()
    for op in ("prolog", "epilog"):
        calls.unlink(missing_ok=True)
        subprocess.run([str(dest / f"mig-batch-{op}")], env={"SLURM_JOB_ID": "5"}, check=True, timeout=30)
        assert calls.read_text() == f"/etc/c d.yaml -I -m mig_batch.slurm.hooks {op}\n"
    calls.unlink()
    subprocess.run([str(dest / "mig-batch-prolog")], env={"SLURM_JOB_ID": "5; rm"}, check=True, timeout=30)
    assert not calls.exists()  # not a job id: nothing asked, nothing run, still exit 0
    import socket  # an agent on the socket compiled in answers: no slow path

    asked = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(tmp_path / "no-agent.sock"))
        listener.listen(1)

        def answer():
            conn, _ = listener.accept()
            asked.append(conn.recv(4096))
            conn.sendall(b'{"ok": true, "detail": "destroyed"}\n')
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        subprocess.run([str(dest / "mig-batch-epilog")], env={"SLURM_JOB_ID": "7"}, check=True, timeout=30)
    assert asked == [b'{"op": "epilog", "job": "7"}\n'] and not calls.exists()
    binary = (dest / "mig-batch-hook").read_bytes()
    for kind, runs in (("c", "mig-batch-hook prolog"), ("python", "hook_client.py prolog")):
        install(dest, str(python), "/etc/c d.yaml", str(tmp_path / "jobs"), str(tmp_path / "no-agent.sock"),
                [get_model("A100-80GB")], hook_client_kind=kind)  # fmt: skip
        prolog = dest / "mig-batch-prolog"
        assert not prolog.is_symlink() and runs in prolog.read_text(), kind
        if kind == "c":
            assert (dest / "mig-batch-hook").read_bytes() == binary  # the shims replaced the links, not written through
    assert not (dest / "mig-batch-hook").exists()  # the Python client's install no longer has it: removed


def test_a_compiled_hook_whose_work_crashes_runs_the_slow_path_once_and_exits_0(tmp_path):
    """Installed direct, the Prolog does its work in a child: when that child dies mid-request (here the
    agent SIGKILLs the process that connected), the Prolog itself runs the slow path, once, and exits 0 (a
    failing Prolog drains the node). The slow path's parent is the Prolog, not the killed child."""
    from mig_batch.mig.models import get_model
    from mig_batch.slurm.install import install

    calls, python = logging_python(tmp_path, '"$PPID $@"')
    dest, agent_socket = tmp_path / "etc", tmp_path / "agent.sock"
    install(dest, str(python), "/etc/c.yaml", str(tmp_path / "jobs"), str(agent_socket), [get_model("A100-80GB")],
            hook_client_kind="direct")  # fmt: skip
    asked, killed = [], []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(agent_socket))
        listener.listen(1)

        def kill_the_asker():
            conn, _ = listener.accept()
            with conn:
                asked.append(conn.makefile("rb").readline())
                pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
                os.kill(pid, signal.SIGKILL)  # before the connection closes: the child never sees its end
                killed.append(pid)

        thread = threading.Thread(target=kill_the_asker, daemon=True)
        thread.start()
        prolog = subprocess.Popen([str(dest / "mig-batch-prolog")], env={"SLURM_JOB_ID": "7"})
        assert prolog.wait(timeout=60) == 0
        thread.join(10)
    assert asked == [b'{"op": "prolog", "job": "7"}\n'] and killed and killed[0] != prolog.pid
    assert calls.read_text() == f"{prolog.pid} -I -m mig_batch.slurm.hooks prolog\n"


def test_the_sweep_logs_a_failing_pass_and_keeps_sweeping(site, batch, gpus, tmp_path, monkeypatch, caplog):
    stray = gpus.create(0, "1g.5gb", 6)  # made behind mig_batch's back: the sweep's to destroy
    real, calls = gpus.gpus, []

    def lost_once():  # one NVML hiccup: the pass at start fails
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("NVML: GPU is lost")
        return real()

    monkeypatch.setattr(gpus, "gpus", lost_once)
    a = agent(site, batch, gpus)
    server = AgentServer(tmp_path / "agent.sock", a)
    thread = threading.Thread(target=serve, args=(server, a, 0.05), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not a.reconciled and time.monotonic() < deadline:  # no NVML call here: the emulator's lock is per process
        time.sleep(0.05)
    serving = thread.is_alive()
    if serving:
        server.shutdown()  # honoured even if serve_forever has not begun yet
    server.server_close()
    thread.join(10)
    assert serving and gpus.instances(0) == [] and stray is not None and len(calls) >= 2
    assert "NVML: GPU is lost" in caplog.text and not thread.is_alive()


def test_a_gpu_with_mig_mode_off_is_refused_by_name_and_published_for_the_controller(site, batch, nvml_emu_creator):
    from mig_batch.gpu import nvml_emu
    from mig_batch.mig.models import get_model

    model = get_model("A100-40GB")
    backend, _ = nvml_emu_creator([nvml_emu.EmulatedGpu(model, True), nvml_emu.EmulatedGpu(model, False)], node="n1")
    a = agent(site, batch, backend)
    assert a.reconcile() == []  # a GPU with MIG off is not an error of its own: it is listed, not touched
    assert parse_agent_tag(batch.nodes()[0].agent_tag).mig_off == (1,)
    job = decide(batch, 1, "1g.5gb", 0)  # decided before the controller learned it
    result = a.prolog(job)
    assert result.report.kind == "requeue" and "MIG mode is off on GPU 1 of n1" in result.report.reason
    assert "nvidia-smi -i 1 -mig 1" in result.report.reason
    assert backend.instances(0) == [] and "NoDevFiles" in (site.job_dir / job).read_text()
    published = parse_agent_tag(batch.nodes()[0].agent_tag)
    assert published.mig_off == (1,) and published.problem.job == job
    ok = decide(batch, 0, "1g.5gb", 0)
    assert a.prolog(ok).report.kind == "made"


def test_a_multi_instance_job_on_a_gpu_with_mig_mode_off_is_refused_by_name(site, batch, nvml_emu_creator):
    from mig_batch.gpu import nvml_emu
    from mig_batch.mig.models import get_model

    model = get_model("A100-40GB")
    backend, _ = nvml_emu_creator([nvml_emu.EmulatedGpu(model, True), nvml_emu.EmulatedGpu(model, False)], node="n1")
    a = agent(site, batch, backend)  # rank 1 was decided before the controller learned GPU 1 is off
    request = "mig-batch:v1;req=1g.5gb;n=2"
    job = batch.add(request)
    spots = ((0, "1g.5gb", 0), (1, "1g.5gb", 0))
    batch.pin_and_release([Pin(job, "n1", placed_tag(parse_tag(request), Placed("n1", 0, "1g.5gb", 0, spots=spots)))])
    batch.start(job)
    result = a.prolog(job)
    assert result.report.kind == "requeue" and "MIG mode is off on GPU 1 of n1" in result.report.reason
    assert "nvidia-smi -i 1 -mig 1" in result.report.reason and a.mig_off == (1,)
    assert backend.instances(0) == [] and "NoDevFiles" in (site.job_dir / job).read_text()
    assert parse_agent_tag(batch.nodes()[0].agent_tag).problem.job == job


def test_the_journal_lists_what_another_writer_added_replaced_or_removed_since(tmp_path):
    """The agent keeps parsed entries between listings; a hook's in-process fallback writes the same directory."""
    from mig_batch.node.journal import Entry

    agent_side, hook_side = Journal(tmp_path / "j"), Journal(tmp_path / "j")
    first = Entry("7", 0, 1, "1g.10gb", 0, "MIG-a", 1.0)
    agent_side.add(first)
    assert agent_side.entries() == [first]
    replaced = Entry("7", 2, 3, "2g.20gb", 4, "MIG-b", 2.0)
    hook_side.add(replaced)
    hook_side.add(Entry("8", 1, 1, "1g.10gb", 6, "MIG-c", 3.0))
    assert [(e.job, e.uuid) for e in agent_side.entries()] == [("7", "MIG-b"), ("8", "MIG-c")]
    hook_side.remove("7")
    assert [e.job for e in agent_side.entries()] == ["8"]


def test_the_agent_answers_a_burst_wider_than_its_workers_and_drops_a_client_that_sends_nothing(
    site, batch, gpus, tmp_path, monkeypatch
):
    """Connections wait for one of the fixed workers; clients that connect and stay silent hold a worker
    only until the handler's timeout, so they cannot stall the job starts behind them for good."""
    from mig_batch.node import service

    monkeypatch.setattr(service._Handler, "timeout", 1.0)
    sock = tmp_path / "agent.sock"
    server = AgentServer(sock, agent(site, batch, gpus))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    silent = []
    t0 = time.monotonic()  # no worker is free before the first silent client's timeout from here
    for _ in range(server.workers):  # every worker is taken by a client that never sends
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(sock))
        silent.append(s)
    answers: list[tuple[bool, str]] = []
    askers = [threading.Thread(target=lambda: answers.append(hook_client.ask(str(sock), "ping", "", 30)))
              for _ in range(3 * server.workers)]  # fmt: skip
    for t in askers:
        t.start()
    for t in askers:
        t.join(30)
    waited = time.monotonic() - t0
    server.shutdown()
    server.server_close()
    for s in silent:
        s.close()
    assert len(answers) == 3 * server.workers and all(ok for ok, _ in answers), answers[:3]
    assert 0.95 <= waited < 10  # they waited for the silent ones' timeout (FIFO: those came first), not for ever


def test_a_request_left_waiting_too_long_is_closed_unanswered_so_only_the_hooks_slow_path_does_it(
    site, batch, gpus, tmp_path, monkeypatch
):
    from mig_batch.node import service

    monkeypatch.setattr(service._Handler, "timeout", 1.5)
    sock = tmp_path / "agent.sock"
    server = AgentServer(sock, agent(site, batch, gpus))
    server.queue_limit_s = 0.5
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    silent = []
    for _ in range(server.workers):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(sock))
        silent.append(s)
    time.sleep(0.2)  # every worker holds a silent client now
    with pytest.raises(OSError):  # queued past the limit: closed without an answer, as the hook sees it
        hook_client.ask(str(sock), "ping", "", 30)
    ok, _ = hook_client.ask(str(sock), "ping", "", 30)  # the workers are free again
    server.shutdown()
    server.server_close()
    for s in silent:
        s.close()
    assert ok


def test_a_socket_that_cannot_be_bound_says_why(site, batch, gpus, tmp_path):
    with pytest.raises(OSError, match="too long"):
        AgentServer(tmp_path / ("x" * 120) / "agent.sock", agent(site, batch, gpus))


def test_the_python_hook_client_waits_for_room_in_a_full_backlog_instead_of_taking_the_slow_path(tmp_path):
    """A burst can fill the agent's listen backlog; a connect refused with EAGAIN is tried again until the
    client's timeout instead of counting as an agent that does not answer."""
    path = str(tmp_path / "agent.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(0)
    queued = []
    while True:  # fill the backlog with connections nobody accepts yet
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            break
        queued.append(s)

    def agent_later() -> None:
        time.sleep(0.5)
        while True:
            conn, _ = listener.accept()
            with conn:
                if conn.recv(4096).endswith(b"\n"):  # the hook's request (the filler connections send nothing)
                    conn.sendall(b'{"ok": true, "detail": "pong"}\n')
                    return

    server = threading.Thread(target=agent_later, daemon=True)
    server.start()
    for s in queued:
        s.close()  # closed fillers are accepted and read as empty, then the hook's request comes
    ok, answer = hook_client.ask(path, "ping", "", 10)
    server.join(10)
    listener.close()
    assert ok and "pong" in answer


def test_events_of_several_kinds_read_only_those_rows_through_the_jobs_index(tmp_path):
    store = Store(tmp_path / "state.db")
    for i in range(8):
        store.event("7", "requeued" if i % 2 else "running", n=i)
    store.event("8", "requeued", n=99)
    store.event("7", "pin-refused", n=8)
    sql: list[str] = []
    store.db.set_trace_callback(sql.append)
    newest = store.events(job="7", kind={"requeued", "pin-refused"}, last=3)
    store.db.set_trace_callback(None)
    assert [(e["kind"], e["n"]) for e in newest] == [("requeued", 5), ("requeued", 7), ("pin-refused", 8)]
    plan = " ".join(str(row) for row in store.db.execute("EXPLAIN QUERY PLAN " + sql[-1]))  # the values in the text
    assert "events_job" in plan, plan
    assert [e["n"] for e in store.events(job="7", kind=("running",))] == [0, 2, 4, 6]
