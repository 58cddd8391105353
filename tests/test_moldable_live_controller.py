"""mig-batchd with ``moldable.planner: far|auto``: the waiting moldable jobs planned together over the
FakeBatch cluster (controller/live_moldable.py), the rest left to the earliest-finish rule."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import JobState
from mig_batch.batch.tags import NodeReport, parse_place
from mig_batch.config import ConfigError, MoldableConfig, SiteConfig, load_config
from mig_batch.controller.daemon import Controller
from mig_batch.controller.live_moldable import sizes_of
from mig_batch.mig.models import get_model
from mig_batch.planner.problem import gpu_scheme
from mig_batch.state import Store

BIG = "mig-batch:v1;req=7g.80gb"
A100 = get_model("A100-80GB")


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
    assert sizes_of(times, schemes) == {1: 600.0, 3: 240.0, 7: 100.0}
    assert sizes_of({"A100-80GB": {"1g.20gb": 590.0}}, schemes) == {}


@pytest.mark.parametrize(("text", "says"), [("planner: best", "eft, far, auto"), ("planner_budget_s: 0", "(0, 60]"),
                                            ("planner: 3", "text")])  # fmt: skip
def test_bad_planner_settings_are_refused(tmp_path, text, says):
    path = tmp_path / "site.yaml"
    path.write_text(f"nodes:\n  gpu01: [A100-80GB]\nmoldable:\n  {text}\n")
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace("]", r"\]")):
        load_config(path)


def test_the_default_stays_eft(tmp_path):
    assert MoldableConfig().planner == "eft"
    assert replace(MoldableConfig(), planner="auto").planner == "auto"
