"""One long-lived interactive ``scontrol`` for a long-lived caller (the node agent): each command is a line
on its stdin, not a process of its own (a process costs ~2.5 ms of CPU, a line ~0.4 ms).

scontrol, reading a pipe, echoes each line and prints its prompt after every command: the prompt ends the
answer, and whatever else the command printed (errors included: stderr is merged) is the answer. The
session is restarted after ``max_age_s`` (a changed slurm.conf is read again) and after any failure; when
scontrol prints no prompt at all (a build without readline), the session says it is not usable and the
caller runs its own processes, as before.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import threading
import time

from mig_batch.batch.system import BatchError

log = logging.getLogger("mig-batch")
PROMPT = b"scontrol: "


class SessionError(BatchError):
    pass


class ScontrolSession:
    def __init__(self, exe: str, env: dict[str, str] | None = None, timeout_s: float = 30, max_age_s: float = 300):
        self.exe, self.env, self.timeout_s, self.max_age_s = exe, env, timeout_s, max_age_s
        self.usable = True  # False once scontrol printed no prompt: callers run processes instead
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._started = 0.0

    def run(self, line: str) -> str:
        """What scontrol printed for one command line, its echo left out ("" for a silent success).
        Raises :class:`SessionError` (the next call starts a new scontrol)."""
        if "\n" in line:
            raise ValueError("one command line at a time")
        with self._lock:
            try:
                if self._proc is None or time.monotonic() - self._started > self.max_age_s:
                    self._start()
                assert self._proc is not None and self._proc.stdin is not None
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()
                answer = self._read_to_prompt()
            except (OSError, SessionError) as exc:
                self.close_locked()
                raise SessionError(f"scontrol session: {exc}") from None
        lines = answer.decode(errors="replace").splitlines()
        if lines and lines[0].strip() == line.strip():
            lines = lines[1:]  # readline's echo
        return "\n".join(lines).strip()

    def _start(self) -> None:
        self.close_locked()
        if not self.usable:
            raise SessionError("not usable here")
        self._proc = subprocess.Popen([self.exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=self.env, bufsize=0)  # fmt: skip
        self._started = time.monotonic()
        try:
            self._read_to_prompt(min(self.timeout_s, 5.0))
        except SessionError:
            self.usable = False
            log.warning("scontrol printed no prompt on a pipe; each Slurm update runs its own scontrol")
            raise

    def _read_to_prompt(self, timeout_s: float | None = None) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd, out = self._proc.stdout.fileno(), b""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while not out.endswith(PROMPT):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise SessionError(f"no answer in {self.timeout_s:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise SessionError(f"scontrol ended ({self._proc.poll()})")
            out += chunk
        return out[: -len(PROMPT)]

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def close_locked(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
