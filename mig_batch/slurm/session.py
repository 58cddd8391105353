"""One long-lived interactive ``scontrol`` for a long-lived caller (the node agent): each command is a line
on its stdin, not a process of its own (a process costs ~2.5 ms of CPU, a line ~0.5 ms).

scontrol, reading a pipe, prints its prompt on stdout after every command: the prompt ends the command.
What it wrote to stderr by then is the answer (its errors; stdout carries only readline's echo, which a
terminal without TERM may fold, so it is not read for answers). The session is restarted after
``max_age_s`` (a changed slurm.conf is read again) and after any failure; when scontrol prints no prompt
at all (a build without readline), the session says it is not usable and the caller runs its own
processes, as before.
"""

from __future__ import annotations

import logging
import os
import selectors
import subprocess
import threading
import time

from mig_batch.batch.system import BatchError

log = logging.getLogger("mig-batch")
PROMPT = b"scontrol: "


class SessionError(BatchError):
    """The command's fate is unknown: the session ended or did not answer in time."""


class SessionBroken(SessionError):
    """scontrol ended or its pipe broke before it read the command: sending it again is safe."""


class ScontrolSession:
    """A long-lived ``scontrol`` reading commands on a pipe; one command at a time (thread-safe)."""

    def __init__(self, exe: str, env: dict[str, str] | None = None, timeout_s: float = 30,
                 max_age_s: float = 300) -> None:  # fmt: skip
        self.exe, self.timeout_s, self.max_age_s = exe, timeout_s, max_age_s
        # readline on a pipe: no init file of the host's, no folding of long lines
        self.env = {**(env or os.environ), "INPUTRC": "/dev/null", "COLUMNS": "100000", "TERM": "dumb"}
        self.usable = True  # False once scontrol printed no prompt: callers run processes instead
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = 0.0

    def run(self, line: str, timeout_s: float | None = None) -> str:
        """What scontrol wrote to stderr for one command line ("" for a silent success). Raises
        :class:`SessionBroken` when the command was not sent and :class:`SessionError` when its fate is
        unknown; either way the next call starts a new scontrol."""
        if "\n" in line:
            raise ValueError("one command line at a time")
        with self._lock:
            try:
                if self._proc is None or time.monotonic() - self._started > self.max_age_s:
                    self._start()
                assert self._proc is not None and self._proc.stdin is not None
                try:
                    self._proc.stdin.write(line.encode() + b"\n")
                    self._proc.stdin.flush()
                except OSError as exc:  # scontrol is gone: it never read the line
                    raise SessionBroken(f"scontrol session: {exc}") from None
                self._wait_for_prompt(self.timeout_s if timeout_s is None else timeout_s)
                return self._drain_stderr().decode(errors="replace").strip()
            except BaseException:
                self._close_locked()
                raise

    def _start(self) -> None:
        self._close_locked()
        if not self.usable:
            raise SessionBroken("scontrol session: not usable here")
        try:
            self._proc = subprocess.Popen([self.exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=self.env, bufsize=0)  # fmt: skip
        except OSError as exc:  # no scontrol to run, or no process to spare: nothing was sent
            raise SessionBroken(f"scontrol session: {exc}") from None
        self._started = time.monotonic()
        try:
            self._wait_for_prompt(min(self.timeout_s, 5.0))
        except SessionError as exc:
            if self._proc.poll() is None:  # alive and silent: this scontrol prints no prompt on a pipe
                self.usable = False
                log.warning("scontrol printed no prompt on a pipe; each Slurm update runs its own scontrol")
            raise SessionBroken(str(exc)) from None  # nothing was sent yet
        self._drain_stderr()  # start-up warnings are no command's answer

    def _wait_for_prompt(self, timeout_s: float) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        fd, tail = self._proc.stdout.fileno(), b""
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while not tail.endswith(PROMPT):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise SessionError(f"scontrol session: no answer in {timeout_s:.1f} s")
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise SessionBroken(f"scontrol session: scontrol ended ({self._proc.poll()})")
                tail = (tail + chunk)[-len(PROMPT) :]

    def _drain_stderr(self) -> bytes:
        """What scontrol wrote to stderr so far (it wrote it before its prompt: nothing is waited for)."""
        assert self._proc is not None and self._proc.stderr is not None
        fd, out = self._proc.stderr.fileno(), b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while sel.select(0):
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                out += chunk
        return out

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
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
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
