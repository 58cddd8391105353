"""Prompt slots over the in-memory batch system: mig-batchd decides placements ahead per request and
publishes them, job_submit.lua (here FakeBatch.add_bound) binds a new job to one at submission, and the
next pass records the binding; withdrawals, conflicts and restarts. The real job_submit.lua runs in
tests/test_prompt_slots_e2e.py."""

import dataclasses

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import BatchError, JobState
from mig_batch.batch.tags import NodeReport, parse_place, parse_slot
from mig_batch.config import ConfigError, SiteConfig, load_config
from mig_batch.controller import slots as slots_room
from mig_batch.controller.daemon import Controller
from mig_batch.controller.slots import SLOTS_HEADER, slot_key
from mig_batch.slurm.install import job_submit_lua
from mig_batch.state import Store

RIGID = "mig-batch:v1;req=1g.10gb"
BIG = "mig-batch:v1;req=7g.80gb"


@pytest.fixture
def site(tmp_path):
    return SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",), "n2": ("A100-80GB",)},
                      prompt_slots=3, slots_file=tmp_path / "run" / "slots")  # fmt: skip


@pytest.fixture
def batch():
    return FakeBatch(["n1", "n2"], cpus_per_node=16)


def published(site) -> list[list[str]]:
    lines = site.slots_file.read_text().splitlines()
    assert lines[0].startswith(SLOTS_HEADER + " ")
    return [line.split(" ") for line in lines[1:]]


def primed(site, batch):
    """The store and a controller after a pass that placed a first job of RIGID, which made its slots."""
    store = Store(site.state)
    c = Controller(site, store, batch)
    batch.add(RIGID)
    c.step()
    return store, c


def spot(store, job):
    d = store.decision(job)
    return d.node, d.gpu, d.profile, d.start


def test_a_request_asked_for_gets_slots_spread_over_the_nodes_and_published(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    first = batch.add(RIGID)
    c.step()
    assert store.decision(first).state == "released"  # the first job of a request waits held, as before
    slots = store.slots()
    assert len(slots) == 3 and {s.request for s in slots} == {RIGID}
    assert sorted(s.node for s in slots).count("n1") <= 2 and sorted(s.node for s in slots).count("n2") <= 2
    lines = published(site)
    assert [int(line[0]) for line in lines] == [s.id for s in slots]
    assert all(line[1] == RIGID and line[6] == "16" and line[7] == "-" for line in lines)
    for s in slots:  # held in the view: no job is placed there
        gid = c.gid[(s.node, s.gpu)]
        assert c.view.job_gpu[slot_key(s.id)] == gid and c.view.gpus[gid].instances[slot_key(s.id)] == (s.profile,
                                                                                                          s.start)


def test_a_job_bound_to_a_slot_is_recorded_at_its_spot_without_a_pin_and_the_slot_is_made_again(site, batch):
    store, c = primed(site, batch)
    first = store.slots()[0]
    job = batch.add_bound(RIGID, site.slots_file)
    assert parse_slot(batch.job(job).admin_tag) == first.id and batch.job(job).state is JobState.PENDING
    assert c.step().placed == 1
    d = store.decision(job)
    assert d.state == "released" and d.policy == f"slot-{site.policy}" and d.request == RIGID
    assert spot(store, job) == (first.node, first.gpu, first.profile, first.start)
    assert not [call for call in batch.calls if call[0] == "pin" and call[1] == job]
    assert first.id not in {s.id for s in store.slots()} and len(store.slots()) == 3  # made again
    assert slot_key(first.id) not in c.view.job_gpu and job in c.view.job_gpu
    p = parse_place(batch.job(job).admin_tag)
    batch.start(job, NodeReport("made", p.gpu, p.profile, p.start, 1, f"MIG-{job}"))
    c.step()
    assert store.decision(job).state == "running" and store.instance(job).uuid == f"MIG-{job}"
    batch.finish(job)
    c.step()
    assert store.decision(job).state == "ended" and job not in c.view.job_gpu
    assert store.count_decisions(job) == 1


def test_a_bound_job_that_ended_before_the_next_pass_leaves_its_spot_free(site, batch):
    store, c = primed(site, batch)
    job = batch.add_bound(RIGID, site.slots_file)
    batch.finish(job)
    c.step()
    assert store.decision(job).state == "ended" and job not in c.view.job_gpu


def test_a_slot_on_a_node_gone_down_leaves_the_file_and_its_spot_is_freed_after_the_grace(site, batch, monkeypatch):
    store, c = primed(site, batch)
    on_n1 = [s.id for s in store.slots() if s.node == "n1"]
    assert on_n1
    batch.set_node_up("n1", False)
    c.step()
    assert not [line for line in published(site) if line[2] == "n1"]
    withdrawn = {s.id: s for s in store.slots() if s.id in on_n1}
    assert all(s.withdrawn_at is not None for s in withdrawn.values())
    assert all(slot_key(i) in c.view.job_gpu for i in on_n1)  # a job bound from the old file may yet show up
    c.step()  # ... in a listing made up to WITHDRAWN_GRACE_S after the file without the slot
    assert all(slot_key(i) in c.view.job_gpu for i in on_n1)
    monkeypatch.setattr(slots_room, "WITHDRAWN_GRACE_S", -60.0)
    c.step()
    assert not set(on_n1) & {s.id for s in store.slots()}
    assert not [k for k in c.view.job_gpu if k in {slot_key(i) for i in on_n1}]


def test_a_job_bound_to_a_spot_taken_since_is_held_unplaced_and_decided_again(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    placed = batch.add(RIGID)
    c.step()
    node, gpu, profile, start = spot(store, placed)
    # a file from before (a lost store): its slot names the spot mig-batchd has given to another job since
    site.slots_file.write_text(f"{SLOTS_HEADER} 1\n999 {RIGID} {node} {gpu} {profile} {start} 16 -\n")
    job = batch.add_bound(RIGID, site.slots_file)
    assert parse_slot(batch.job(job).admin_tag) == 999
    c.step()
    assert ("hold", job) in batch.calls and batch.job(job).held
    assert parse_place(batch.job(job).admin_tag) is None  # released by its owner, it starts nowhere
    assert store.decision(job).state == "requeued"
    assert [e["kind"] for e in store.events(job=job, kind="view-conflict")] == ["view-conflict"]
    c.step()
    assert store.decision(job).state == "released" and spot(store, job) != (node, gpu, profile, start)


def test_slots_go_while_a_job_waits_for_a_spot_they_hold(site, batch, monkeypatch):
    monkeypatch.setattr(slots_room, "WITHDRAWN_GRACE_S", -60.0)
    store, c = primed(site, batch)
    assert len(store.slots()) == 3 and {s.node for s in store.slots()} == {"n1", "n2"}
    big = batch.add(BIG)  # a whole GPU: both GPUs hold slots or the first job
    assert c.step().waiting == 1
    assert published(site) == []  # withdrawn at once ...
    c.step()  # ... freed once a listing shows no job took them
    assert store.decision(big).state == "released"


def test_a_restart_holds_the_stores_slots_in_the_view(site, batch):
    store, c = primed(site, batch)
    restarted = Controller(site, Store(site.state), batch)
    assert {k: v for k, v in restarted.view.job_gpu.items() if k.startswith("~")} == \
        {k: v for k, v in c.view.job_gpu.items() if k.startswith("~")}  # fmt: skip
    restarted.step()
    assert len(store.slots()) == 3


def test_no_file_without_prompt_slots_and_slots_left_from_before_are_withdrawn(site, batch):
    off = dataclasses.replace(site, prompt_slots=0)
    c = Controller(off, Store(site.state), batch)
    batch.add(RIGID)
    c.step()
    assert not site.slots_file.exists()
    on = Controller(site, Store(site.state), batch)
    batch.add(RIGID)
    on.step()
    assert len(published(site)) == 3
    Controller(off, Store(site.state), batch).step()
    assert published(site) == []


def test_a_job_over_several_instances_or_naming_a_model_asks_for_no_slots(site, batch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    batch.add("mig-batch:v1;req=1g.10gb;n=2")
    batch.add("mig-batch:v1;req=1g.10gb;model=A100-80GB")
    c.step()
    assert store.slots() == []
    batch.add(RIGID)
    c.step()
    assert {s.request for s in store.slots()} == {RIGID}


def test_a_job_bound_from_the_file_before_a_withdrawal_keeps_its_spot_when_it_shows_up_later(
        site, batch, monkeypatch):  # fmt: skip
    site = dataclasses.replace(site, prompt_slots=1)
    store, c = primed(site, batch)
    before = site.slots_file.with_name("before")
    before.write_text(site.slots_file.read_text())  # what job_submit.lua read; the job is created later
    old = {s.id for s in store.slots()}
    with monkeypatch.context() as m:
        m.setattr(slots_room, "SLOT_LIFETIME_S", -1.0)
        c.step()  # every slot withdrawn (and made again): out of the file, the spots still held
    assert old.isdisjoint(int(line[0]) for line in published(site))
    other = batch.add(RIGID)  # a job mig-batchd places within the grace: not on a spot still held
    c.step()
    job = batch.add_bound(RIGID, before)
    assert parse_slot(batch.job(job).admin_tag) in old
    c.step()
    d = store.decision(job)
    assert d.state == "released" and d.policy == f"slot-{site.policy}" and not batch.job(job).held
    assert c.view.job_gpu[job] == c.gid[(d.node, d.gpu)] and not store.events(kind="view-conflict")
    assert spot(store, other) != spot(store, job)


def test_a_bound_job_held_before_the_pass_is_recorded_and_left_held(site, batch):
    store, c = primed(site, batch)
    job = batch.add_bound(RIGID, site.slots_file)
    batch.hold(job)  # its owner (Slurm shows it as an ordinary hold)
    c.step()
    assert store.decision(job).state == "released" and store.decision(job).policy == f"slot-{site.policy}"
    assert batch.job(job).held and not [call for call in batch.calls if call[0] == "pin" and call[1] == job]


def test_a_hold_that_fails_leaves_the_passs_other_bindings_recorded_and_placed(site, batch, monkeypatch):
    store = Store(site.state)
    c = Controller(site, store, batch)
    placed = batch.add(RIGID)
    c.step()
    node, gpu, profile, start = spot(store, placed)
    taken = site.slots_file.with_name("taken")
    taken.write_text(f"{SLOTS_HEADER} 1\n999 {RIGID} {node} {gpu} {profile} {start} 16 -\n")
    clash = batch.add_bound(RIGID, taken)
    fine = batch.add_bound(RIGID, site.slots_file)

    def refused(job):
        raise BatchError(f"Job {job} is not pending")

    monkeypatch.setattr(batch, "hold", refused)
    c.step()
    assert store.decision(clash) is not None and store.decision(fine).state == "released"
    assert fine in c.view.job_gpu and spot(store, placed) == (node, gpu, profile, start)


def test_a_slot_no_job_took_in_its_lifetime_is_made_again_under_a_new_id(site, batch, monkeypatch):
    store, c = primed(site, batch)
    old = {s.id for s in store.slots()}
    monkeypatch.setattr(slots_room, "SLOT_LIFETIME_S", -1.0)
    c.step()
    assert {int(line[0]) for line in published(site)}.isdisjoint(old)


def test_slot_ids_are_never_given_twice_even_by_a_new_store(tmp_path):
    import time

    first = Store(tmp_path / "a.db").add_slots([(RIGID, "n1", 0, "A100-80GB", "1g.10gb", 0)] * 2)
    again = Store(tmp_path / "b.db").add_slots([(RIGID, "n1", 0, "A100-80GB", "1g.10gb", 0)])  # a lost store
    assert first[1].id == first[0].id + 1 and again[0].id > first[1].id >= int(time.time() * 1000) - 60_000


def test_parse_slot():
    assert parse_slot(RIGID) is None
    assert parse_slot(f"{RIGID};place=n1/0/1g.10gb@3;slot=17;node=made:0/1g.10gb@3/1/MIG-x") == 17
    with pytest.raises(ValueError, match="unreadable slot="):
        parse_slot(f"{RIGID};place=n1/0/1g.10gb@3;slot=x")


def test_job_submit_lua_reads_the_slots_file_only_when_given():
    from mig_batch.mig.models import get_model

    models = [get_model("A100-80GB")]
    assert 'local SLOTS_FILE = "/run/mig-batch/slots"' in job_submit_lua(models, slots_file="/run/mig-batch/slots")
    assert "local SLOTS_FILE = nil\n" in job_submit_lua(models)


@pytest.mark.parametrize("settings, why", [
    ("prompt_slots: -1", "prompt_slots must be a whole number"),
    ("prompt_slots: 2.5", "prompt_slots must be a whole number"),
    ("prompt_slots: true", "prompt_slots must be a whole number"),
    ("prompt_slots: 1001", "prompt_slots must be a whole number"),
    ("prompt_slots: 8\nslice_gres: mig_slices", "prompt_slots needs slice_gres off"),
    ("prompt_slots: 8\nbatch_system: htcondor", "prompt_slots is for Slurm"),
])  # fmt: skip
def test_prompt_slots_setting_is_checked(tmp_path, settings, why):
    path = tmp_path / "mig-batch.yaml"
    path.write_text(settings + "\n")
    with pytest.raises(ConfigError, match=why):
        load_config(path)
    path.write_text("prompt_slots: 8\nslots_file: /run/x/slots\n")
    assert load_config(path).prompt_slots == 8 and str(load_config(path).slots_file) == "/run/x/slots"


def test_the_slots_file_and_a_directory_it_makes_are_readable_by_slurmctlds_user(tmp_path):
    import os

    from mig_batch.controller.slots import write_slots_file

    path = tmp_path / "run" / "slots"
    old = os.umask(0o077)  # as mig-batchd's unit runs it
    try:
        write_slots_file(path, f"{SLOTS_HEADER} 1\n")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644 and path.parent.stat().st_mode & 0o777 == 0o755
    assert path.read_text() == f"{SLOTS_HEADER} 1\n" and [p.name for p in path.parent.iterdir()] == ["slots"]


def test_doctor_names_a_job_submit_lua_that_reads_another_slots_file_or_none(tmp_path):
    from mig_batch.cli.ops_commands import check_prompt_slots
    from mig_batch.mig.models import get_model

    etc = tmp_path / "etc"
    etc.mkdir()
    show = f"SLURM_CONF = {etc / 'slurm.conf'}\nJobSubmitPlugins = lua\n"
    lua = etc / "job_submit.lua"
    slots = tmp_path / "run" / "slots"
    on = SiteConfig(prompt_slots=8, slots_file=slots)
    models = [get_model("A100-80GB")]
    lua.write_text(job_submit_lua(models))
    check = check_prompt_slots(show, on)
    assert not check.ok and "reads no slots file" in check.detail and "slurm install" in check.fix
    assert check_prompt_slots(show, SiteConfig()).ok
    lua.write_text(job_submit_lua(models, slots_file=str(slots)))
    assert check_prompt_slots(show, on).ok
    assert not check_prompt_slots(show, SiteConfig()).ok  # off, yet the script binds jobs to the file's slots
    slots.parent.mkdir(mode=0o700)
    slots.parent.chmod(0o700)
    check = check_prompt_slots(show, on)
    assert not check.ok and f"{slots.parent} is mode 700" in check.detail


def test_a_slot_ages_on_the_controllers_clock(tmp_path):
    """A slot's age is judged on the clock the controller runs on (a day ahead of the machine's here): one pass
    later the same slots stand, and once that clock passes their lifetime they are made anew."""
    site = SiteConfig(state=tmp_path / "s.db", nodes={"n1": ("A100-80GB",), "n2": ("A100-80GB",)},
                      prompt_slots=2, slots_file=tmp_path / "run" / "slots")  # fmt: skip
    batch = FakeBatch(["n1", "n2"], cpus_per_node=16)
    now = [batch.clock + 86400]
    store = Store(site.state)
    c = Controller(site, store, batch, clock=lambda: now[0])
    batch.add(RIGID)
    c.step()
    first = {s.id for s in store.slots() if s.withdrawn_at is None}
    now[0] += 1
    c.step()
    assert first and {s.id for s in store.slots() if s.withdrawn_at is None} == first
    now[0] += slots_room.SLOT_LIFETIME_S + 1
    c.step()
    assert not first & {s.id for s in store.slots() if s.withdrawn_at is None}
