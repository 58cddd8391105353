"""The hook side of the node agent: standard library only, run as a script (not imported through
the package), so that a Prolog or Epilog starts in milliseconds.

    python3 -I -S hook_client.py prolog|epilog JOB_ID SOCKET SLOW_PATH_COMMAND...

It asks the agent over its socket. When the agent does not answer, it runs SLOW_PATH_COMMAND (the same
work in-process, through the package) and says so in the log. It logs through syslog (journald on real
nodes) with the job id, and always exits 0: a failing hook drains the node.
"""

import json
import socket
import subprocess
import sys
import syslog

TIMEOUT_S = {"prolog": 120.0, "epilog": 120.0}


def ask(path: str, op: str, job: str) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT_S.get(op, 30.0))
        sock.connect(path)
        sock.sendall(json.dumps({"op": op, "job": job}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data.endswith(b"\n"):
        raise OSError("the agent closed the connection without an answer")  # it died mid-request
    return json.loads(data)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[1] not in ("prolog", "epilog"):
        sys.stderr.write("usage: hook_client.py prolog|epilog JOB_ID SOCKET SLOW_PATH_COMMAND...\n")
        return 0
    op, job, path, slow = argv[1], argv[2], argv[3], argv[4:]
    syslog.openlog(f"mig-batch-{op}", syslog.LOG_PID, syslog.LOG_DAEMON)
    if not job:
        return 0
    try:
        answer = ask(path, op, job)
        level = syslog.LOG_INFO if answer.get("ok") else syslog.LOG_WARNING
        syslog.syslog(level, f"job {job}: {answer.get('detail', answer)}")
        return 0
    except (OSError, ValueError) as exc:
        syslog.syslog(syslog.LOG_WARNING, f"job {job}: node agent unreachable at {path} ({exc}); slow path")
    if slow:
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
