"""MIG slices in HTCondor's accounting and limits, on the real test pool (tests/harness/htcondor_pool.py):
the accounting config ``mig-batch htcondor install`` writes (``mig_batch.htcondor.accounting``), the
controller's pin writing each job's slices, ``condor_userprio`` counting them, and a per-user slice cap
(a concurrency limit) keeping a second job idle with HTCondor's own reason.

This test process is the controller (its token, a queue superuser); the job's owner acts through the pool's
command-line tools inside the chroot, and ``condor_userprio`` runs there as root.
"""

import contextlib
import re
import time

import pytest
from harness.htcondor_pool import LocalPool, controller_batch

from mig_batch.batch.system import BatchError, Pin
from mig_batch.htcondor import accounting
from mig_batch.mig.models import get_model

WHY_NOT = LocalPool.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

A100 = get_model("A100-80GB")
SLICES_3G = A100.profile("3g.40gb").memory_slices  # 4 of the GPU's 8
CAP = 6  # the job owner's MIG slices (MIG_SLICES.CIUSER_LIMIT): one 3g.40gb fits, two do not
GROUP = "group_mig"
DEFAULT_CAP = 2  # every other user's (CONCURRENCY_LIMIT_DEFAULT_MIG_SLICES): were it the owner's, nothing would run
# the config install writes, each node's count by its name: the first startd's $(HOSTNAME) is the pool's host
# name; the second startd (local name NODEB) takes its own count, as a second host would by its name
ACCOUNTING = "\n".join([
    accounting.schedd_config(),
    accounting.execute_config({"migpool": [A100], "nodeb": [A100]}),
    "NODEB.MACHINE_RESOURCE_MigSlices = $(MIG_BATCH_SLICES_nodeb)",
    f"CONCURRENCY_LIMIT_DEFAULT_{accounting.LIMIT.upper()} = {DEFAULT_CAP}",
    f"{accounting.LIMIT.upper()}.{LocalPool.user.upper()}_LIMIT = {CAP}",
    f"GROUP_NAMES = {GROUP}",  # an accounting group with a quota: its use is counted in slot weight, so slices
    f"GROUP_QUOTA_{GROUP} = {SLICES_3G}",
])  # fmt: skip
JOB = """executable = /bin/sh
arguments = "-c 'sleep {seconds}'"
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
    pool = LocalPool(tmp_path_factory.mktemp("htcondor-accounting"), extra_config=ACCOUNTING)
    pool.start()
    yield pool
    pool.stop()


@pytest.fixture(scope="module")
def controller(pool):
    with controller_batch(pool) as batch:
        yield batch


def submit(pool, name, seconds=300, extra=""):
    """A managed job (+MigRequest) submitted by its owner; its id."""
    text = JOB.format(name=name, seconds=seconds, extra='+MigRequest = "40G"\n' + extra)
    (pool.shared / f"{name}.sub").write_text(text)
    proc = pool.run("condor_submit", f"{name}.sub", user=pool.user, cwd=str(pool.shared))
    cluster = re.search(r"submitted to cluster (\d+)", proc.stdout)
    assert cluster, proc.stdout + proc.stderr
    return f"{cluster.group(1)}.0"


def pin(controller, job_id, node, start):
    tag = f"mig-batch:v1;req=40G;place={node}/0/3g.40gb@{start}"
    assert controller.pin_and_release([Pin(job_id, node, tag, None, SLICES_3G)]) == {}


def job_attrs(pool, job_id, *attrs):
    """The owner's view of the job (condor_q -af, one value per attribute)."""
    out = pool.run("condor_q", job_id, "-af:t", *attrs, user=pool.user).stdout.strip("\n")
    # stripped: 23.9's negotiator ends its reasons with a space
    return dict(zip(attrs, (value.strip() for value in out.split("\t")), strict=True))


def usage(pool):
    """Each submitter's weighted resources in use, as condor_userprio's accounting ads say."""
    out = pool.run("condor_userprio", "-l").stdout
    ads = [dict(re.findall(r"^(\w+) = (.*)$", block, re.M)) for block in out.split("\n\n")]
    return {ad["Name"].strip('"'): float(ad["WeightedResourcesUsed"]) for ad in ads if "Name" in ad}


def wait_until(what, probe, done=bool, timeout=60.0):
    """``probe()`` once ``done`` says so of it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if done(value):
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not after {timeout:.0f}s (last: {probe()!r})")


def test_the_owner_cannot_set_the_count_or_dodge_the_limit(pool, controller):
    forged = submit(pool, "forged", extra="hold = True\n+MigBatchSlices = 0\nrequest_MigSlices = 0\n"
                    "concurrency_limits = license_x")  # fmt: skip
    attrs = ("MigBatchSlices", "RequestMigSlices", "ConcurrencyLimits", "MigBatchOwnLimits")  # -af evaluates them
    assert list(job_attrs(pool, forged, *attrs).values()) == ["undefined", "0", "license_x", "license_x"]
    for attr, value in (("MigBatchSlices", "0"), ("RequestMigSlices", "0"), ("ConcurrencyLimits", '"license_x"')):
        refused = pool.run("condor_qedit", forged, attr, value, user=pool.user, check=False)
        assert refused.returncode != 0 and f'Failed to set attribute "{attr}"' in refused.stderr + refused.stdout
    # the owner's own limits stay theirs to change
    assert pool.run("condor_qedit", forged, "MigBatchOwnLimits", '"license_y"', user=pool.user).returncode == 0
    pin(controller, forged, "nodea", 0)
    limits = f"license_y,{accounting.LIMIT}.{pool.user}:{SLICES_3G}"
    assert list(job_attrs(pool, forged, *attrs).values()) == [str(SLICES_3G), str(SLICES_3G), limits, "license_y"]
    controller.cancel(forged)


def test_usage_grows_by_the_slices_held_and_the_cap_keeps_a_second_job_idle_naming_it(pool, controller):
    me = f"{pool.user}@migpool.local"
    for leftover in (j for j in controller.jobs() if not j.finished):
        controller.cancel(leftover.job_id)
    wait_until("no usage left", lambda: usage(pool).get(me, 0.0) == 0.0)
    first, second = submit(pool, "first"), submit(pool, "second")
    try:
        pin(controller, first, "nodea", 4)
        wait_until("the first job runs", lambda: job_attrs(pool, first, "JobStatus")["JobStatus"] == "2")
        # the negotiator charges the partitionable slot's weight (8) at the match, then the dynamic slot's
        # (the job's 4 slices) once the startd has advertised it
        wait_until("usage of the slices held", lambda: usage(pool).get(me) == float(SLICES_3G))
        slot = pool.run("condor_status", "-af", "Name", "MigSlices", "SlotWeight", "RemoteUser").stdout
        assert re.search(rf"^slot1_\d+@migpool {SLICES_3G} {SLICES_3G} {me}$", slot, re.M), slot  # the job's slot

        pin(controller, second, "nodeb", 0)  # room on nodeb, but 4 + 4 slices are over the cap of 6
        reason = f"concurrency limit {accounting.LIMIT}.{pool.user} reached"
        why = wait_until("the second job's reason", lambda: job_attrs(pool, second, "JobStatus", "LastRejMatchReason"),
                         lambda seen: seen["LastRejMatchReason"] == reason)  # fmt: skip
        assert why["JobStatus"] == "1"  # idle: pinned, and waiting for the user's slices
        time.sleep(10)  # two more negotiation cycles: still idle, for the same reason
        assert job_attrs(pool, second, "JobStatus", "LastRejMatchReason") == why
        assert usage(pool)[me] == float(SLICES_3G)

        controller.cancel(first)  # its slices back: the second job runs
        wait_until("the second job runs", lambda: job_attrs(pool, second, "JobStatus")["JobStatus"] == "2")
        wait_until("usage of the second job's slices", lambda: usage(pool).get(me) == float(SLICES_3G))
    finally:
        for job_id in (first, second):
            with contextlib.suppress(BatchError):  # already removed
                controller.cancel(job_id)


def test_an_accounting_groups_use_counts_the_slices_too(pool, controller):
    for leftover in (j for j in controller.jobs() if not j.finished):
        controller.cancel(leftover.job_id)
    member = f"{GROUP}.{pool.user}@migpool.local"  # the submitter: the group and its user
    wait_until("no usage left", lambda: not any(usage(pool).get(name) for name in (GROUP, member)))
    job_id = submit(pool, "grouped", extra=f"accounting_group = {GROUP}")
    try:
        pin(controller, job_id, "nodeb", 0)
        wait_until("the group's use of the slices held",
                   lambda: (usage(pool).get(GROUP), usage(pool).get(member)) == (SLICES_3G, SLICES_3G))  # fmt: skip
        assert job_attrs(pool, job_id, "JobStatus", "AcctGroup") == {"JobStatus": "2", "AcctGroup": GROUP}
    finally:
        controller.cancel(job_id)
