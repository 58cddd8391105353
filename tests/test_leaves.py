"""Flex-MIG's finer requests: a compute and memory demand met by N leaves (mig_batch.leaves), through
migsub, `mig-batch translate --instances auto` and job_submit.lua's generated table."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.config import ConfigError, load_config
from mig_batch.leaves import LeafPlan, choose_leaves, leaf_profiles, leaves_for
from mig_batch.mig.models import all_models, get_model
from mig_batch.mig.tables import tables_for
from mig_batch.placement.multi import flex_mig_profile, max_per_gpu, node_capacity
from mig_batch.request import ComputeShare, MigRequest, RequestError
from mig_batch.slurm.install import profile_table

MODELS = sorted(all_models().values(), key=lambda m: m.name)


def _covers(request: MigRequest, model, leaf, count: int) -> bool:
    plan = leaves_for(request, model)
    return count * leaf.compute_slices >= plan.compute_slices and count * leaf.memory_mib >= plan.memory_mib


shares = st.one_of(st.none(), st.integers(1, 40).map(lambda n: ComputeShare(slices=n)),
                   st.floats(0.01, 1.0).map(lambda f: ComputeShare(fraction=f)))  # fmt: skip
requests = st.builds(MigRequest, memory_mib=st.one_of(st.none(), st.integers(1, 400_000)), compute=shares).filter(
    lambda r: r.memory_mib is not None or r.compute is not None)


@settings(max_examples=300, deadline=None)
@given(request=requests, model=st.sampled_from(MODELS))
def test_the_leaves_cover_the_request_and_no_fewer_would(request, model):
    plan = leaves_for(request, model)
    assert plan.covers()
    assert plan.leaf.name == flex_mig_profile(model, plan.count)  # Flex-MIG's leaf for that many
    for fewer in range(1, plan.count):  # N minimal under the rule: fewer leaves, each the rule's, fall short
        assert not _covers(request, model, model.profile(flex_mig_profile(model, fewer)), fewer)


@settings(max_examples=200, deadline=None)
@given(request=requests, nodes=st.dictionaries(st.sampled_from(["n1", "n2", "n3"]),
                                               st.lists(st.sampled_from(["A100-40GB", "A100-80GB", "H100-80GB"]),
                                                        min_size=1, max_size=4), min_size=1))  # fmt: skip
def test_the_chosen_model_is_the_fewest_leaves_a_node_holds(request, nodes):
    models = [get_model(m) for m in sorted({m for gpus in nodes.values() for m in gpus})]
    capacity = {}
    for model in models:
        leaf = leaves_for(request, model).leaf.name
        capacity[model.name] = max((node_capacity([g for g in gpus if g == model.name], {model.name: leaf}), n)
                                   for n, gpus in nodes.items())  # fmt: skip
    holdable = [leaves_for(request, m) for m in models if capacity[m.name][0] >= leaves_for(request, m).count]
    if not holdable:
        with pytest.raises(RequestError, match="more leaves than any node"):
            choose_leaves(request, models, capacity)
        return
    choice = choose_leaves(request, models, capacity)
    assert choice.chosen.count == min(p.count for p in holdable)
    assert capacity[choice.chosen.model][0] >= choice.chosen.count and choice.chosen.covers()


def test_the_papers_examples():
    a40, a80 = get_model("A100-40GB"), get_model("A100-80GB")
    five_g = ComputeShare(slices=5)
    # 5g.25gb: five 1g.5gb leaves when 25 GB is read as the paper's nominal size (25GB = 23.3 GiB) ...
    assert _plan(leaves_for(MigRequest(memory_mib=23842, compute=five_g), a40)) == ("1g.5gb", 5)
    # ... six when 25 GiB is asked: a 1g.5gb has 4.75 GiB, so five hold only 23.75 GiB
    assert _plan(leaves_for(MigRequest(memory_mib=25 * 1024, compute=five_g), a40)) == ("1g.5gb", 6)
    # on an A100-80GB compute decides: five 1g.10gb (48.5 GiB)
    assert _plan(leaves_for(MigRequest(memory_mib=25 * 1024, compute=five_g), a80)) == ("1g.10gb", 5)
    # one leaf: Flex-MIG's 1g.10gb for a job of one instance, even where a 1g.5gb would do
    assert _plan(leaves_for(MigRequest(memory_mib=4 * 1024), a40)) == ("1g.10gb", 1)
    # 8 GiB and one slice: one 1g.10gb rather than two 1g.5gb
    assert _plan(leaves_for(MigRequest(memory_mib=8 * 1024, compute=ComputeShare(slices=1)), a40)) == ("1g.10gb", 1)
    # 30 % of an A100 is 2.1 slices: three leaves
    assert leaves_for(MigRequest(compute=ComputeShare(fraction=0.3)), a80).count == 3


def _plan(plan: LeafPlan) -> tuple[str, int]:
    return plan.leaf.name, plan.count


@pytest.mark.parametrize(("request_", "message"), [
    (MigRequest(profiles=("1g.10gb",)), "a profile name"),
    (MigRequest(memory_mib=1024, count=3), "counts its own leaves"),
    (MigRequest(), "needs GPU compute and/or GPU memory"),
])  # fmt: skip
def test_requests_that_cannot_be_over_leaves_are_refused(request_, message):
    with pytest.raises(RequestError, match=message):
        leaves_for(request_, get_model("A100-80GB"))


# --- the site setting --------------------------------------------------------------------------------------


def test_leaf_requests_are_off_by_default_and_must_be_a_boolean(tmp_path):
    (tmp_path / "a.yaml").write_text("nodes: {n1: [A100-80GB]}\n")
    assert load_config(tmp_path / "a.yaml").flex.leaf_requests is False
    (tmp_path / "b.yaml").write_text("flex: {leaf_requests: true}\n")
    assert load_config(tmp_path / "b.yaml").flex.leaf_requests is True
    (tmp_path / "c.yaml").write_text("flex: {leaf_requests: yes please}\n")
    with pytest.raises(ConfigError, match="flex.leaf_requests must be true or false"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("flex: {leaves: true}\n")
    with pytest.raises(ConfigError, match="unknown flex setting"):
        load_config(tmp_path / "d.yaml")


# --- migsub -------------------------------------------------------------------------------------------------


@pytest.fixture
def site(tmp_path, monkeypatch):
    def make(leaf_requests: bool, nodes: str = "{n1: [A100-80GB], n2: [A100-40GB, A100-40GB]}"):
        (tmp_path / "site.yaml").write_text(f"nodes: {nodes}\nflex: {{leaf_requests: {str(leaf_requests).lower()}}}\n")
        monkeypatch.setenv("MIG_BATCH_CONFIG", str(tmp_path / "site.yaml"))
        job = tmp_path / "job.sh"
        job.write_text("#!/bin/sh\necho hi\n")
        return job

    return make


def _migsub(capsys, *argv: str) -> tuple[int, dict | str]:
    from mig_batch.cli.migsub import main

    code = main(["--dry-run", "--json", *argv])
    out = capsys.readouterr()
    return code, json.loads(out.out) if code == 0 else out.err


def test_migsub_turns_a_request_no_instance_meets_into_leaves(site, capsys):
    job = site(True)
    code, out = _migsub(capsys, "--gpu-compute", "8g", str(job))
    # 8 slices: 8 leaves; only n2 (two A100-40GB, 14 x 1g.5gb) holds eight, n1 holds 7 x 1g.10gb
    assert code == 0 and out["leaves"] == {"A100-40GB": {"leaf": "1g.5gb", "count": 8},
                                           "A100-80GB": {"leaf": "1g.10gb", "count": 8}}  # fmt: skip
    assert "--gres=mig:1g.5gb:8" in out["sbatch"] and "--ntasks-per-node=8" in out["sbatch"]
    assert not any(a.startswith("--comment") for a in out["sbatch"])  # the leaves are the whole request
    code, out = _migsub(capsys, "--gpu-compute", "5g", "--gpu-mem", "25G", "--instances", "auto", str(job))
    assert code == 0 and "--gres=mig:1g.10gb:5" in out["sbatch"]  # A100-80GB: 5 leaves, A100-40GB: 6
    code, out = _migsub(capsys, "--gpu-compute", "5g", "--gpu-mem", "25G", str(job))  # 7g.40gb holds it
    assert code == 0 and out["leaves"] == {} and "--gres=mig:25600M" in out["sbatch"]


def test_migsub_pins_the_model_when_another_has_the_same_leaf_in_another_count(site, capsys):
    job = site(True, "{n1: [A100-80GB], n2: [H100-80GB]}")
    # 1g.10gb: 9933 MiB on an A100-80GB, 9984 MiB on an H100-80GB
    need = 3 * get_model("A100-80GB").profile("1g.10gb").memory_mib + 1
    assert need <= 3 * get_model("H100-80GB").profile("1g.10gb").memory_mib
    code, out = _migsub(capsys, "--gpu-mem", f"{need}M", "--instances", "auto", str(job))
    assert code == 0 and "--gres=mig:1g.10gb:3" in out["sbatch"] and "--constraint=H100-80GB" in out["sbatch"]


def test_migsub_refuses_leaves_the_site_has_not_enabled_or_no_node_holds(site, capsys):
    job = site(False)
    code, err = _migsub(capsys, "--gpu-compute", "8g", str(job))
    assert code == 2 and "a site that sets flex.leaf_requests: true runs it over several leaves" in err
    assert "no MIG profile of A100-40GB, A100-80GB satisfies compute 8g" in err
    code, err = _migsub(capsys, "--gpu-mem", "4G", "--instances", "auto", str(job))
    assert code == 2 and "--instances auto asks for several leaves" in err
    job = site(True)
    code, err = _migsub(capsys, "--gpu-mem", "200G", str(job))
    most = 2 * max_per_gpu(tables_for("A100-40GB"), "1g.5gb")
    assert code == 2 and f"A100-40GB needs 43 x 1g.5gb, the most is {most} (on n2)" in err
    assert "more leaves than any node of this site holds" in err


# --- mig-batch translate --------------------------------------------------------------------------------------


def test_translate_shows_the_leaves_of_every_model(capsys):
    from mig_batch.cli.main import main

    assert main(["translate", "--compute", "5g", "--mem", "25G", "--instances", "auto", "--json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)["leaves"]}
    assert set(rows) == {m.name for m in MODELS}
    for model in MODELS:
        plan = leaves_for(MigRequest(memory_mib=25 * 1024, compute=ComputeShare(slices=5)), model)
        assert (rows[model.name]["leaf"], rows[model.name]["count"]) == (plan.leaf.name, plan.count)


# --- job_submit.lua's table ------------------------------------------------------------------------------------


def test_the_lua_table_carries_each_models_leaves_and_the_setting():
    models = [get_model("A100-40GB"), get_model("A100-80GB"), get_model("A30-24GB")]
    for flag in (True, False):
        lua = profile_table(models, {"n1": ["A100-40GB"]}, flag)
        assert f"MIG_LEAF_REQUESTS = {str(flag).lower()}" in lua.splitlines()
    lua = profile_table(models)
    assert "MIG_LEAF_REQUESTS = false" in lua
    for model in models:
        one, many = leaf_profiles(model)
        line = next(x for x in lua.splitlines() if f'["{model.name}"]' in x)
        assert re.search(rf'leaf_one = "{re.escape(one.name)}", leaf = "{re.escape(many.name)}"', line), line
        # the leaves the Lua counts with are rows of the same table, with the sizes the Python rule uses
        for leaf in (one, many):
            assert f'name = "{leaf.name}", memory_mib = {leaf.memory_mib}, compute = {leaf.compute_slices},' in \
                lua.split(f'["{model.name}"]')[1].split("} },")[0]  # fmt: skip


def test_the_generated_lua_translates_as_python_does():
    """Runs job_submit.lua where a Lua runtime (lupa) is installed; the table test above always runs."""
    lupa = pytest.importorskip("lupa")
    from mig_batch.slurm.install import job_submit_lua

    nodes = {"n1": ["A100-80GB"], "n2": ["A100-40GB", "A100-40GB"]}
    models = [get_model("A100-40GB"), get_model("A100-80GB")]
    source = job_submit_lua(models, nodes, True)
    capacity = {m.name: max((node_capacity([g for g in gpus if g == m.name], {m.name: flex_mig_profile(m, 2)}), n)
                            for n, gpus in nodes.items()) for m in models}  # fmt: skip
    for mib, slices in [(25 * 1024, 5), (23842, 5), (0, 8), (60 * 1024, 0), (4096, 0), (30 * 1024, 3)]:
        lua = lupa.LuaRuntime(unpack_returned_tuples=True)
        lua.execute("slurm = { SUCCESS = 0, ERROR = -1, "
                    "log_user = function(f, ...) LOGGED = string.format(f, ...) end }")
        lua.execute(source)
        comment = "mig-batch:instances=auto" + (f";compute={slices}g" if slices else "")
        job = lua.table_from({"tres_per_node": f"gres/mig:{mib or 1}M", "comment": comment,
                              "ntasks_per_node": 65534, "num_tasks": 1, "min_nodes": 4294967294})  # fmt: skip
        assert lua.globals().slurm_job_submit(job, None, 0) == 0, lua.globals().LOGGED
        request = MigRequest(memory_mib=mib or 1, compute=ComputeShare(slices=slices) if slices else None)
        chosen = choose_leaves(request, models, capacity).chosen
        tag = f"req={chosen.leaf.name}" + (f";n={chosen.count}" if chosen.count > 1 else "")
        assert tag in job.admin_comment, (job.admin_comment, chosen)
        assert math.isclose(job.ntasks_per_node, chosen.count) or chosen.count == 1


def node_set_names() -> set[str]:
    """The variables a node agent sets for a job's tasks, besides CUDA_VISIBLE_DEVICES: those of a subjob over
    two instances, which has them all."""
    from types import SimpleNamespace

    from mig_batch.batch.tags import Placed
    from mig_batch.node.agent import NodeAgent

    agent = SimpleNamespace(node="n1", margin=5.0, clock=lambda: 100.0)
    entries = [SimpleNamespace(uuid=f"MIG-{n}", gpu=0, profile="1g.10gb", start=n) for n in range(2)]
    lines = NodeAgent._exports(agent, entries, Placed("n1", 0, "1g.10gb", 0, window_s=60.0, subjob=2))
    names = {line.split(" export ")[-1].removeprefix("export ").partition("=")[0] for line in lines}
    return names - {"CUDA_VISIBLE_DEVICES"}


def test_the_generated_lua_marks_a_mig_batch_jobs_environment_and_unmarks_any_other():
    """A marked job gets no GPU until its TaskProlog sets its instance, and none from a TaskProlog that finds
    no file of its Prolog's. A job submitted from inside a MIG job inherits the mark: not a MIG job itself,
    it loses it. Slurm's lua reaches batch jobs' environment only."""
    lupa = pytest.importorskip("lupa")
    from mig_batch.slurm.install import job_submit_lua

    source = job_submit_lua([get_model("A100-80GB")], {"n1": ["A100-80GB"]}, True)

    def submitted(tres: str, environment: dict[str, str] | None, script: str | None = "#!/bin/sh"):
        lua = lupa.LuaRuntime(unpack_returned_tuples=True)
        lua.execute("slurm = { SUCCESS = 0, ERROR = -1, log_user = function(f, ...) end }")
        lua.execute(source)
        fields = {"tres_per_node": tres, "ntasks_per_node": 65534, "num_tasks": 1, "min_nodes": 4294967294,
                  "script": script, "environment": lua.table_from(environment) if environment is not None else None}
        job = lua.table_from({k: v for k, v in fields.items() if v is not None})
        assert lua.globals().slurm_job_submit(job, None, 0) == 0
        return dict(job.environment) if environment is not None else None

    marked = {"MIG_BATCH_JOB": "1", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}  # until its TaskProlog sets it
    assert submitted("gres/mig:1g.10gb", {"HOME": "/h"}) == {"HOME": "/h", **marked}
    assert submitted("gres/mig:1g.10gb", {"CUDA_VISIBLE_DEVICES": "0,1"}) == marked
    assert submitted("gres/gpu:1", {"MIG_BATCH_JOB": "1"}) == {"MIG_BATCH_JOB": ""}
    # submitted from inside a MIG job (a subjob chain's runner submits the next subjob so): what the node set
    # for that job is not this one's, its chain and checkpoint directory are
    names = node_set_names()
    inherited = {"MIG_BATCH_JOB": "1", "CUDA_VISIBLE_DEVICES": "MIG-a", "MIG_BATCH_CHAIN": "5",
                 "MIG_BATCH_CHECKPOINT_DIR": "/ckpt", **dict.fromkeys(names, "from its submitter")}  # fmt: skip
    forgotten = {**inherited, **dict.fromkeys(names, ""), "CUDA_VISIBLE_DEVICES": "NoDevFiles"}
    assert submitted("gres/mig:1g.10gb", inherited) == {**forgotten, "MIG_BATCH_JOB": "1"}
    assert submitted("gres/gpu:1", inherited) == {**forgotten, "MIG_BATCH_JOB": ""}
    assert submitted("gres/gpu:1", {"MIG_BATCH_JOB": "1", "CUDA_VISIBLE_DEVICES": "0"})["CUDA_VISIBLE_DEVICES"] == "0"
    assert submitted("gres/gpu:1", {"HOME": "/h"}) == {"HOME": "/h"}
    assert submitted("gres/mig:1g.10gb", None, script=None) is None  # srun, salloc: nothing to mark
