"""The store's retention: mig-batchd forgets what ended longer ago than ``retention_days``, keeps what is
still going and what it reads back, in short transactions within a budget of each pass."""

import math
import time

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.config import ConfigError, SiteConfig, load_config
from mig_batch.controller import daemon
from mig_batch.controller.daemon import Controller
from mig_batch.state import ChainRecord, Decision, Store

NOW = time.time()  # the store stamps new rows with the clock: job 6's event is recent
OLD = NOW - 40 * 86400  # past a 30-day retention
RECENT = NOW - 86400


def decision(store: Store, job: str, state: str, when: float) -> None:
    store.record_decision(Decision(job, "mig-batch:v1;req=1g.10gb", "n1", 0, "A100-80GB", "1g.10gb", 0, "decided",
                                   "mfi"))  # fmt: skip
    for step in {"released": ["released"], "running": ["released", "running"],
                 "ended": ["released", "running", "ended"], "requeued": ["released", "requeued"]}.get(state, []):
        store.set_state(job, step)
    store.db.execute("UPDATE decisions SET updated_at=? WHERE job=?", (when, job))
    store.db.execute("UPDATE events SET time=? WHERE job=?", (when, job))


def chain(store: Store, job: str, state: str, when: float, later: str, offer: int) -> None:
    store.add_chain(ChainRecord(job, "/ckpt", 6144, 30, 300, None, when, state, 1, 0, 0, None))
    store.link_job(later, job)
    store.db.execute("UPDATE chains SET updated_at=? WHERE job=?", (when, job))
    store.db.execute("UPDATE events SET time=? WHERE job=?", (when, job))  # chain-registered, chain-job
    for sub in (job, later):
        store.db.execute("INSERT INTO subjobs (job, run, offer, profile, memory_slices, memory_mib, window_s, "
                         "granted_at) VALUES (?,?,?,?,?,?,?,?)",
                         (sub, 1, offer, "1g.10gb", 1, 9856, 60, when))  # fmt: skip


def offer(store: Store, oid: int, closes: float) -> None:
    store.db.execute("INSERT INTO offers VALUES (?,?,?,?,?,?,?,?,?,?)",
                     (oid, closes - 60, "n1", 0, "A100-80GB", "1g.10gb", 0, closes - 60, closes, None))  # fmt: skip
    store.db.execute("INSERT INTO replies VALUES (?,?,?,?,?,?,?,?)", (oid, "x", 1, "1g.10gb", 60, 9856, "b", "r"))


def node_event(store: Store, kind: str, node: str, when: float, **detail) -> None:
    store.event(None, kind, node=node, **detail)
    store.db.execute("UPDATE events SET time=? WHERE id=(SELECT max(id) FROM events)", (when,))


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    decision(s, "1", "ended", OLD)  # forgotten
    decision(s, "2", "running", OLD)  # active: kept, with its events
    decision(s, "3", "ended", RECENT)  # kept
    decision(s, "4", "requeued", OLD)  # forgotten, also while its job waits: decided again as a new one
    s.event("5", "waiting", reason="no room")  # a job never decided
    s.db.execute("UPDATE events SET time=? WHERE job='5'", (OLD,))
    s.event("6", "waiting", reason="no room")  # ... recently
    for when, gpus in ((OLD - 10, [1]), (OLD, [2])):
        node_event(s, "mig-off", "n1", when, gpus=gpus)  # the newest is what status shows: kept
    node_event(s, "node-down", "n2", OLD - 5)  # node events of other kinds: forgotten
    node_event(s, "node-back", "n2", OLD)
    s.event("1", "node-problem", node="n3", key="5.000/1")  # a restarted mig-batchd reads the key back: kept
    s.db.execute("UPDATE events SET time=? WHERE id=(SELECT max(id) FROM events)", (OLD,))
    offer(s, 1, OLD)  # closed long ago, named by no kept subjob: forgotten
    offer(s, 2, OLD)  # named by a subjob of a chain still going: kept
    offer(s, 3, RECENT)
    chain(s, "10", "done", OLD, "11", 1)  # over long ago: forgotten with its subjobs
    chain(s, "20", "running", OLD, "21", 2)  # still going: kept
    decision(s, "21", "ended", OLD)  # a going chain's earlier job: kept
    s.db.commit()
    yield s
    s.close()


def test_prune_forgets_what_ended_before_the_cutoff_and_keeps_what_is_going_or_read_back(store):
    gone, done = store.prune(NOW - 30 * 86400)
    assert done
    assert sorted(d.job for d in store.decisions(("decided", "released", "running", "ended", "requeued"))) == \
        ["2", "21", "3"]  # fmt: skip
    assert {e["job"] for e in store.events() if e["job"]} == {"1", "2", "20", "21", "3", "6"}  # 20: the going chain's
    assert [e["kind"] for e in store.events(job="1")] == ["node-problem"]
    assert store.newest_node_events("node-problem")["n3"]["key"] == "5.000/1"
    assert [e["gpus"] for e in store.events(kind="mig-off", node="n1")] == [[2]]
    assert store.events(node="n2") == []
    assert sorted(o["id"] for o in store.offers()) == [2, 3]
    assert store.db.execute("SELECT COUNT(*) FROM replies WHERE offer=1").fetchone()[0] == 0
    assert [c.job for c in store.chains()] == ["20"] and store.chain_jobs("10") == []
    assert sorted(r[0] for r in store.db.execute("SELECT job FROM subjobs")) == ["20", "21"]
    assert gone == {"chains": 1, "decisions": 2, "events": 4 + 3 + 1 + 2 + 1 + 2, "offers": 1}
    assert store.prune(NOW - 30 * 86400) == ({"chains": 0, "decisions": 0, "events": 0, "offers": 0}, True)


def test_a_chain_none_of_whose_jobs_the_batch_system_lists_is_forgotten_as_abandoned(store):
    """A chain whose held job was cancelled before a subjob ran never ends: judged by the jobs listed."""
    store.prune(NOW - 30 * 86400, live=["21"])  # its later job still listed: kept
    assert [c.job for c in store.chains()] == ["20"]
    gone, _ = store.prune(NOW - 30 * 86400, live=["2", "3"])
    assert gone["chains"] == 1 and store.chains() == [] and store.offers()[0]["id"] == 3
    assert sorted(d.job for d in store.decisions(("running", "ended"))) == ["2", "3"]  # 21 went with it


def test_every_prune_makes_progress_within_its_budget_and_goes_on_where_it_stopped(store):
    total, calls, done = {"chains": 0, "decisions": 0, "events": 0, "offers": 0}, 0, False
    while not done and calls < 100:
        gone, done = store.prune(NOW - 30 * 86400, batch=1, budget_s=0)  # one transaction a call
        assert done or any(gone.values())
        total, calls = {k: total[k] + gone[k] for k in total}, calls + 1
    assert calls > 5 and total == {"chains": 1, "decisions": 2, "events": 13, "offers": 1}


def test_mig_batchd_prunes_after_a_pass_then_hourly_and_never_with_retention_0(tmp_path, monkeypatch):
    calls = []
    site = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",)}, poll_interval_s=0.01)
    batch = FakeBatch(["n1"])
    job = batch.add("mig-batch:v1;req=1g.10gb")
    controller = Controller(site, Store(site.state), batch)
    monkeypatch.setattr(controller.store, "prune",
                        lambda before, live, budget_s: calls.append((before, set(live))) or ({}, True))  # fmt: skip
    controller.run(stop_after=0.2)  # several passes: one prune, with the jobs the pass listed
    assert len(calls) == 1 and calls[0][1] == {job} and NOW - 30 * 86400 <= calls[0][0] <= time.time() - 30 * 86400
    ran = calls[0][0] + 30 * 86400
    for now in (ran + 60, ran + daemon.PRUNE_EVERY_S + 1):
        controller.prune(now)
    assert len(calls) == 2 and calls[-1][0] == ran + daemon.PRUNE_EVERY_S + 1 - 30 * 86400
    unfinished = Controller(site, Store(site.state), batch)
    monkeypatch.setattr(unfinished.store, "prune", lambda before, live, budget_s: calls.append(budget_s) or ({}, False))
    unfinished.prune(NOW)
    unfinished.prune(NOW + 1)  # not done: goes on at the next pass
    assert calls[-2:] == [daemon.PRUNE_BUDGET_S, daemon.PRUNE_BUDGET_S]
    failing = Controller(site, Store(site.state), batch)
    monkeypatch.setattr(failing.store, "prune", lambda *a, **k: calls.append("failed") or 1 / 0)
    failing.prune(NOW)
    failing.prune(NOW + 1)  # a failure is tried again an interval later, not every pass
    assert calls[-2:] == [daemon.PRUNE_BUDGET_S, "failed"]
    keep = Controller(SiteConfig(state=site.state, nodes=site.nodes, retention_days=0), Store(site.state), batch)
    monkeypatch.setattr(keep.store, "prune", lambda *a, **k: pytest.fail("retention_days 0 keeps everything"))
    keep.prune(NOW)


@pytest.mark.parametrize("value", [-1, 0.5, "30d", True, math.inf])
def test_retention_days_must_be_a_number_of_days(tmp_path, value):
    path = tmp_path / "mig-batch.yaml"
    path.write_text(f"retention_days: {value if not isinstance(value, str) else repr(value)}\n".replace("inf", ".inf"))
    with pytest.raises(ConfigError, match="retention_days must be a number of days, at least 1, or 0"):
        load_config(path)
    path.write_text("retention_days: 7\n")
    assert load_config(path).retention_days == 7


def test_each_nodes_newest_event_of_a_kind_is_read_through_the_kinds_index(tmp_path):
    """``mig-batch status`` (mig-off) and a restarted mig-batchd (node-problem) read each node's newest event
    of a kind: one query through the kind's index, not a read back through every event per node."""
    store = Store(tmp_path / "state.db")
    store.event(None, "mig-off", node="n1", gpus=[0])
    store.event("7", "node-problem", node="n2", key="1/1")
    store.event(None, "mig-off", node="n1", gpus=[])
    store.event(None, "mig-off", node="n2", gpus=[1])
    sql: list[str] = []
    store.db.set_trace_callback(sql.append)
    assert store.newest_node_events("mig-off") == {"n1": {"node": "n1", "gpus": []}, "n2": {"node": "n2", "gpus": [1]}}
    assert store.newest_node_events("node-problem") == {"n2": {"node": "n2", "key": "1/1"}}
    store.db.set_trace_callback(None)
    plan = " ".join(str(row) for row in store.db.execute("EXPLAIN QUERY PLAN " + sql[-1]))
    assert "events_kind" in plan and "SCAN events" not in plan.replace("SCAN events USING", ""), plan
