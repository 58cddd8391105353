"""End to end on a real HTCondor pool (a sid chroot with minicondor, two startds as nodes ``nodea`` and
``nodeb``; tests/harness/htcondor_pool.py), started once for the module.

This test process is the controller: it talks to the pool through ``HTCondorBatch`` with the
controller's token (a queue superuser). The job owner acts through the pool's own command-line tools
run as that user inside the chroot, so the two identities never share a process (the bindings keep
one security session per process).
"""

import re
import time

import pytest
from harness.htcondor_pool import LocalPool, controller_batch

from mig_batch.batch.system import JobState, Pin
from mig_batch.batch.tags import AgentTag, parse_agent_tag, parse_place

WHY_NOT = LocalPool.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

REQUEST = "mig-batch:v1;req=20G"
JOB = """executable = /bin/sh
arguments = "-c 'grep ^MigBatchNodeName $_CONDOR_MACHINE_AD; sleep {seconds}'"
output = {name}.out
error = {name}.err
log = {name}.log
request_cpus = 1
request_memory = 64M
request_disk = 10M
should_transfer_files = NO
{extra}
queue
"""


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    pool = LocalPool(tmp_path_factory.mktemp("htcondor"))
    started = time.monotonic()
    pool.start()
    print(f"\nHTCondor pool started in {time.monotonic() - started:.1f}s: {pool.timings}")
    yield pool
    pool.stop()


@pytest.fixture(scope="module")
def controller(pool):
    with controller_batch(pool) as batch:
        yield batch


def submit_as_owner(pool, name, seconds=1, held=True, check=True, **request):
    """condor_submit run by the job's owner inside the pool, with request attributes (``MigRequest="20G"``
    by default; the schedd's transform makes the tag from them); the job id, or the refusal."""
    extra = [f"+{attr} = {value}" for attr, value in ({"MigRequest": '"20G"'} | request).items()]
    extra += ["hold = True"] if held else []
    (pool.shared / f"{name}.sub").write_text(JOB.format(name=name, seconds=seconds, extra="\n".join(extra)))
    proc = pool.run("condor_submit", f"{name}.sub", user=pool.user, cwd=str(pool.shared), check=check)
    cluster = re.search(r"submitted to cluster (\d+)", proc.stdout)
    if not check:
        return proc
    assert cluster, proc.stdout
    return f"{cluster.group(1)}.0"


def owner(pool, *argv):
    """A command of the job's owner (condor authenticates the unix user inside the chroot)."""
    return pool.run(*argv, user=pool.user, check=False)


def wait_for(controller, job_id, done, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = controller.job(job_id)
        if job is not None and done(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} still {controller.job(job_id)} after {timeout}s")


def negotiated(controller, job_id):
    """The job once the negotiator has considered it: matched (running or done), or rejected."""
    controller.schedd.reschedule()  # a negotiation cycle now
    return wait_for(controller, job_id, lambda j: j.running or j.finished or j.reason == "no match found")


def placed(node):
    return f"{REQUEST};place={node}/0/3g.40gb@4"


def test_pinned_jobs_run_only_on_their_nodes_and_finish(pool, controller):
    first, second = submit_as_owner(pool, "first"), submit_as_owner(pool, "second")
    seen = {j.job_id: j for j in controller.jobs()}
    assert seen[first].state is JobState.HELD and seen[first].managed and seen[first].admin_tag == REQUEST
    assert seen[second].held
    cluster_only = second.partition(".")[0]  # a job named as its cluster is its proc 0
    named = controller.jobs_named([first, cluster_only, f"0{first}", "99999.0", "not-a-job-id"])
    assert named == {first: seen[first], cluster_only: seen[second], f"0{first}": seen[first], "99999.0": None}

    # crosswise from the order condor would pick by itself: the second startd first
    started = time.monotonic()
    pins = [Pin(first, "nodeb", placed("nodeb")), Pin(second, "nodea", placed("nodea"))]
    assert controller.pin_and_release(pins) == {}
    for job_id, node in ((first, "nodeb"), (second, "nodea")):
        job = wait_for(controller, job_id, lambda j: j.finished)
        assert (job.node, job.outcome, job.exit_status) == (node, "COMPLETED", 0)
        assert parse_place(job.admin_tag).node == node
        name = "first" if job_id == first else "second"
        seen_by_job = (pool.shared / f"{name}.out").read_text().strip()  # what the job saw of its machine
        assert seen_by_job == f'MigBatchNodeName = "{node}"'
    print(f"pinned -> both finished in {time.monotonic() - started:.1f}s")
    [gone] = controller.jobs_named([first]).values()
    assert gone is None or gone.finished  # leaving the queue, or gone from it


def test_a_managed_job_without_a_pin_matches_no_node_and_waits_as_held(pool, controller):
    job_id = submit_as_owner(pool, "unpinned", held=False)  # idle in HTCondor's words
    job = negotiated(controller, job_id)
    assert (job.state, job.reason) == (JobState.HELD, "no match found")
    assert controller.pin_and_release([Pin(job_id, "nodea", placed("nodea"))]) == {}
    assert wait_for(controller, job_id, lambda j: j.finished).node == "nodea"


def test_the_schedd_makes_the_tag_and_drops_what_the_owner_wrote_into_placement_attributes(pool, controller):
    forged = submit_as_owner(pool, "forged", MigModel='"H100-80GB"', MigBatchNode='"nodea"',
                             MigBatchTag='"mig-batch:v1;req=1g;place=nodea/0/7g.80gb@0"')  # fmt: skip
    job = controller.job(forged)
    assert job.admin_tag == "mig-batch:v1;req=20G;model=H100-80GB" and parse_place(job.admin_tag) is None
    pin = pool.run("condor_q", forged, "-af", "MigBatchNode").stdout.strip()
    assert pin == "undefined" and job.held  # unpinned: it waits for the controller
    unmanaged = submit_as_owner(pool, "unmanaged", MigRequest="undefined", MigBatchTag=f'"{placed("nodea")}"')
    assert controller.job(unmanaged).admin_tag == "" and not controller.job(unmanaged).managed
    refused = submit_as_owner(pool, "injected", check=False, MigRequest='"20G;place=nodea/0/7g.80gb@0"')
    assert refused.returncode != 0 and "MigRequest, MigCompute, MigModel, MigMoldable may hold only" in refused.stderr
    # condor_submit -i marks the job InteractiveJob: a MIG job is refused with the way that works
    refused = submit_as_owner(pool, "interactive", check=False, InteractiveJob="True")
    assert refused.returncode != 0 and "a MIG job (MigRequest) cannot be interactive" in refused.stderr, refused
    plain = submit_as_owner(pool, "interactive-plain", MigRequest="undefined", InteractiveJob="True")
    controller.cancel(plain)  # not a MIG job: the site's own rules
    # an expression that reads one way to the requirements and another to the tag's transform (a review's attack:
    # the transform deletes the owner's tag before it builds its own): frozen to one value first
    sneaky = 'ifThenElse(MigBatchTag is undefined, "/x;chain=42.0;ckpt=/shared/a", "/shared/a")'
    refused = submit_as_owner(pool, "expression", check=False, MigCheckpointDir=sneaky)
    assert refused.returncode != 0 and "a subjob chain" in refused.stderr, refused  # its value now: the first
    chain = submit_as_owner(pool, "expression-tagged", MigCheckpointDir=sneaky, MigBatchTag='"x"')
    tag = controller.job(chain).admin_tag
    assert ";chain=" not in tag and ";ckpt=/shared/a;" in tag, tag  # the value the requirements saw
    controller.cancel(chain)
    for job_id in (forged, unmanaged):
        controller.cancel(job_id)


def test_the_owner_cannot_edit_the_placement_but_the_controller_can(pool, controller):
    job_id = submit_as_owner(pool, "edits")
    for attr, value in (("MigBatchNode", '"nodeb"'), ("MigBatchTag", f'"{placed("nodeb")}"')):
        refused = owner(pool, "condor_qedit", job_id, attr, value)
        assert refused.returncode != 0 and f'Failed to set attribute "{attr}"' in refused.stderr + refused.stdout
    assert controller.job(job_id).admin_tag == REQUEST
    # the owner may edit its own job otherwise: the refusal above is the protection, not a wrong identity
    assert owner(pool, "condor_qedit", job_id, "MigBatchOwnerNote", '"mine"').returncode == 0
    controller.set_job_tag(job_id, placed("nodea"))
    assert controller.job(job_id).admin_tag == placed("nodea")
    controller.cancel(job_id)
    assert wait_for(controller, job_id, lambda j: j.finished).cancelled


def test_requeue_hold_unpins_so_an_owner_release_runs_nothing(pool, controller):
    job_id = submit_as_owner(pool, "requeued", seconds=60)
    assert controller.pin_and_release([Pin(job_id, "nodeb", placed("nodeb"))]) == {}
    assert wait_for(controller, job_id, lambda j: j.running).node == "nodeb"
    refused = controller.pin_and_release([Pin(job_id, "nodea", placed("nodea"))])
    assert job_id in refused  # a running job is not pinned again
    controller.requeue_hold(job_id, "the node could not place it")
    job = controller.job(job_id)
    assert job.held and "requeued" in job.reason
    # HTCondor lets the owner release a job its superuser held; with no pin it matches nowhere, and
    # the controller still sees a job waiting for its decision
    assert owner(pool, "condor_release", job_id).returncode == 0
    job = negotiated(controller, job_id)
    assert (job.state, job.reason) == (JobState.HELD, "no match found")
    assert controller.pin_and_release([Pin(job_id, "nodea", placed("nodea"))]) == {}
    assert wait_for(controller, job_id, lambda j: j.running).node == "nodea"
    controller.cancel(job_id)
    assert wait_for(controller, job_id, lambda j: j.finished).outcome == "CANCELLED"


def test_node_agent_state_reaches_the_controller_through_the_startd(pool, controller):
    assert {n.node for n in controller.nodes()} == {"nodea", "nodeb"}
    tag = AgentTag(started=100.0, reconciled=time.time(), strays=2)
    controller.set_node_tag("nodeb", tag.text())
    deadline = time.monotonic() + 30  # the startd cron runs every 5 s, then updates the collector
    while time.monotonic() < deadline:
        nodes = {n.node: n for n in controller.nodes()}
        if nodes["nodeb"].agent_tag:
            break
        time.sleep(0.5)
    assert parse_agent_tag(nodes["nodeb"].agent_tag) == parse_agent_tag(tag.text())
    assert nodes["nodea"].agent_tag == "" and all(n.up for n in nodes.values())


def test_the_controller_decides_over_htcondor_and_each_job_runs_where_decided(pool, controller, tmp_path):
    """mig-batchd's decision core, unchanged, with HTCondor as its batch system (no node agent yet: the
    jobs run without instances; the point is that the decision reaches the right startd)."""
    from mig_batch.config import SiteConfig
    from mig_batch.controller.daemon import Controller
    from mig_batch.state import Store

    for leftover in (j for j in controller.jobs() if not j.finished):  # the controller would place them too
        controller.cancel(leftover.job_id)
    site = SiteConfig(state=tmp_path / "state.db", nodes={"nodea": ("A100-80GB",), "nodeb": ("H100-80GB",)})
    store = Store(site.state)
    daemon = Controller(site, store, controller)
    # the model pins each job to one node's GPU: where it runs is the controller's doing, not chance
    # not submitted on hold: a job its owner holds is theirs, and the controller leaves it held
    on_h100 = submit_as_owner(pool, "on-h100", held=False, MigRequest='"40G"', MigModel='"H100-80GB"')
    on_a100 = submit_as_owner(pool, "on-a100", held=False, MigRequest='"40G"', MigModel='"A100-80GB"')
    jobs = {on_h100: "nodeb", on_a100: "nodea"}
    stats = daemon.step()
    assert stats.placed == 2 and not stats.errors, stats
    for job_id, node in jobs.items():
        decided = store.decision(job_id)
        finished = wait_for(controller, job_id, lambda j: j.finished)
        assert decided.node == node and (finished.node, finished.outcome) == (node, "COMPLETED")
        place = parse_place(finished.admin_tag)  # what HTCondor carried is what the store recorded
        assert (place.node, place.gpu, place.profile, place.start) == (node, decided.gpu, decided.profile,
                                                                       decided.start)  # fmt: skip
    daemon.step()
    assert {store.decision(j).state for j in jobs} == {"ended"}


def test_a_pool_stops_leaving_nothing_running_or_mounted_and_the_image_untouched(tmp_path):
    solo = LocalPool(tmp_path / "solo", nodes=("solo",))
    solo.start()
    assert solo.run("condor_status", "-af", "MigBatchNodeName").stdout.split() == ["solo"]
    chroot = str(solo.chroot)
    solo.stop()
    with open("/proc/mounts") as mounts:
        assert not [line for line in mounts if chroot in line]
    assert not solo._pids()
    assert (tmp_path / "solo" / "log" / "MasterLog").exists()  # condor's logs kept for a post-mortem
    assert not (solo.image.path / "home" / solo.user).exists()  # the account went to the overlay only



def test_an_owner_reads_why_their_job_waits_and_where_it_runs_with_condor_q(pool, controller, tmp_path):
    """mig-batchd writes a waiting job's reason into its tag; the job's owner (no root) reads it with condor_q,
    as migsub status --backend htcondor does."""
    from mig_batch.cli.migsub_status import CONDOR_Q_ARGS, parse_condor_json, status_row
    from mig_batch.config import SiteConfig
    from mig_batch.controller.daemon import Controller
    from mig_batch.state import Store

    for leftover in (j for j in controller.jobs() if not j.finished):
        controller.cancel(leftover.job_id)
    site = SiteConfig(state=tmp_path / "state.db", nodes={"nodea": ("A100-80GB",)})
    daemon = Controller(site, Store(site.state), controller)
    whole = submit_as_owner(pool, "whole", seconds=120, held=False, MigRequest='"7g.80gb"')
    small = submit_as_owner(pool, "small", held=False, MigRequest='"1g.10gb"')
    try:
        assert daemon.step().placed == 1
        seen = owner(pool, "condor_q", whole, small, *CONDOR_Q_ARGS)
        assert seen.returncode == 0, seen.stderr
        rows = {r["job"]: r for r in (status_row(*rec) for rec in parse_condor_json(seen.stdout)) if r is not None}
        assert rows[small]["waits"].startswith("no room: every GPU that could hold 1g.10gb is busy"), rows
        assert rows[whole]["placement"]["node"] == "nodea", rows
    finally:
        controller.cancel(whole)
        controller.cancel(small)


def test_a_pin_starts_its_job_once_so_an_owners_release_after_a_run_starts_nothing(pool, controller):
    """A job released by its owner after it ran, before the controller's pass unpins it (a chain's subjob held by
    its exit policy, a running job its owner held), matches nothing: the pin's start count is spent. A new pin
    starts it again."""
    job_id = submit_as_owner(pool, "once", seconds=60)
    assert controller.pin_and_release([Pin(job_id, "nodeb", placed("nodeb"))]) == {}
    assert wait_for(controller, job_id, lambda j: j.running).node == "nodeb"
    assert owner(pool, "condor_hold", job_id).returncode == 0
    assert wait_for(controller, job_id, lambda j: j.held).held_by_user
    assert owner(pool, "condor_release", job_id).returncode == 0  # still pinned: the controller saw nothing yet
    job = negotiated(controller, job_id)
    assert (job.state, job.reason) == (JobState.PENDING, "no match found"), job
    controller.requeue_hold(job_id, "its owner released it")  # what the controller's pass does
    assert controller.pin_and_release([Pin(job_id, "nodeb", placed("nodeb"))]) == {}
    assert wait_for(controller, job_id, lambda j: j.running).node == "nodeb"
    controller.cancel(job_id)
    assert wait_for(controller, job_id, lambda j: j.finished).cancelled
