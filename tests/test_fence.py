"""Each job fenced to its own MIG instance: the node agent over NVML on the emulated libnvidia-ml, whose
instances come with the driver's capability files, and processes of ordinary users (``setpriv``) that
open the capability device nodes as CUDA would (the emulated node's ``cuda-open``)."""

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import Pin
from mig_batch.batch.tags import Placed, parse_report, parse_tag, placed_tag
from mig_batch.gpu import nvml_emu
from mig_batch.node.agent import NO_DEVICE, NodeAgent
from mig_batch.node.fence import CapabilityFence, FenceError
from mig_batch.node.journal import Journal

ALICE, BOB = 64101, 64102  # ordinary users (no passwd entry needed: setpriv takes numbers)
TAG = "mig-batch:v1;req=1g.10gb"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="device nodes and other users' processes need root and setpriv")


@pytest.fixture
def node(nvml_emu_library, monkeypatch):
    """An emulated node with two A100-40GB in a directory every user may enter (as /dev and /proc are)."""
    from mig_batch.gpu.nvml import NvmlNode

    directory = Path(tempfile.mkdtemp(prefix="mig-batch-fence-"))
    os.chmod(directory, 0o755)
    nvml_emu.make_node(directory, "n1", ["A100-40GB", "A100-40GB"])
    shutil.copy(nvml_emu.CUDA_OPEN, directory / "cuda-open")
    monkeypatch.setenv(nvml_emu.NODE_ENV, str(directory))
    backend = NvmlNode()
    yield backend, directory
    backend.close()
    shutil.rmtree(directory, ignore_errors=True)


def fence_of(directory: Path) -> CapabilityFence:
    return CapabilityFence(directory / "capabilities", directory / "nvidia-caps", directory / "devices")


def make_agent(directory: Path, backend, batch: FakeBatch, journal_dir: Path) -> NodeAgent:
    return NodeAgent("n1", backend, Journal(journal_dir), batch, journal_dir.parent / "jobs", fence=fence_of(directory))


def decide(batch, gpu, profile, start, uid, request=TAG, spots=None):
    job = batch.add(request, user_id=uid)
    place = Placed("n1", gpu, profile, start) if spots is None else spots
    batch.pin_and_release([Pin(job, "n1", placed_tag(parse_tag(request), place))])
    batch.start(job)
    return job


def cuda_open(directory: Path, uid: int, uuids: str) -> tuple[int, str]:
    """What a process of ``uid`` gets opening the MIG devices ``uuids`` as CUDA would."""
    env = {"PATH": "/usr/bin:/bin", nvml_emu.NODE_ENV: str(directory), "CUDA_VISIBLE_DEVICES": uuids}
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", str(directory / "cuda-open")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    return done.returncode, done.stdout + done.stderr


def uuid_of(batch, job):
    return parse_report(batch.job(job).admin_tag).uuid


def test_each_users_job_opens_its_own_instance_and_not_the_others_whatever_cuda_visible_devices_says(node, tmp_path):
    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    alice_job, bob_job = decide(batch, 0, "1g.10gb", 0, ALICE), decide(batch, 0, "1g.10gb", 1, BOB)
    agent.prolog(alice_job)
    agent.prolog(bob_job)
    alice, bob = uuid_of(batch, alice_job), uuid_of(batch, bob_job)
    assert cuda_open(directory, ALICE, alice) == (0, f"opened {alice} gpu0/mig/gi1\nopened {alice} gpu0/mig/gi1/ci0\n")
    code, out = cuda_open(directory, ALICE, bob)  # Alice points CUDA at Bob's instance
    assert code == 1 and out.count("Permission denied") == 2, out
    assert cuda_open(directory, BOB, bob)[0] == 0
    assert cuda_open(directory, BOB, alice)[0] == 1
    assert cuda_open(directory, 0, alice)[0] == 0  # root still may (monitoring, the agent)


def test_the_next_job_on_a_slice_gets_it_and_the_ended_jobs_user_has_nothing_left(node, tmp_path):
    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    first = decide(batch, 1, "3g.20gb", 4, ALICE)
    agent.prolog(first)
    minors = fence_of(directory).minors(1, parse_report(batch.job(first).admin_tag).gi_id)
    agent.epilog(first)
    for minor in minors:  # back to root before the instance went
        info = os.lstat(directory / "nvidia-caps" / f"nvidia-cap{minor}")
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o400)
    second = decide(batch, 1, "3g.20gb", 4, BOB)
    agent.prolog(second)
    uuid = uuid_of(batch, second)
    assert cuda_open(directory, BOB, uuid)[0] == 0
    assert cuda_open(directory, ALICE, uuid)[0] == 1


def test_a_multi_instance_jobs_ranks_reach_all_their_instances_and_only_theirs(node, tmp_path):
    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    other = decide(batch, 0, "1g.10gb", 2, BOB)
    agent.prolog(other)
    spots = ((0, "1g.10gb", 0), (1, "1g.10gb", 0))
    job = decide(batch, 0, "1g.10gb", 0, ALICE, request="mig-batch:v1;req=1g.10gb;n=2",
                 spots=Placed("n1", 0, "1g.10gb", 0, spots=spots))  # fmt: skip
    result = agent.prolog(job)
    [listed] = [line.split("=", 1)[1] for line in result.exports if line.startswith("export MIG_BATCH_INSTANCES=")]
    ranks = listed.split(",")
    assert len(ranks) == 2
    for uuid in ranks:  # one process per rank, each on its own instance
        assert cuda_open(directory, ALICE, uuid)[0] == 0
        assert cuda_open(directory, BOB, uuid)[0] == 1
    assert cuda_open(directory, ALICE, listed)[0] == 0  # or one process opening both
    assert cuda_open(directory, ALICE, uuid_of(batch, other))[0] == 1


def test_a_restarted_agent_sets_every_node_back_to_the_journals_holder(node, tmp_path):
    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    job = decide(batch, 0, "2g.10gb", 0, ALICE)
    agent.prolog(job)
    fence = fence_of(directory)
    gi = parse_report(batch.job(job).admin_tag).gi_id
    [gi_minor, ci_minor] = fence.minors(0, gi)
    caps = directory / "nvidia-caps"
    # while the agent was down: nvidia-modprobe (or an operator) made the job's node anew, world-readable,
    # and a node of an instance nobody holds was left to a user
    os.unlink(caps / f"nvidia-cap{ci_minor}")
    os.mknod(caps / f"nvidia-cap{ci_minor}", stat.S_IFCHR | 0o444, os.makedev(nvml_emu.CAPS_MAJOR, ci_minor))
    os.mknod(caps / "nvidia-cap400", stat.S_IFCHR | 0o444, os.makedev(nvml_emu.CAPS_MAJOR, 400))
    os.chown(caps / "nvidia-cap400", BOB, BOB)
    assert cuda_open(directory, BOB, uuid_of(batch, job))[0] == 1  # the GPU instance's node still fences it
    restarted = make_agent(directory, backend, batch, tmp_path / "journal")
    changed = restarted.refence()
    assert len(changed) == 2, changed
    for minor, uid in ((gi_minor, ALICE), (ci_minor, ALICE), (400, 0)):
        info = os.lstat(caps / f"nvidia-cap{minor}")
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (uid, 0o400), minor
    assert cuda_open(directory, ALICE, uuid_of(batch, job))[0] == 0
    assert restarted.refence() == []  # nothing left to change


def test_a_symlink_a_user_put_in_place_of_a_node_is_replaced_not_followed(node, tmp_path):
    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o600)
    job = decide(batch, 0, "1g.10gb", 0, ALICE)
    # the minor the next instance will get (gi 1 on GPU 0), pointed at a root file beforehand
    (directory / "nvidia-caps" / "nvidia-cap12").symlink_to(victim)
    agent.prolog(job)
    assert stat.S_ISCHR(os.lstat(directory / "nvidia-caps" / "nvidia-cap12").st_mode)
    info = os.stat(victim)
    assert (info.st_uid, stat.S_IMODE(info.st_mode), victim.read_text()) == (0, 0o600, "root's\n")


def test_a_job_that_cannot_be_fenced_does_not_run_and_its_instance_is_destroyed(node, tmp_path):
    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    os.chmod(directory / "nvidia-caps", 0o777)  # a directory any user could put nodes in
    job = decide(batch, 0, "1g.10gb", 0, ALICE)
    result = agent.prolog(job)
    assert result.exports == [f"export CUDA_VISIBLE_DEVICES={NO_DEVICE}"]
    assert result.report.kind == "requeue" and "writable by root only" in result.report.reason
    assert backend.instances(0) == [] and Journal(tmp_path / "journal").entries() == []
    with pytest.raises(FenceError, match="unknown"):
        fence_of(directory).grant(0, 1, -1)


def test_doctor_says_whether_the_fence_can_work_on_the_node(node):
    from mig_batch.cli.ops_commands import check_fence
    from mig_batch.config import FenceConfig, SiteConfig

    _backend, directory = node
    fenced = SiteConfig(fence=FenceConfig("capabilities", str(directory / "capabilities"),
                                          str(directory / "nvidia-caps"), str(directory / "devices")))  # fmt: skip
    assert check_fence(fenced, "n1").ok
    os.chmod(directory / "nvidia-caps", 0o775)
    found = check_fence(fenced, "n1")
    assert not found.ok and "writable by root only" in found.detail and "NVreg_ModifyDeviceFiles=0" in found.fix
    os.chmod(directory / "nvidia-caps", 0o755)
    (directory / "devices").write_text("Character devices:\n  1 mem\n")
    assert "nvidia-caps" in check_fence(fenced, "n1").detail
    off = check_fence(SiteConfig(fence=FenceConfig("off")), "n1")
    assert off.ok and "every local user" in off.detail


def test_an_entry_whose_instance_went_behind_the_agents_back_gives_the_id_to_nobody(node, tmp_path):
    """An old entry for a GPU instance id made again for another job never hands that job's nodes back."""
    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    for _ in range(8):
        batch.add(TAG)  # Alice's job 9 and Bob's 10: the old entry comes last in the journal's order of jobs
    alice_job = decide(batch, 0, "1g.10gb", 0, ALICE)
    agent.prolog(alice_job)
    gone = parse_report(batch.job(alice_job).admin_tag)
    backend.destroy(0, gone.gi_id, gone.uuid)  # an operator's nvidia-smi, a GPU reset: the entry stays
    bob_job = decide(batch, 0, "1g.10gb", 0, BOB)
    agent.prolog(bob_job)
    bob = parse_report(batch.job(bob_job).admin_tag)
    assert bob.gi_id == gone.gi_id  # the driver gave the id again
    agent.refence()
    agent.reconcile()  # Alice's job still runs: its entry stays, naming nothing
    assert cuda_open(directory, BOB, bob.uuid)[0] == 0
    assert cuda_open(directory, ALICE, bob.uuid)[0] == 1


@pytest.mark.parametrize("restarted", [False, True])
def test_a_process_still_holding_an_earlier_jobs_node_is_killed_before_the_next_job_gets_the_slice(node, tmp_path,
                                                                                                  restarted):
    """The driver checks a descriptor's minor only, and the next instance on the slice gets the same minor.
    ``restarted``: the agent that grants it next does not know who held it last."""
    import signal
    import time

    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    first = decide(batch, 1, "1g.10gb", 6, ALICE)
    agent.prolog(first)
    [minor, _] = fence_of(directory).minors(1, parse_report(batch.job(first).admin_tag).gi_id)
    node_path = directory / "nvidia-caps" / f"nvidia-cap{minor}"
    read, write = os.pipe()
    keeper = os.fork()
    if keeper == 0:  # one of Alice's processes, opened the node during her job and kept it (O_PATH: no driver here)
        try:
            held = os.open(node_path, os.O_PATH)
            os.setresgid(ALICE, ALICE, ALICE)
            os.setresuid(ALICE, ALICE, ALICE)
            os.write(write, b"x")
            time.sleep(60)
            os.close(held)
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"x"
    try:
        assert fence_of(directory).holders_of([minor]) == {keeper: ALICE}
        agent.epilog(first)
        if restarted:
            agent = make_agent(directory, backend, batch, tmp_path / "journal")
        second = decide(batch, 1, "1g.10gb", 6, BOB)
        agent.prolog(second)
        assert fence_of(directory).minors(1, parse_report(batch.job(second).admin_tag).gi_id)[0] == minor
        _, status = os.waitpid(keeper, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(keeper, signal.SIGKILL)
            os.waitpid(keeper, 0)


def test_an_instance_journaled_before_the_fence_keeps_its_job_and_goes_to_its_owner(node, tmp_path):
    """An upgrade with jobs running: their entries name no owner; nothing is taken from them, and the
    reconcile gives their nodes to the owner the batch system names."""
    from dataclasses import replace

    backend, directory = node
    batch = FakeBatch(["n1"])
    old = NodeAgent("n1", backend, Journal(tmp_path / "journal"), batch, tmp_path / "jobs")  # no fence
    job = decide(batch, 0, "2g.10gb", 0, ALICE)
    old.prolog(job)
    journal = Journal(tmp_path / "journal")
    journal.add(replace(journal.get(job), uid=-1))  # as an earlier release journaled it
    uuid = uuid_of(batch, job)
    fence = fence_of(directory)
    for minor in fence.minors(0, parse_report(batch.job(job).admin_tag).gi_id):  # as nvidia-modprobe makes them
        os.mknod(directory / "nvidia-caps" / f"nvidia-cap{minor}", stat.S_IFCHR | 0o444,
                 os.makedev(nvml_emu.CAPS_MAJOR, minor))  # fmt: skip
    upgraded = make_agent(directory, backend, batch, tmp_path / "journal")
    upgraded.refence()
    assert cuda_open(directory, ALICE, uuid)[0] == 0  # not taken from the running job
    upgraded.reconcile()
    assert Journal(tmp_path / "journal").get(job).uid == ALICE
    assert cuda_open(directory, ALICE, uuid)[0] == 0
    assert cuda_open(directory, BOB, uuid)[0] == 1


def test_an_instance_its_epilog_could_not_destroy_stays_taken_back(node, tmp_path):
    backend, directory = node
    batch = FakeBatch(["n1"])
    agent = make_agent(directory, backend, batch, tmp_path / "journal")
    job = decide(batch, 0, "1g.10gb", 3, ALICE)
    agent.prolog(job)
    uuid = uuid_of(batch, job)
    nvml_emu.attach(directory, uuid, os.getpid())  # a process still on it: NVML refuses to destroy
    assert "still in use" in agent.epilog(job, attempts=1, pause_s=0)
    agent.refence()
    assert cuda_open(directory, ALICE, uuid)[0] == 1


def test_processes_are_looked_through_only_where_another_user_may_hold_the_node(node, tmp_path, monkeypatch):
    """The scan costs ms on a busy node: a fresh node, or one its last holder gets again, needs none."""
    backend, directory = node
    fence = fence_of(directory)
    scans = []
    monkeypatch.setattr(fence, "holders_of", lambda minors, but=(): scans.append(but) or {})
    inst = backend.create(0, "1g.10gb", 0)
    fence.grant(0, inst.gi_id, ALICE)  # never made before: nobody could have opened it
    fence.revoke(0, inst.gi_id)
    fence.grant(0, inst.gi_id, ALICE)  # her own again
    assert scans == []
    fence.revoke(0, inst.gi_id)
    fence.grant(0, inst.gi_id, BOB)
    assert scans == [(0, BOB)]
    restarted = fence_of(directory)  # knows no last holder: the node was there to open
    monkeypatch.setattr(restarted, "holders_of", lambda minors, but=(): scans.append(but) or {})
    restarted.grant(0, inst.gi_id, BOB)
    assert scans == [(0, BOB), (0, BOB)]
