"""mig-batchd's metrics (OpenMetrics from its own small HTTP server) and the node agent's (a node-exporter
textfile): the text is well formed, the numbers are the snapshot's, a scrape while the batch system is down
still answers with the last good pass; bad settings are refused (exit 2); slow or many clients can neither take
the daemon's file descriptors nor keep a scrape out, and a scrape renders nothing."""

import contextlib
import json
import os
import re
import socket
import stat
import threading
import time
import urllib.request

import pytest

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import BatchError, BatchJob, JobState
from mig_batch.batch.tags import NodeReport, parse_place
from mig_batch.config import ConfigError, SiteConfig, listen_address, load_config
from mig_batch.controller.daemon import Controller
from mig_batch.controller.metrics import ControllerMetrics, EventTally, job_counts, wait_category
from mig_batch.controller.metrics_server import MetricsServer
from mig_batch.node.metrics import AgentMetrics, Histogram, counter, gauge, render, write_textfile
from mig_batch.safe_files import UnsafePath
from mig_batch.state import Store

RIGID = "mig-batch:v1;req=1g.10gb"
BIG = "mig-batch:v1;req=7g.80gb"

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                     r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*\})? (-?[0-9.e+-]+|[+-]Inf|NaN)$')  # fmt: skip
_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


def parse(text: str, openmetrics: bool = True) -> dict[str, dict[str, float]]:
    """Samples by name then labels text, checked as a scraper would: every sample under a TYPE line of its
    family with a suffix its type allows, families not repeated, ``# EOF`` last (OpenMetrics)."""
    lines = text.rstrip("\n").split("\n")
    if openmetrics:
        assert lines[-1] == "# EOF" and text.endswith("\n")
        lines = lines[:-1]
    families: dict[str, str] = {}
    current = None
    samples: dict[str, dict[str, float]] = {}
    for line in lines:
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            base = name[:-len("_total")] if not openmetrics and kind == "counter" else name
            assert base not in families, f"family {base} twice"
            families[base], current = kind, base
            continue
        if line.startswith("# HELP "):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.groups()
        assert current is not None and any(name == current + s for s in _SUFFIXES[families[current]]), line
        samples.setdefault(name, {})[labels or ""] = float(value)
    return samples


# --- the text --------------------------------------------------------------------------------------------


def test_render_writes_openmetrics_and_the_textfile_format():
    families = [counter("x_events", "what \"happened\"\nhere", {(("kind", 'a"b'),): 3}),
                gauge("x_up", "up", 1.0)]  # fmt: skip
    om = render(families)
    assert "# TYPE x_events counter\n" in om and 'x_events_total{kind="a\\"b"} 3\n' in om
    assert "# HELP x_events what \\\"happened\\\"\\nhere" in om and om.endswith("# EOF\n")
    assert parse(om) == {"x_events_total": {'{kind="a\\"b"}': 3.0}, "x_up": {"": 1.0}}
    prom = render(families, openmetrics=False)
    assert "# TYPE x_events_total counter\n" in prom and "# EOF" not in prom
    parse(prom, openmetrics=False)


def test_a_histogram_is_cumulative_with_count_and_sum():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    s = parse(render([h.family("p_seconds", "p")]))
    assert s["p_seconds_bucket"] == {'{le="0.1"}': 2, '{le="1"}': 3, '{le="+Inf"}': 4}
    assert s["p_seconds_count"] == {"": 4} and s["p_seconds_sum"][""] == pytest.approx(3.65)


# --- the pure counts ------------------------------------------------------------------------------------


def test_jobs_are_counted_by_state_and_why_they_wait():
    def job(i, state, **kw):
        return BatchJob(str(i), state, RIGID, **kw)

    jobs = [job(1, JobState.HELD), job(2, JobState.HELD), job(3, JobState.HELD, held_by_user=True),
            job(4, JobState.HELD), job(5, JobState.PENDING, reason="Resources"), job(6, JobState.RUNNING),
            job(7, JobState.FINISHED), BatchJob("8", JobState.PENDING, "")]  # fmt: skip
    waits = {"4": "job 12 to end"}
    counts = job_counts(jobs, waits, decided={"2"})
    assert counts == {(("state", "held"), ("reason", "no-room")): 1, (("state", "held"), ("reason", "pinned")): 1,
                      (("state", "held"), ("reason", "held-by-user")): 1,
                      (("state", "held"), ("reason", "dependency")): 1,
                      (("state", "pending"), ("reason", "Resources")): 1, (("state", "running"), ("reason", "")): 1}
    assert wait_category("its begin time, 2030-01-01 00:00:00") == "begin-time"
    assert wait_category("no room: every GPU that could hold 7g.80gb is busy; it starts when jobs end") == "no-room"
    assert wait_category("its partitions debug hold none of the inventory's nodes") == "partition"


def test_event_tally_counts_what_an_operator_graphs(tmp_path):
    store = Store(tmp_path / "s.db")
    store.event("1", "decided", node="n1")
    tally = EventTally()
    tally.read(store)  # the first read only notes where the log ends
    store.event("2", "decided", node="n1", subjob=1)
    store.event("3", "requeued", node="n2", reason="x")
    store.event(None, "node-back", node="n2", strays=2)
    store.event("4", "node-problem", node="n2", hook="epilog", reason="busy")
    tally.read(store)
    s = parse(render(tally.families()))
    assert s["mig_batch_decisions_total"] == {"": 1} and s["mig_batch_chain_grants_total"] == {"": 1}
    assert s["mig_batch_requeues_total"] == {"": 1} and s["mig_batch_strays_destroyed_total"] == {"": 2}
    assert s["mig_batch_node_problems_total"] == {'{node="n2"}': 1}
    assert s["mig_batch_events_total"]['{kind="node-back"}'] == 1


# --- served, from a controller on the FakeBatch ----------------------------------------------------------


class FlakyBatch(FakeBatch):
    down = False

    def jobs(self):
        if self.down:
            raise BatchError("slurm_load_jobs error: Unable to contact slurm controller")
        return super().jobs()


def scrape(server):
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        return parse(answer.read().decode())


def test_a_scrape_shows_the_jobs_slices_and_passes_and_the_last_good_pass_while_down(tmp_path):
    site = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",), "n2": ("A100-80GB",)})
    batch = FlakyBatch(["n1", "n2"])
    clock = [5000.0]
    metrics = ControllerMetrics()
    c = Controller(site, Store(site.state), batch, clock=lambda: clock[0], metrics=metrics)
    server = MetricsServer("127.0.0.1", 0, metrics)
    server.start()
    try:
        jobs = [batch.add(RIGID) for _ in range(3)] + [batch.add(BIG) for _ in range(3)]
        sleeps = []

        def sleep(seconds):
            sleeps.append(seconds)
            clock[0] += seconds
            if len(sleeps) == 1 and not batch.down:  # the first pass placed what fits; one job starts
                p = parse_place(batch.job(jobs[0]).admin_tag)
                batch.start(jobs[0], NodeReport("made", p.gpu, p.profile, p.start, 1, "MIG-x"))
            if len(sleeps) == 3:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            c.run(sleep=sleep)
        s = scrape(server)
        assert s["mig_batch_passes_total"] == {'{result="ok"}': 3, '{result="failed"}': 0}
        assert s["mig_batch_pass_duration_seconds_count"] == {"": 3}
        assert s["mig_batch_last_good_pass_timestamp_seconds"] == {"": clock[0] - 1.0}
        assert s["mig_batch_batch_system_up"] == {"": 1}
        jobs_by = s["mig_batch_jobs"]
        # 2 GPUs: three 1g jobs and one 7g job fit, the other 7g jobs wait for room
        assert jobs_by['{state="running",reason=""}'] == 1
        assert jobs_by['{state="pending",reason="none"}'] == 3  # released, not started
        assert jobs_by['{state="held",reason="no-room"}'] == 2
        slices = s["mig_batch_slices"]
        used = sum(v for k, v in slices.items() if 'state="used"' in k)
        free = sum(v for k, v in slices.items() if 'state="free"' in k)
        assert used == 3 + 8 and free == 16 - used
        assert s["mig_batch_decisions_total"] == {"": 4} and s["mig_batch_placed_total"] == {"": 4}
        assert s["mig_batch_node_up"] == {'{node="n1"}': 1, '{node="n2"}': 1}
        last_good = clock[0] - 1.0
        batch.down = True
        sleeps.clear()
        with pytest.raises(KeyboardInterrupt):
            c.run(sleep=sleep)
        s = scrape(server)
        assert s["mig_batch_passes_total"]['{result="failed"}'] == 3
        assert s["mig_batch_batch_system_up"] == {"": 0}
        assert s["mig_batch_last_good_pass_timestamp_seconds"] == {"": last_good}
        assert s["mig_batch_next_pass_delay_seconds"] == {"": 8.0} and s["mig_batch_failing_passes"] == {"": 3}
        assert s["mig_batch_jobs"] == jobs_by  # the last good pass's counts stay
        assert s["mig_batch_events_total"]['{kind="batch-down"}'] == 1
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/other", timeout=10)
    finally:
        server.shutdown()
        server.server_close()


def test_the_line_cache_renders_as_render_does_when_numbers_change():
    from mig_batch.controller.metrics import LineCache

    cache = LineCache()
    up = {(("node", f"n{i}"),): 1.0 for i in range(5)}
    for change in range(4):  # the same again, one number changed and a node more, a node gone
        families = [gauge("x_up", "up\nnow", up), counter("x_events", "e", {(("kind", 'a"b'),): 3}),
                    Histogram((0.1,)).family("x_seconds", "s")]  # fmt: skip
        assert cache.text(families) + "# EOF\n" == render(families)
        if change == 1:
            up[(("node", "n3"),)] = 0.0
            up[(("node", "n9"),)] = float("nan")
        elif change == 2:
            del up[(("node", "n0"),)]


# --- the HTTP edge under attack (anyone on the host can connect) ------------------------------------------


def published(tmp_path):
    """A ControllerMetrics after one pass of a controller on the FakeBatch (jobs, slices and nodes counted)."""
    from mig_batch.controller.health import Health

    m = ControllerMetrics()
    c = Controller(SiteConfig(nodes={"n1": ("A100-80GB",)}), Store(tmp_path / "state.db"), FakeBatch(["n1"]),
                   metrics=m)  # fmt: skip
    c.step()
    m.count_snapshot(0.0, c.snapshot.jobs.values(), {}, c.view, c.snapshot.nodes, c.snapshot.inventory)
    m.publish(Health(1.0), None)
    return m


def open_fds():
    return len(os.listdir("/proc/self/fd"))


class Trickle:
    """Slowloris: sockets connected to the server, each sent one byte of a request that never ends each period."""

    def __init__(self, port, n, period=0.5):
        self.socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
        self.period, self.stop = period, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        prefix = b"GET /metrics HTTP/1.1\r\nX-Slow: "
        sent = 0
        while not self.stop.is_set():
            byte = prefix[sent:sent + 1] or b"a"
            sent += 1
            for s in self.socks:
                with contextlib.suppress(OSError):  # the server closed it: expected
                    s.send(byte)
            self.stop.wait(self.period)

    def close(self):
        self.stop.set()
        self.thread.join()
        for s in self.socks:
            s.close()


def test_slow_clients_can_neither_take_the_fds_nor_keep_a_scrape_out(tmp_path):
    from mig_batch.controller.metrics_server import MAX_CONNECTIONS

    server = MetricsServer("127.0.0.1", 0, published(tmp_path))
    server.start()
    before = open_fds()
    trickle = None
    try:
        trickle = Trickle(server.server_address[1], 3 * MAX_CONNECTIONS + 4)
        time.sleep(1.2)  # every connection accepted, two bytes each
        held = open_fds() - before - len(trickle.socks)  # the server's side of them
        assert held <= MAX_CONNECTIONS + 2, f"the server holds {held} sockets"
        for _ in range(3):  # a scrape, while the slow ones keep coming
            started = time.monotonic()
            s = scrape(server)
            assert time.monotonic() - started < 2.0
            assert s["mig_batch_slices"] and s["mig_batch_passes_total"]
        assert open_fds() - before - len(trickle.socks) <= MAX_CONNECTIONS + 2
    finally:
        if trickle is not None:
            trickle.close()
        server.shutdown()
        server.server_close()


def test_a_trickled_request_is_closed_at_its_deadline_not_kept_by_each_byte(tmp_path):
    server = MetricsServer("127.0.0.1", 0, published(tmp_path), request_deadline_s=1.0)
    server.start()
    try:
        slow = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=0.2)
        started = time.monotonic()
        closed = None
        for byte in (b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 100)[:25]:  # a byte every 0.2 s: 5 s
            try:
                slow.send(bytes([byte]))
                if slow.recv(1) == b"":
                    closed = time.monotonic() - started
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = time.monotonic() - started
                break
        slow.close()
        assert closed is not None and 0.9 <= closed < 2.0, closed
    finally:
        server.shutdown()
        server.server_close()


_OUT_OF_FDS = """
import os, resource, sys, time
from mig_batch.controller.metrics import ControllerMetrics
from mig_batch.controller.metrics_server import MetricsServer
server = MetricsServer("127.0.0.1", 0, ControllerMetrics())
server.start()
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8,
                                            resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
hog = []
try:
    while True:
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
print(server.server_address[1], flush=True)
sys.stdin.readline()  # a client is waiting: the server cannot accept it
started = time.process_time()
time.sleep(1.5)
print(time.process_time() - started, flush=True)
for fd in hog:
    os.close(fd)
sys.stdin.readline()
"""


def test_out_of_fds_the_server_waits_without_spinning_and_answers_after(tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", _OUT_OF_FDS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        port = int(child.stdout.readline())
        client = socket.create_connection(("127.0.0.1", port), timeout=5)  # the kernel's backlog takes it
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        child.stdin.write("\n")
        child.stdin.flush()
        assert float(child.stdout.readline()) < 0.25  # CPU seconds in 1.5 s: paused, not spinning on accept
        answer = b""
        while chunk := client.recv(65536):  # accepted once fds are free again
            answer += chunk
        client.close()
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"# EOF\n")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=10) == 0
        assert child.stderr.read().count("cannot accept connections: [Errno 24]") == 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_scrape_sends_the_text_rendered_once_per_publish(tmp_path, monkeypatch):
    import mig_batch.controller.metrics as metrics_module
    from mig_batch.controller.health import Health

    m = published(tmp_path)
    calls = []

    def spy(families, *args, **kwargs):
        families = list(families)
        calls.append([f.name for f in families])
        return render(families, *args, **kwargs)

    monkeypatch.setattr(metrics_module, "render", spy)
    server = MetricsServer("127.0.0.1", 0, m)
    server.start()
    try:
        m.publish(Health(1.0), None)  # a pass: its text rendered now, the snapshot's kept from its counting
        assert calls and not any("mig_batch_slices" in names for names in calls)
        published_text = m.text()
        calls.clear()
        for _ in range(3):
            url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
            with urllib.request.urlopen(url, timeout=10) as answer:
                assert answer.read() == published_text
        assert calls == []  # a scrape renders nothing
        assert parse(published_text.decode())["mig_batch_slices"]
        request = urllib.request.Request(url, data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 405
    finally:
        server.shutdown()
        server.server_close()


# --- the settings ----------------------------------------------------------------------------------------


def test_metrics_listen_is_off_by_default_localhost_without_a_host_and_refused_when_bad(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("nodes: {n1: [A100-80GB]}\n")
    assert load_config(path).metrics_listen == ""
    path.write_text("nodes: {n1: [A100-80GB]}\nmetrics_listen: 9810\n")
    assert listen_address(load_config(path).metrics_listen) == ("localhost", 9810)
    for bad in ("99999", "host:", "yes", "true", "[1, 2]"):
        path.write_text(f"nodes: {{n1: [A100-80GB]}}\nmetrics_listen: {bad}\n")
        with pytest.raises(ConfigError, match="metrics_listen"):
            load_config(path)


def test_mig_batchd_refuses_a_metrics_port_in_use_with_exit_2(tmp_path, capsys):
    from mig_batch.cli.daemons import batchd_main

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        path = tmp_path / "site.yaml"
        path.write_text(f"state: {tmp_path / 'state.db'}\nnodes: {{n1: [A100-80GB]}}\n"
                        f"metrics_listen: 127.0.0.1:{taken.getsockname()[1]}\n")  # fmt: skip
        assert batchd_main(["--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert "metrics_listen" in err and "cannot listen" in err and "Traceback" not in err
    finally:
        taken.close()


# --- the node agent's textfile ------------------------------------------------------------------------------


def test_the_agent_textfile_is_node_exporter_text_written_only_in_a_trusted_directory(tmp_path):
    m = AgentMetrics()
    m.hook("prolog", "made", 0.03)
    m.hook("prolog", "requeue", 0.2)
    m.hook("epilog", "done")
    m.reconciled(2)
    text = render(m.families("n1", 100.0, 200.0, 3, 1), openmetrics=False)
    s = parse(text, openmetrics=False)
    assert s["mig_batch_agent_hooks_total"] == {'{node="n1",hook="epilog",outcome="done"}': 1,
                                                '{node="n1",hook="prolog",outcome="made"}': 1,
                                                '{node="n1",hook="prolog",outcome="requeue"}': 1}  # fmt: skip
    assert s["mig_batch_agent_strays_destroyed_total"] == {'{node="n1"}': 2}
    assert s["mig_batch_agent_prolog_seconds_count"] == {'{node="n1"}': 2}
    assert s["mig_batch_agent_last_reconcile_timestamp_seconds"] == {'{node="n1"}': 200}
    good = tmp_path / "textfile"
    good.mkdir(mode=0o755)
    write_textfile(good / "mig_batch.prom", text)
    assert (good / "mig_batch.prom").read_text() == text
    assert stat.S_IMODE((good / "mig_batch.prom").stat().st_mode) == 0o644
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UnsafePath):
        write_textfile(open_dir / "mig_batch.prom", text)
    assert not (open_dir / "mig_batch.prom").exists()


def test_the_health_file_is_json_beside_the_store(tmp_path):
    from mig_batch.controller.health import health_path

    site = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",)})
    batch = FakeBatch(["n1"])
    c = Controller(site, Store(site.state), batch, clock=lambda: 7000.0)

    def stop(_seconds):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        c.run(sleep=stop)
    data = json.loads(health_path(site.state).read_text())
    assert data["last_good_pass"] == 7000.0 and data["nodes"]["n1"]["up"] is True


def test_the_grafana_dashboard_graphs_only_metrics_that_exist(tmp_path):
    from pathlib import Path

    from mig_batch.controller.health import Health

    dashboard = json.loads((Path(__file__).parents[1] / "etc" / "grafana" / "mig-batch-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][0]["query"])
    used = {m for e in exprs for m in re.findall(r"\bmig_batch_[a-z_]+", e)}
    m = ControllerMetrics()
    site = SiteConfig(nodes={"n1": ("A100-80GB",)})
    c = Controller(site, Store(tmp_path / "state.db"), FakeBatch(["n1"]), metrics=m)
    c.step()
    m.count_snapshot(0.0, c.snapshot.jobs.values(), {}, c.view, c.snapshot.nodes, c.snapshot.inventory)
    m.publish(Health(1.0), None)
    agent = render(AgentMetrics().families("n1", 0.0, 0.0, 0, 0))
    served = set()  # every family declared (some have no sample yet), by the names its samples take
    for line in (m.text().decode() + agent).splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            served |= {name + suffix for suffix in _SUFFIXES[kind]}
    assert used and used <= served, used - served
    assert len(dashboard["panels"]) >= 10 and dashboard["__inputs"][0]["pluginId"] == "prometheus"
