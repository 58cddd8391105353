"""mig-batchd with ``moldable.planner: far|auto``: the waiting moldable jobs planned together over the
FakeBatch cluster (controller/live_moldable.py), the rest left to the earliest-finish rule."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import JobState
from mig_batch.batch.tags import NodeReport, parse_place
from mig_batch.config import (
    DEFAULT_MOLDABLE_PLANNER,
    MOLDABLE_PLANNERS,
    ConfigError,
    MoldableConfig,
    SiteConfig,
    load_config,
)
from mig_batch.controller.daemon import Controller
from mig_batch.controller.live_moldable import sizes_of
from mig_batch.mig.models import get_model
from mig_batch.planner.problem import gpu_scheme
from mig_batch.state import Store
from mig_batch.yaml_text import parse_yaml

BIG = "mig-batch:v1;req=7g.80gb"
A100 = get_model("A100-80GB")
REPO = Path(__file__).resolve().parents[1]


def _site(tmp_path, planner: str, nodes: int = 1) -> SiteConfig:
    return SiteConfig(state=tmp_path / "state.db", nodes={f"n{i + 1}": ("A100-80GB",) for i in range(nodes)},
                      moldable=MoldableConfig(planner=planner, planner_budget_s=0.5))  # fmt: skip


def _window(decision) -> int:
    return A100.profile(decision.profile).window(decision.start)


@pytest.mark.parametrize("planner", ["far", "auto"])
def test_planned_jobs_are_decided_on_disjoint_slices_with_the_planner_named(tmp_path, planner):
    site = _site(tmp_path, planner)
    batch = FakeBatch(["n1"], cpus_per_node=64)
    store = Store(site.state)
    c = Controller(site, store, batch)
    jobs = [batch.add("mig-batch:v1;req=1g;moldable=1g:600,2g:330,3g:240,7g:200") for _ in range(4)]
    c.step()
    decided = [store.decision(j) for j in jobs]
    started = [d for d in decided if d is not None]
    assert started and all(d.policy == f"moldable-{planner}" for d in started)
    used = 0
    for d in started:
        assert not used & _window(d)  # one GPU: no two decisions share a slice
        used |= _window(d)
    assert all(batch.job(d.job).state is JobState.PENDING and not batch.job(d.job).held for d in started)


def test_a_job_whose_sizes_the_planner_lacks_goes_to_the_earliest_finish_rule(tmp_path):
    """1g.20gb is not the planner's 1-slice profile (1g.10gb): that job is sized by the rule."""
    site = _site(tmp_path, "auto")
    batch = FakeBatch(["n1"], cpus_per_node=64)
    store = Store(site.state)
    c = Controller(site, store, batch)
    floor = batch.add("mig-batch:v1;req=1g.20gb;moldable=1g.20gb:600")
    planned = batch.add("mig-batch:v1;req=1g;moldable=1g:600,2g:400")
    c.step()
    assert store.decision(floor).policy == f"moldable-{site.policy}" and store.decision(floor).profile == "1g.20gb"
    d = store.decision(planned)
    assert d is not None and d.policy == "moldable-auto" and not _window(d) & _window(store.decision(floor))


def test_a_waiting_rigid_jobs_reservation_is_not_taken(tmp_path):
    """A whole-GPU rigid job waits behind a running one (EASY reservation at its expected end): a
    moldable job that would run past that instant is not started on the GPU."""
    site = _site(tmp_path, "auto")
    batch = FakeBatch(["n1"], cpus_per_node=64)
    store = Store(site.state)
    c = Controller(site, store, batch)
    batch.clock = time.time()  # the controller's clock: its prediction ends 10 minutes from now
    small = batch.add("mig-batch:v1;req=1g;moldable=1g:600")
    c.step()
    p = parse_place(batch.job(small).admin_tag)
    batch.start(small, NodeReport("made", p.gpu, p.profile, p.start, 1, f"MIG-{small}"))
    c.step()
    rigid = batch.add(BIG)
    long = batch.add("mig-batch:v1;req=1g;moldable=1g:100000,2g:90000")
    short = batch.add("mig-batch:v1;req=1g;moldable=1g:60,2g:40")
    c.step()
    assert store.decision(rigid) is None  # waits for the whole GPU
    assert store.decision(long) is None  # would hold slices past the rigid job's reservation
    assert store.decision(short).policy == "moldable-auto"  # ends before it opens: backfilled by the plan


def test_sizes_of_keeps_the_planner_profiles_only():
    schemes = {"A100-80GB": gpu_scheme("A100-80GB")}
    times = {"A100-80GB": {"1g.10gb": 600.0, "1g.20gb": 590.0, "3g.40gb": 240.0, "7g.80gb": 100.0}}
    assert sizes_of(times, schemes) == ({1: 600.0, 3: 240.0, 7: 100.0}, {"A100-80GB"})
    assert sizes_of({"A100-80GB": {"1g.20gb": 590.0}}, schemes) == ({}, frozenset())
    both = {**schemes, "A100-40GB": gpu_scheme("A100-40GB")}
    assert sizes_of(times, both) == ({1: 600.0, 3: 240.0, 7: 100.0}, {"A100-80GB"})  # its model only
    times["A100-40GB"] = {"1g.5gb": 700.0, "7g.40gb": 90.0}
    assert sizes_of(times, both) == ({1: 700.0, 7: 100.0}, {"A100-80GB", "A100-40GB"})  # 3g: not on the 40GB
    # 1g listed on the 40GB as 1g.10gb only (its planner 1g is 1g.5gb): a 1g could run there, and the plan
    # would have no 1g at all: left to the rule
    floor = {"A100-80GB": {"1g.10gb": 600.0, "2g.20gb": 320.0, "7g.80gb": 100.0},
             "A100-40GB": {"1g.10gb": 600.0, "2g.10gb": 320.0, "7g.40gb": 100.0}}  # fmt: skip
    assert sizes_of(floor, both) == ({}, frozenset())


def test_a_job_for_one_model_is_planned_on_that_models_gpus_only(tmp_path):
    """``--gpu A100-40GB`` on a cluster of both: planned (not left to the rule after), on the 40GB GPU, though
    the 80GB GPU is as free."""
    site = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",), "n2": ("A100-40GB",)},
                      moldable=MoldableConfig(planner="auto", planner_budget_s=0.5))  # fmt: skip
    batch = FakeBatch(["n1", "n2"], cpus_per_node=64)
    store = Store(site.state)
    c = Controller(site, store, batch)
    job = batch.add("mig-batch:v1;req=1g.5gb;gpu=A100-40GB;moldable=1g.5gb:600,3g.20gb:20,7g.40gb:19")
    c.step()
    d = store.decision(job)
    assert d is not None and (d.node, d.profile, d.policy) == ("n2", "3g.20gb", "moldable-auto")


@pytest.mark.parametrize(("text", "says"), [("planner: best", "eft, far, auto"), ("planner_budget_s: 0", "(0, 60]"),
                                            ("planner: 3", "text")])  # fmt: skip
def test_bad_planner_settings_are_refused(tmp_path, text, says):
    path = tmp_path / "site.yaml"
    path.write_text(f"nodes:\n  gpu01: [A100-80GB]\nmoldable:\n  {text}\n")
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace("]", r"\]")):
        load_config(path)


def test_one_default_planner_everywhere(tmp_path):
    """The code, the shipped configuration and docs/moldable.md name the same default; eft stays selectable."""
    assert MoldableConfig().planner == DEFAULT_MOLDABLE_PLANNER in MOLDABLE_PLANNERS
    empty = tmp_path / "empty.yaml"
    empty.write_text("state: /tmp/x.db\n")
    assert load_config(empty).moldable.planner == DEFAULT_MOLDABLE_PLANNER
    pinned = tmp_path / "eft.yaml"
    pinned.write_text("moldable:\n  planner: eft\n")
    assert load_config(pinned).moldable.planner == "eft"
    shipped, docs = REPO / "etc" / "mig-batch.yaml", REPO / "docs" / "moldable.md"  # the tests run from a checkout
    assert parse_yaml(shipped.read_text())["moldable"]["planner"] == DEFAULT_MOLDABLE_PLANNER
    named = re.findall(r"The default moldable planner is \*\*`([a-z-]+)`\*\*", docs.read_text())
    assert named == [DEFAULT_MOLDABLE_PLANNER], f"docs/moldable.md names {named} as the measured default"


@pytest.mark.parametrize("tag", ["mig-batch:v1;req=1g.10gb;moldable=1g.10gb:600,2g.20gb:300",
                                 "mig-batch:v1;req=10gb;moldable=1g:600"])  # fmt: skip
def test_a_job_listing_no_planner_profile_of_a_model_still_starts_on_that_models_idle_gpu(tmp_path, tag):
    """The A100-80GB runs a whole-GPU job; the A100-40GB is idle, and the job can run there on 1g.10gb,
    which is not the 40GB's planner profile of 1g (1g.5gb). Barring the 40GB would make it wait an hour
    for the 80GB: it is left to the earliest-finish rule, which starts it on the 40GB now."""
    site = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",), "n2": ("A100-40GB",)},
                      moldable=MoldableConfig(planner="auto", planner_budget_s=0.3))  # fmt: skip
    batch = FakeBatch(["n1", "n2"], cpus_per_node=64)
    batch.clock = time.time()
    store = Store(site.state)
    c = Controller(site, store, batch)
    big = batch.add(BIG)
    c.step()
    p = parse_place(batch.job(big).admin_tag)
    batch.start(big, NodeReport("made", p.gpu, p.profile, p.start, 1, f"MIG-{big}"))
    c.step()
    job = batch.add(tag)
    c.step()
    d = store.decision(job)
    assert d is not None and (d.node, d.profile) == ("n2", "1g.10gb"), d


def _behind_a_whole_gpu_job(tmp_path, monkeypatch, max_reservations: int):
    """One A100-80GB running a whole-GPU job for an hour; what each pass's moldable placing returned is
    collected in the list returned."""
    site = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",)},
                      moldable=MoldableConfig(planner="auto", planner_budget_s=0.3,
                                              max_reservations=max_reservations))  # fmt: skip
    batch = FakeBatch(["n1"], cpus_per_node=64)
    batch.clock = time.time()
    store = Store(site.state)
    c = Controller(site, store, batch)
    big = batch.add(BIG, time_limit_s=3600)
    c.step()
    p = parse_place(batch.job(big).admin_tag)
    batch.start(big, NodeReport("made", p.gpu, p.profile, p.start, 1, f"MIG-{big}"))
    c.step()
    outcomes: list = []
    place = c.moldable.place
    monkeypatch.setattr(c.moldable, "place", lambda *a: outcomes.append(place(*a)) or outcomes[-1])
    return batch, store, c, outcomes


def test_a_plan_holds_at_most_max_reservations_and_is_not_made_again_while_nothing_changes(tmp_path, monkeypatch):
    """Ten jobs wait behind a whole-GPU job: the plan reserves slices for the first three only
    (``max_reservations``: the others wait without a hold, as under the rule), and the next passes, with the
    same jobs and holds and nothing of the plan able to start, reuse it instead of planning for a second."""
    import mig_batch.controller.live_moldable as live_moldable

    calls = []
    real = live_moldable.plan_live
    monkeypatch.setattr(live_moldable, "plan_live", lambda *a, **k: calls.append(1) or real(*a, **k))
    batch, store, c, outcomes = _behind_a_whole_gpu_job(tmp_path, monkeypatch, 3)
    jobs = [batch.add("mig-batch:v1;req=1g;moldable=1g:600,7g:60") for _ in range(10)]
    for _ in range(3):
        c.step()
    assert all(store.decision(j) is None for j in jobs)
    assert [(len(reserved), waiting) for _, reserved, waiting in outcomes] == [(3, 10)] * 3
    assert len(calls) == 1
    (event,) = store.events(kind="moldable-plan")
    assert (event["planned"], event["unplaced"], len(event["steps"])) == (10, 0, 10)
    batch.add("mig-batch:v1;req=1g;moldable=1g:600,7g:60")  # a new job: planned again
    c.step()
    assert len(calls) == 2


def test_the_plans_reservations_go_to_the_oldest_waiting_jobs(tmp_path, monkeypatch):
    """The head of the queue (7g for 3000 s) and four short jobs wait behind a whole-GPU job; auto plans the
    short ones first, but with max_reservations=2 the head holds its slices, as it would under the rule."""
    batch, store, c, outcomes = _behind_a_whole_gpu_job(tmp_path, monkeypatch, 2)
    head = batch.add("mig-batch:v1;req=7g;moldable=7g:3000")
    for _ in range(4):
        batch.add("mig-batch:v1;req=7g;moldable=7g:100")
    c.step()
    (event,) = store.events(kind="moldable-plan")
    assert event["steps"][0]["job"] != head  # planned after the short ones
    ((_, reserved, waiting),) = outcomes
    assert waiting == 5 and len(reserved) == 2
    assert any(round(hold.until - hold.since) == 3000 for _, hold in reserved)  # the head's
