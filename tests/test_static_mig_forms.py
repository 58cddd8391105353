"""Slurm's static-MIG request forms (--gres=gpu:<profile>[:n], --gpus-per-node=<profile>[:n], --gpus=<profile>[:n])
are MIG jobs in job_submit.lua wherever the profile is one of the site's; gpu:1 and gpu:<other type> keep their
meaning. The generated script run in a Lua runtime (lupa) as slurmctld runs it."""

import pytest

from mig_batch.mig.models import get_model
from mig_batch.slurm.install import job_submit_lua

lupa = pytest.importorskip("lupa")
NO_VAL, NO_VAL16 = 4294967294, 65534


def submit(fields: dict) -> tuple[int, dict, str | None]:
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.execute("slurm = { SUCCESS = 0, ERROR = -1, log_info = function(f, ...) end, "
                "log_user = function(f, ...) LOGGED = string.format(f, ...) end }")  # fmt: skip
    lua.execute(job_submit_lua([get_model("A100-80GB")], {"n1": ["A100-80GB"], "n2": ["A100-80GB"]}, False))
    job = lua.table_from({"ntasks_per_node": NO_VAL16, "num_tasks": NO_VAL, "min_nodes": NO_VAL,
                          "max_nodes": NO_VAL, "priority": NO_VAL, **fields})  # fmt: skip
    code = lua.globals().slurm_job_submit(job, None, 1000)
    return code, dict(job), lua.globals().LOGGED


@pytest.mark.parametrize("fields, tag, left", [
    ({"tres_per_node": "gres:gpu:3g.40gb:1"}, "mig-batch:v1;req=3g.40gb", ("tres_per_node", "")),
    ({"tres_per_node": "gres/gpu:3g.40gb"}, "mig-batch:v1;req=3g.40gb", ("tres_per_node", "")),
    ({"tres_per_node": "gres:gpu:1g.10gb:2", "num_tasks": 2}, "mig-batch:v1;req=1g.10gb;n=2", ("tres_per_node", "")),
    ({"tres_per_job": "gres:gpu:1g.10gb:2", "num_tasks": 2}, "mig-batch:v1;req=1g.10gb;n=2", ("tres_per_job", "")),
    ({"tres_per_node": "gres:gpu:3G.40GB:1,gres:tmpdisk:1"}, "mig-batch:v1;req=3g.40gb",
     ("tres_per_node", "gres:tmpdisk:1")),
])  # fmt: skip
def test_a_static_mig_form_is_a_mig_job(fields, tag, left):
    code, job, logged = submit(fields)
    assert code == 0, logged
    assert job["admin_comment"] == tag and job["priority"] == 0  # tagged and held for mig-batchd
    assert job[left[0]] == left[1]  # the gpu GRES gone: mig_batch makes the instance


@pytest.mark.parametrize("fields", [
    {"tres_per_node": "gres:gpu:1"},  # a whole GPU, as the site has it
    {"tres_per_node": "gres:gpu:a100:1"},
    {"tres_per_job": "gres:gpu:2"},
    {"tres_per_node": "gres:gpu:9g.90gb:1"},  # no such profile here: Slurm's own GRES answer
])  # fmt: skip
def test_other_gpu_requests_keep_their_meaning(fields):
    code, job, _ = submit(fields)
    assert code == 0 and job.get("admin_comment") is None and job.get("priority") == NO_VAL
    assert all(job[k] == v for k, v in fields.items())


def test_a_static_form_of_zero_instances_is_refused():
    code, _, logged = submit({"tres_per_node": "gres:gpu:1g.10gb:0"})
    assert code != 0 and "at least one instance" in logged


@pytest.mark.parametrize("model", ["A100-80GB", "A100-40GB", "H100-80GB", "A30-24GB"])
def test_the_lua_tells_the_same_round_up_as_migsub(model):
    """job_submit.lua's round-up note (slurm.log_user at submission) is request.py's, word for word, for every
    whole-GiB memory request a model can hold: one rule (ROUND_UP_RULE) on both sides."""
    from mig_batch.request import MigRequest, round_up, translate

    gpu = get_model(model)
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.execute("slurm = { SUCCESS = 0, ERROR = -1, log_info = function(f, ...) end, "
                "log_user = function(f, ...) LOGGED = string.format(f, ...) end }")  # fmt: skip
    lua.execute(job_submit_lua([gpu], {"n1": [model]}, False))
    told = 0
    for gib in range(1, gpu.largest_profile.memory_mib // 1024 + 1):
        lua.globals().LOGGED = None
        job = lua.table_from({"ntasks_per_node": NO_VAL16, "num_tasks": NO_VAL, "min_nodes": NO_VAL,
                              "max_nodes": NO_VAL, "priority": NO_VAL,
                              "tres_per_node": f"gres:mig:{gib}G"})  # fmt: skip
        assert lua.globals().slurm_job_submit(job, None, 1000) == 0
        request = MigRequest(memory_mib=gib * 1024)
        expected = round_up(request, gpu, translate(request, gpu))
        logged = lua.globals().LOGGED
        assert logged == (f"mig-batch: mig:{gib}G rounds up: {expected.message()}" if expected else None), gib
        told += expected is not None
    assert told > 0  # the rule acts on every model's ladder


def submit_with_slices(fields: dict, modify: dict | None = None, uid: int = 1000) -> tuple[int, str | None]:
    """slurm_job_submit (or, with ``modify``, slurm_job_modify of an untagged job) on a site counting slices."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.execute("slurm = { SUCCESS = 0, ERROR = -1, log_info = function(f, ...) INFO = string.format(f, ...) end, "
                "log_user = function(f, ...) LOGGED = string.format(f, ...) end }")  # fmt: skip
    lua.execute(job_submit_lua([get_model("A100-80GB")], {"n1": ["A100-80GB"]}, False, slice_gres="mig_slices"))
    job = lua.table_from({"ntasks_per_node": NO_VAL16, "num_tasks": NO_VAL, "min_nodes": NO_VAL,
                          "max_nodes": NO_VAL, "priority": NO_VAL, **fields})  # fmt: skip
    if modify is None:
        return lua.globals().slurm_job_submit(job, None, uid), lua.globals().LOGGED
    record = lua.table_from({"admin_comment": None, "priority": 1, "job_id": 7})
    update = lua.table_from({"ntasks_per_node": NO_VAL16, "num_tasks": NO_VAL, "min_nodes": NO_VAL,
                             "max_nodes": NO_VAL, "priority": NO_VAL, **modify})  # fmt: skip
    return lua.globals().slurm_job_modify(update, record, None, uid), lua.globals().INFO


@pytest.mark.parametrize("fields", [
    {"tres_per_node": "gres:mig:1g.10gb,gres:gpu:1"},
    {"tres_per_node": "gres:mig:1g.10gb", "tres_per_job": "gres:gpu:2"},
    {"tres_per_node": "gres:mig:1g.10gb", "tres_per_task": "gres/gpu:1"},
    {"tres_per_node": "gres:mig:1g.10gb", "tres_per_socket": "gres:mig_slices:4"},
    {"tres_per_node": "gres:gpu:1g.10gb:1", "tres_per_job": "gres:gpu:1"},
])  # fmt: skip
def test_a_mig_job_cannot_also_hold_whole_gpus_or_the_slice_count(fields):
    code, logged = submit_with_slices(fields)
    assert code != 0 and "a MIG job's GPUs are its MIG instances" in logged, logged


@pytest.mark.parametrize("fields", [
    {"tres_per_task": "gres/mig_slices:16"},
    {"tres_per_node": "gres:mig_slices:8"},
    {"tres_per_job": "gres:mig:1g.10gb"},  # only --gres (per node) is read as a MIG request
])  # fmt: skip
def test_a_job_without_a_mig_decision_cannot_take_mig_gres(fields):
    code, logged = submit_with_slices(fields)
    assert code != 0 and "is mig_batch's to set" in logged, logged


def test_an_owner_cannot_add_the_slice_count_to_a_job_later_but_an_operator_can():
    update = {"tres_per_node": "gres/mig_slices:8"}
    code, info = submit_with_slices({}, modify=update, uid=1000)
    assert code == 2002 and "only mig-batchd sets it" in info  # ESLURM_ACCESS_DENIED
    assert submit_with_slices({}, modify=update, uid=0)[0] == 0
    assert submit_with_slices({}, modify={"tres_per_node": "gres/gpu:1"}, uid=1000)[0] == 0


@pytest.mark.parametrize("fields, accepted, said", [
    ({"tres_per_node": "gres:mig:1g.10gb", "array_inx": "1-40%8"}, True, None),
    ({"tres_per_node": "gres:gpu:3g.40gb:1", "array_inx": "1-4"}, True, None),
    ({"tres_per_node": "gres:mig:1g.10gb", "array_inx": "1-4", "comment": "moldable=1g:300,3g:110"}, True, None),
    ({"tres_per_node": "gres:mig:1g.10gb:2", "num_tasks": 2, "array_inx": "1-4"}, False,
     "a job over several MIG instances cannot be a job array (--array 1-4)"),
    ({"tres_per_node": "gres:mig:6144M", "array_inx": "1-4",
      "comment": "atomize=1;ckpt=/tmp/c;smin=30;smax=300"}, False, "a subjob chain cannot be a job array"),
    ({"tres_per_node": "gres:mig:1g.10gb", "array_inx": "1-4", "dependency": "aftercorr:12"}, False,
     "a MIG job array cannot depend with aftercorr (--dependency aftercorr:12)"),
    ({"tres_per_node": "gres:mig:1g.10gb", "array_inx": "1-4", "dependency": "afterok:12"}, True, None),
])  # fmt: skip
def test_a_mig_job_array_is_held_for_mig_batchd_and_the_forms_decided_as_one_are_refused(fields, accepted, said):
    code, job, logged = submit(fields)
    assert (code == 0) is accepted, logged
    if accepted:  # held, tagged, and never bound to a prompt slot (one slot cannot serve every task)
        assert job["admin_comment"].startswith("mig-batch:v1;req=") and job["priority"] == 0
        assert ";place=" not in job["admin_comment"]
    else:
        assert said in logged
