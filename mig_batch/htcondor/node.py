"""The node agent on an HTCondor execute node: the batch-neutral :class:`~mig_batch.node.agent.NodeAgent`
with :class:`~mig_batch.htcondor.adapter.HTCondorBatch` as its channel, served to the job wrapper.

HTCondor runs the job wrapper (``USER_JOB_WRAPPER``, :mod:`mig_batch.htcondor.job_wrapper`) as the job's
user, never root, so the wrapper asks this root service over a Unix socket that any local user may
open; who asks is decided from the socket's peer credentials, not from anything the caller says:

- the caller must descend from a ``condor_starter`` of this node's startd (the startd's ``-local-name``,
  none on a node with one startd); the starter's ``-a`` names the slot, and the schedd must show the job
  the caller names running in exactly that slot (``RemoteHost``), so a job can ask only for itself;
- the caller's uid must be the job owner's (looked up in the caller's own root), when the owner has
  an account there (sites that run jobs as slot users skip this part);
- the job's instance is destroyed only for a caller in the slot that provisioned it (remembered in a
  root-only directory beside the journal, so across a restart of the agent too).

Instances are destroyed when the job leaves its slot: the wrapper asks at the job's exit and on the
signals HTCondor sends for ``condor_rm``, ``condor_hold`` and an eviction; whatever the wrapper cannot
report (SIGKILL, a dead wrapper) the agent's reconcile sweeps, every ``reconcile_interval_s``, from the
schedd's view of which managed jobs still run on this node. The reports reach the controller through
HTCondor: the job's ``MigBatchTag`` (the agent's identity is a queue superuser) and the node's
``MigBatchAgent`` machine attribute (a node-local file a startd cron job publishes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import socketserver
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mig_batch.errors import MigBatchError
from mig_batch.node.agent import NodeAgent
from mig_batch.node.journal import Journal
from mig_batch.node.service import BURST_BACKLOG

log = logging.getLogger("mig-batch-agent")
RUNNING = 2  # JobStatus
STALE_SLOT_S = 600.0  # a remembered slot without a journal entry this old: its instance is long gone


class CallerRefused(MigBatchError):
    """The caller is not the job it names (or not in a slot of this node)."""


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    slot: str  # the starter's slot, e.g. slot1_1
    local_name: str  # the startd's -local-name ("" for the plain startd)


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1] if flag in args[:-1] else ""


def find_caller(pid: int, uid: int) -> Caller:
    """The slot ``pid`` runs in: its nearest ``condor_starter`` ancestor (root's, so a job cannot forge
    it) and that starter's startd."""
    current, seen = pid, 0
    while current > 1 and seen < 64:
        status = _status(current)
        if status.get("Name") == "condor_starter":
            starter_uid = int(status["Uid"].split()[0])
            slot = _after(_cmdline(current), "-a")
            parent = int(status["PPid"])
            if starter_uid != 0 or not slot or _status(parent).get("Name") != "condor_startd":
                raise CallerRefused(f"pid {pid}: its condor_starter {current} is not a root starter of a startd slot")
            return Caller(pid, uid, slot, _after(_cmdline(parent), "-local-name"))
        current, seen = int(status["PPid"]), seen + 1
    raise CallerRefused(f"pid {pid} runs in no HTCondor slot (no condor_starter among its parents)")


def owner_uid(pid: int, owner: str) -> int | None:
    """The uid of ``owner`` in the passwd file of ``pid``'s root (a chroot's own), None if unknown."""
    try:
        with open(f"/proc/{pid}/root/etc/passwd") as f:
            for line in f:
                fields = line.split(":")
                if len(fields) > 2 and fields[0] == owner:
                    return int(fields[2])
    except (OSError, ValueError):
        return None
    return None


class SlotGuard:
    """Decides whether a caller may provision or destroy a job's instance (see the module's text)."""

    def __init__(self, batch, node: str, local_name: str = "", settle_s: float = 10.0,
                 directory: Path | None = None, journal: Journal | None = None):  # fmt: skip
        self.batch, self.node, self.local_name, self.settle_s = batch, node, local_name, settle_s
        self.slots: dict[str, str] = {}  # job -> the slot that provisioned it
        # kept on disk too (root's, beside the journal): a restarted agent still takes the wrapper's epilog
        self.directory, self.journal = directory, journal
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        self._startd = ""

    def _remember(self, job: str, slot: str) -> None:
        self.slots[job] = slot
        if self.directory is None:
            return
        # drop those whose instance is gone (the sweep took it); not a fresh one, whose instance another
        # thread may be making right now (not journaled yet)
        stale = time.time() - STALE_SLOT_S
        for old in self.directory.iterdir():
            with contextlib.suppress(OSError):
                if self.journal is not None and self.journal.get(old.name) is None and old.stat().st_mtime < stale:
                    old.unlink()
        (self.directory / job).write_text(slot)

    def _recalled(self, job: str) -> str | None:
        if job in self.slots or self.directory is None:
            return self.slots.get(job)
        try:
            return (self.directory / job).read_text()
        except OSError:
            return None

    def _forget(self, job: str) -> None:
        self.slots.pop(job, None)
        if self.directory is not None:
            (self.directory / job).unlink(missing_ok=True)

    def startd(self) -> str:
        """This node's startd name as HTCondor writes it in RemoteHost (``nodeb@migpool``)."""
        if not self._startd:
            for ad in self.batch._startds():
                if str(ad.get("MigBatchNodeName")) == self.node and "@" in str(ad.get("Name", "")):
                    self._startd = str(ad["Name"]).partition("@")[2]
                    break
        if not self._startd:
            raise CallerRefused(f"the collector knows no startd with MigBatchNodeName {self.node!r}")
        return self._startd

    def check_prolog(self, caller: Caller, job: str) -> None:
        if caller.local_name != self.local_name:
            raise CallerRefused(f"caller in a slot of startd {caller.local_name or '(plain)'}, not of {self.node}")
        want = f"{caller.slot}@{self.startd()}"
        deadline = time.monotonic() + self.settle_s  # the schedd may record the start a moment later
        while True:
            ad = self._ad(job)
            if ad is None:
                raise CallerRefused(f"no job {job} in the queue")
            if int(ad.get("JobStatus", 0)) == RUNNING and ad.get("RemoteHost") == want:
                break
            if time.monotonic() > deadline:
                raise CallerRefused(f"job {job} is not running in {want} (status {ad.get('JobStatus')}, "
                                    f"RemoteHost {ad.get('RemoteHost')})")  # fmt: skip
            time.sleep(0.3)
        expected = owner_uid(caller.pid, str(ad.get("Owner", "")))
        if expected is not None and expected != caller.uid:
            raise CallerRefused(f"caller uid {caller.uid} is not job {job}'s owner {ad.get('Owner')} ({expected})")
        self._remember(job, caller.slot)

    def check_epilog(self, caller: Caller, job: str) -> None:
        if caller.local_name != self.local_name or self._recalled(job) != caller.slot:
            raise CallerRefused(f"job {job}'s instance was not made for slot {caller.slot}; the reconcile "
                                "destroys it once the job left its slot")  # fmt: skip
        self._forget(job)

    def _ad(self, job: str) -> dict | None:
        with self.batch._call(f"read job {job}"):
            ads = self.batch.schedd.query(constraint=_job_constraint(job),
                                          projection=["JobStatus", "RemoteHost", "Owner"])  # fmt: skip
        return self.batch._plain(ads[0]) if ads else None


def peer(sock: socket.socket) -> tuple[int, int]:
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


def exports_env(lines: Sequence[str]) -> dict[str, str]:
    """``export NAME=value`` lines (the agent's job environment) as a mapping."""
    return dict(line.removeprefix("export ").split("=", 1) for line in lines if "=" in line)


def _job_constraint(job: str) -> str:
    from mig_batch.htcondor.adapter import _job_constraint as constraint

    return constraint(job)


class _Handler(socketserver.StreamRequestHandler):
    server: WrapperServer

    def handle(self) -> None:
        agent, guard = self.server.agent, self.server.guard
        try:
            request = json.loads(self.rfile.readline(65536) or b"{}")
            op, job = request.get("op"), str(request.get("job", ""))
            t0 = time.perf_counter()
            if op == "ping":
                self._answer(True, f"agent for {agent.node} up since {agent.started:.0f}")
                return
            if op not in ("prolog", "epilog"):
                self._answer(False, f"unknown op {op!r}; known: ping, prolog, epilog")
                return
            _job_constraint(job)  # a cluster.proc id, nothing else (it names files below)
            caller = find_caller(*peer(self.request))
            if op == "prolog":
                guard.check_prolog(caller, job)
                result = agent.prolog(job)
                detail = result.problem or (result.report.text() if result.report else "nothing to do")
                env = exports_env(result.exports)
                self._answer(env.get("CUDA_VISIBLE_DEVICES", "").startswith("MIG-"), detail, env)
            else:
                guard.check_epilog(caller, job)
                detail = agent.epilog(job)
                self._answer(True, detail)
            log.info("job %s %s %.0f ms (slot %s): %s", job, op, (time.perf_counter() - t0) * 1e3, caller.slot, detail)
        except CallerRefused as exc:
            log.warning("refused: %s", exc)
            self._answer(False, f"refused: {exc}")
        except (OSError, ValueError, KeyError, MigBatchError) as exc:
            log.warning("request failed: %s: %s", type(exc).__name__, exc)
            with contextlib.suppress(OSError):
                self._answer(False, f"{type(exc).__name__}: {exc}")

    def _answer(self, ok: bool, detail: str, env: dict[str, str] | None = None) -> None:
        self.wfile.write(json.dumps({"ok": ok, "detail": detail, "env": env or {}}).encode() + b"\n")


class WrapperServer(socketserver.ThreadingUnixStreamServer):
    """The agent's socket for job wrappers: mode 0666 (the wrappers run as job users); every request
    is checked by :class:`SlotGuard` from the peer's credentials."""

    daemon_threads = True
    request_queue_size = BURST_BACKLOG

    def __init__(self, path: Path, agent: NodeAgent, guard: SlotGuard):
        self.agent, self.guard = agent, guard
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o666)


def agent_main(argv: Sequence[str] | None = None) -> int:
    """``mig-batch-htcondor-agent``: the node agent of an HTCondor execute node (root, systemd)."""
    from mig_batch.entry import run_guarded

    return run_guarded(_agent, argv, "mig-batch-htcondor-agent")


def _agent(argv: list[str]) -> int:
    from mig_batch.config import load_config, open_backend
    from mig_batch.entry import DEBUG_HELP, LOG_LEVELS, log_level
    from mig_batch.htcondor.adapter import HTCondorBatch

    parser = argparse.ArgumentParser(prog="mig-batch-htcondor-agent",
                                     description="mig_batch node agent for an HTCondor execute node")  # fmt: skip
    parser.add_argument("--config", help="site config (default: MIG_BATCH_CONFIG or /etc/mig-batch/mig-batch.yaml)")
    parser.add_argument("--node", default=socket.gethostname().split(".")[0],
                        help="this node's MigBatchNodeName (default: the short host name)")  # fmt: skip
    parser.add_argument("--startd-local-name", default="",
                        help="the -local-name of this node's startd when several run on one host")  # fmt: skip
    parser.add_argument("--log-level", type=log_level, default="INFO", help=f"one of {', '.join(LOG_LEVELS)}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config(args.config)
    batch = HTCondorBatch(config.htcondor_config or None, agent_file=config.htcondor_agent_file)
    node_dir = Path(str(config.node_dir).format(node=args.node))
    journal = Journal(node_dir / "journal", adopt_old_files=True)
    agent = NodeAgent(args.node, open_backend(config, args.node), journal, batch,
                      Path(str(config.job_dir).format(node=args.node)), config.policy,
                      config.atomize.checkpoint_margin_s)  # fmt: skip
    guard = SlotGuard(batch, args.node, args.startd_local_name, directory=node_dir / "slots", journal=journal)
    from mig_batch.node.service import serve

    server = WrapperServer(Path(str(config.agent_socket).format(node=args.node)), agent, guard)
    serve(server, agent, config.reconcile_interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(agent_main())
