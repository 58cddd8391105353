"""The hook side of the node agent: standard library only, run as a script (not imported through
the package), so that a Prolog or Epilog starts in milliseconds.

    python3 -I -S hook_client.py prolog|epilog JOB_ID SOCKET SLOW_PATH_COMMAND...

It asks the agent over its socket. When the agent does not answer, it runs SLOW_PATH_COMMAND (the same
work in-process, through the package) and says so in the log. It logs through syslog (journald on real
nodes) with the job id, and always exits 0: a failing hook drains the node.

Every job pays this start twice, so it imports only C modules (``_socket``, ``syslog``, ``time``): json, socket
and subprocess would triple its start-up. The request is one JSON line written by hand; the answer
is logged as the agent sent it.
"""

import _socket
import sys
import syslog
import time

TIMEOUT_S = {"prolog": 120.0, "epilog": 120.0}


def ask(path: str, op: str, job: str, timeout_s: float | None = None) -> tuple[bool, str]:
    """(ok, the agent's answer line); OSError when the agent does not answer."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        timeout = timeout_s or TIMEOUT_S.get(op, 30.0)
        sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock.connect(path)
                break
            except BlockingIOError:  # the agent's backlog is full (a burst of job starts): wait for room
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
        sock.sendall(b'{"op": "%s", "job": "%s"}\n' % (op.encode(), job.encode()))
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    if not data.endswith(b"\n"):
        raise OSError("the agent closed the connection without an answer")  # it died mid-request
    return b'"ok": true' in data, data.decode(errors="replace").strip()


def safe_job_id(job: str) -> bool:
    """Slurm's job ids (also 123_4 and 123+1): nothing that could break the hand-written JSON."""
    return 0 < len(job) <= 64 and all(c.isascii() and (c.isalnum() or c in "_+.-") for c in job)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[1] not in ("prolog", "epilog"):
        sys.stderr.write("usage: hook_client.py prolog|epilog JOB_ID SOCKET SLOW_PATH_COMMAND...\n")
        return 0
    op, job, path, slow = argv[1], argv[2], argv[3], argv[4:]
    syslog.openlog(f"mig-batch-{op}", syslog.LOG_PID, syslog.LOG_DAEMON)
    if not safe_job_id(job):
        syslog.syslog(syslog.LOG_WARNING, f"job id {job!r} is not a Slurm job id; nothing asked")
        return 0
    try:
        ok, answer = ask(path, op, job)
        trouble = not ok or "node=requeue:" in answer  # the prolog could not place the job: an operator's concern
        syslog.syslog(syslog.LOG_WARNING if trouble else syslog.LOG_INFO, f"job {job}: {answer}")
        return 0
    except OSError as exc:
        syslog.syslog(syslog.LOG_WARNING, f"job {job}: node agent unreachable at {path} ({exc}); slow path")
    if slow:
        import subprocess  # only on the slow path: its import costs more than the whole fast path

        try:
            proc = subprocess.run(slow, capture_output=True, text=True, timeout=TIMEOUT_S[op])
            detail = (proc.stdout.strip() or proc.stderr.strip() or f"exit {proc.returncode}")[-500:]
            level = syslog.LOG_INFO if proc.returncode == 0 else syslog.LOG_ERR
            syslog.syslog(level, f"job {job} (slow path): {detail}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            syslog.syslog(syslog.LOG_ERR, f"job {job}: slow path failed: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
