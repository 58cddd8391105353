"""The HTCondor agent's socket against hostile local users, with real processes over a real socket: a fake
slot (processes named ``condor_startd`` and ``condor_starter`` with ``-a slot1_2``, as the agent finds
them in /proc) runs the job's processes as an unprivileged uid, the schedd is a stand-in. A pid freed by
a caller outside the slot is handed to a process in the victim's slot (``ns_last_pid``), as a reviewer
did by waiting for the pid to come round."""

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mig_batch.htcondor import node, peers
from mig_batch.htcondor.node import SlotGuard
from mig_batch.htcondor.server import WrapperServer


def python_for_every_uid() -> str:
    """A Python that other uids may run (the venv's may sit under a home they cannot enter)."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(os.path.realpath(candidate))
        if path.exists() and all(p.stat().st_mode & 0o001 for p in (path, *path.parents)):
            return str(path)
    return ""


PYTHON = python_for_every_uid()
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="runs processes as other uids and picks pids: root only"),
              pytest.mark.skipif(not PYTHON, reason="no Python here that other uids may run")]  # fmt: skip
VICTIM, OTHER = 4242, 65534  # the job's owner (no account needed), and nobody
JOB = "7.0"  # runs in slot1_2 of nodeb

STARTD = """
import ctypes, subprocess, sys
ctypes.CDLL(None).prctl(15, b"condor_startd", 0, 0, 0)  # PR_SET_NAME: what /proc/<pid>/status shows
sys.exit(subprocess.call([sys.executable, "-I", "-S", "-c", sys.argv[1], "-a", sys.argv[2]]))
"""

# runs each order {"uid", "code", "args", "pid"} as a job process of its slot; answers with its pid
STARTER = """
import ctypes, json, os, signal, sys
ctypes.CDLL(None).prctl(15, b"condor_starter", 0, 0, 0)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its job processes reaped at once
for line in sys.stdin:
    order = json.loads(line)
    if order.get("pid"):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(order["pid"] - 1))  # the next fork gets that pid, when it is free
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.setgroups([])
        os.setgid(order["uid"])
        os.setuid(order["uid"])
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", order["code"], *order["args"]])
    print(pid, flush=True)
"""

# a job process asking the agent: argv path op job out; its answer and how long it took go to out
ASK = """
import json, os, socket, sys, time
path, op, job, out = sys.argv[1:5]
t0 = time.monotonic()
with socket.socket(socket.AF_UNIX) as s:
    s.settimeout(10)
    s.connect(path)
    s.sendall(json.dumps({"op": op, "job": job}).encode() + b"\\n")
    answer = s.makefile("rb").readline().decode()
with open(out + ".tmp", "w") as f:
    json.dump({"answer": answer, "s": time.monotonic() - t0}, f)
os.rename(out + ".tmp", out)
"""

SLEEP = "import time; time.sleep(60)"

# connects, leaves the socket to a child and exits when told (a line), freeing its pid; the child sends an
# epilog when told (SIGUSR1)
ATTACKER = """
import os, signal, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
child = os.fork()
if child == 0:
    signal.sigwait({signal.SIGUSR1})
    s.sendall(('{"op": "epilog", "job": "%s"}\\n' % sys.argv[2]).encode())
    print(s.makefile("rb").readline().decode().strip() or '{"ok": false, "detail": "closed"}', flush=True)
else:
    print(os.getpid(), child, flush=True)
    sys.stdin.readline()
os._exit(0)
"""

# nobody holding many connections open without a word
HOLDER = """
import os, resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
held, deadline = [], time.monotonic() + 10
while len(held) < int(sys.argv[2]) and time.monotonic() < deadline:
    s = socket.socket(socket.AF_UNIX)
    s.setblocking(False)
    try:
        s.connect(sys.argv[1])
    except BlockingIOError:  # a full backlog: the agent is behind
        s.close()
        time.sleep(0.01)
        continue
    held.append(s)
print(len(held), flush=True)
time.sleep(60)
"""


class FakeBatch:
    """The schedd: job 7.0 runs in slot1_2 of nodeb, job 8.0 elsewhere; owners without an account here."""

    def _startds(self):
        return [{"Name": "slot1@nodeb@pool", "MigBatchNodeName": "nodeb"}]

    def _call(self, what):
        return contextlib.nullcontext()

    @property
    def schedd(self):
        return self

    def query(self, constraint, projection):
        cluster = constraint.split()[2]
        remote = {"7": "slot1_2@nodeb@pool", "8": "slot1_1@nodea@pool"}.get(cluster)
        return [{"JobStatus": 2, "RemoteHost": remote, "Owner": "no-account-here"}] if remote else []

    def _plain(self, ad):
        return ad


class FakeAgent:
    node, started = "nodeb", time.time()

    def __init__(self):
        self.calls: list[tuple] = []

    def prolog(self, job, owner_uid=None):
        self.calls.append(("prolog", job, owner_uid))
        return SimpleNamespace(problem="", report=None, exports=[f"export CUDA_VISIBLE_DEVICES=MIG-{job}"])

    def epilog(self, job):
        self.calls.append(("epilog", job))
        return f"destroyed the instance of {job}"


class Slot:
    """A fake startd and starter; :meth:`run` starts a job process in the slot."""

    def __init__(self, name: str, out: Path):
        self.out, self.asked, self.lock = out, 0, threading.Lock()
        self.proc = subprocess.Popen([PYTHON, "-I", "-S", "-c", STARTD, STARTER, name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip

    def run(self, uid: int, code: str, *args: str, pid: int = 0) -> int:
        with self.lock:  # one order at a time on the starter's pipes
            self.proc.stdin.write(json.dumps({"uid": uid, "code": code, "args": list(args), "pid": pid}) + "\n")
            self.proc.stdin.flush()
            return int(self.proc.stdout.readline())

    def ask(self, path: Path, uid: int, op: str, job: str) -> tuple[dict, float]:
        """A job process of ``uid`` in this slot asks the agent: its answer and how long that took."""
        with self.lock:
            self.asked += 1
            out = self.out / f"answer-{self.asked}"
        self.run(uid, ASK, str(path), op, job, str(out))
        deadline = time.monotonic() + 15
        while not out.exists():
            assert time.monotonic() < deadline, f"no answer to {op} {job}"
            time.sleep(0.02)
        got = json.loads(out.read_text())
        return (json.loads(got["answer"]) if got["answer"] else {"ok": False, "detail": "closed"}), got["s"]

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)  # the startd, the starter and their job processes
        self.proc.wait()


@pytest.fixture
def bed():
    """A served agent (socket, fake agent, guard) in a directory other uids can reach, and slot1_2."""
    top = Path(tempfile.mkdtemp(prefix="migb-"))  # short: a socket path has 107 bytes at most
    top.chmod(0o755)
    (top / "out").mkdir(mode=0o777)
    (top / "out").chmod(0o777)
    agent = FakeAgent()
    guard = SlotGuard(FakeBatch(), "nodeb", settle_s=0.0, directory=top / "slots")
    server = WrapperServer(top / "agent.sock", agent, guard)
    bed = SimpleNamespace(path=top / "agent.sock", agent=agent, guard=guard, server=server, serving=None)

    def serve():
        bed.serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        bed.serving.start()

    def pause():
        server.shutdown()  # connections wait in the backlog, unaccepted

    bed.serve, bed.pause = serve, pause
    serve()
    bed.slot = Slot("slot1_2", top / "out")
    try:
        yield bed
    finally:
        bed.slot.close()
        server.shutdown()
        server.server_close()
        shutil.rmtree(top)


def ask_as_root(path: Path, payload: bytes, timeout: float = 5.0) -> dict:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        with contextlib.suppress(OSError):  # an oversize request is cut short
            s.sendall(payload)
        line = s.makefile("rb").readline()
    return json.loads(line) if line else {"ok": False, "detail": "closed without an answer"}


def kernel_has_peer_pidfd() -> bool:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        try:
            os.close(a.getsockopt(socket.SOL_SOCKET, 77))
            return True
        except OSError:
            return False


def epilogs(agent: FakeAgent) -> list[tuple]:
    return [call for call in agent.calls if call[0] == "epilog"]


# --- (a) who asks: the uid that owns the job, from a pid that cannot be swapped --------------------------


def test_another_uids_process_in_the_jobs_slot_cannot_end_its_instance(bed):
    answer, _ = bed.slot.ask(bed.path, VICTIM, "prolog", JOB)
    assert answer["ok"] and answer["env"]["CUDA_VISIBLE_DEVICES"] == "MIG-7.0", answer
    answer, _ = bed.slot.ask(bed.path, OTHER, "epilog", JOB)
    assert not answer["ok"] and f"made for uid {VICTIM}, not uid {OTHER}" in answer["detail"], answer
    assert bed.agent.calls == [("prolog", JOB, VICTIM)]  # the verified uid, for the instance's fence
    answer, _ = bed.slot.ask(bed.path, OTHER, "prolog", JOB)  # nor claim the job anew
    assert not answer["ok"] and f"made for uid {VICTIM}" in answer["detail"], answer
    assert epilogs(bed.agent) == []
    # the owner's epilog, also from a restarted agent (the uid is kept with the slot, root's only)
    restarted = SlotGuard(FakeBatch(), "nodeb", settle_s=0.0, directory=bed.guard.directory)
    bed.server.guard = restarted
    assert (bed.guard.directory / JOB).stat().st_mode & 0o777 == 0o600
    answer, _ = bed.slot.ask(bed.path, VICTIM, "epilog", JOB)
    assert answer["ok"] and epilogs(bed.agent) == [("epilog", JOB)], answer


@pytest.mark.parametrize("attacker, pidfd, accepted", [
    (OTHER, "kernel", "at once"), (OTHER, "kernel", "after the swap"),
    (OTHER, "pidfd_open", "at once"), (OTHER, "pidfd_open", "after the swap"),
    (VICTIM, "kernel", "after the swap"), (VICTIM, "pidfd_open", "at once"),
])  # fmt: skip
def test_a_pid_handed_on_to_the_victims_slot_ends_no_instance(bed, monkeypatch, attacker, pidfd, accepted):
    """The reviewer's attack: connect from outside any slot, leave the socket to a child, exit; once the
    pid belongs to a process in the victim's slot, send the epilog. The same uid as the victim's counts
    as an attacker too (its process in no slot); on a kernel without SO_PEERPIDFD a pid reused before
    the accept by a process of that same uid cannot be told apart (the one case left out)."""
    if pidfd == "kernel" and not kernel_has_peer_pidfd():
        pytest.skip("this kernel has no SO_PEERPIDFD (Linux >= 6.5)")
    if pidfd == "pidfd_open":
        monkeypatch.setattr(peers, "SO_PEERPIDFD", 9999, raising=False)  # ENOPROTOOPT, as on an older kernel
    answer, _ = bed.slot.ask(bed.path, VICTIM, "prolog", JOB)
    assert answer["ok"], answer
    if accepted == "after the swap":
        bed.pause()
    thief = subprocess.Popen([PYTHON, "-I", "-S", "-c", ATTACKER, str(bed.path), JOB], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, user=attacker, group=attacker,
                             extra_groups=[])  # fmt: skip
    try:
        freed, child = map(int, thief.stdout.readline().split())
        deadline = time.monotonic() + 5
        # "at once": accepted (the agent counts the uid's connections) while the pid is still its own
        while accepted == "at once" and not getattr(bed.server, "_open", {attacker: 1}).get(attacker):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.05)
        thief.stdin.write("exit\n")
        thief.stdin.flush()
        assert thief.wait(timeout=5) == 0  # reaped: the pid is free
        for _ in range(20):  # another fork on the host may take it first
            if bed.slot.run(VICTIM, SLEEP, pid=freed) == freed:
                break
        else:
            pytest.skip(f"pid {freed} kept being taken by other processes")
        deadline = time.monotonic() + 5
        while not Path(f"/proc/{freed}/status").read_text().startswith("Name:\tpython"):  # set up, exec'd
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert f"Uid:\t{VICTIM}\t" in Path(f"/proc/{freed}/status").read_text()  # the victim's, in its slot
        if accepted == "after the swap":
            bed.serve()
        os.kill(child, signal.SIGUSR1)
        answer = json.loads(thief.stdout.readline())
    finally:
        thief.kill()
    assert not answer["ok"] and answer["detail"].startswith("refused"), answer
    assert epilogs(bed.agent) == []
    answer, _ = bed.slot.ask(bed.path, VICTIM, "epilog", JOB)  # the victim's own epilog still works
    assert answer["ok"] and epilogs(bed.agent) == [("epilog", JOB)], answer


# --- (b) what one uid can hold ------------------------------------------------------------------------


def test_idle_connections_of_another_uid_lock_out_neither_root_nor_a_job(bed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # systemd's soft default for the agent's unit
    holder = subprocess.Popen([PYTHON, "-I", "-S", "-c", HOLDER, str(bed.path), "1100"], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert int(holder.stdout.readline()) == 1100  # all open at once on nobody's side
        t0 = time.monotonic()
        answer = ask_as_root(bed.path, b'{"op": "ping"}\n', timeout=2.0)
        assert answer["ok"] and time.monotonic() - t0 < 2.0, answer
        answer, took = bed.slot.ask(bed.path, VICTIM, "prolog", JOB)
        assert answer["ok"] and took < 2.0, (answer, took)
    finally:
        holder.kill()
        holder.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_silent_or_endless_request_is_closed_at_its_deadline(bed):
    bed.server.read_timeout_s = 0.5
    with socket.socket(socket.AF_UNIX) as silent, socket.socket(socket.AF_UNIX) as dripping:
        silent.settimeout(5)
        dripping.settimeout(5)
        t0 = time.monotonic()
        silent.connect(str(bed.path))
        dripping.connect(str(bed.path))
        with contextlib.suppress(BrokenPipeError):  # closed at the deadline
            for _ in range(10):  # a byte at a time: the deadline is for the whole line
                dripping.send(b" ")
                time.sleep(0.1)
        for sock in (silent, dripping):
            answer = json.loads(sock.makefile("rb").readline())
            assert not answer["ok"] and "no request line within 0.5 s" in answer["detail"], answer
        assert time.monotonic() - t0 < 2.0


def test_one_slot_waits_on_the_schedd_once_at_a_time(bed):
    """A job asking for a job that is not in its slot (8.0 runs on nodea), three times at once: one
    request waits for the schedd's late view, the others get one look; so does the next, in the cool-down."""
    bed.guard.settle_s = 1.5
    answers: list[tuple[dict, float]] = []
    asking = [threading.Thread(target=lambda: answers.append(bed.slot.ask(bed.path, VICTIM, "prolog", "8.0")))
              for _ in range(3)]  # fmt: skip
    for thread in asking:
        thread.start()
    for thread in asking:
        thread.join()
    took = sorted(seconds for _, seconds in answers)
    assert took[0] < 1.0 and took[1] < 1.0 and took[2] >= 1.5, took
    assert not any(answer["ok"] for answer, _ in answers)
    answer, seconds = bed.slot.ask(bed.path, VICTIM, "prolog", "8.0")
    assert not answer["ok"] and seconds < 1.0, (answer, seconds)
    assert bed.agent.calls == []


# --- (c) malformed requests ---------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [
    b"[]\n", b'"x"\n', b"3\n", b"null\n", b'{"op": 3}\n', b'{"op": ["prolog"]}\n', b'{"op": "prolog"}\n',
    b'{"op": "prolog", "job": ["7.0"]}\n', b'{"op": "epilog", "job": "../../escaped"}\n',
    b'{"op": "prolog", "job": "7.0 || true"}\n', b"\xff\xfe\x00\x01binary\n", b"{" * 10 + b"\n",
    b"[" * 2000 + b"]" * 2000 + b"\n", b"x" * 70_000 + b"\n", b'{"op": "prolog", "job": "7.0"\n',
])  # fmt: skip
def test_a_malformed_request_is_answered_with_an_error_and_no_traceback(bed, caplog, capfd, payload):
    answer = ask_as_root(bed.path, payload)
    assert not answer["ok"] and answer["detail"].startswith("bad request: "), answer
    assert ask_as_root(bed.path, b'{"op": "ping"}\n')["ok"]  # and the agent answers on
    assert "Traceback" not in caplog.text + capfd.readouterr().err
    assert all(record.exc_info is None for record in caplog.records)
    assert bed.agent.calls == []


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) and root")
@pytest.mark.parametrize("what", ["fifo", "dev-zero", "symlink", "huge"])
def test_a_passwd_file_the_job_put_in_its_own_root_costs_the_agent_nothing(what, tmp_path):
    """A job in a mount namespace of its own may put anything at its /etc/passwd, which the agent reads as root
    to compare the owner's uid: a FIFO must not block, /dev/zero not fill memory, a link not be followed."""
    planted = tmp_path / "passwd"
    if what == "fifo":
        os.mkfifo(planted)
    elif what == "huge":
        with open(planted, "wb") as f:
            f.truncate(peers.PASSWD_MAX_BYTES + 1)
    elif what == "symlink":
        planted.write_text("alice:x:4321:4321::/:/bin/sh\n")  # a file only root may read, say
    source = "/dev/zero" if what == "dev-zero" else str(planted)
    # a link at /etc/passwd: an /etc of the job's own (a bind mount of a link would bind its target)
    script = 'mount -t tmpfs none /etc && ln -s "$1" /etc/passwd && exec sleep 30' if what == "symlink" \
        else 'mount --bind "$1" /etc/passwd && exec sleep 30'  # fmt: skip
    job = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", source])
    try:
        deadline = time.monotonic() + 10
        while os.path.samestat(os.stat("/etc/passwd"), os.stat(f"/proc/{job.pid}/root/etc/passwd")):
            assert time.monotonic() < deadline and job.poll() is None, "the job's /etc/passwd was not planted"
            time.sleep(0.05)
        t0 = time.monotonic()
        assert peers.owner_uid(job.pid, "alice") is None
        assert time.monotonic() - t0 < 1.0
    finally:
        job.kill()
        job.wait()


def test_a_passwd_file_of_the_jobs_own_root_names_the_owner(tmp_path):
    planted = tmp_path / "passwd"
    planted.write_text("root:x:0:0::/root:/bin/sh\nalice:x:4321:4321::/home/alice:/bin/sh\n")
    job = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            'mount --bind "$1" /etc/passwd && exec sleep 30', "sh", str(planted)])  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while peers.owner_uid(job.pid, "alice") is None:
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.05)
        assert peers.owner_uid(job.pid, "alice") == 4321
    finally:
        job.kill()
        job.wait()


def test_a_job_asking_for_its_instance_again_and_again_is_refused(monkeypatch):
    """Prolog, epilog, prolog...: each cycle would create and destroy an instance under the node's lock."""
    now = [1000.0]
    monkeypatch.setattr(node.time, "monotonic", lambda: now[0])
    guard = SlotGuard(FakeBatch(), "nodeb", settle_s=0.0)
    for _ in range(node.PROLOGS_PER_WINDOW):
        guard._count_prolog("7.0")
        now[0] += 1
    with pytest.raises(peers.CallerRefused, match="times within"):
        guard._count_prolog("7.0")
    guard._count_prolog("8.0")  # another job is not held back
    now[0] += node.PROLOG_WINDOW_S
    guard._count_prolog("7.0")  # a rerun after a while (an eviction) is served
