"""Prolog/epilog and the state store, against the emulated backend and a real SQLite file."""

import sqlite3

import pytest

from mig_batch.config import ConfigError, SiteConfig, load_config
from mig_batch.gpu.emulated import EmulatedNode
from mig_batch.slurm.hooks import epilog, prolog
from mig_batch.state import Decision, StateError, Store

TAG = "mig-batch:v1;req=4g.20gb"


@pytest.fixture
def site(tmp_path):
    config = SiteConfig(state=tmp_path / "state.db", gpu_backend="emulated", emulated_dir=tmp_path / "gpus",
                        job_dir=tmp_path / "jobs", nodes={"n1": ("A100-40GB", "A100-40GB")})  # fmt: skip
    EmulatedNode(config.emulated_dir, "n1", list(config.nodes["n1"]))
    return config


def decide(config, job, gpu, profile, start, request=TAG):
    store = Store(config.state)
    store.record_decision(Decision(job, request, "n1", gpu, "A100-40GB", profile, start, "released", "mfi"))
    store.close()


def env(job):
    return {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "n1"}


def test_prolog_creates_the_decided_instance_and_epilog_destroys_it_once(site):
    decide(site, "7", 1, "4g.20gb", 0)
    prolog(site, env("7"))
    node = EmulatedNode(site.emulated_dir, "n1")
    [inst] = node.instances(1)
    assert (inst.profile, inst.start) == ("4g.20gb", 0)
    assert (site.job_dir / "7").read_text().startswith(f"export CUDA_VISIBLE_DEVICES={inst.uuid}\n")
    prolog(site, env("7"))  # a second run (requeue on the same node) reuses the instance
    assert node.instances(1) == [inst]
    epilog(site, env("7"))
    epilog(site, env("7"))  # idempotent
    assert node.instances(1) == [] and not (site.job_dir / "7").exists()
    assert Store(site.state).instance("7") is None


def test_stale_decision_falls_back_to_mfi_on_the_node(site):
    node = EmulatedNode(site.emulated_dir, "n1")
    node.create(1, "1g.5gb", 2)  # someone else holds part of the decided spot
    decide(site, "8", 1, "4g.20gb", 0)
    prolog(site, env("8"))
    placed = [i for i in node.instances(0)]
    assert [(i.profile, i.start) for i in placed] == [("4g.20gb", 0)]  # the free GPU, by MFI
    events = Store(site.state).events("8", "prolog-replaced")
    assert events and events[0]["decided"] == "1/4g.20gb@0" and events[0]["placed"] == "0/4g.20gb@0"


def test_prolog_that_cannot_place_asks_for_a_requeue_and_does_not_fail(site):
    node = EmulatedNode(site.emulated_dir, "n1")
    node.create(0, "7g.40gb", 0)
    node.create(1, "4g.20gb", 0)
    decide(site, "9", 1, "4g.20gb", 0)
    prolog(site, env("9"))  # returns normally: a failing prolog would drain the node
    store = Store(site.state)
    assert store.decision("9").state == "requeue"
    assert store.instance("9") is None
    assert "NoDevFiles" in (site.job_dir / "9").read_text()


def test_unmanaged_jobs_are_left_alone(site):
    prolog(site, env("10"))
    epilog(site, env("10"))
    assert EmulatedNode(site.emulated_dir, "n1").instances(0) == []


def test_store_refuses_a_newer_schema_and_keeps_decisions(tmp_path):
    path = tmp_path / "s.db"
    store = Store(path)
    store.record_decision(Decision("1", TAG, "n1", 0, "A100-40GB", "4g.20gb", 0, "decided", "mfi"))
    store.set_state("1", "released")
    store.close()
    assert Store(path).decision("1").state == "released"
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(StateError, match="schema 99"):
        Store(path)


def test_config_errors_name_the_setting(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy: best\n")
    with pytest.raises(ConfigError, match="policy 'best' is not one of"):
        load_config(path)
    path.write_text("nodes: {n1: [A200]}\n")
    with pytest.raises(ConfigError, match="nodes.n1"):
        load_config(path)
    path.write_text("colour: red\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config(path)


def test_controller_reconcile_reports_instances_no_job_owns(site):
    from mig_batch.controller.daemon import Controller
    from mig_batch.slurm.commands import SlurmCli

    decide(site, "7", 1, "4g.20gb", 0)
    prolog(site, env("7"))  # recorded: not a stray
    EmulatedNode(site.emulated_dir, "n1").create(0, "1g.5gb", 6)  # made behind mig_batch's back
    store = Store(site.state)
    controller = Controller(site, store, SlurmCli())
    problems = controller.reconcile_nodes([("n1", EmulatedNode(site.emulated_dir, "n1"))])
    assert problems == ["n1 GPU 0: 1g.5gb@6 belongs to no job"]
    assert store.events(kind="stray-instance")
    assert controller.view.gpus[1].instances == {"7": ("4g.20gb", 0)}  # view rebuilt from the store


def test_a_chain_runs_its_subjobs_as_linked_slurm_jobs(site):
    from mig_batch.controller.tags import parse_tag
    from mig_batch.state import ChainRecord, SubjobRecord

    store = Store(site.state)
    store.add_chain(ChainRecord("10", "/ckpt", 1000.0, 60, 600, None, 0.0, "waiting", 0, 0, 0.0, None))
    later = "mig-batch:v1;req=1g.5gb;atomize=1;ckpt=/ckpt;smin=60;smax=600;chain=10"
    assert parse_tag(later).atomize.chain == "10" and parse_tag(later).text() == later
    store.link_job("11", "10")
    assert store.chain("11").job == "10" and store.chain_jobs("10") == ["10", "11"]
    d = Decision("11", later, "n1", 0, "A100-40GB", "1g.5gb", 6, "decided", "sja-efficiency")
    store.grant_subjob(d, SubjobRecord("11", 0, None, "1g.5gb", 1, 4864.0, 300.0, 0.0, *(None,) * 5))
    assert store.chain("10").state == "granted"  # the chain's row, not a new one
    started = store.start_subjob("11")  # the prolog of job 11
    assert started is not None and started.job == "10" and started.deadline == pytest.approx(started.started_at + 300)
    store.end_subjob("11", 75, "continue", "waiting")
    assert [s.outcome for s in store.subjobs("10")] == ["continue"] == [s.outcome for s in store.subjobs("11")]
    assert store.chain("10").subjobs == 1 and store.chain("999") is None


def test_a_schema_2_store_gains_chain_links(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE chains (job TEXT PRIMARY KEY)")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    store = Store(path)
    assert store.chain_jobs("1") == []
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 3
