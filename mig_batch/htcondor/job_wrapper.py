"""HTCondor's USER_JOB_WRAPPER for mig_batch: standard library only, installed as a copy (``mig-batch
htcondor install`` fills in SOCKET) and run by the starter as the job's user, with the job's argv.

An unmanaged job (no ``MigBatchTag`` in ``$_CONDOR_JOB_AD``) is exec'd as is. A managed one: ask the
node agent (``prolog``) for the instance the controller decided, export what it answers
(``CUDA_VISIBLE_DEVICES=MIG-<uuid>``; the wrapper runs last, so this overrides HTCondor's own GPU
variables), run the job as a child, pass on the signals HTCondor sends (condor_rm, condor_hold, an
eviction: SIGTERM, or the job's KillSig), and when the child is gone ask the agent to destroy the
instance (``epilog``); a SIGKILL of this wrapper leaves that to the agent's sweep. When no instance
could be made, the job does not run: the wrapper waits for the controller to requeue it (the agent
reported the reason into the job's tag), and after ``REQUEUE_WAIT_S`` gives up through HTCondor's
wrapper error file, which holds the job with the reason.

A job over several instances (``+MigRequest = "1g.10gb:4"``) gets every instance: ``CUDA_VISIBLE_DEVICES`` of
rank 0, ``MIG_BATCH_INSTANCES`` (every UUID in rank order), ``MIG_BATCH_INSTANCE_COUNT`` and ``MIG_BATCH_SPOTS``
as the agent answers, and ``MIG_BATCH_BIND``, this wrapper's path. HTCondor starts one process and has no
TaskProlog, so the job starts one process per instance and binds each to its own: ``"$MIG_BATCH_BIND" --rank
CMD...`` reads the process's local rank (torchrun's ``LOCAL_RANK``, Open MPI's ``OMPI_COMM_WORLD_LOCAL_RANK``,
MPICH's ``MPI_LOCALRANKID``, else ``MIG_BATCH_RANK``), sets ``CUDA_VISIBLE_DEVICES`` and ``MIG_BATCH_INSTANCE``
to that rank's and execs CMD. It only reads the job's own environment and never asks the agent: each instance
is fenced to the job's owner anyway.

A subjob of a chain (``migsub --atomize``: ``atomize=1`` in the tag, and a window in the agent's answer,
``MIG_BATCH_DEADLINE``) is run the way Slurm's subjob runner runs one (:mod:`mig_batch.subjob.runner`): in a
process group of its own with USR1 ignored until the training installs its handler, warned with USR1
``MIG_BATCH_CHECKPOINT_MARGIN`` seconds before the deadline, SIGTERM at the deadline plus ``SUBJOB_GRACE_S``
and SIGKILL 5 s later; ``MIG_BATCH_CHECKPOINT_DIR`` is the tag's ``ckpt``. Its exit status goes to HTCondor
as is: 0 ends the chain, any other is held by the chain's exit policy for mig-batchd (docs/htcondor.md,
"Subjob chains"). It samples no GPU memory (the wrapper has no NVML): admission uses the declared size.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from types import FrameType
from typing import Any

SOCKET = "/run/mig-batch/agent.sock"  # filled in at install; "{node}" is the node's MigBatchNodeName
AGENT_RETRY_S = 60.0  # the agent restarting (systemd: RestartSec=5) is waited for this long
REQUEUE_WAIT_S = 300.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
RANK_FLAG = "--rank"  # "$MIG_BATCH_BIND" --rank CMD...: one rank process bound to its own instance
RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MIG_BATCH_RANK")  # the first set wins
SUBJOB_GRACE_S = 5.0  # a subjob still running this long after its deadline gets SIGTERM (the runner's --grace)
SUBJOB_KILL_S = 5.0  # ... and SIGKILL this long after that
POLL_S = 0.1


def read_ad(path: str | None) -> dict[str, str]:
    """``Name = value`` lines of a ClassAd file; string values unquoted, others as text."""
    ad: dict[str, str] = {}
    if path is None:  # no such file
        return ad
    try:
        with open(path) as f:
            for line in f:
                name, sep, value = line.partition(" = ")
                if sep:
                    value = value.strip()
                    if len(value) >= 2 and value[0] == value[-1] == '"':
                        value = value[1:-1].replace('\\"', '"')
                    ad[name.strip()] = value
    except (OSError, TypeError):
        pass
    return ad


def ask(path: str, op: str, job: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """The agent's answer (a dict); OSError when it does not answer, ValueError when the answer is
    not a JSON object."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(json.dumps({"op": op, "job": job}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise OSError("the agent closed the connection without an answer")
            data += chunk
    answer = json.loads(data)
    if not isinstance(answer, dict):
        raise ValueError(f"the agent answered {data[:80]!r}, not a JSON object")
    return answer


def ask_patiently(path: str, op: str, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + AGENT_RETRY_S
    while True:
        try:
            return ask(path, op, job)
        except (OSError, ValueError) as exc:  # a garbled answer: as if the agent were down
            if time.monotonic() > deadline:
                return {"ok": False, "detail": f"node agent unreachable at {path}: {exc}"}
            time.sleep(1.0)


def say(text: str) -> None:
    sys.stderr.write(f"mig-batch wrapper: {text}\n")
    sys.stderr.flush()


def give_up(reason: str) -> int:
    """HTCondor holds the job with ``reason`` (the starter reads the wrapper error file)."""
    path = os.environ.get("_CONDOR_WRAPPER_ERROR_FILE")
    if path:
        with open(path, "w") as f:
            f.write(f"mig-batch: {reason}\n")
    say(reason)
    return 1


def tag_fields(tag: str) -> dict[str, str]:
    """``name=value`` fields of a ``MigBatchTag`` (after its ``mig-batch:v1`` head)."""
    return dict(f.split("=", 1) for f in tag.split(";")[1:] if "=" in f)


def run_child(argv: list[str], deadline: float | None = None, margin: float = 0.0) -> int:
    """Run the job with the signals passed on; its wait status. With a ``deadline`` (a subjob's window), the
    job runs in a process group of its own, USR1 ignored until it installs a handler, and is warned, stopped
    and killed as the module's text says."""
    pid = os.fork()
    if pid == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        if deadline is not None:
            os.setsid()  # the warning reaches the training under the job's shell
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # an early USR1 must not kill it while it starts
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            say(f"cannot run {argv[0]}: {exc}")
            os._exit(127)

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if deadline is not None:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    warned = terminated = False
    while True:
        try:
            done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if done:
            return status
        assert deadline is not None
        now = time.time()
        if not warned and now >= deadline - margin:
            warned = True
            forward(signal.SIGUSR1, None)
        if not terminated and now >= deadline + SUBJOB_GRACE_S:
            terminated = True
            forward(signal.SIGTERM, None)
        if terminated and now >= deadline + SUBJOB_GRACE_S + SUBJOB_KILL_S:
            forward(signal.SIGKILL, None)
        time.sleep(POLL_S)


def wait_for_requeue(detail: str) -> int:
    """The agent could not make the instance; the controller holds the job (SIGTERM ends this)."""
    say(f"no MIG instance ({detail}); waiting for mig-batchd to requeue the job")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    time.sleep(REQUEUE_WAIT_S)
    return give_up(f"no MIG instance and no requeue within {REQUEUE_WAIT_S:.0f}s: {detail}")


def bind_rank(command: list[str]) -> int:
    """Exec ``command`` on its local rank's instance (see the module's text); 2 with a message when it has
    no rank or the job no instance of that rank."""
    if not command:
        say(f"{RANK_FLAG}: give the command to run on the rank's instance")
        return 2
    name = next((var for var in RANK_VARS if os.environ.get(var, "").strip()), "")
    if not name:
        say(f"{RANK_FLAG}: no local rank in the environment ({', '.join(RANK_VARS)})")
        return 2
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    uuids = os.environ.get("MIG_BATCH_INSTANCES", visible if visible.startswith("MIG-") else "").split(",")
    spots = os.environ.get("MIG_BATCH_SPOTS", os.environ.get("MIG_BATCH_INSTANCE", "")).split(",")
    text = os.environ[name].strip()
    if not text.isdigit() or int(text) >= len(uuids) or not uuids[int(text)].startswith("MIG-"):
        say(f"{RANK_FLAG}: {name}={text} is not a rank of this job's {len([u for u in uuids if u])} MIG instance(s)")
        return 2
    rank = int(text)
    os.environ.update({"CUDA_VISIBLE_DEVICES": uuids[rank], "MIG_BATCH_RANK": str(rank)})
    if rank < len(spots) and spots[rank]:
        os.environ["MIG_BATCH_INSTANCE"] = spots[rank]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        say(f"cannot run {command[0]}: {exc}")
    return 127


def main(argv: list[str]) -> int:
    command = argv[1:]
    if command[:1] == [RANK_FLAG]:  # a rank process of the job, not the starter: bind it, ask nobody
        return bind_rank(command[1:])
    if not command:
        say("no job command given")
        return 1
    job_ad = read_ad(os.environ.get("_CONDOR_JOB_AD"))
    if "MigBatchTag" not in job_ad:  # not ours
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            say(f"cannot run {command[0]}: {exc}")
            return 127
    job = f"{job_ad.get('ClusterId', '')}.{job_ad.get('ProcId', '0')}"
    node = read_ad(os.environ.get("_CONDOR_MACHINE_AD")).get("MigBatchNodeName", "")
    path = SOCKET.replace("{node}", node)
    answer = ask_patiently(path, "prolog", job)
    env = answer.get("env") or {}
    if not answer.get("ok") or not str(env.get("CUDA_VISIBLE_DEVICES", "")).startswith("MIG-"):
        if str(answer.get("detail", "")).startswith(("refused", "node agent unreachable")):
            return give_up(str(answer.get("detail")))
        return wait_for_requeue(answer.get("detail", ""))
    os.environ.update({str(k): str(v) for k, v in env.items()})
    os.environ["MIG_BATCH_BIND"] = os.path.abspath(argv[0])  # "$MIG_BATCH_BIND" --rank CMD: a rank on its own
    deadline, margin = None, 0.0
    fields = tag_fields(job_ad.get("MigBatchTag", ""))
    if fields.get("atomize") == "1" and env.get("MIG_BATCH_DEADLINE"):  # a chain's subjob, in its window
        try:
            deadline, margin = float(env["MIG_BATCH_DEADLINE"]), float(env.get("MIG_BATCH_CHECKPOINT_MARGIN") or 0)
        except ValueError:
            say(f"no window kept: the agent's deadline {env['MIG_BATCH_DEADLINE']!r} is no number")
        if fields.get("ckpt"):
            os.environ["MIG_BATCH_CHECKPOINT_DIR"] = fields["ckpt"]
    status = run_child(command, deadline, margin)
    done = ask_patiently(path, "epilog", job)
    if not done.get("ok"):
        say(f"epilog: {done.get('detail')}")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP take no handler
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # the job's own death, as HTCondor would have seen it
        return 128 + sig  # a signal this process survives (one ignored since before exec)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
