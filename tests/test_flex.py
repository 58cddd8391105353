"""Jobs over several MIG instances (Flex-MIG's one-to-many): the placement core, the tag grammar, the
controller's decision on the in-memory batch system, the store, the node agent on the emulated NVML,
migsub's checks and the TaskProlog's per-rank lines."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import JobState, Pin
from mig_batch.batch.tags import NodeReport, Placed, parse_place, parse_report, parse_tag, placed_tag, with_report
from mig_batch.config import SiteConfig
from mig_batch.controller.daemon import Controller
from mig_batch.controller.ledger import build_view
from mig_batch.mig.models import get_model
from mig_batch.mig.tables import tables_for
from mig_batch.node.agent import NodeAgent
from mig_batch.node.journal import Journal
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.multi import (
    MULTI_POLICIES,
    MultiPlacement,
    MultiPolicy,
    MultiRejection,
    flex_mig_profile,
    max_per_gpu,
    node_capacity,
)
from mig_batch.slurm.install import install
from mig_batch.state import Store

FOUR = "mig-batch:v1;req=1g.10gb;n=4"


# --- placement core ---------------------------------------------------------------------------------


def _windows_disjoint(cluster: Cluster, placement: MultiPlacement) -> bool:
    masks = {}
    for spot in placement.spots:
        gpu = cluster.gpus[spot.gid]
        window = cluster.tables[gpu.model].window(spot.profile, spot.start)
        mask = masks.get(spot.gid, gpu.mask)
        if mask & window or spot.start not in get_model(gpu.model).profile(spot.profile).starts:
            return False
        masks[spot.gid] = mask | window
    return True


@given(
    policy=st.sampled_from(["mfi", "flex-mig"]),
    busy=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]), st.integers(0, 6)),
                  max_size=10),
    profile=st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb"]),
    instances=st.integers(1, 16),
)
def test_a_multi_instance_decision_is_feasible_on_every_gpu_and_all_or_none_in_the_store(
    tmp_path_factory, policy, busy, profile, instances
):
    cluster = Cluster.homogeneous("A100-80GB", 4, gpus_per_host=2)
    for n, (gid, p, start) in enumerate(busy):
        try:
            cluster.allocate(gid, f"busy{n}", p, start)
        except ValueError:
            continue  # a spot taken already: this GPU has less busy
    free_before = {h: 0 for h in ("node00000", "node00001")}
    for gpu in cluster.gpus:
        tables = tables_for(gpu.model)
        mask, k = gpu.mask, tables.index(profile)
        while tables.free_starts[k][mask]:
            mask |= tables.window(profile, min(tables.free_starts[k][mask]))
            free_before[gpu.host] += 1
    decision = MultiPolicy(policy).decide(cluster, {"A100-80GB": profile}, instances)
    if isinstance(decision, MultiRejection):  # refused only when no node has N free spots
        assert max(free_before.values()) < instances
        assert "no node has room" in decision.reason
        return
    assert len(decision.spots) == instances and _windows_disjoint(cluster, decision)
    assert {cluster.gpus[s.gid].host for s in decision.spots} == {decision.host}
    # recorded: every rank or none
    store = Store(tmp_path_factory.mktemp("store") / "state.db")
    from mig_batch.state import Decision

    first = decision.spots[0]
    d = Decision("7", FOUR, decision.host, first.gpu_index, decision.model, first.profile, first.start, "decided",
                 policy)  # fmt: skip
    spots = tuple((s.gpu_index, s.profile, s.start) for s in decision.spots)
    with pytest.raises(ValueError):  # a rank 0 that is not the decision's spot: nothing written
        store.record_decision(d, spots=((first.gpu_index, first.profile, first.start + 1), *spots[1:]))
    assert store.decision("7") is None and store.spots("7") == []
    store.record_decision(d, spots=spots)
    assert store.spots("7") == (list(spots) if instances > 1 else [])


def test_mfi_packs_and_flex_mig_spreads_round_robin():
    cluster = Cluster.homogeneous("A100-80GB", 2, gpus_per_host=2)
    ours = MultiPolicy("mfi").decide(cluster, {"A100-80GB": "1g.10gb"}, 4)
    base = MultiPolicy("flex-mig").decide(cluster, {"A100-80GB": "1g.10gb"}, 4)
    assert [s.gid for s in base.spots] == [0, 1, 0, 1]  # round robin, lowest free start each time
    assert ours.gpus_used() <= base.gpus_used()
    assert ours.delta_f < base.delta_f  # ours raises fragmentation less, by construction
    policy = MultiPolicy("flex-mig")  # the next decision starts on the GPU after the last one's first
    first = policy.decide(cluster, {"A100-80GB": "1g.10gb"}, 1)
    second = policy.decide(cluster, {"A100-80GB": "1g.10gb"}, 1)
    assert (first.spots[0].gid, second.spots[0].gid) == (0, 1)


def test_capacities_and_flex_migs_leaf():
    assert max_per_gpu(tables_for("A100-80GB"), "1g.10gb") == 7
    assert max_per_gpu(tables_for("A100-40GB"), "1g.5gb") == 7
    assert max_per_gpu(tables_for("A100-80GB"), "3g.40gb") == 2
    assert node_capacity(["A100-80GB", "A100-80GB"], {"A100-80GB": "2g.20gb"}) == 6
    assert flex_mig_profile(get_model("A100-80GB"), 1) == "1g.10gb"
    assert flex_mig_profile(get_model("A100-40GB"), 1) == "1g.10gb"
    assert flex_mig_profile(get_model("A100-40GB"), 4) == "1g.5gb"
    assert MultiPolicy("mfi").decide(Cluster.homogeneous("A100-80GB", 1), {"A100-80GB": "1g.10gb"}, 0).reason


def test_an_unknown_multi_policy_is_refused():
    with pytest.raises(ValueError, match="flex-mig"):
        MultiPolicy("best")


# --- tags ------------------------------------------------------------------------------------------


def test_tags_carry_the_count_and_every_spot_and_old_tags_parse_as_before():
    assert parse_tag("mig-batch:v1;req=1g.10gb").instances == 1
    tag = parse_tag(FOUR)
    assert tag.instances == 4 and tag.text() == FOUR and tag.request().count == 4
    with pytest.raises(ValueError, match="n="):
        parse_tag("mig-batch:v1;req=1g.10gb;n=0")
    spots = ((0, "1g.10gb", 6), (0, "1g.10gb", 5), (1, "1g.10gb", 6), (1, "1g.10gb", 5))
    text = placed_tag(tag, Placed("n1", 0, "1g.10gb", 6, spots=spots))
    assert parse_place(text).ranks() == spots
    assert parse_place(placed_tag(parse_tag("mig-batch:v1;req=1g.10gb"), Placed("n1", 1, "1g.10gb", 3))).ranks() == \
        ((1, "1g.10gb", 3),)  # fmt: skip
    more = tuple(NodeReport("made", g, p, s, 10 + i, f"MIG-{i}") for i, (g, p, s) in enumerate(spots[1:], 1))
    report = NodeReport("made", 0, "1g.10gb", 6, 10, "MIG-0", more=more)
    reported = with_report(with_report(text, NodeReport("requeue", reason="x")), report)
    assert parse_report(reported) == report and [r.uuid for r in report.ranks()] == [f"MIG-{i}" for i in range(4)]
    assert parse_report(with_report(reported, NodeReport("requeue", reason="y"))).ranks() == ()


# --- the controller on the in-memory batch system ----------------------------------------------------


@pytest.fixture
def site(tmp_path):
    return SiteConfig(state=tmp_path / "state.db", job_dir=tmp_path / "jobs", node_dir=tmp_path / "node",
                      nodes={"n1": ("A100-80GB",), "n2": ("A100-80GB", "A100-80GB")})  # fmt: skip


def test_the_controller_decides_node_and_every_spot_at_once_and_frees_them_all(site):
    batch = FakeBatch(["n1", "n2"])
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add("mig-batch:v1;req=1g.10gb;n=9")  # more than n1 holds: n2, over both its GPUs
    assert c.step().placed == 1
    place = parse_place(batch.job(job).admin_tag)
    assert place.node == "n2" and len(place.ranks()) == 9 and len(set(place.ranks())) == 9
    assert [tuple(s) for s in store.spots(job)] == list(place.ranks())
    assert store.decision(job).policy == "multi-mfi"
    keys = [k for k in c.view.job_gpu if k.partition("#")[0] == job]
    assert len(keys) == 9
    reports = [NodeReport("made", g, p, s, i, f"MIG-{i}") for i, (g, p, s) in enumerate(place.ranks())]
    batch.start(job, NodeReport(**{**reports[0].__dict__, "more": tuple(reports[1:])}))
    c.step()
    assert store.instance(job).uuid == "MIG-0" and len(store.instances()) == 9
    again = Controller(site, Store(site.state), batch)  # a restart rebuilds every rank in the view
    assert sorted(k for k in again.view.job_gpu if k.partition("#")[0] == job) == sorted(keys)
    batch.finish(job)
    c.step()
    assert store.instances() == [] and not any(k.partition("#")[0] == job for k in c.view.job_gpu)
    assert store.decision(job).state == "ended"


def test_a_job_that_cannot_fit_now_stays_held_with_the_reason_once(site):
    batch = FakeBatch(["n1", "n2"])
    store = Store(site.state)
    c = Controller(site, store, batch)
    filler = [batch.add("mig-batch:v1;req=7g.80gb") for _ in range(3)]
    c.step()
    job = batch.add(FOUR)
    c.step()
    c.step()
    assert batch.job(job).state is JobState.HELD and store.decision(job) is None
    events = store.events(job=job, kind="waiting")
    assert len(events) == 1 and "no node has room for 4 x 1g.10gb now" in events[0]["reason"]
    batch.start(filler[0])
    batch.finish(filler[0])
    assert c.step().placed == 1 and len(parse_place(batch.job(job).admin_tag).ranks()) == 4


def test_flex_mig_baseline_is_a_site_setting(site, tmp_path):
    import dataclasses

    batch = FakeBatch(["n1", "n2"])
    c = Controller(dataclasses.replace(site, multi_policy="flex-mig"), Store(site.state), batch)
    job = batch.add(FOUR)
    c.step()
    assert parse_place(batch.job(job).admin_tag).node == "n1"  # the first node that fits
    assert Store(site.state).decision(job).policy == "multi-flex-mig"


def test_a_replaced_multi_instance_job_moves_every_rank(site):
    batch = FakeBatch(["n1", "n2"])
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add("mig-batch:v1;req=1g.10gb;n=2")
    c.step()
    node = parse_place(batch.job(job).admin_tag).node
    gpu_of_node = 0
    ranks = (NodeReport("replaced", gpu_of_node, "1g.10gb", 0, 1, "MIG-a"),
             NodeReport("replaced", gpu_of_node, "1g.10gb", 1, 2, "MIG-b"))  # fmt: skip
    batch.start(job, NodeReport("replaced", gpu_of_node, "1g.10gb", 0, 1, "MIG-a", more=ranks[1:]))
    c.step()
    assert store.spots(job) == [(0, "1g.10gb", 0), (0, "1g.10gb", 1)]
    assert c.view.gpus[c.gid[(node, 0)]].instances == {job: ("1g.10gb", 0), f"{job}#1": ("1g.10gb", 1)}


# --- the node agent on the emulated NVML --------------------------------------------------------------


@pytest.fixture
def gpus(nvml_emu_creator):
    backend, _ = nvml_emu_creator(["A100-80GB", "A100-80GB"], node="n1")
    return backend


def _released(batch, spots, request=FOUR):
    job = batch.add(request)
    g, p, s = spots[0]
    batch.pin_and_release([Pin(job, "n1", placed_tag(parse_tag(request), Placed("n1", g, p, s, spots=spots)))])
    batch.start(job)
    return job


def _agent(site, batch, gpus):
    return NodeAgent("n1", gpus, Journal(site.node_dir / "journal"), batch, site.job_dir)


SPOTS = ((0, "1g.10gb", 0), (0, "1g.10gb", 1), (1, "1g.10gb", 0), (1, "1g.10gb", 1))


def test_the_agent_makes_every_rank_binds_one_per_task_and_the_epilog_destroys_all(site, gpus):
    batch = FakeBatch(["n1"])
    job = _released(batch, SPOTS)
    a = _agent(site, batch, gpus)
    a.prolog(job)
    made = {(i.gpu, i.start): i.uuid for g in (0, 1) for i in gpus.instances(g)}
    uuids = [made[(g, s)] for g, _, s in SPOTS]
    text = (site.job_dir / job).read_text()
    assert f"export MIG_BATCH_INSTANCES={','.join(uuids)}\n" in text and "export MIG_BATCH_INSTANCE_COUNT=4\n" in text
    for rank, uuid in enumerate(uuids):
        assert f"#rank {rank} export CUDA_VISIBLE_DEVICES={uuid}\n" in text
    report = parse_report(batch.job(job).admin_tag)
    assert report.kind == "made" and [r.uuid for r in report.ranks()] == uuids
    a.prolog(job)  # a second run keeps what it made
    assert sum(len(gpus.instances(g)) for g in (0, 1)) == 4
    assert a.reconcile() == []  # a live multi-instance job's ranks are not strays
    a.epilog(job)
    assert gpus.instances(0) == gpus.instances(1) == [] and Journal(site.node_dir / "journal").entries() == []


def test_a_partial_failure_destroys_what_it_made_and_falls_back_on_the_node(site, gpus):
    batch = FakeBatch(["n1"])
    gpus.create(1, "1g.10gb", 1)  # rank 3's spot is taken: ranks 0-2 are made first, then undone
    job = _released(batch, SPOTS)
    _agent(site, batch, gpus).prolog(job)
    report = parse_report(batch.job(job).admin_tag)
    assert report.kind == "replaced" and len(report.ranks()) == 4
    assert sum(len(gpus.instances(g)) for g in (0, 1)) == 5  # four ranks and the foreign one, no leftovers
    assert len({(r.gpu, r.start) for r in report.ranks()} | {(1, 1)}) == 5


def test_when_the_ranks_fit_nowhere_on_the_node_nothing_is_left_and_a_requeue_is_asked(site, gpus):
    batch = FakeBatch(["n1"])
    gpus.create(0, "7g.80gb", 0)
    gpus.create(1, "4g.40gb", 0)
    job = _released(batch, SPOTS)
    result = _agent(site, batch, gpus).prolog(job)
    assert result.report.kind == "requeue" and "do not fit on n1" in result.report.reason
    assert [len(gpus.instances(g)) for g in (0, 1)] == [1, 1]
    assert "NoDevFiles" in (site.job_dir / job).read_text()


def test_the_reconcile_destroys_every_rank_of_a_job_that_is_gone(site, gpus):
    batch = FakeBatch(["n1"])
    job = _released(batch, SPOTS)
    a = _agent(site, batch, gpus)
    a.prolog(job)
    batch.finish(job)  # its Epilog never ran
    assert len(a.reconcile()) == 4 and gpus.instances(0) == gpus.instances(1) == []


def test_a_lost_journal_keeps_every_rank_of_a_running_job(site, gpus):
    """The journal removed while a multi-instance job runs: the reconcile journals each rank again from the
    job's report, and its Epilog destroys all four."""
    batch = FakeBatch(["n1"])
    job = _released(batch, SPOTS)
    _agent(site, batch, gpus).prolog(job)
    made = gpus.instances(0) + gpus.instances(1)
    (site.node_dir / "journal" / "entries.log").unlink()
    a = _agent(site, batch, gpus)
    assert a.reconcile() == [] and gpus.instances(0) + gpus.instances(1) == made
    a.epilog(job)
    assert gpus.instances(0) == gpus.instances(1) == []


# --- the TaskProlog and job_submit.lua's table ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["python", "direct"])
def test_the_taskprolog_gives_each_task_its_own_rank(tmp_path, kind):
    """The shell TaskProlog and the compiled one (installed direct) alike."""
    install(tmp_path / "etc", sys.executable, "/etc/c.yaml", str(tmp_path / "jobs"), "/run/s", [get_model("A100-80GB")],
            {"n1": ["A100-80GB"]}, hook_client_kind=kind)  # fmt: skip
    assert (tmp_path / "etc" / "mig-batch-taskprolog").is_symlink() == (kind == "direct")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "5").write_text("export CUDA_VISIBLE_DEVICES=MIG-a\nexport MIG_BATCH_INSTANCES=MIG-a,MIG-b\n"
                                         "#rank 0 export CUDA_VISIBLE_DEVICES=MIG-a\n"
                                         "#rank 1 export CUDA_VISIBLE_DEVICES=MIG-b\n")  # fmt: skip

    def printed(**env) -> str:
        return subprocess.run([str(tmp_path / "etc" / "mig-batch-taskprolog")], env={"SLURM_JOB_ID": "5", **env},
                              capture_output=True, text=True, check=True).stdout  # fmt: skip

    def task(**env):
        out = printed(**env)
        exports = dict(line.split(" ", 1)[1].split("=", 1) for line in out.splitlines())
        return exports["CUDA_VISIBLE_DEVICES"], out

    assert task(SLURM_LOCALID="1")[0] == "MIG-b"
    assert task(SLURM_LOCALID="0")[0] == "MIG-a" and task()[0] == "MIG-a"
    assert "#rank" not in task(SLURM_LOCALID="1")[1] and "MIG_BATCH_INSTANCES=MIG-a,MIG-b" in task()[1]
    assert task(SLURM_LOCALID="1; rm -rf /")[0] == "MIG-a"
    assert printed(SLURM_JOB_ID="6") == "" and printed(SLURM_JOB_ID="../jobs/5") == ""  # no file; not a job id
    # a MIG job (job_submit.lua marks its environment) whose Prolog left no file: no GPU, not every one
    assert printed(SLURM_JOB_ID="6", MIG_BATCH_JOB="1") == "export CUDA_VISIBLE_DEVICES=NoDevFiles\n"
    assert printed(SLURM_JOB_ID="6", MIG_BATCH_JOB="") == ""  # submitted from a MIG job, not one itself
    (tmp_path / "jobs" / "5").write_text("export A=1\n#rank 0 export B=2")  # no newline at its end
    assert printed() == "export A=1\nexport B=2\n"
    lua = (tmp_path / "etc" / "mig-batch-submit.lua").read_text()  # the submit logic job_submit.lua loads
    line = next(x for x in lua.splitlines() if 'name = "1g.10gb"' in x)
    assert f"per_gpu = {max_per_gpu(tables_for('A100-80GB'), '1g.10gb')}" in line
    assert '["n1"] = { "A100-80GB" }' in lua


# --- migsub ----------------------------------------------------------------------------------------------


def test_migsub_adds_the_tasks_and_refuses_more_than_a_node_holds(tmp_path, monkeypatch, capsys):
    from mig_batch.cli.migsub import main

    (tmp_path / "site.yaml").write_text("nodes: {n1: [A100-80GB], n2: [A100-40GB, A100-40GB]}\n")
    monkeypatch.setenv("MIG_BATCH_CONFIG", str(tmp_path / "site.yaml"))
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n#MIG --instances 4\necho hi\n")
    assert main(["--dry-run", "--json", "--mig", "1g.10gb", str(job)]) == 0
    import json

    sbatch = json.loads(capsys.readouterr().out)["sbatch"]
    assert "--gres=mig:1g.10gb:4" in sbatch and "--ntasks-per-node=4" in sbatch and "--nodes=1" in sbatch
    most = 2 * max_per_gpu(tables_for("A100-40GB"), "1g.5gb")  # n2: two A100-40GB
    assert main(["--dry-run", "--mig", "1g.5gb", "--instances", str(most), str(job)]) == 0
    capsys.readouterr()
    assert main(["--dry-run", "--mig", "1g.5gb", "--instances", str(most + 1), str(job)]) == 2
    assert f"no node of this site holds {most + 1} instances of 1g.5gb; the most is {most} (on n2)" in \
        capsys.readouterr().err  # fmt: skip
    two_nodes = tmp_path / "nodes.sh"
    two_nodes.write_text("#!/bin/sh\n#SBATCH --nodes=2\necho hi\n")
    assert main(["--dry-run", "--mig", "1g.10gb", "--instances", "2", str(two_nodes)]) == 2
    assert "runs on one node" in capsys.readouterr().err


def test_the_placement_comparison_runs_every_job_under_both_rules():
    from mig_batch.sim.flex_place import run, workload

    jobs = workload(3, 60, per_slot=1.5)
    for policy in ("flex-mig", "mfi"):
        outcome = run(policy, jobs)
        assert outcome.makespan >= max(j.arrival for j in jobs) and outcome.mean_wait >= 0
        assert 1 <= outcome.gpus_per_multi_job <= 2  # a node has two GPUs


def test_simulate_multi_prints_what_the_pure_comparison_computes(capsys):
    import json

    from mig_batch.cli.main import main
    from mig_batch.sim.flex_place import run, workload

    assert main(["simulate", "multi", "--seeds", "2", "--jobs", "40", "--per-slot", "1.5", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [(o["seed"], o["policy"]) for o in printed] == [(s, p) for s in (0, 1) for p in ("flex-mig", "mfi")]
    for o in printed:
        again = run(o["policy"], workload(o["seed"], 40, 1.5), seed=o["seed"])
        assert (o["makespan"], o["mean_wait"]) == (again.makespan, again.mean_wait)


def test_a_prolog_that_stopped_midway_is_started_again_for_every_rank(site, gpus):
    batch = FakeBatch(["n1"])
    job = _released(batch, SPOTS)
    a = _agent(site, batch, gpus)
    a.prolog(job)
    journal = Journal(site.node_dir / "journal")
    lost = journal.get(f"{job}#3")
    journal.remove(f"{job}#3")  # as if the agent died before journaling rank 3
    gpus.destroy(lost.gpu, lost.gi_id)
    a.prolog(job)
    assert len(journal.entries()) == 4 and sum(len(gpus.instances(g)) for g in (0, 1)) == 4
    assert [r.uuid for r in parse_report(batch.job(job).admin_tag).ranks()] == \
        [journal.get(f"{job}#{r}" if r else job).uuid for r in range(4)]  # fmt: skip


def test_status_shows_every_rank_on_its_gpu(tmp_path, capsys):
    import json

    from mig_batch.cli.main import main
    from mig_batch.state import Decision

    (tmp_path / "site.yaml").write_text(f"state: {tmp_path}/state.db\nnodes: {{n1: [A100-80GB, A100-80GB]}}\n")
    store = Store(tmp_path / "state.db")
    store.record_decision(Decision("9", FOUR, "n1", 0, "A100-80GB", "1g.10gb", 0, "decided", "multi-mfi"),
                          spots=SPOTS)  # fmt: skip
    store.close()
    assert main(["status", "--config", str(tmp_path / "site.yaml"), "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)
    seen = [(g["gpu"], j["job"], j["start"]) for g in gpus for j in g["jobs"]]
    assert sorted(seen) == sorted((g, "9" if r == 0 else f"9#{r}", s) for r, (g, _, s) in enumerate(SPOTS))


# --- one job's instances share one GPU model ------------------------------------------------------------------


def mixed_model_node(tmp_path) -> tuple[FakeBatch, Store, Controller]:
    """One node with an A100-40GB and an A100-80GB, on the fake batch system: (batch, store, controller)."""
    site = SiteConfig(state=tmp_path / "state.db", job_dir=tmp_path / "jobs", node_dir=tmp_path / "node",
                      nodes={"n1": ("A100-40GB", "A100-80GB")})  # fmt: skip
    batch = FakeBatch(["n1"])
    store = Store(site.state)
    return batch, store, Controller(site, store, batch)


def test_a_mixed_model_node_gets_one_model_per_job_and_placement_goes_on(tmp_path):
    batch, store, c = mixed_model_node(tmp_path)
    multi = batch.add("mig-batch:v1;req=20480M;n=2")
    plain = batch.add("mig-batch:v1;req=1g.10gb")
    assert c.step().placed == 2 and not c.step().errors
    place, d = parse_place(batch.job(multi).admin_tag), store.decision(multi)
    models = {c.view.gpus[c.gid["n1", g]].model for g, _, _ in place.ranks()}
    assert models == {d.model} and len(place.ranks()) == 2
    pin = c.pinning.pin(d)
    assert pin.slices == sum(get_model(d.model).profile(p).memory_slices for _, p, _ in place.ranks())
    assert parse_place(batch.job(plain).admin_tag) is not None


def test_the_multi_policies_never_mix_models_and_node_capacity_counts_one_model():
    cluster = build_view({"n1": ("A100-40GB", "A100-80GB")})
    profiles = {"A100-40GB": "1g.10gb", "A100-80GB": "1g.10gb"}
    per = {m: max_per_gpu(tables_for(m), "1g.10gb") for m in profiles}
    for name in MULTI_POLICIES:
        for n in range(1, max(per.values()) + 1):
            p = MultiPolicy(name).decide(cluster, profiles, n)
            assert isinstance(p, MultiPlacement), (name, n, p)
            assert {cluster.gpus[s.gid].model for s in p.spots} == {p.model}
        too_many = MultiPolicy(name).decide(cluster, profiles, max(per.values()) + 1)
        assert not isinstance(too_many, MultiPlacement)
    assert node_capacity(["A100-40GB", "A100-80GB"], profiles) == max(per.values())
    assert node_capacity(["A100-80GB", "A100-80GB"], profiles) == 2 * per["A100-80GB"]


def test_the_generated_lua_counts_one_model_per_node():
    lupa = pytest.importorskip("lupa")
    from mig_batch.slurm.install import job_submit_lua

    nodes = {"n1": ["A100-40GB", "A100-80GB"]}
    source = job_submit_lua([get_model("A100-40GB"), get_model("A100-80GB")], nodes, False)
    most = node_capacity(nodes["n1"], {"A100-40GB": "1g.10gb", "A100-80GB": "1g.10gb"})
    assert most == max(max_per_gpu(tables_for(m), "1g.10gb") for m in nodes["n1"])  # not their sum
    for count, ok in [(most, True), (most + 1, False)]:
        lua = lupa.LuaRuntime(unpack_returned_tuples=True)
        lua.execute("slurm = { SUCCESS = 0, ERROR = -1, "
                    "log_user = function(f, ...) LOGGED = string.format(f, ...) end }")
        lua.execute(source)
        job = lua.table_from({"tres_per_node": f"gres/mig:1g.10gb:{count}", "ntasks_per_node": 65534,
                              "num_tasks": 1, "min_nodes": 4294967294})  # fmt: skip
        assert (lua.globals().slurm_job_submit(job, None, 0) == 0) is ok, lua.globals().LOGGED
        if not ok:
            assert f"the most is {most} (on n1)" in lua.globals().LOGGED


def test_every_rank_of_a_multi_instance_job_is_held_until_the_job_ends(site):
    batch = FakeBatch(["n1", "n2"])
    c = Controller(site, Store(site.state), batch)
    job = batch.add("mig-batch:v1;req=1g.10gb;n=3", time_limit_s=600.0)
    assert c.step().placed == 1
    now = 1000.0
    ends = {h.until for t in c.timelines({j.job_id: j for j in batch.jobs()}, now, None) for h in t.holds}
    assert ends == {now + batch.job(job).time_limit_s}


def test_rank_keys_name_the_job_and_parse_back():
    from mig_batch.batch.tags import job_of, rank_key

    assert rank_key("42", 0) == "42" and job_of("42") == "42"
    assert [job_of(rank_key("42", r)) for r in range(5)] == ["42"] * 5
    assert len({rank_key("42", r) for r in range(5)}) == 5


def test_a_count_inside_req_is_the_instance_count_and_a_contradicting_n_is_refused(site):
    assert parse_tag("mig-batch:v1;req=1g.10gb:4").instances == 4
    assert parse_tag("mig-batch:v1;req=1g.10gb:4;n=4").instances == 4
    assert parse_tag("mig-batch:v1;req=1g.10gb:1;n=3").instances == 3
    with pytest.raises(ValueError, match="asks for 4 instances but n=2"):
        parse_tag("mig-batch:v1;req=1g.10gb:4;n=2")
    batch = FakeBatch(["n1", "n2"])
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add("mig-batch:v1;req=1g.10gb:4")
    bad = batch.add("mig-batch:v1;req=1g.10gb:4;n=2")
    assert c.step().placed == 1
    assert len(parse_place(batch.job(job).admin_tag).ranks()) == 4
    assert batch.job(bad).state is JobState.HELD and store.events(job=bad, kind="bad-tag")


def test_a_blocked_multi_instance_job_gets_no_one_instance_reservation(site, tmp_path):
    batch = FakeBatch(["n1", "n2"])
    store = Store(site.state)
    c = Controller(site, store, batch)
    for _ in range(3):
        batch.add("mig-batch:v1;req=7g.80gb")
    c.step()
    blocked = batch.add(FOUR)
    refused = batch.add(f"mig-batch:v1;req=1g.10gb;n=2;atomize=1;ckpt={tmp_path / 'ckpt'};smin=30;smax=300")
    batch.add(f"mig-batch:v1;req=1g.10gb;atomize=1;ckpt={tmp_path / 'other'};smin=30;smax=300")
    asked = []
    timelines = c.timelines
    c.timelines = lambda jobs, now, blocked: asked.append(blocked) or timelines(jobs, now, blocked)
    c.step()
    assert asked and all(b is None for b in asked)
    assert store.decision(blocked) is None and store.decision(refused) is None and store.chain(refused) is None
    assert "cannot be a subjob chain" in store.events(job=refused, kind="waiting")[0]["reason"]


def test_a_stored_decision_mixing_models_is_pinned_with_each_gpus_slices(tmp_path):
    from mig_batch.state import Decision

    site = SiteConfig(state=tmp_path / "state.db", job_dir=tmp_path / "jobs", node_dir=tmp_path / "node",
                      nodes={"n1": ("A100-40GB", "A100-80GB")})  # fmt: skip
    batch = FakeBatch(["n1"])
    store = Store(site.state)
    old = batch.add("mig-batch:v1;req=20480M;n=2")  # decided before jobs kept to one model
    spots = ((0, "3g.20gb", 0), (1, "2g.20gb", 0))
    store.record_decision(Decision(old, "mig-batch:v1;req=20480M;n=2", "n1", 0, "A100-40GB", "3g.20gb", 0, "decided",
                                   "multi-mfi"), spots=spots)  # fmt: skip
    c = Controller(site, store, batch)
    plain = batch.add("mig-batch:v1;req=1g.10gb")
    assert c.step().placed == 2
    assert parse_place(batch.job(plain).admin_tag) is not None
    assert c.pinning.pin(store.decision(old)).slices == get_model("A100-40GB").profile("3g.20gb").memory_slices + \
        get_model("A100-80GB").profile("2g.20gb").memory_slices  # fmt: skip


def test_an_unpinnable_decision_does_not_keep_other_jobs_from_their_pins(site):
    from mig_batch.state import Decision

    batch = FakeBatch(["n1", "n2"])
    store = Store(site.state)
    broken = batch.add("mig-batch:v1;req=1g.10gb")
    store.record_decision(Decision(broken, "not a tag", "n1", 0, "A100-80GB", "1g.10gb", 0, "decided", "mfi"))
    c = Controller(site, store, batch)
    plain = batch.add("mig-batch:v1;req=1g.10gb")
    stats = c.step()
    assert stats.placed == 1 and parse_place(batch.job(plain).admin_tag) is not None
    assert any(broken in e and "cannot be pinned" in e for e in stats.errors)


def test_a_job_the_node_moved_to_another_models_gpu_is_recorded_with_that_model(tmp_path):
    batch, store, c = mixed_model_node(tmp_path)
    job = batch.add("mig-batch:v1;req=9000M;n=2")
    c.step()
    d = store.decision(job)
    other = next(g for g in c.view.gpus if g.model != d.model)
    profile = c.profiles_for(parse_tag(d.request))[other.model]
    starts = sorted(tables_for(other.model).free_starts[tables_for(other.model).index(profile)][0])[:2]
    reports = [NodeReport("replaced", other.index, profile, s, i, f"MIG-{i}") for i, s in enumerate(starts)]
    batch.start(job, NodeReport(**{**reports[0].__dict__, "more": tuple(reports[1:])}))
    c.step()
    moved = store.decision(job)
    assert moved.model == other.model and moved.gpu == other.index
    assert c.pinning.pin(moved).slices == 2 * get_model(other.model).profile(profile).memory_slices
