"""Controller.step over the in-memory batch system: decisions, node reports, restarts, refused pins,
requeues, node failures, moldable and chain decisions; no Slurm needed."""

import time
from dataclasses import replace

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import After, Awaits, BatchError, JobState
from mig_batch.batch.tags import AgentTag, NodeReport, parse_place, parse_report, parse_tag, wait_note, with_wait_note
from mig_batch.config import SiteConfig
from mig_batch.controller.daemon import Controller
from mig_batch.controller.waits import NOTES_PER_PASS
from mig_batch.state import Store

RIGID = "mig-batch:v1;req=1g.10gb"
BIG = "mig-batch:v1;req=7g.80gb"
CHAIN = "mig-batch:v1;req=6144M;atomize=1;ckpt={};smin=30;smax=300"


@pytest.fixture
def site(tmp_path):
    return SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",), "n2": ("A100-80GB",)})


@pytest.fixture
def batch():
    return FakeBatch(["n1", "n2"])


def made(batch, job):
    """The batch system starts the job; its node made the instance where decided."""
    p = parse_place(batch.job(job).admin_tag)
    batch.start(job, NodeReport("made", p.gpu, p.profile, p.start, 1, f"MIG-{job}"))


def test_rigid_jobs_are_decided_pinned_released_followed_and_freed(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    jobs = [batch.add(RIGID) for _ in range(3)]
    stats = c.step()
    assert stats.placed == 3 and not stats.errors
    for job in jobs:
        assert batch.job(job).state is JobState.PENDING  # released
        assert parse_place(batch.job(job).admin_tag).profile == "1g.10gb"
        assert store.decision(job).state == "released"
    made(batch, jobs[0])
    c.step()
    assert store.decision(jobs[0]).state == "running" and store.instance(jobs[0]).uuid == f"MIG-{jobs[0]}"
    batch.finish(jobs[0])
    assert c.step().ended == 1
    assert store.decision(jobs[0]).state == "ended" and store.instance(jobs[0]) is None
    assert jobs[0] not in c.view.job_gpu and jobs[1] in c.view.job_gpu


def test_a_refused_pin_stays_decided_and_is_applied_again(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    batch.refuse.add(job)
    stats = c.step()
    assert stats.placed == 0 and stats.errors and store.decision(job).state == "decided"
    assert batch.job(job).held
    batch.refuse.clear()
    assert c.step().placed == 1
    assert store.decision(job).state == "released" and store.count_decisions(job) == 1


def test_a_restart_rebuilds_the_view_from_the_store_and_decides_nothing_twice(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    big = [batch.add(BIG) for _ in range(2)]
    c.step()
    batch.refuse.add(big[1])
    waiting = batch.add(BIG)  # no room left for a third whole GPU
    c.step()
    restarted = Controller(site, Store(site.state), batch)  # a crash: only the store survives
    assert set(restarted.view.job_gpu) == set(big)
    stats = restarted.step()
    assert stats.waiting == 1 and store.decision(waiting) is None
    assert [store.count_decisions(j) for j in big] == [1, 1]


def test_a_requeue_report_holds_the_job_and_decides_it_again(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    batch.start(job, NodeReport("requeue", reason="decided spot taken; nothing fits on n1"))
    c.step()
    # the placement out first: Slurm's requeue-hold is one its owner may release (job_submit.lua lets a placed job go)
    assert batch.calls[-2:] == [("set_job_tag", job), ("requeue_hold", job)]
    assert batch.job(job).admin_tag == RIGID  # no placement nor report: its owner's release starts nothing
    c.step()  # Slurm starts a requeued job only after its credential's lifetime: its slot would idle meanwhile
    assert store.count_decisions(job) == 1 and store.events(job=job, kind="waiting")[-1]["reason"].startswith(
        "its begin time")  # fmt: skip
    batch._set(job, not_before=time.time() - 1)
    c.step()  # held again: decided anew
    assert store.count_decisions(job) == 2 and store.decision(job).state == "released"


@pytest.mark.parametrize("outcome, requeued", [("COMPLETED", True), ("FAILED", True), ("CANCELLED", False)])
def test_a_job_that_ran_without_its_instance_and_ended_unseen_goes_back_to_the_queue(site, batch, outcome, requeued):
    """Its prolog reported "requeue" (it ran with no GPU) and it ended before a pass saw it run (the controller
    was down): requeued held and decided again, not counted as ended; one its owner cancelled stays ended."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    batch.start(job, NodeReport("requeue", reason="decided spot taken; nothing fits on n1"))
    batch.finish(job, outcome=outcome)
    c.step()
    assert (("requeue_hold", job) in batch.calls) is requeued
    assert store.decision(job).state == ("requeued" if requeued else "ended")
    assert store.events(job=job, kind="node-problem")
    if requeued:
        assert batch.job(job).held and batch.job(job).admin_tag == RIGID  # nor placement nor report left
        batch._set(job, not_before=time.time() - 1)
        c.step()
        assert store.count_decisions(job) == 2 and store.decision(job).state == "released"


def test_a_job_that_keeps_running_without_its_instance_is_requeued_a_bounded_number_of_times(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    runs = 0
    for _ in range(6):
        c.step()
        if store.decision(job).state != "released":
            break
        batch.start(job, NodeReport("requeue", reason="the GPU is sick"))
        batch.finish(job)
        runs += 1
        c.step()
        batch._set(job, not_before=time.time() - 1)
    assert runs == 3 and store.decision(job).state == "ended" and store.count_decisions(job) == 3
    assert "not requeued again" in store.events(job=job, kind="ran-without-instance")[-1]["error"]


def test_a_job_that_ran_without_its_instance_and_was_forgotten_stays_ended_with_the_event(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    batch.start(job, NodeReport("requeue", reason="nothing fits"))
    batch.finish(job)

    def refused(job, reason=""):  # Slurm: the record purged meanwhile (MinJobAge), or a job not requeueable
        raise BatchError(f"scontrol requeuehold {job}: Invalid job id specified")

    batch.requeue_hold = refused
    c.step()
    assert store.decision(job).state == "ended" and store.events(job=job, kind="ran-without-instance")


def test_a_replaced_instance_moves_in_the_view(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    p = parse_place(batch.job(job).admin_tag)
    other = 6 if p.start != 6 else 0
    batch.start(job, NodeReport("replaced", p.gpu, "1g.10gb", other, 3, "MIG-x"))
    c.step()
    gid = c.view.job_gpu[job]
    assert c.view.gpus[gid].instances[job] == ("1g.10gb", other)
    assert store.decision(job).start == other and store.events(job, "node-replaced")


def test_a_job_its_owner_moved_after_the_release_is_followed_on_the_node_it_runs_on(site, batch):
    """scontrol update nodelist=... on a released job: the other node's agent places it on itself and reports
    "replaced". Read on the decided node, the view showed a slice there and none where the job ran."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    decided = store.decision(job).node
    elsewhere = "n2" if decided == "n1" else "n1"
    batch.start(job, NodeReport("replaced", 0, "1g.10gb", 6, 3, "MIG-x"), node=elsewhere)
    c.step()
    assert c.view.gpus[c.view.job_gpu[job]].host == elsewhere
    assert store.decision(job).node == elsewhere and store.instance(job).node == elsewhere
    assert not any(job in g.instances for g in c.view.gpus if g.host == decided)


def test_a_down_node_is_fenced_until_its_agent_reconciled(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    running = batch.add(BIG)
    c.step()
    node = parse_place(batch.job(running).admin_tag).node
    made(batch, running)
    c.step()
    batch.set_node_up(node, False)
    batch.requeue(running)  # Slurm requeues the job of the failed node
    c.step()
    assert store.decision(running).state == "requeued" and batch.job(running).held
    assert c.step().placed == 0  # until the begin time Slurm gives a requeued job
    assert store.events(job=running, kind="waiting")[-1]["reason"].startswith("its begin time")
    batch._set(running, not_before=time.time() - 1)
    other = c.step()  # decided again, elsewhere
    assert other.placed == 1 and parse_place(batch.job(running).admin_tag).node != node
    late = batch.add(BIG)
    c.step()
    assert store.decision(late) is None  # the only free GPU is on the fenced node
    batch.set_node_up(node, True)
    c.step()
    assert store.decision(late) is None  # up, but its agent has not reconciled since
    batch.set_node_tag(node, AgentTag(started=0, reconciled=2e9, strays=1).text())
    c.step()
    c.step()
    assert store.decision(late) is not None and store.decision(late).node == node


def test_moldable_jobs_get_a_size_and_a_policy_name(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add("mig-batch:v1;req=1g;moldable=1g:600,7g:60")
    c.step()
    d = store.decision(job)
    assert d.policy == f"moldable-{site.moldable.planner}" and d.profile == "7g.80gb"  # the default planner's name
    today = replace(site, state=site.state.with_name("today.db"), moldable=replace(site.moldable, planner="eft"))
    store = Store(today.state)
    c = Controller(today, store, batch)
    job = batch.add("mig-batch:v1;req=1g;moldable=1g:600,7g:60")
    c.step()
    d = store.decision(job)
    assert d.policy == f"moldable-{site.policy}" and d.profile == "7g.80gb"  # the earliest-finish rule's: its policy


def test_a_chain_subjob_is_granted_with_its_window_and_its_next_job_linked(site, batch, tmp_path):
    store = Store(site.state)
    c = Controller(site, store, batch)
    tag = f"mig-batch:v1;req=6144M;atomize=1;ckpt={tmp_path / 'ckpt'};smin=30;smax=300"
    first = batch.add(tag)
    c.step()
    place = parse_place(batch.job(first).admin_tag)
    assert place is not None and 30 <= place.window_s <= 300
    made(batch, first)
    c.step()
    assert store.subjobs(first)[0].started_at is not None
    nxt = batch.add(f"{tag};chain={first}")
    batch.finish(first, exit_status=75)  # checkpointed, more to do
    c.step()
    assert store.chain_jobs(first) == [first, nxt]
    c.step()
    assert parse_place(batch.job(nxt).admin_tag) is not None and store.chain(nxt).job == first


def test_a_chain_whose_next_job_is_missing_goes_on_in_its_own_job_unplaced_until_granted(site, batch, tmp_path):
    """The fallback requeue-holds the ended job: its old placement must go, or its owner's release would start
    it on a slot given to others."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = batch.add(f"mig-batch:v1;req=6144M;atomize=1;ckpt={tmp_path / 'ckpt'};smin=30;smax=300")
    c.step()
    made(batch, first)
    c.step()
    batch.finish(first, exit_status=75)  # checkpointed, and the runner could not submit the next job
    c.step()
    assert ("requeue_hold", first) in batch.calls and store.decision(first).state == "requeued"
    assert parse_place(batch.job(first).admin_tag) is None and parse_report(batch.job(first).admin_tag) is None
    c.step()
    assert parse_place(batch.job(first).admin_tag) is not None  # the next subjob's grant


def chain_job_running(site, batch, tmp_path):
    """A chain's first job, placed and running; the store, the controller, the job and its tag."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    tag = CHAIN.format(tmp_path / "ckpt")
    first = batch.add(tag)
    c.step()
    made(batch, first)
    c.step()
    return store, c, first, tag


def chain_job_running_with_its_next(site, batch, tmp_path):
    """A chain's first job, running, and the chain's next job, which its runner submitted as it stopped."""
    store, c, first, tag = chain_job_running(site, batch, tmp_path)
    nxt = batch.add(f"{tag};chain={first}")
    return store, c, first, nxt


def test_a_subjob_slurm_requeued_while_running_ends_and_its_chain_goes_on_in_the_runners_next_job(site, batch,
                                                                                                   tmp_path):
    """An operator's requeue stops the runner, which submits the chain's next job: the chain goes on there; the
    requeued job is cancelled (its id, started again, could meet a skipped Prolog), no failure counted."""
    store, c, first, nxt = chain_job_running_with_its_next(site, batch, tmp_path)
    batch.requeue(first)
    c.step()
    assert store.subjobs(first)[0].outcome == "requeued" and store.chain(first).failures == 0
    assert store.chain_jobs(first) == [first, nxt] and batch.job(first).cancelled
    assert store.decision(first).state == "requeued" and store.instance(first) is None and first not in c.view.job_gpu
    assert parse_place(batch.job(nxt).admin_tag) is not None and store.chain(first).state == "granted"


def test_a_chains_job_left_behind_by_a_refused_cancel_is_not_granted_and_cancelled_again(site, batch, tmp_path):
    """Only a chain's latest job runs its subjobs: the requeued one, held and unplaced, stays so until the
    batch system takes its cancel."""
    store, c, first, nxt = chain_job_running_with_its_next(site, batch, tmp_path)
    batch.requeue(first)

    def refused(job):
        raise BatchError(f"cancel of {job} refused")

    cancel, batch.cancel = batch.cancel, refused
    for _ in range(3):
        c.step()
    assert store.chain_jobs(first) == [first, nxt] and parse_place(batch.job(nxt).admin_tag) is not None
    assert batch.job(first).held and parse_place(batch.job(first).admin_tag) is None
    assert store.decision(first).state == "requeued" and store.count_decisions(first) == 1
    batch.cancel = cancel  # the batch system takes the cancel again: the job left behind goes
    c.step()
    assert batch.job(first).cancelled and store.count_decisions(first) == 1


def chain_subjob_requeued(site, batch, tmp_path):
    """A chain's only job, seen running on a node, then requeued by Slurm (no next job from its runner): the
    store, the controller, the job, the node it ran on and the other node."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = batch.add(CHAIN.format(tmp_path / "ckpt"))
    c.step()
    ran_on = store.decision(first).node
    other = next(n for n in ("n1", "n2") if n != ran_on)
    made(batch, first)
    c.step()
    batch.requeue(first)
    return store, c, first, ran_on, other


def test_a_subjob_requeued_with_no_next_job_waits_for_its_begin_time_to_go_back_to_its_node(site, batch, tmp_path):
    """Its node died with the runner, or the runner could not submit the next job: the chain goes on in the
    requeued job itself, granted on another node until the begin time Slurm moved ahead has passed."""
    store, c, first, ran_on, other = chain_subjob_requeued(site, batch, tmp_path)
    batch.set_node_up(other, False)
    for _ in range(3):
        c.step()
    assert [s.outcome for s in store.subjobs(first)] == ["requeued"] and store.chain(first).failures == 0
    assert store.decision(first).state == "requeued" and batch.job(first).held  # only the node it ran on has room
    batch._set(first, not_before=time.time() - 1)  # the begin time has passed: its node's cache is gone
    c.step()
    assert store.decision(first).node == ran_on and store.decision(first).state == "released"


def test_pins_refused_after_a_requeue_do_not_send_the_subjob_back_to_the_node_it_ran_on(site, batch, tmp_path):
    """Granted elsewhere after Slurm requeued it, the subjob's pins are refused there: its decision then names
    that node, yet the node it ran on stays out of its grants until the begin time Slurm moved ahead."""
    store, c, first, ran_on, other = chain_subjob_requeued(site, batch, tmp_path)
    batch.refuse.add(first)
    for _ in range(6):
        c.step()
    decided = [e["node"] for e in store.events(job=first, kind="decided")]
    assert decided[0] == ran_on and set(decided[1:]) == {other}, decided  # never back to where it ran
    assert store.decision(first).state == "requeued" and store.events(job=first, kind="pin-refused")
    batch.refuse.clear()
    batch._set(first, not_before=time.time() - 1)  # the begin time has passed; the refusing node is still out
    c.step()
    assert store.decision(first).node == ran_on and store.decision(first).state == "released"


def test_a_chain_goes_on_in_its_own_job_away_from_the_node_it_has_just_run_on(site, batch, tmp_path):
    """The node the policy prefers is the one the job ran on: the next grant goes elsewhere, after a requeue
    by Slurm and after the fallback's requeue-hold alike."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = batch.add(CHAIN.format(tmp_path / "ckpt"))
    c.step()
    preferred = store.decision(first).node
    made(batch, first)
    c.step()
    batch.requeue(first)  # an operator's requeue; its runner could not submit the next job
    c.step()
    c.step()
    assert store.decision(first).node != preferred and store.decision(first).state == "released"
    made(batch, first)
    c.step()
    batch.finish(first, exit_status=75)
    c.step()
    c.step()
    assert store.decision(first).node == preferred  # back where it did not run just before
    made(batch, first)
    c.step()
    batch.finish(first, exit_status=75)
    c.step()
    c.step()
    assert store.decision(first).node != preferred and parse_place(batch.job(first).admin_tag).node != preferred


def test_a_subjob_whose_node_could_not_place_it_is_started_again_elsewhere(site, batch, tmp_path):
    """The Prolog's report asks for a requeue: its runner exits at once (no window), the subjob ends as not
    started (no failure), and the chain goes on in that job, elsewhere. Before, the chain stayed running."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = batch.add(CHAIN.format(tmp_path / "ckpt"))
    c.step()
    node = store.decision(first).node
    batch.start(first, NodeReport("requeue", reason="decided spot taken; nothing fits"))
    c.step()
    assert [s.outcome for s in store.subjobs(first)] == ["not-started"] and store.chain(first).state == "waiting"
    assert store.decision(first).state == "requeued" and ("requeue_hold", first) in batch.calls
    c.step()
    assert store.decision(first).state == "released" and store.decision(first).node != node


def test_a_requeued_subjob_keeps_its_chains_failures_in_a_row(site, batch, tmp_path):
    store, c, first, nxt = chain_job_running_with_its_next(site, batch, tmp_path)
    batch.finish(first, exit_status=1)  # a failed subjob
    c.step()
    assert store.chain(first).failures == 1
    made(batch, nxt)
    c.step()
    batch.requeue(nxt)  # no next job: it goes on in nxt
    c.step()
    assert [s.outcome for s in store.subjobs(first)] == ["failed", "requeued"] and store.chain(first).failures == 1


def test_a_released_subjob_an_operator_holds_is_theirs_to_release(site, batch):
    """A begin time just ahead of mig-batchd's clock (slurmctld's runs ahead) on a held job is no requeue."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    subjob = batch.add("mig-batch:v1;req=1g.10gb;atomize=1;ckpt=/ckpt;smin=60;smax=600")
    c.step()
    batch._set(subjob, state=JobState.HELD, not_before=time.time() + 2)
    calls = len(batch.calls)
    c.step()
    assert store.decision(subjob).state == "released" and batch.calls[calls:] == []
    batch._set(subjob, state=JobState.PENDING, not_before=time.time() + 2)  # released; its begin time near
    c.step()
    assert store.decision(subjob).state == "released" and batch.calls[calls:] == []


def test_a_chain_is_not_planned_on_a_down_node(site, batch):
    """The chains' gaps come from timelines, not the view's buckets: a fenced GPU must be missing there too."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    batch.set_node_up("n1", False)  # n1's GPUs come first in every tie
    job = batch.add("mig-batch:v1;req=6144M;atomize=1;ckpt=/tmp/ckpt;smin=30;smax=300")
    c.step()
    assert store.decision(job).node == "n2"


def test_a_moldable_job_does_not_wait_for_a_down_node(site, batch):
    """7g would finish first on the down node's GPU once its last job ends: the planner must not reserve
    it there, but start the job now on the node that is up."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    batch.clock = time.time()  # the jobs' ends (start + time limit) in wall time, as mig-batchd reads them
    ending = batch.add(RIGID, time_limit_s=100)
    c.step()
    made(batch, ending)
    assert store.decision(ending).node == "n1"
    batch.set_node_up("n1", False)  # its job keeps running: Slurm has not requeued it
    busy = batch.add(RIGID)
    c.step()
    made(batch, busy)
    assert store.decision(busy).node == "n2"
    job = batch.add("mig-batch:v1;req=1g;moldable=1g:600,7g:60")
    c.step()
    d = store.decision(job)
    assert d is not None and (d.node, d.profile) == ("n2", "1g.10gb")


def test_a_lost_job_record_ends_its_decision(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    batch.forget(job)
    assert c.step().ended == 1 and store.decision(job).state == "ended"


def test_a_job_released_to_a_node_that_then_goes_down_is_decided_again_elsewhere(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    node = parse_place(batch.job(job).admin_tag).node
    batch.set_node_up(node, False)  # drained before the job could start there
    c.step()
    assert store.decision(job).state == "requeued" and batch.job(job).held and batch.job(job).admin_tag == RIGID
    c.step()
    assert parse_place(batch.job(job).admin_tag).node != node and store.count_decisions(job) == 2


def nodes_of(store, jobs):
    return [store.decision(j).node for j in jobs]


def test_a_node_without_idle_cpus_takes_no_placement_while_another_has_them(site):
    batch = FakeBatch(["n1", "n2"], cpus_per_node=2)
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = [batch.add(RIGID) for _ in range(4)]
    c.step()
    assert sorted(nodes_of(store, first)) == ["n1", "n1", "n2", "n2"]  # MFI alone puts three on n1 (below)
    for job in first[:2]:
        made(batch, job)
    later = batch.add(RIGID)  # n1: 0 idle (2 running); n2: 2 idle, both promised to released jobs
    c.step()
    assert store.decision(later).node in ("n1", "n2")  # every node full: placed as before, it waits for CPUs
    batch.finish(first[0])
    batch.finish(first[1])
    last = batch.add(RIGID, cpus=2)
    c.step()
    assert store.decision(last).node == "n1"  # n1 has its two CPUs back; n2's are promised


def test_moldable_starts_take_cpus_in_the_pass_that_decides_them(site):
    """A node whose CPUs the pass's moldable starts have used takes no more of them in that pass, as for
    rigid jobs; MFI alone would put the first three on n1."""
    batch = FakeBatch(["n1", "n2"], cpus_per_node=2)
    store = Store(site.state)
    c = Controller(site, store, batch)
    jobs = [batch.add("mig-batch:v1;req=1g;moldable=1g:60") for _ in range(4)]
    c.step()
    assert sorted(nodes_of(store, jobs)) == ["n1", "n1", "n2", "n2"]


def test_when_every_node_is_full_jobs_go_where_the_fewest_wait_for_cpus(site):
    """Every node's CPUs are promised: a job pinned now waits for one on its node. MFI alone would pile the
    whole pass onto its favourite node while the other's CPUs free up; the jobs alternate instead."""
    batch = FakeBatch(["n1", "n2"], cpus_per_node=2)
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = [batch.add(RIGID) for _ in range(4)]
    c.step()
    assert sorted(nodes_of(store, first)) == ["n1", "n1", "n2", "n2"]  # released, not started: both full
    overflow = [batch.add(RIGID) for _ in range(4)]
    c.step()
    assert sorted(nodes_of(store, overflow)) == ["n1", "n1", "n2", "n2"]
    assert all(batch.job(j).state is JobState.PENDING and not batch.job(j).held for j in overflow)


def test_when_mig_fits_on_none_of_the_least_loaded_nodes_another_full_node_takes_the_job(site):
    batch = FakeBatch(["n1", "n2"], cpus_per_node=1)
    store = Store(site.state)
    c = Controller(site, store, batch)
    whole = batch.add("mig-batch:v1;req=7g.80gb")
    c.step()
    gpu_full = store.decision(whole).node
    other = "n2" if gpu_full == "n1" else "n1"
    made(batch, whole)  # its node: no idle CPU, no free slice
    two = [batch.add(RIGID) for _ in range(2)]
    c.step()
    assert nodes_of(store, two) == [other, other]  # the second: both full, and only the other has a slice
    late = batch.add(RIGID)  # the whole GPU's node has the most room (0 against -1), but no slice
    c.step()
    assert store.decision(late) is not None, "left waiting: MIG fits only on the node with less room"
    assert store.decision(late).node == other and not batch.job(late).held


def test_when_mig_fits_on_none_of_the_least_loaded_nodes_the_next_least_loaded_takes_the_job(tmp_path):
    """Every node full: n1 has the most room but no slice, n3 less room, n2 the least. MFI over every node
    would take n2 (the first of two GPUs alike); the job goes to n3, where the fewest wait after n1."""
    site = SiteConfig(state=tmp_path / "state.db", nodes={n: ("A100-80GB",) for n in ("n1", "n2", "n3")},
                      policy="mfi")  # fmt: skip
    batch = FakeBatch(["n1", "n2", "n3"], cpus_per_node=4)
    store = Store(site.state)
    c = Controller(site, store, batch)

    def placed(tag, cpus, start):
        job = batch.add(tag, cpus=cpus)
        c.step()
        if start:
            made(batch, job)
        return store.decision(job).node

    assert placed(BIG, 4, True) == "n1"  # no CPU, no slice
    assert [placed(RIGID, 4, True) for _ in range(2)] == ["n2", "n3"]  # one 1g each, no CPU
    assert placed(RIGID, 3, False) == "n2"  # waits there for 3 CPUs: n2's room -3
    assert placed(RIGID, 1, False) == "n3"  # the most room where MIG fits: n3's room -1
    assert placed(RIGID, 1, False) == "n3"  # MIG fits on n2 and n3 alike; n3 has more room


def test_a_request_that_fits_on_no_node_is_tried_on_every_node_once_a_pass(site):
    """A saturated cluster's queue: the second job of a shape that fits nowhere skips the second try."""
    batch = FakeBatch(["n1", "n2"], cpus_per_node=1)
    store = Store(site.state)
    c = Controller(site, store, batch)
    wholes = [batch.add("mig-batch:v1;req=7g.80gb", cpus=cpus) for cpus in (1, 2)]
    c.step()
    made(batch, wholes[0])  # one node: running, room 0; the other: released, 2 CPUs promised, room -1
    calls = []
    decide = c.policy.decide
    c.policy.decide = lambda *a, **k: calls.append(1) or decide(*a, **k)
    waiting = [batch.add(RIGID) for _ in range(3)]
    c.step()
    assert [store.decision(j) for j in waiting] == [None] * 3
    assert len(calls) == 2 + 1 + 1  # most room first, then every node once; then most room alone


@pytest.mark.parametrize(("policy", "nodes"), [("mfi", ["n1", "n1", "n1", "n2"]), ("mix", ["n1"] * 4)])
def test_without_cpu_figures_placement_is_the_policy_alone(site, batch, policy, nodes):
    """MFI spreads the fourth 1g to the empty GPU; `mix` (the default) packs by best fit."""
    import dataclasses

    site = dataclasses.replace(site, policy=policy)
    store = Store(site.state)
    c = Controller(site, store, batch)
    jobs = [batch.add(RIGID) for _ in range(4)]
    c.step()
    assert nodes_of(store, jobs) == nodes


def test_gpus_an_agent_finds_with_mig_mode_off_take_no_placement_and_status_says_so(site, batch, capsys):
    from mig_batch.cli.main import main

    store = Store(site.state)
    c = Controller(site, store, batch)
    batch.set_node_tag("n1", AgentTag(started=0, reconciled=1, mig_off=(0,)).text())
    jobs = [batch.add(BIG) for _ in range(2)]
    c.step()
    assert store.decision(jobs[0]).node == "n2" and store.decision(jobs[1]) is None  # n1's only GPU is off
    assert store.events(kind="mig-off", node="n1")[-1]["gpus"] == [0]
    site_file = site.state.parent / "site.yaml"
    site_file.write_text(f"state: {site.state}\nnodes: {{n1: [A100-80GB], n2: [A100-80GB]}}\n")
    assert main(["status", "--config", str(site_file), "--json"]) == 0
    status = {(g["node"], g["gpu"]): g["mig_mode"] for g in __import__("json").loads(capsys.readouterr().out)}
    assert status == {("n1", 0): "off", ("n2", 0): "on"}
    batch.set_node_tag("n1", AgentTag(started=0, reconciled=1).text())  # an administrator enabled it
    c.step()
    assert store.decision(jobs[1]).node == "n1"
    assert main(["status", "--config", str(site_file), "--json"]) == 0  # the node's newest mig-off event counts
    assert {g["mig_mode"] for g in __import__("json").loads(capsys.readouterr().out)} == {"on"}


def _fragmented(tmp_path, live_defrag: bool):
    """Three GPUs: n1 holds chain subjobs A and B (1g each), n2 chain C, n3 a long rigid 4g job;
    two whole-GPU (7g) jobs H and J wait. Set up with live defragmentation off, then the controller
    restarts with ``live_defrag`` as given."""
    import dataclasses
    import time

    from mig_batch.config import AtomizeConfig

    nodes = {n: ("A100-80GB",) for n in ("n1", "n2", "n3")}
    off = SiteConfig(state=tmp_path / "state.db", nodes=nodes)
    batch = FakeBatch(list(nodes))
    base = batch.clock = time.time() - 2990  # the chains' subjobs (3000 s windows) started that long ago
    store = Store(off.state)
    c = Controller(off, store, batch)
    fill = [batch.add(BIG, time_limit_s=7200), batch.add(BIG, time_limit_s=7200)]
    rigid = batch.add("mig-batch:v1;req=4g.40gb", time_limit_s=7200)
    c.step()
    for job in (*fill, rigid):
        made(batch, job)
    assert {parse_place(batch.job(j).admin_tag).node for j in (*fill, rigid)} == {"n1", "n2", "n3"}
    tag = "mig-batch:v1;req=1g.10gb;atomize=1;ckpt={};smin=30;smax=3000"
    where = {parse_place(batch.job(j).admin_tag).node: j for j in (*fill, rigid)}
    batch.finish(where["n1"])
    chains = {}
    for name in ("A", "B"):
        chains[name] = batch.add(tag.format(tmp_path / name))
        c.step()
    batch.finish(where["n2"])
    chains["C"] = batch.add(tag.format(tmp_path / "C"))
    c.step()
    for name, offset in (("A", 0), ("C", 50), ("B", 100)):  # A's window ends now, C's and B's later
        batch.clock = base + offset
        made(batch, chains[name])
    assert [parse_place(batch.job(chains[n]).admin_tag).node for n in "ABC"] == ["n1", "n1", "n2"]
    batch.clock = base + 200
    waiting = [batch.add(BIG), batch.add(BIG)]  # H, J: whole GPUs; the free slices add up to more
    c.step()
    assert all(batch.job(j).held for j in waiting)
    on = dataclasses.replace(off, atomize=AtomizeConfig(live_defrag=live_defrag))
    c = Controller(on, store, batch)  # a restart with the key as given
    c.step()
    return c, batch, store, chains, waiting, rigid


def _checkpoint(c, batch, chains, name):
    """Chain ``name``'s subjob checkpoints (exit 75); its next job is submitted first, as the runner does."""
    import time

    batch.clock = time.time()  # the next job is submitted now: it has not waited long (defrag_max_hold_s)
    nxt = batch.add(f"{batch.job(chains[name]).admin_tag.split(';place=')[0].split(';chain=')[0]};chain={chains[name]}")
    batch.finish(chains[name], exit_status=75)
    c.step()
    c.step()
    return nxt


@pytest.mark.parametrize("live_defrag", [True, False])
def test_live_defrag_grants_a_chains_next_subjob_elsewhere_and_a_waiting_7g_job_runs(tmp_path, live_defrag):
    c, batch, store, chains, waiting, rigid = _fragmented(tmp_path, live_defrag)
    a2 = _checkpoint(c, batch, chains, "A")
    a2_node = parse_place(batch.job(a2).admin_tag).node
    _checkpoint(c, batch, chains, "B")
    placed = [j for j in waiting if parse_place(batch.job(j).admin_tag) is not None]
    if live_defrag:
        assert a2_node == "n3"  # next to the long rigid job, not back on n1 where B still ran
        assert [parse_place(batch.job(j).admin_tag).node for j in placed] == ["n1"]  # a 7g job got n1
    else:
        assert a2_node == "n1" and placed == []  # A went back to n1: no whole GPU opened
    # nothing was stopped for it: the rigid job and chain C still run, nothing was cancelled or requeued
    assert batch.job(rigid).running and batch.job(chains["C"]).running
    assert not [call for call in batch.calls if call[0] in ("cancel", "requeue_hold", "hold")]
    assert not [d for d in store.decisions() if d.state == "requeued"]


@pytest.mark.parametrize("max_hold_s", [1800.0, 0.0])
def test_a_kept_window_holds_a_chain_back_only_for_a_bounded_time(tmp_path, max_hold_s):
    import dataclasses
    import time

    from mig_batch.config import AtomizeConfig

    nodes = {n: ("A100-80GB",) for n in ("n1", "n2")}
    off = SiteConfig(state=tmp_path / "state.db", nodes=nodes)
    batch = FakeBatch(list(nodes))
    now = time.time()
    batch.clock = now - 2990
    store = Store(off.state)
    c = Controller(off, store, batch)
    fill = [batch.add(BIG, time_limit_s=7200), batch.add(BIG, time_limit_s=7200)]
    c.step()
    for job in fill:
        made(batch, job)
    on_n1 = next(j for j in fill if parse_place(batch.job(j).admin_tag).node == "n1")
    batch.finish(on_n1)
    tag = "mig-batch:v1;req=1g.10gb;atomize=1;ckpt={};smin={};smax=3000"
    b = batch.add(tag.format(tmp_path / "B", 30))
    c.step()
    batch.clock = now - 2890
    made(batch, b)  # B's window ends in about 230 s by its time limit
    batch.clock = now - 60
    a = batch.add(tag.format(tmp_path / "A", 600))  # needs 600 s: cannot run before B's window opens
    whole = batch.add(BIG)  # fits nowhere; would fit on n1 once B checkpoints
    on = dataclasses.replace(off, atomize=AtomizeConfig(live_defrag=True, defrag_max_hold_s=max_hold_s))
    c = Controller(on, store, batch)
    c.step()
    assert batch.job(whole).held
    granted = parse_place(batch.job(a).admin_tag)
    if max_hold_s > 60:
        assert granted is None  # n1 is kept for the 7g job: A waits
    else:
        assert granted is not None and granted.node == "n1"  # waited past the bound: offered the kept window
    assert batch.job(b).running and batch.job(fill[1] if on_n1 == fill[0] else fill[0]).running


@pytest.mark.parametrize("live_defrag", [True, False])
def test_at_short_windows_a_subjob_is_expected_to_end_with_its_window_not_slurms_limit(tmp_path, live_defrag):
    """Slurm's limit for a 16 s window is 2 min (grace, USR1 margin, whole minutes). Taken as the
    subjob's end, it made the chains' GPU look busy long after their checkpoints: live defrag then
    moved a chain's next subjob back next to the other chain (it seemed to end in time) and the
    waiting 7g job never got the GPU. The expected end is the window's end."""
    import time

    from mig_batch.config import AtomizeConfig

    nodes = {"n1": ("A100-80GB", "A100-80GB")}
    site = SiteConfig(state=tmp_path / "state.db", nodes=nodes, atomize=AtomizeConfig(live_defrag=live_defrag))
    batch, store = FakeBatch(["n1"]), Store(site.state)
    c = Controller(site, store, batch)
    batch.clock = time.time()
    rigid = batch.add("mig-batch:v1;req=4g.40gb", time_limit_s=1800)
    c.step()
    made(batch, rigid)
    filler = batch.add("mig-batch:v1;req=3g.40gb", time_limit_s=1800)
    c.step()
    made(batch, filler)
    full = parse_place(batch.job(rigid).admin_tag).gpu
    assert parse_place(batch.job(filler).admin_tag).gpu == full  # one GPU full, the other free
    tag = "mig-batch:v1;req=1g.10gb;atomize=1;ckpt={};smin=4;smax=16"
    chains = {}
    for name, ago in (("A", 14), ("B", 10)):  # A's window ends in 2 s, B's in 6 s
        chains[name] = batch.add(tag.format(tmp_path / name))
        c.step()
        batch.clock = time.time() - ago
        made(batch, chains[name])
        assert batch.job(chains[name]).end_time - batch.job(chains[name]).start_time == 120  # Slurm's limit
    assert {parse_place(batch.job(j).admin_tag).gpu for j in chains.values()} == {1 - full}
    whole = batch.add(BIG)
    c.step()
    batch.finish(filler)  # room next to the long rigid job
    c.step()
    assert batch.job(whole).held
    a2 = _checkpoint(c, batch, chains, "A")
    assert parse_place(batch.job(a2).admin_tag).gpu == full  # elsewhere: B's GPU is the 7g job's next
    assert not store.events(kind="defrag-moved")
    _checkpoint(c, batch, chains, "B")
    assert parse_place(batch.job(whole).admin_tag).gpu == 1 - full
    assert batch.job(rigid).running
    assert not [call for call in batch.calls if call[0] in ("cancel", "requeue_hold", "hold")]


def test_a_job_its_owner_holds_stays_held_until_they_release_it(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    made(batch, job)
    c.step()
    assert store.decision(job).state == "running"
    batch.user_hold(job)  # HTCondor: condor_hold by the owner vacates the job; its instance goes
    c.step()
    assert store.decision(job).state == "requeued" and job not in c.view.job_gpu
    assert ("requeue_hold", job) in batch.calls  # unpinned: released by its owner, it waits for a decision
    calls = len(batch.calls)
    for _ in range(3):
        c.step()
    assert batch.job(job).held and batch.calls[calls:] == [] and store.count_decisions(job) == 1
    batch.user_hold(job, held=False)
    c.step()
    assert store.count_decisions(job) == 2 and store.decision(job).state == "released"


def test_chain_grants_take_cpus_in_the_pass_that_decides_them(site, tmp_path):
    """A node whose CPUs the pass's grants have used takes no more of them in that pass, as for rigid and
    moldable jobs: a chain chosen for a gap there waits for the next pass instead of for a CPU on a full
    node while another node has CPUs. Without this, all three went to n1's three GPUs in the first pass,
    with two CPUs there."""
    site = SiteConfig(state=site.state, nodes={"n1": ("A100-80GB",) * 3, "n2": ("A100-80GB",) * 3})
    batch = FakeBatch(["n1", "n2"], cpus_per_node=2)
    store = Store(site.state)
    c = Controller(site, store, batch)
    tag = "mig-batch:v1;req=6144M;atomize=1;ckpt={};smin=30;smax=300"
    jobs = [batch.add(tag.format(tmp_path / f"c{i}")) for i in range(3)]

    def granted():
        return sorted(d.node for j in jobs if (d := store.decision(j)) is not None)

    c.step()
    assert granted() and all(granted().count(n) <= 2 for n in ("n1", "n2"))
    c.step()
    assert len(granted()) == 3 and all(granted().count(n) <= 2 for n in ("n1", "n2"))


@pytest.fixture
def partitioned():
    """n1 in partition gpu, n2 in partition other: MFI's ties go to n1."""
    return FakeBatch(["n1", "n2"], partitions={"n1": ("gpu",), "n2": ("other",)})


@pytest.mark.parametrize("tag", [RIGID, "mig-batch:v1;req=1g;moldable=1g:60", "mig-batch:v1;req=1g.10gb;n=2",
                                 "mig-batch:v1;req=6144M;atomize=1;ckpt=/tmp/ckpt;smin=30;smax=300"])  # fmt: skip
def test_a_job_goes_only_to_nodes_of_its_partitions(site, partitioned, tag):
    """Slurm refuses a pin outside the job's partitions: decided there, it was pinned again every pass
    while its slot stayed taken."""
    store = Store(site.state)
    c = Controller(site, store, partitioned)
    job = partitioned.add(tag, partitions=("other",))
    anywhere = partitioned.add(tag)
    c.step()
    c.step()
    assert store.decision(job).node == "n2" and store.decision(job).state == "released"
    assert store.decision(anywhere) is not None


def test_a_moldable_job_reserves_no_gpu_outside_its_partitions(site, partitioned):
    """7g would finish first on n1's GPU once its job ends, but the job may run on n2 only: reserved on n1,
    it waited for a slot Slurm would refuse it, and kept that slot from others; it starts 1g on n2 now."""
    store = Store(site.state)
    c = Controller(site, store, partitioned)
    partitioned.clock = time.time()  # the jobs' ends (start + time limit) in wall time, as mig-batchd reads them
    ending = partitioned.add(RIGID, time_limit_s=100, partitions=("gpu",))
    busy = partitioned.add(RIGID, partitions=("other",))
    c.step()
    made(partitioned, ending)
    made(partitioned, busy)
    assert (store.decision(ending).node, store.decision(busy).node) == ("n1", "n2")
    job = partitioned.add("mig-batch:v1;req=1g;moldable=1g:600,7g:60", partitions=("other",))
    c.step()
    d = store.decision(job)
    assert d is not None and (d.node, d.profile) == ("n2", "1g.10gb")


def test_a_request_that_fits_nowhere_in_one_partition_may_fit_in_another(site, partitioned):
    store = Store(site.state)
    c = Controller(site, store, partitioned)
    whole = partitioned.add(BIG, partitions=("gpu",))
    c.step()
    made(partitioned, whole)  # n1's GPU is full
    waits, fits = partitioned.add(BIG, partitions=("gpu",)), partitioned.add(BIG, partitions=("gpu", "other"))
    c.step()
    assert store.decision(waits) is None and store.decision(fits).node == "n2"


def test_a_job_whose_partitions_hold_no_mig_node_waits_with_the_reason(site, partitioned):
    store = Store(site.state)
    c = Controller(site, store, partitioned)
    job = partitioned.add(RIGID, partitions=("cpu",))
    c.step()
    c.step()
    assert store.decision(job) is None
    [event] = store.events(job, "waiting")
    assert "partition(s) cpu" in event["reason"]


def test_a_pin_refused_three_times_on_a_node_is_decided_again_elsewhere(site, batch):
    """The job's own limits (an excluded node, a reservation) make Slurm refuse its pin there: it was pinned
    again every pass, for ever, its slot taken."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(BIG)
    refusing = None

    def refuse_on_first_node(pins):
        nonlocal refusing
        refusing = refusing or pins[0].node
        failed = {p.job_id: "Requested node configuration is not available" for p in pins if p.node == refusing}
        rest = [p for p in pins if p.node != refusing]
        return {**failed, **FakeBatch.pin_and_release(batch, rest)}

    batch.pin_and_release = refuse_on_first_node
    for _ in range(3):
        c.step()
        assert store.decision(job).node == refusing or store.decision(job).state != "released"
    c.step()
    assert store.decision(job).node != refusing and store.decision(job).state == "released"
    [event] = store.events(job, "pin-refused")
    assert event["node"] == refusing and "not available" in event["reason"]
    assert sum(job in g.instances for g in c.view.gpus) == 1


def test_a_pin_without_an_answer_is_not_a_refusal(site, batch):
    """A slurmctld too busy to answer must not send every job of three passes elsewhere."""
    from mig_batch.batch.system import Unanswered

    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(BIG)
    batch.pin_and_release = lambda pins: {p.job_id: Unanswered("Socket timed out on send/recv operation") for p in pins}
    for _ in range(4):
        c.step()
    first = store.decision(job)
    assert first.state == "decided" and not store.events(job, "pin-refused")


def test_a_job_is_decided_only_once_its_begin_time_comes(site, batch):
    """Pinned and released before its --begin, its slice would idle until then."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    later = batch.add(RIGID, not_before=time.time() + 3600)
    soon = batch.add(RIGID, not_before=time.time() - 1)
    assert c.step().placed == 1
    assert store.decision(later) is None and store.decision(soon).state == "released"
    assert [e["reason"] for e in store.events(job=later)] == [
        f"its begin time, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(batch.job(later).not_before))}"
    ]
    batch._set(later, not_before=time.time() - 1)
    assert c.step().placed == 1 and store.decision(later).state == "released"


@pytest.mark.parametrize("awaits, outcome, decided", [
    ("end", "FAILED", True), ("success", "COMPLETED", True), ("success", "FAILED", False),
    ("failure", "FAILED", True), ("failure", "COMPLETED", False),
])  # fmt: skip
def test_a_job_waits_for_the_jobs_it_depends_on_and_never_for_a_dependency_that_failed(site, batch, awaits,
                                                                                      outcome, decided):  # fmt: skip
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = batch.add("a user's job")
    job = batch.add(RIGID, after=[After(first, Awaits(awaits))])
    c.step()
    assert store.decision(job) is None
    assert store.events(job=job)[-1]["reason"] == f"job {first} to end"
    batch.start(first)
    c.step()
    assert store.decision(job) is None
    batch.finish(first, exit_status=0 if outcome == "COMPLETED" else 1, outcome=outcome)
    c.step()
    assert (store.decision(job) is not None) is decided
    if not decided:
        assert store.events(job=job)[-1]["reason"] == (
            f"its dependency on job {first}, which can never be met: that job ended {outcome}")


def test_a_job_after_another_failed_starts_when_that_one_is_held_after_a_special_exit(site, batch):
    """Slurm counts a job requeued held on its special exit code (SPECIAL_EXIT) as failed for afternotok; it
    would start the dependent job at once while mig-batchd kept it waiting."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = batch.add("a user's job")
    job = batch.add(RIGID, after=[After(first, Awaits.FAILURE)])
    batch.start(first)
    c.step()
    assert store.decision(job) is None
    batch._set(first, state=JobState.HELD, outcome="SPECIAL_EXIT")  # scontrol requeuehold state=specialexit
    assert c.step().placed == 1 and store.decision(job) is not None


@pytest.mark.parametrize("ended", [False, True])
def test_a_job_after_another_started_plus_minutes_waits_that_long(site, batch, ended):
    """Slurm's after:<job>+<minutes> counts from the other job's start, whether or not it still runs."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = batch.add("a user's job")
    job = batch.add(RIGID, after=[After(first, Awaits.START, 600.0)])
    batch.start(first)
    batch._set(first, start_time=time.time() - 60)
    if ended:
        batch.finish(first)
    c.step()
    assert store.decision(job) is None and store.events(job=job)[-1]["reason"] == f"job {first} to have run 10 min"
    batch._set(first, start_time=time.time() - 601)
    assert c.step().placed == 1


def _task(batch, record: str, array: str, *tasks: int) -> str:
    """A record of job array ``array`` as Slurm lists it: its own id (the array's id for the record of its
    pending tasks), standing for ``tasks``."""
    return batch.add("a task", job_id=record, array=array, array_tasks=[range(t, t + 1) for t in tasks])


@pytest.mark.parametrize("awaits, failed, decided", [
    ("end", False, True), ("end", True, True), ("success", False, True), ("success", True, False),
    ("failure", False, False), ("failure", True, True), ("start", False, True),
])  # fmt: skip
def test_a_job_after_an_array_waits_for_all_its_tasks_as_slurm_counts_them(site, batch, awaits, failed, decided):
    """A job after an array (Slurm: afterok:50_*) waits while any task waits or runs; then Slurm's rule for
    the array as a whole: it succeeded only if every task did. A slot decided sooner would idle."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    batch.start(_task(batch, "51", "50", 1))
    _task(batch, "50", "50", 2, 3)  # the pending tasks' record keeps the array's id
    job = batch.add(RIGID, after=[After("50_*", Awaits(awaits), array="50")])
    c.step()
    assert store.decision(job) is None
    assert store.events(job=job)[-1]["reason"] == f"job 50_* to {'start' if awaits == 'start' else 'end'}"
    batch.forget("50")  # the scheduler starts them: each its own record (the last keeps the array's id)
    for record, task in (("52", 2), ("50", 3)):
        batch.start(_task(batch, record, "50", task))
    if awaits == "start":
        assert c.step().placed == 1
        return
    for record in ("51", "52"):
        batch.finish(record, exit_status=1 if failed and record == "52" else 0,
                     outcome="FAILED" if failed and record == "52" else "COMPLETED")  # fmt: skip
    c.step()
    assert store.decision(job) is None and store.events(job=job)[-1]["reason"] == "job 50_* to end"  # 50_3 runs
    batch.finish("50")
    c.step()
    assert (store.decision(job) is not None) is decided
    if not decided:
        ended = "its task 52 ended FAILED" if awaits == "success" else "every task of it ended COMPLETED"
        assert store.events(job=job)[-1]["reason"] == f"its dependency on job 50_*, which can never be met: {ended}"


def test_a_job_after_an_array_started_plus_minutes_counts_from_its_last_tasks_start(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    first, last = _task(batch, "71", "70", 1), _task(batch, "70", "70", 2)
    job = batch.add(RIGID, after=[After("70_*", Awaits.START, 300.0, array="70")])
    for record, ago in ((first, 900), (last, 60)):
        batch.start(record)
        batch._set(record, start_time=time.time() - ago)
    c.step()
    assert store.decision(job) is None and store.events(job=job)[-1]["reason"] == "job 70_* to have run 5 min"
    batch._set(last, start_time=time.time() - 301)
    assert c.step().placed == 1


def test_a_job_after_one_task_of_an_array_waits_for_that_task_only(site, batch):
    """The task may be among the array's pending ones (one record for all of them), even past where Slurm
    cut their list short; once it has its own record, the other tasks do not matter."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    _task(batch, "61", "60", 1)
    batch.add("pending tasks", job_id="60", array="60", array_tasks=[range(2, 41), range(41, 2**63)])  # 2-40,...
    job = batch.add(RIGID, after=[After("60_77", Awaits.SUCCESS, array="60", task=77)])
    c.step()
    assert store.decision(job) is None and store.events(job=job)[-1]["reason"] == "job 60_77 to end"
    batch.start(_task(batch, "62", "60", 77))  # its own record; the list still cut before it
    c.step()
    assert store.decision(job) is None
    batch.finish("62")  # Slurm looks at the task's own record first: the cut list's range no longer counts
    assert c.step().placed == 1
    other = batch.add(RIGID, after=[After("60_5", Awaits.SUCCESS, array="60", task=5)])
    batch.forget("60")  # every pending task ended and its record was purged
    assert c.step().placed == 1 and store.decision(other) is not None


@pytest.mark.parametrize("whole", [False, True])
def test_a_job_after_a_task_failed_starts_when_the_task_is_held_after_a_special_exit(site, batch, whole):
    """Slurm judges afternotok on a task by that task's record; on a whole array by a record it picks, so
    there mig-batchd waits for the array to end."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    task = _task(batch, "81", "80", 1)
    after = After("80_*", Awaits.FAILURE, array="80") if whole else After("80_1", Awaits.FAILURE, array="80", task=1)
    job = batch.add(RIGID, after=[after])
    batch.start(task)
    c.step()
    batch._set(task, state=JobState.HELD, outcome="SPECIAL_EXIT")
    c.step()
    assert (store.decision(job) is not None) is not whole


def test_a_released_job_whose_dependency_fails_gives_its_slot_back(site, batch):
    """Released on a dependency the batch system judges (alternatives, or an array whose failed task's record
    was purged): when that fails, the batch system never starts the job, so its slot goes back and it waits,
    held, with the reason."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID, after=[After("7_*", Awaits.END)])
    c.step()
    assert store.decision(job).state == "released" and job in c.view.job_gpu
    batch._set(job, after=(After("7_*", Awaits.NEVER),))
    c.step()
    assert store.decision(job).state == "requeued" and job not in c.view.job_gpu
    assert batch.job(job).held and parse_place(batch.job(job).admin_tag) is None
    for _ in range(2):
        c.step()
    assert store.count_decisions(job) == 1
    assert [e["reason"] for e in store.events(job=job, kind="waiting")] == [
        "its dependency on job 7_*, which the batch system says can never be met"]


def test_a_released_job_whose_owner_moves_its_begin_time_gives_its_slot_back_until_then(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    assert store.decision(job).state == "released"
    batch._set(job, not_before=time.time() + 5)  # Slurm's clock a little ahead of this host's: kept
    c.step()
    assert store.decision(job).state == "released"
    batch._set(job, not_before=time.time() + 3600)  # scontrol update starttime=now+1hour
    c.step()
    assert store.decision(job).state == "requeued" and job not in c.view.job_gpu and batch.job(job).held
    batch._set(job, not_before=time.time() - 1)
    c.step()
    assert store.count_decisions(job) == 2 and store.decision(job).state == "released"


def test_a_released_job_held_again_keeps_its_slot_whatever_it_waits_for(site, batch):
    """Held after its release (by its owner, an operator, or Slurm after a failed launch), a job is theirs to
    release; it keeps its slot meanwhile. Taken back, its hold would become mig-batchd's, and mig-batchd would
    release it."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    batch.hold(job)
    batch._set(job, not_before=time.time() + 3600)
    calls = len(batch.calls)
    for _ in range(2):
        c.step()
    assert store.decision(job).state == "released" and job in c.view.job_gpu and batch.calls[calls:] == []


def test_a_decision_whose_pin_failed_is_not_pinned_again_once_its_dependency_fails(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID, after=[After("7_*", Awaits.END)])
    batch.refuse.add(job)
    c.step()
    assert store.decision(job).state == "decided"
    batch.refuse.clear()
    batch._set(job, after=(After("7_*", Awaits.NEVER),))
    c.step()
    assert store.decision(job).state == "requeued" and job not in c.view.job_gpu
    assert batch.job(job).held and parse_place(batch.job(job).admin_tag) is None


def test_a_subjobs_begin_time_does_not_hold_it_back(site, batch):
    """Slurm sets a requeued job's begin time ahead (its credential's lifetime); a subjob's pin starts it at
    once, so that it keeps its gap."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    subjob = batch.add("mig-batch:v1;req=1g.10gb;atomize=1;ckpt=/ckpt;smin=60;smax=600", not_before=time.time() + 120)
    rigid = batch.add(RIGID, not_before=time.time() + 120)
    c.step()
    assert store.decision(subjob) is not None and store.decision(rigid) is None


def test_a_released_subjob_that_slurm_requeued_before_a_pass_saw_it_run_is_granted_again_elsewhere(site, batch):
    """Requeued by Slurm after its start and before a pass saw it run, a subjob is pending again, its begin
    time 120 s on (cred_expire). Its slot would idle until then, and its window end that much after its gap:
    it is granted again at once, on another node than the one whose slurmd may skip its Prolog."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    subjob = batch.add("mig-batch:v1;req=1g.10gb;atomize=1;ckpt=/ckpt;smin=60;smax=600")
    c.step()
    d = store.decision(subjob)
    assert d.state == "released"
    batch.start(subjob)
    batch.requeue(subjob)
    assert batch.job(subjob).not_before > time.time() + 60
    c.step()
    assert [s.outcome for s in store.subjobs(subjob)] == ["requeued"] and store.chain(subjob).failures == 0
    assert store.decision(subjob).state == "requeued" and batch.job(subjob).held
    c.step()
    again = store.decision(subjob)
    assert again.state == "released" and again.node != d.node and store.count_decisions(subjob) == 2
    made(batch, subjob)
    c.step()
    assert store.decision(subjob).state == "running"


def test_a_job_after_another_started_waits_for_its_start_and_a_purged_one_for_nothing(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    first, gone = batch.add("a user's job"), batch.add("another")
    job = batch.add(RIGID, after=[After(first, Awaits.START), After(gone, Awaits.SUCCESS)])
    batch.forget(gone)  # its record is purged: it ended long ago, as the dependency wanted or not
    c.step()
    assert store.decision(job) is None and store.events(job=job)[-1]["reason"] == f"job {first} to start"
    batch.start(first)
    assert c.step().placed == 1


def test_a_dependency_the_batch_system_says_never_holds_keeps_the_job_waiting(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add(RIGID, after=[After("77", Awaits.NEVER)])
    for _ in range(2):
        assert c.step().placed == 0
    assert store.decision(job) is None
    assert [e["reason"] for e in store.events(job=job)] == [
        "its dependency on job 77, which the batch system says can never be met"]  # said once


def test_the_pass_bench_keeps_its_queue_and_places_the_churn():
    """``mig-batch bench pass`` on a small cluster: as many jobs arrive as end between passes, so the
    submitted count is running or queued at the end; each steady pass places about as many as ended."""
    from mig_batch.bench.controller_pass import bench_controller_pass

    (row,) = bench_controller_pass([16], jobs_per_gpu=6, gpus_per_node=4, churn=10, passes=3)
    assert (row.gpus, row.nodes) == (16, 4)
    assert row.running + row.queued == 16 * 6
    assert row.queued > 0 and 0 < row.placed_per_pass <= 10 + 7  # what ended frees, give or take a fit
    assert 0 < row.p50_ms <= row.max_ms


def test_a_pass_reads_the_time_from_the_injected_clock(site, batch):
    """The begin time is judged on the controller's clock, not the machine's: a job due at 5,000 on a clock
    at 4,000 waits (while the machine's time is long past it), and is placed once that clock passes it."""
    now = [4_000.0]
    store = Store(site.state)
    c = Controller(site, store, batch, clock=lambda: now[0])
    job = batch.add(RIGID, not_before=5_000.0)
    assert c.step().placed == 0
    assert any("begin time" in e.get("reason", "") for e in store.events(job=job, kind="waiting"))
    now[0] = 5_001.0
    assert c.step().placed == 1 and store.decision(job) is not None


def test_a_failing_cancel_in_the_placement_phase_is_logged_with_its_job_and_the_pass_goes_on(site, batch, tmp_path,
                                                                                               monkeypatch):
    """A job naming a chain that is over is cancelled; when the batch system refuses that cancel, the other
    waiting jobs are still placed and the error names the job."""
    store, c, first, tag = chain_job_running(site, batch, tmp_path)
    batch.finish(first, exit_status=0)  # the chain is done
    c.step()
    assert store.chain(first).state == "done"
    late = batch.add(f"{tag};chain={first}")
    rigid = batch.add(RIGID)

    def refuse(job):
        raise BatchError(f"Invalid job id specified for job {job}")

    monkeypatch.setattr(batch, "cancel", refuse)
    stats = c.step()  # the refused cancel is logged with the job (it is tried again next pass)
    assert store.decision(rigid) is not None and parse_place(batch.job(rigid).admin_tag) is not None
    assert store.events(job=late, kind="chain-job-cancelled") and any(late in e for e in stats.errors)


def test_a_waiting_job_shows_its_owner_why_and_the_note_goes_when_it_is_placed(site, batch):
    """Each waiting job's reason is written into its tag (Slurm: AdminComment, which its owner reads), once per
    change, and its pin writes the tag again without it."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    small = [batch.add(BIG) for _ in range(2)]  # both GPUs taken whole
    c.step()
    for job in small:
        made(batch, job)
    big = batch.add(BIG)
    after = batch.add(RIGID, after=[After(small[0], Awaits.END)])
    c.step()
    assert wait_note(batch.job(big).admin_tag).startswith("no room: every GPU that could hold 7g.80gb is busy")
    assert wait_note(batch.job(after).admin_tag) == f"job {small[0]} to end"
    assert parse_tag(batch.job(big).admin_tag) == parse_tag(BIG)  # the request as it was
    writes = batch.calls.count(("set_job_tag", big))
    c.step()  # nothing changed: nothing written
    assert batch.calls.count(("set_job_tag", big)) == writes
    batch.finish(small[0])
    c.step()
    assert store.decision(big).state == "released" and wait_note(batch.job(big).admin_tag) == ""
    assert parse_place(batch.job(big).admin_tag) is not None
    assert wait_note(batch.job(after).admin_tag).startswith("no room: every GPU that could hold 1g.10gb is busy")


def test_wait_notes_are_written_a_few_per_pass_and_again_when_refused(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    later = time.time() + 3600
    jobs = [batch.add(RIGID, not_before=later) for _ in range(NOTES_PER_PASS + 5)]
    written = batch.set_job_tag

    tries = []

    def down(job, tag):
        tries.append(job)
        raise BatchError("slurmctld not answering")

    batch.set_job_tag = down
    c.step()
    assert not any(wait_note(batch.job(j).admin_tag) for j in jobs)
    assert len(tries) == 1  # one failed note stops the others (an unanswering Slurm would stall the pass)
    batch.set_job_tag = written
    c.step()
    assert sum(bool(wait_note(batch.job(j).admin_tag)) for j in jobs) == NOTES_PER_PASS
    c.step()
    assert all(wait_note(batch.job(j).admin_tag).startswith("its begin time") for j in jobs)


def test_a_wait_note_is_one_short_field_of_the_tag():
    tag = with_wait_note(RIGID, "job 4; then more=text\n" + "x" * 400)
    assert tag.startswith(RIGID + ";waits=job 4, then more=text x") and len(wait_note(tag)) == 200
    assert parse_tag(tag) == parse_tag(RIGID) and parse_place(tag) is None
    assert with_wait_note(tag, "") == RIGID and with_wait_note(with_wait_note(tag, "b"), "c") == RIGID + ";waits=c"
