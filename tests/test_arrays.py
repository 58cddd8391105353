"""MIG job arrays in the controller, over the in-memory batch system: a record of several pending tasks is
never pinned; its tasks are split off within the array's limit and then placed one by one, each on its own
instance; the last task is placed in the array's own record."""

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import JobState
from mig_batch.batch.tags import NodeReport, parse_place
from mig_batch.config import SiteConfig
from mig_batch.controller.arrays import SPLIT_AHEAD
from mig_batch.controller.daemon import Controller
from mig_batch.state import Store

RIGID = "mig-batch:v1;req=1g.10gb"
BIG = "mig-batch:v1;req=7g.80gb"


def controller(tmp_path, nodes=("n1", "n2")):
    site = SiteConfig(state=tmp_path / "state.db", nodes={n: ("A100-80GB",) for n in nodes})
    batch = FakeBatch(list(nodes))
    return Controller(site, Store(site.state), batch), batch


def array(batch, tag, tasks, limit=0):
    return batch.add(tag, job_id="100", array="100", array_tasks=(range(1, tasks + 1),), array_limit=limit)


def tasks_of(batch, array_id="100"):
    return {j.job_id: j for j in batch.jobs() if j.array == array_id}


def spot(job):
    p = parse_place(job.admin_tag)
    return p.node, p.gpu, p.profile, p.start


def run_released(batch):
    """Slurm starts what was released; the node made the instance where decided."""
    for j in batch.jobs():
        if j.state is JobState.PENDING:
            p = parse_place(j.admin_tag)
            batch.start(j.job_id, NodeReport("made", p.gpu, p.profile, p.start, 1, f"MIG-{j.job_id}"))


def test_an_array_record_is_never_pinned_and_its_tasks_run_each_on_its_own_instance(tmp_path):
    c, batch = controller(tmp_path)
    array(batch, RIGID, 10)
    c.step()  # splits tasks 1-9 off (the last stays in the record)
    assert not [call for call in batch.calls if call[0] == "pin"]
    split = [j for j in tasks_of(batch).values() if j.job_id != "100"]
    assert sorted(j.array_tasks[0][0] for j in split) == list(range(1, 10))
    assert all(j.held and j.admin_tag == RIGID for j in split)
    c.step()  # places the split tasks; the record, one task now, too
    run_released(batch)
    c.step()
    running = [j for j in tasks_of(batch).values() if j.running]
    assert len(running) == 10
    assert len({spot(j) for j in running}) == 10  # no two tasks on one instance
    pinned = [call[1] for call in batch.calls if call[0] == "pin"]
    assert sorted(pinned) == sorted(tasks_of(batch)) and len(pinned) == 10  # each once, the record as one task


def test_the_array_limit_bounds_the_tasks_in_flight(tmp_path):
    c, batch = controller(tmp_path)
    array(batch, RIGID, 20, limit=3)
    most = 0
    for _ in range(40):
        c.step()
        run_released(batch)
        live = [j for j in tasks_of(batch).values() if j.task_count == 1 and not j.finished]
        most = max(most, sum(1 for j in live if not j.held))  # released or running
        for j in live:
            if j.running:
                batch.finish(j.job_id)
                break
        if all(j.finished for j in tasks_of(batch).values()):
            break
    assert most == 3
    assert all(j.finished for j in tasks_of(batch).values()) and len(tasks_of(batch)) == 20


def test_tasks_that_fit_nowhere_stop_the_splitting(tmp_path):
    c, batch = controller(tmp_path, nodes=("n1",))
    array(batch, BIG, 200)
    for _ in range(5):
        c.step()
    split = [j for j in tasks_of(batch).values() if j.task_count == 1]
    assert len(split) == SPLIT_AHEAD + 1  # one placed (the node's one GPU), SPLIT_AHEAD waiting
    assert sum(1 for j in split if not j.held) == 1


def test_a_user_held_array_and_one_waiting_for_its_dependency_are_not_split(tmp_path):
    c, batch = controller(tmp_path)
    held = array(batch, RIGID, 5)
    batch.user_hold(held)
    c.step()
    assert len(tasks_of(batch)) == 1
    batch.user_hold(held, held=False)
    batch._set(held, not_before=time.time() + 86400)
    c.step()
    assert len(tasks_of(batch)) == 1


@settings(max_examples=30, deadline=None)
@given(tasks=st.integers(2, 60), limit=st.integers(0, 9), ends=st.lists(st.integers(0, 5), min_size=1, max_size=30))
def test_every_task_runs_once_alone_and_within_the_limit(tmp_path_factory, tasks, limit, ends):
    c, batch = controller(tmp_path_factory.mktemp("a"))
    array(batch, RIGID, tasks, limit)
    for k in range(200):
        c.step()
        run_released(batch)
        live = [j for j in tasks_of(batch).values() if j.task_count == 1 and not j.finished]
        assert not limit or sum(1 for j in live if not j.held) <= limit
        running = [j for j in live if j.running]
        assert len({spot(j) for j in running}) == len(running)
        for j in running[: ends[k % len(ends)] or 1]:
            batch.finish(j.job_id)
        if all(j.finished for j in tasks_of(batch).values()):
            break
    records = tasks_of(batch)
    assert all(j.finished for j in records.values())
    assert sorted(t for j in records.values() for t in j.array_tasks[0]) == list(range(1, tasks + 1))


def test_the_arrays_last_task_waits_while_its_other_tasks_fill_the_limit(tmp_path):
    """Nothing ends between the passes: the array's own record of its last task is not placed while the
    tasks split off fill the array's limit."""
    c, batch = controller(tmp_path)
    array(batch, RIGID, 3, limit=2)
    for _ in range(4):
        c.step()
        in_flight = [j for j in tasks_of(batch).values() if not j.held and not j.finished]
        assert len(in_flight) <= 2, in_flight
    assert len([j for j in tasks_of(batch).values() if not j.held]) == 2


def test_tasks_slurm_cut_from_the_list_are_never_split():
    """Slurm cuts a long list of pending tasks ("...,171,190-..."): what follows the cut names no task, and
    an update of made-up tasks could reach tasks split off before."""
    from mig_batch.batch.system import BatchJob
    from mig_batch.controller.arrays import ArrayTasks
    from mig_batch.slurm.commands import array_tasks

    record = BatchJob("7", JobState.HELD, RIGID, array="7", array_tasks=array_tasks("1,3,6,171,190-..."))
    tasks = ArrayTasks(Store(":memory:"), FakeBatch(["n1"])).next_tasks(record, [])
    assert tasks == [1, 3, 6, 171]
