"""mig-batchd degrades quietly: a failing batch system backs passes off exponentially to a cap, with one log
line and one event when it goes down and when it is back; ``mig-batch status`` says how fresh each node is and
never shows a node it has not read lately as free. On the FakeBatch with an injected clock and sleep."""

import json
import logging

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import BatchError
from mig_batch.batch.tags import AgentTag
from mig_batch.cli.main import main
from mig_batch.config import SiteConfig
from mig_batch.controller.daemon import Controller
from mig_batch.controller.health import (
    BACKOFF_CAP_S,
    DOWN,
    FRESH,
    NEVER_READ,
    STALE,
    Health,
    health_path,
    node_state,
    read_health,
)
from mig_batch.state import Store

RIGID = "mig-batch:v1;req=1g.10gb"


class Stop(BaseException):
    """Ends Controller.run from the injected sleep."""


class FlakyBatch(FakeBatch):
    def __init__(self, nodes):
        super().__init__(nodes)
        self.down = False

    def jobs(self):
        if self.down:
            raise BatchError("squeue: error: slurm_load_jobs error: Unable to contact slurm controller\n"
                             "(connect failure)")  # fmt: skip
        return super().jobs()


class Clock:
    def __init__(self, t=10_000.0):
        self.t = t

    def __call__(self):
        return self.t


def run_for(controller, clock, sleeps, passes, on_pass=None):
    """Run the controller ``passes`` passes; each sleep advances ``clock`` by its delay (recorded)."""

    def sleep(seconds):
        sleeps.append(seconds)
        clock.t += seconds
        if on_pass is not None:
            on_pass(len(sleeps))
        if len(sleeps) >= passes:
            raise Stop

    with pytest.raises(Stop):
        controller.run(sleep=sleep)


# --- the pure part -----------------------------------------------------------------------------------


def test_backoff_doubles_to_the_cap_and_resets_after_a_good_pass():
    h = Health(poll_interval_s=1.0)
    assert h.delay() == 1.0
    changes = [h.failed(100.0 + k, "boom", batch=True) for k in range(8)]
    assert [c.kind for c in changes if c] == ["down"]  # one change for eight failures
    assert h.delay() == BACKOFF_CAP_S
    delays = []
    h2 = Health(poll_interval_s=1.0)
    for k in range(7):
        h2.failed(float(k), "boom", batch=True)
        delays.append(h2.delay())
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    back = h.succeeded(200.0, [("n1", True, 150.0)])
    assert back is not None and back.kind == "back" and back.failures == 8 and back.down_for_s == 100.0
    assert h.delay() == 1.0 and h.last_good == 200.0 and not h.down
    assert h.succeeded(201.0) is None


def test_a_long_error_keeps_its_head_and_its_reason_on_one_line():
    h = Health(poll_interval_s=1.0)
    why = "failed (1):\nslurm_load_jobs error: Unable to contact slurm controller"
    h.failed(1.0, "squeue " + "-O Field:| " * 80 + why, batch=True)
    assert h.error.startswith("squeue -O") and h.error.endswith("Unable to contact slurm controller")
    assert len(h.error) <= 300 and "\n" not in h.error


def test_a_bug_after_the_batch_system_failed_is_a_change_of_its_own():
    h = Health(poll_interval_s=0.5)
    assert h.failed(1.0, "down", batch=True).batch
    assert h.failed(2.0, "down again", batch=True) is None
    bug = h.failed(3.0, "KeyError: 'x'", batch=False)
    assert bug is not None and not bug.batch and bug.kind == "down"


def test_node_state_from_the_health_file():
    h = Health(poll_interval_s=1.0)
    h.succeeded(1000.0, [("n1", True, 990.0), ("n2", False, None)])
    data = json.loads(json.dumps(h.to_json(1000.0)))
    assert node_state(data, "n1", 1005.0) == (FRESH, 1000.0)
    assert node_state(data, "n2", 1005.0) == (DOWN, 1000.0)
    assert node_state(data, "n1", 1016.0) == (STALE, 1000.0)  # 15 s: the minimum staleness
    assert node_state(data, "n3", 1005.0) == (NEVER_READ, None)
    assert node_state(None, "n1", 1005.0) == (NEVER_READ, None)


# --- the loop, on the FakeBatch --------------------------------------------------------------------


@pytest.fixture
def site(tmp_path):
    return SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",), "n2": ("A100-80GB",)},
                      poll_interval_s=1.0)  # fmt: skip


def test_an_outage_logs_one_line_down_one_back_and_records_both_events(site, caplog):
    batch = FlakyBatch(["n1", "n2"])
    clock = Clock()
    store = Store(site.state)
    c = Controller(site, store, batch, clock=clock)
    sleeps: list[float] = []

    def script(n):
        if n == 2:
            batch.down = True
        if n == 14:
            batch.down = False
            batch.add(RIGID)

    with caplog.at_level(logging.INFO, logger="mig-batchd"):
        run_for(c, clock, sleeps, passes=17, on_pass=script)
    # passes 1-2 good (1 s apart), 3-14 fail (backing off to the cap), 15-17 good again
    assert sleeps[:2] == [1.0, 1.0]
    assert sleeps[2:14] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0, 30.0, 30.0, 30.0, 30.0]
    assert sleeps[14:] == [1.0, 1.0, 1.0]
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2, [r.getMessage() for r in lines]
    assert "does not answer" in lines[0].getMessage() and "\n" not in lines[0].getMessage()
    assert "back after" in lines[1].getMessage() and "(12 failed passes)" in lines[1].getMessage()
    events = store.events()
    kinds = [e["kind"] for e in events]
    assert kinds.count("batch-down") == 1 and kinds.count("batch-back") == 1
    back = next(e for e in events if e["kind"] == "batch-back")
    assert back["failed_passes"] == 12 and back["down_for_s"] == pytest.approx(sum(sleeps[2:14]), abs=1)
    assert "Unable to contact slurm controller" in next(e for e in events if e["kind"] == "batch-down")["error"]
    assert "decided" in kinds  # the job submitted at the recovery was placed
    health = read_health(health_path(site.state))
    assert health is not None and health["failures"] == 0 and health["last_good_pass"] == clock.t - 1.0
    assert set(health["nodes"]) == {"n1", "n2"}


def test_a_bug_is_logged_once_with_its_traceback_and_backs_off(site, caplog, monkeypatch):
    batch = FakeBatch(["n1", "n2"])
    clock = Clock()
    c = Controller(site, Store(site.state), batch, clock=clock)

    def broken():
        raise KeyError("surprise")

    monkeypatch.setattr(c, "step", broken)
    sleeps: list[float] = []
    with caplog.at_level(logging.INFO, logger="mig-batchd"):
        run_for(c, clock, sleeps, passes=6)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].exc_info is not None and "KeyError" in errors[0].getMessage()
    assert sleeps == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert [e["kind"] for e in c.store.events()] == ["pass-failing"]


# --- mig-batch status ----------------------------------------------------------------------------------


def write_site(tmp_path, store):
    path = tmp_path / "site.yaml"
    path.write_text(f"state: {store}\nnodes:\n  n1: [A100-80GB]\n  n2: [A100-80GB]\n  n3: [A100-80GB]\n")
    return path


def status(capsys, config, *extra):
    assert main(["status", "--config", str(config), *extra]) == 0
    return capsys.readouterr().out


def test_status_shows_nodes_never_read_or_stale_as_unknown_never_free(site, tmp_path, capsys):
    import time as real_time

    config = write_site(tmp_path, site.state)
    batch = FlakyBatch(["n1", "n2", "n3"])
    batch.set_node_up("n2", False)
    batch.set_node_tag("n1", AgentTag(real_time.time() - 100, real_time.time() - 42).text())
    store = Store(site.state)
    c = Controller(SiteConfig(state=site.state, nodes={n: ("A100-80GB",) for n in ("n1", "n2", "n3")}), store, batch)
    now = real_time.time()
    c.outcomes.good(0.01, 0, 0, c._read(), c.view, {})  # a good pass just now, n1-n3 read
    data = json.loads(status(capsys, config, "--json"))
    states = {g["node"]: g["node_state"] for g in data}
    assert states == {"n1": FRESH, "n2": DOWN, "n3": FRESH}
    assert data[0]["free_slices"] == 8 and data[1]["free_slices"] is None
    assert data[0]["agent_reconciled_at"] == pytest.approx(now - 42, abs=1) and data[1]["agent_reconciled_at"] is None
    assert "agent 42 s" in status(capsys, config) or "agent 43 s" in status(capsys, config)
    assert all(g["last_good_pass"] == pytest.approx(now, abs=5) for g in data)
    # the file says n3 was never read and n1 was read long ago
    path = health_path(site.state)
    health = json.loads(path.read_text())
    health["nodes"]["n1"]["read"] = now - 600
    del health["nodes"]["n3"]
    health["failing_since"], health["failures"], health["error"] = now - 600, 20, "slurmctld down"
    path.write_text(json.dumps(health))
    data = json.loads(status(capsys, config, "--json"))
    assert {g["node"]: g["node_state"] for g in data} == {"n1": STALE, "n2": DOWN, "n3": NEVER_READ}
    assert all(g["free_slices"] is None for g in data)
    text = status(capsys, config)
    assert "failing" in text and "slurmctld down" in text
    assert "????????" in text and "········" not in text  # nothing shown free
    assert "never read" in text and "stale" in text


def test_status_without_a_health_file_marks_every_node_unknown(site, tmp_path, capsys):
    config = write_site(tmp_path, site.state)
    Store(site.state).close()
    data = json.loads(status(capsys, config, "--json"))
    assert {g["node_state"] for g in data} == {NEVER_READ}
    assert all(g["free_slices"] is None and g["last_good_pass"] is None for g in data)
    text = status(capsys, config)
    assert "no good pass recorded" in text
