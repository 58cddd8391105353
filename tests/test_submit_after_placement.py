"""A Slurm job after its placement (issue 45, point 5): its owner cannot move it off its node, drop its slice's
GRES or change its node and task counts (an operator can); a MIG job asks for one node; a node's reconcile
finds a job by its expanded node list, never the compressed text (``n[1-2]`` names neither n1 nor n2)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import BatchJob, JobState, Pin
from mig_batch.batch.tags import NodeReport, Placed, parse_tag, placed_tag, with_report
from mig_batch.mig.models import get_model
from mig_batch.node.agent import NodeAgent
from mig_batch.node.journal import Journal
from mig_batch.slurm.commands import (
    FIELDS,
    JOB_HEAD,
    REASON_END,
    RECORD_END,
    SlurmError,
    expand_hostlist,
    parse_job_line,
    records,
)
from mig_batch.slurm.install import job_submit_lua

NO_VAL, NO_VAL16 = 4294967294, 65534
NO_VAL64 = float(2**64 - 2)  # as slurmctld hands Lua a uint64: a double
ACCESS_DENIED, INVALID_NODE_COUNT = 2002, 2006  # slurm_errno.h
TAG = "mig-batch:v1;req=1g.10gb"
PLACED = TAG + ";place=n1/0/1g.10gb@0;node=made:0:1g.10gb@0:1:MIG-a"
OWNER, OTHER = 1000, 1001

# What slurmctld 22.05 shows job_modify of an update for what it leaves: counts NO_VAL or NO_VAL16, but
# ntasks_per_board 0 (seen on the real Slurm); text nil
UNSET_COUNTS = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL, "ntasks_per_node": NO_VAL16,
                "ntasks_per_socket": NO_VAL16, "ntasks_per_core": NO_VAL16, "ntasks_per_board": 0,
                "ntasks_per_tres": NO_VAL16, "priority": NO_VAL, "nice": NO_VAL, "min_cpus": NO_VAL,
                "cpus_per_task": NO_VAL16, "pn_min_cpus": NO_VAL16, "pn_min_memory": NO_VAL64,
                "pn_min_tmp_disk": NO_VAL, "shared": NO_VAL16, "contiguous": NO_VAL16}  # fmt: skip
# each field a placement depends on, with a change of it: scontrol's NodeList, ExcNodeList, Features, ...
PLACEMENT_CHANGES = {"req_nodes": "n2", "exc_nodes": "n1", "features": "A100-40GB", "prefer": "A100-40GB",
                     "batch_features": "x", "partition": "other", "reservation": "r1", "gres": "",
                     "tres_per_node": "", "tres_per_job": "gres/gpu:1", "tres_per_socket": "gres/gpu:1",
                     "tres_per_task": "cpu:2", "cpus_per_tres": "gres/gpu:2", "mem_per_tres": "gres/gpu:100",
                     "min_nodes": 2, "max_nodes": 1, "num_tasks": 4, "ntasks_per_node": 4, "ntasks_per_socket": 2,
                     "ntasks_per_core": 1, "ntasks_per_board": 1, "ntasks_per_tres": 1, "min_cpus": 64,
                     "cpus_per_task": 8, "pn_min_cpus": 32, "pn_min_memory": 500_000, "pn_min_tmp_disk": 10**6,
                     "shared": 0, "contiguous": 1}  # fmt: skip
OTHER_CHANGES = {"time_limit": 30, "begin_time": 2_000_000_000, "comment": "mine", "name": "renamed"}


def _runtime(lupa, path: Path | None = None):
    """slurmctld's lua with the generated script: from ``path`` (as Slurm loads it: its folder known) or as text."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.execute("slurm = { SUCCESS = 0, ERROR = -1, log_info = function(f, ...) INFO = string.format(f, ...) end, "
                "log_user = function(f, ...) LOGGED = string.format(f, ...) end }")
    source = job_submit_lua([get_model("A100-80GB")], {"n1": ["A100-80GB"], "n2": ["A100-80GB"]}, False)
    if path is None:
        lua.execute(source)
    else:
        path.write_text(source)
        lua.globals().dofile(str(path))
    return lua


def _modify(lua, tag: str, uid: int, /, **changes) -> int:
    """slurm_job_modify of job 7 (tagged ``tag``: held unless placed) by ``uid``, the update ``changes``."""
    job_desc = lua.table_from({**UNSET_COUNTS, **changes})
    job_rec = lua.table_from({"admin_comment": tag, "priority": 1 if ";place=" in tag else 0, "job_id": 7})
    return lua.globals().slurm_job_modify(job_desc, job_rec, None, uid)


@pytest.fixture
def lua():
    return _runtime(pytest.importorskip("lupa"))


@pytest.mark.parametrize("field", sorted(PLACEMENT_CHANGES))
def test_the_owner_cannot_change_a_placement_field_of_a_placed_job_and_root_can(lua, field):
    change = {field: PLACEMENT_CHANGES[field]}
    assert _modify(lua, PLACED, OWNER, **change) == ACCESS_DENIED
    assert f"refused a change of {field} of placed job 7 by uid {OWNER}" in lua.globals().INFO
    assert _modify(lua, PLACED, 0, **change) == 0  # an operator's change passes as it is
    # with mig-batchd's own tag in the same update: still only root's (Slurm lets no owner set AdminComment)
    assert _modify(lua, PLACED, OWNER, admin_comment=PLACED, **change) == ACCESS_DENIED


@pytest.mark.parametrize("field", sorted(OTHER_CHANGES))
def test_the_owner_still_changes_what_a_placement_does_not_depend_on(lua, field):
    assert _modify(lua, PLACED, OWNER, **{field: OTHER_CHANGES[field]}) == 0


def test_mig_batchds_updates_pass(lua):
    """Root's pin (node list, tag with the placement, slice GRES), its requeue's tag without one and hold, and
    the node's report in the tag."""
    assert _modify(lua, TAG, 0, req_nodes="n1", admin_comment=PLACED, tres_per_node="gres/mig_slices:1") == 0
    assert _modify(lua, PLACED, 0, admin_comment=TAG) == 0
    assert _modify(lua, PLACED, 0, priority=0) == 0
    assert _modify(lua, PLACED, 0, admin_comment=PLACED + ";x") == 0


def test_an_unplaced_job_changes_freely_but_never_to_several_nodes(lua):
    assert _modify(lua, TAG, OWNER, partition="other", exc_nodes="n2", num_tasks=2) == 0
    for counts in ({"min_nodes": 2}, {"max_nodes": 2}, {"min_nodes": 1, "max_nodes": 3}):
        assert _modify(lua, TAG, OWNER, **counts) == INVALID_NODE_COUNT, counts
        assert _modify(lua, TAG, 0, **counts) == 0
    assert _modify(lua, TAG, OWNER, min_nodes=1, max_nodes=1) == 0
    assert _modify(lua, "", OWNER, min_nodes=4, req_nodes="n2") == 0  # not a MIG job: not this script's


def test_slurm_user_is_an_operator_as_root_is(tmp_path):
    """Slurm's lua is told no SlurmUser: the script reads it from the slurm.conf beside it."""
    lupa = pytest.importorskip("lupa")
    nobody = pwd.getpwnam("nobody").pw_uid
    (tmp_path / "slurm.conf").write_text("ClusterName=c\n  slurmuser = nobody  # the daemons' user\n")
    lua = _runtime(lupa, tmp_path / "job_submit.lua")
    assert _modify(lua, PLACED, nobody, exc_nodes="n1") == 0
    assert _modify(lua, PLACED, 0, exc_nodes="n1") == 0
    assert _modify(lua, PLACED, OWNER, exc_nodes="n1") == ACCESS_DENIED
    (tmp_path / "slurm.conf").write_text(f"SlurmUser={OTHER}\n")  # a number names the uid
    lua = _runtime(lupa, tmp_path / "job_submit.lua")
    assert _modify(lua, PLACED, OTHER, exc_nodes="n1") == 0
    assert _modify(lua, PLACED, nobody, exc_nodes="n1") == ACCESS_DENIED


def _submit(lua, **fields) -> tuple[int, object]:
    job = lua.table_from({"tres_per_node": "gres/mig:1g.10gb", "ntasks_per_node": NO_VAL16, "num_tasks": 1,
                          "min_nodes": NO_VAL, **fields})  # fmt: skip
    return lua.globals().slurm_job_submit(job, None, OWNER), job


@pytest.mark.parametrize("nodes", [(2, 2), (1, 2), (3, NO_VAL)], ids=["-N2", "-N1-2", "min3"])
@pytest.mark.parametrize("tres", ["gres/mig:1g.10gb", "gres/mig:1g.10gb:2"])
def test_a_mig_job_on_several_nodes_is_refused_at_submission(lua, nodes, tres):
    rc, _ = _submit(lua, tres_per_node=tres, min_nodes=nodes[0], max_nodes=nodes[1])
    assert rc == -1
    assert f"on {max(n for n in nodes if n != NO_VAL)} nodes: a MIG job runs on one node" in lua.globals().LOGGED


def test_a_mig_job_on_one_node_is_accepted_and_kept_on_one(lua):
    for fields in ({}, {"min_nodes": 1, "max_nodes": 1}, {"max_nodes": NO_VAL}):
        rc, job = _submit(lua, **fields)
        assert rc == 0 and job.max_nodes == 1 and job.admin_comment == TAG, fields


# --- host lists -------------------------------------------------------------------------------------------


def test_slurms_host_lists_expand_to_their_nodes():
    assert expand_hostlist("n[1-2]") == ("n1", "n2")
    assert expand_hostlist("gpu[01-03,07]") == ("gpu01", "gpu02", "gpu03", "gpu07")
    assert expand_hostlist("a1,b[2-3]") == ("a1", "b2", "b3")
    assert expand_hostlist("n[8-10],r[1-2]n[01-02]") == ("n8", "n9", "n10", "r1n01", "r1n02", "r2n01", "r2n02")
    assert expand_hostlist("n1") == ("n1",)
    assert expand_hostlist("") == expand_hostlist("(null)") == expand_hostlist("None assigned") == ()
    for bad in ("n[", "n]", "n[]", "n[2-1]", "n[[1]]", "a,,b", "n[x]", "n[0-99999999]", "a[0-999]b[0-999]"):
        with pytest.raises(SlurmError):
            expand_hostlist(bad)


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm's scontrol is not installed")
def test_host_lists_expand_as_slurms_own_scontrol_does(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p Nodes=n1\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for text in ("n[1-2]", "gpu[01-03,07]", "a1,b[2-3]", "n[098-100],n[8-10]", "r[1-2]n[01-02]", "x-1,y[7,09-11]"):
        shown = subprocess.run(["scontrol", "show", "hostnames", text], env=env, capture_output=True, text=True,
                               timeout=10, check=True).stdout.split()  # fmt: skip
        assert list(expand_hostlist(text)) == shown, text


_RANGE = st.tuples(st.integers(0, 120), st.integers(0, 12), st.integers(1, 4))  # first, length, width
_NAME = st.tuples(st.from_regex(r"[a-z][a-z0-9_-]{0,4}[a-z_-]", fullmatch=True),
                  st.lists(st.lists(_RANGE, min_size=1, max_size=3), max_size=2))  # fmt: skip


def _brute_force(names) -> tuple[str, list[str]]:
    """The compressed text of ``names`` (a prefix and up to two brackets of ranges each) and every node it
    names, by enumerating the numbers each bracket stands for."""
    pieces, hosts = [], []
    for prefix, brackets in names:
        text, expanded = prefix, [prefix]
        for ranges in brackets:
            numbers = [f"{n:0{w}d}" for first, length, w in ranges for n in range(first, first + length + 1)]
            text += "[" + ",".join(f"{f:0{w}d}-{f + n:0{len(f'{f:0{w}d}')}d}" for f, n, w in ranges) + "]"
            expanded = [e + n for e in expanded for n in numbers]
        pieces.append(text)
        hosts.extend(expanded)
    return ",".join(pieces), hosts


@given(st.lists(_NAME, min_size=1, max_size=4))
def test_expanding_a_host_list_names_every_node_it_stands_for_in_order(names):
    text, hosts = _brute_force(names)
    assert expand_hostlist(text) == tuple(hosts), text


# --- the reconcile ------------------------------------------------------------------------------------------


def _squeue_record(job: BatchJob, nodelist: str) -> str:
    """``job`` as squeue prints it (FORMAT), running on ``nodelist``."""
    values = {"JobID": job.job_id, "ArrayJobID": job.job_id, "ArrayTaskID": "N/A", "State": "RUNNING",
              "PriorityLong": "1", "UserID": str(job.user_id), "NodeList": nodelist, "SubmitTime": "1",
              "StartTime": "2", "EndTime": "3", "TimeLimit": "1:00:00", "exit_code": "0", "Reason": "None",
              "NumCPUs": "1", "Partition": "gpu", "EligibleTime": "1", "Dependency": "(null)",
              "admin_comment": job.admin_tag}  # fmt: skip
    text = ""
    for field in FIELDS:
        end = {"Reason": REASON_END, "admin_comment": RECORD_END}.get(field, "|")
        text += values[field] + end
    (record,) = records(text + "\n", JOB_HEAD)  # as the adapter splits squeue's output
    return record


class SlurmShown:
    """The in-memory batch system's jobs as Slurm's adapter reads them: each running job on ``nodelist``."""

    def __init__(self, batch: FakeBatch, nodelist: str) -> None:
        self.batch, self.nodelist = batch, nodelist

    def __getattr__(self, name: str):
        return getattr(self.batch, name)

    def _shown(self, job: BatchJob | None) -> BatchJob | None:
        if job is None or not job.running:
            return job
        return parse_job_line(_squeue_record(job, self.nodelist))

    def jobs(self) -> list[BatchJob]:
        return [self._shown(j) for j in self.batch.jobs()]

    def jobs_named(self, jobs):
        return {job: self._shown(j) for job, j in self.batch.jobs_named(jobs).items()}

    def job(self, job: str) -> BatchJob | None:
        return self._shown(self.batch.job(job))


@pytest.mark.parametrize("nodelist", ["n[1-2]", "n[0-1]", "m7,n1"])
@pytest.mark.parametrize("listing", [False, True], ids=["asked", "listed"])
def test_the_reconcile_keeps_the_instance_of_a_job_whose_node_list_includes_its_node(
        tmp_path, nvml_emu_creator, nodelist, listing):  # fmt: skip
    """``listing``: a foreign instance on the node makes the reconcile list every job (and destroy that one)."""
    gpus, _ = nvml_emu_creator(["A100-80GB"], node="n1")
    batch = FakeBatch(["n1", "n2"])
    job = batch.add(TAG)
    batch.pin_and_release([_pin(job)])
    batch.start(job)
    agent = NodeAgent("n1", gpus, Journal(tmp_path / "journal"), SlurmShown(batch, nodelist), tmp_path / "jobs")
    agent.prolog(job)
    (mine,) = gpus.instances(0)
    if listing:
        gpus.create(0, "1g.10gb", 6)
    strays = agent.reconcile()
    assert [i.uuid for i in gpus.instances(0)] == [mine.uuid], strays
    assert len(strays) == int(listing)
    batch.finish(job)  # and once it ended, its instance is a stray
    assert len(agent.reconcile()) == 1 and gpus.instances(0) == []


def _pin(job: str) -> Pin:
    return Pin(job, "n1", placed_tag(parse_tag(TAG), Placed("n1", 0, "1g.10gb", 0)))


def test_a_job_on_several_nodes_holds_each_and_its_first_is_its_node():
    job = parse_job_line(_squeue_record(BatchJob("5", JobState.RUNNING, with_report(PLACED, NodeReport(
        "made", 0, "1g.10gb", 0, 1, "MIG-a")), user_id=OWNER), "gpu[01-02]"))  # fmt: skip
    assert job.node == "gpu01" and job.nodes == ("gpu01", "gpu02")
    assert job.on("gpu01") and job.on("gpu02") and not job.on("gpu[01-02]") and not job.on("gpu03")
    assert BatchJob("6", JobState.RUNNING, "", node="c1").on("c1")  # a batch system that lists no nodes


# --- on the real local Slurm ------------------------------------------------------------------------------


@pytest.mark.slow
def test_on_slurm_the_owner_cannot_move_a_placed_job_root_can_and_two_nodes_are_refused():
    """slurmctld runs the generated script: the owner (``nobody``) gets Slurm's "Access/permission denied" for
    ExcNodeList, NumNodes and Gres of a placed, pending job and may still change its comment; root's
    ExcNodeList passes; ``sbatch -N 2`` of a MIG job is refused with its reason."""
    from harness.slurm_cluster import LocalCluster

    if LocalCluster.available() is not None:
        pytest.skip(str(LocalCluster.available()))
    if os.geteuid() != 0:
        pytest.skip("runs slurmctld and acts as another user: needs root")
    # the testbed (its TaskProlog runs as the user) and the user's folder outside pytest's folders, whose root
    # another pytest run makes 0700 again at any time
    root = Path(tempfile.mkdtemp(prefix="mig-batch-bed-"))
    root.chmod(0o711)
    try:
        _owner_and_root_on_slurm(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _owner_and_root_on_slurm(root: Path) -> None:
    from harness.slurm_cluster import MigTestbed

    with MigTestbed(root / "bed") as bed:
        shared = Path(tempfile.mkdtemp(prefix="mig-batch-user-"))
        shared.chmod(0o1777)
        for folder in bed.cluster.conf.parents:  # slurm.conf: what the user's commands read
            if folder.is_relative_to(tempfile.gettempdir()):
                folder.chmod(folder.stat().st_mode | 0o001)
        bed.cluster.conf.chmod(0o644)

        def as_nobody(*argv: str) -> subprocess.CompletedProcess:
            return bed.cluster.run("setpriv", f"--reuid={pwd.getpwnam('nobody').pw_uid}", "--regid=65534",
                                   "--clear-groups", "--", *argv, check=False, timeout=15)  # fmt: skip

        def sbatch(*args: str) -> subprocess.CompletedProcess:
            return as_nobody("sbatch", "--parsable", f"--chdir={shared}", f"--output={shared}/%j.out", *args)

        waits = [sbatch("--wrap", "sleep 40") for _ in range(2)]  # no MIG: they start at once
        assert all(w.returncode == 0 for w in waits), [w.stderr for w in waits]
        waits = [w.stdout.strip() for w in waits]
        # placed at once (Slurm judges "?"), pending until one of them ends
        job = sbatch("--gres=mig:1g.10gb", f"--dependency=afterany:{waits[0]}?afterany:{waits[1]}", "--wrap", "true")
        assert job.returncode == 0, job.stderr
        job = job.stdout.strip()
        deadline = time.monotonic() + 30
        while ";place=" not in (tag := bed.cluster.run("squeue", "-h", "-j", job, "-O", "admin_comment:1000").stdout):
            assert time.monotonic() < deadline, (bed.cluster.run("scontrol", "show", "job").stdout,
                                                 [p.read_text() for p in shared.iterdir()])  # fmt: skip
            time.sleep(0.2)
        node = tag.split(";place=")[1].split("/")[0]
        for change in (f"ExcNodeList={node}", "NumNodes=2", "Gres=", "Partition=gpu", f"NodeList={node}"):
            refused = as_nobody("scontrol", "update", f"jobid={job}", change)
            assert refused.returncode != 0 and "Access/permission denied" in refused.stderr, (change, refused.stderr)
        allowed = as_nobody("scontrol", "update", f"jobid={job}", "Comment=mine")
        assert allowed.returncode == 0, allowed.stderr
        other = next(n for n in bed.nodes if n != node)
        by_root = bed.cluster.run("scontrol", "update", f"jobid={job}", f"ExcNodeList={other}", check=False)
        assert by_root.returncode == 0, by_root.stderr
        shown = bed.cluster.run("scontrol", "show", "job", job).stdout
        assert f"ExcNodeList={other}" in shown and "Comment=mine" in shown, shown
        two = sbatch("-N", "2", "--gres=mig:1g.10gb", "--wrap", "true")
        assert two.returncode != 0 and "a MIG job runs on one node" in two.stderr, two.stderr
        bed.cluster.run("scancel", job, *waits)
        shutil.rmtree(shared, ignore_errors=True)
