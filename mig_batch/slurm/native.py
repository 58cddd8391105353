"""The Slurm calls made once per job, through libslurm instead of a command: the helper library
``plugins/slurm/mig-batch-slurm.c``, built by ``mig-batch slurm install`` against the site's slurm.h and
named by the config's ``slurm_library``. Thin: each call is one Slurm RPC; no decisions."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time

NO_VAL = 0xFFFFFFFE
ABI_VERSION = 5  # mb_abi_version() of plugins/slurm/mig-batch-slurm.c this module calls
PROBE_TIMEOUT_S = 30.0
INVALID_JOB_ID = 2017  # ESLURM_INVALID_JOB_ID: Slurm no longer (or never) knew the job
NO_CHANGE_IN_DATA = 1900  # SLURM_NO_CHANGE_IN_DATA: nothing changed since the stamp given
_loaded: dict[str, SlurmApi] = {}
_lock = threading.Lock()
log = logging.getLogger("mig-batch")


class SlurmApiError(Exception):
    """A call Slurm refused or could not answer: ``code`` is Slurm's error number."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code

    @property
    def answered(self) -> bool:
        """Whether slurmctld answered about the job (ESLURM_*), not a failure to reach it, to hear its answer
        in time or to authenticate (socket and protocol errors, 5000-5005 among them; ESLURM_AUTH_*)."""
        return 2000 <= self.code < 5000


def version_text(number: int) -> str:
    return f"{number >> 16}.{(number >> 8) & 0xFF:02d}.{number & 0xFF}"


class SlurmApi:
    """The helper library, loaded once per process and path; Slurm's configuration read once (``conf``, else
    ``SLURM_CONF``, else Slurm's default)."""

    def __init__(self, path: str, conf: str = ""):
        lib = _bind(path)
        # it links libslurm by its ABI version (libslurm.so.N): a Slurm whose structures differ has another N,
        # and loading fails in _bind
        lib.mb_init(conf.encode() if conf else None)
        self.path, self._lib = path, lib
        self.built_for = version_text(lib.mb_built_version())  # the Slurm release whose slurm.h it was built with

    @classmethod
    def load(cls, path: str, conf: str = "") -> SlurmApi:
        """The library at ``path``, loaded once per process; ``OSError`` says why it cannot be."""
        with _lock:
            if path not in _loaded:
                # libslurm writes an array's pending tasks as text cut at this many characters (64 by default),
                # when it loads jobs in this process: 0 writes them in full (a cut list names no task)
                os.environ["SLURM_BITSTR_LEN"] = "0"
                _loaded[path] = cls(path, conf)
            return _loaded[path]

    def _error(self, code: int, what: str) -> SlurmApiError:
        """As scontrol words it: "<Slurm's message> for job <id>"."""
        return SlurmApiError(code, f"{self._lib.mb_strerror(code).decode(errors='replace')} {what}")

    def job_lines(self, job_id: int) -> str:
        """The job's records as squeue's lines (``FIELDS`` of commands.py); "" when Slurm does not know it."""
        buffer = ctypes.c_void_p()
        code = self._lib.mb_job_lines(job_id, ctypes.byref(buffer))
        text = self._take(buffer)
        if code == INVALID_JOB_ID:
            return ""
        if code:
            raise self._error(code, f"for job {job_id}")
        return text

    def all_job_lines(self, since: int = 0) -> tuple[str | None, int]:
        """(every job's records as squeue's lines, slurmctld's stamp of them); (None, ``since``) when no job
        changed since that earlier stamp (0: read them anyway)."""
        buffer, stamp = ctypes.c_void_p(), ctypes.c_int64(since)
        code = self._lib.mb_all_job_lines(since, ctypes.byref(stamp), ctypes.byref(buffer))
        text = self._take(buffer)
        if code == NO_CHANGE_IN_DATA:
            return None, since
        if code:
            raise self._error(code, "reading the jobs")
        return text, stamp.value

    def _take(self, buffer: ctypes.c_void_p) -> str:
        """The C string the library allocated, freed."""
        if not buffer.value:
            return ""
        try:
            return ctypes.string_at(buffer).decode(errors="surrogateescape")
        finally:
            self._lib.mb_free(buffer)

    def update_job(self, job_id: str, nodes: str | None = None, admin_comment: str | None = None,
                   time_limit_min: int | None = None, start_now: bool = False, tres_per_node: str | None = None,
                   release: bool = False) -> None:  # fmt: skip
        """One update RPC; None leaves a field as it is. Slurm applies the nodes, AdminComment and time limit
        before ``release`` and stops at a field it refuses; the TRES and start time come after it."""
        code = self._lib.mb_update_job(job_id.encode(), _c(nodes), _c(admin_comment),
                                       NO_VAL if time_limit_min is None else time_limit_min, int(start_now),
                                       _c(tres_per_node), int(release))  # fmt: skip
        if code:
            raise self._error(code, f"for job {job_id}")


def _c(text: str | None) -> bytes | None:
    return None if text is None else text.encode(errors="surrogateescape")


def open_api(path: str, env: dict[str, str] | None = None) -> SlurmApi | None:
    """The helper at ``path`` (the config's ``slurm_library``; "": none) for a long-lived process, Slurm's
    configuration read from ``env``'s ``SLURM_CONF`` (once: restart the process after changing where
    slurmctld is); None, with a warning saying why, when it cannot be loaded: Slurm's commands then do its
    work."""
    if not path:
        return None
    conf = (env or os.environ).get("SLURM_CONF", "")
    try:
        probe(path, conf)
        return SlurmApi.load(path, conf)
    except OSError as exc:
        log.warning("slurm_library %s cannot be loaded (%s); using Slurm's commands. Build it again with "
                    "`mig-batch slurm install`, or leave slurm_library out of the config", path, exc)
        return None


def probe(path: str, conf: str) -> None:
    """Load the library and read Slurm's configuration in a child first: libslurm ends the process it runs in
    when it cannot read that configuration."""
    if path in _loaded:
        return
    _bind(path)  # a missing, foreign or outdated file: its own reason, here
    child = os.fork()
    if child == 0:
        code = 1
        try:
            SlurmApi(path, conf)
            code = 0
        finally:
            os._exit(code)
    where = conf or "Slurm's default slurm.conf"
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while (status := os.waitpid(child, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:  # e.g. looking up a configless controller in a DNS that never answers
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise OSError(f"libslurm did not start with {where} within {PROBE_TIMEOUT_S:.0f} s")
        time.sleep(0.01)
    if status[1] != 0:
        raise OSError(f"libslurm could not start with {where} (exit status {os.waitstatus_to_exitcode(status[1])})")


def _bind(path: str) -> ctypes.CDLL:
    """The library with its functions' types; ``OSError`` when it is missing, built against a libslurm this
    host no longer has, or built by another mig_batch (another interface)."""
    # global: the plugins libslurm loads (auth, hash) look its symbols up there
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    try:
        lib.mb_abi_version.restype = ctypes.c_int
        abi = lib.mb_abi_version()
    except AttributeError:
        abi = 0
    if abi != ABI_VERSION:
        raise OSError(f"{path} was built by another mig_batch (interface {abi}, this one needs {ABI_VERSION}): "
                      "run `mig-batch slurm install` again")  # fmt: skip
    for name, restype, argtypes in (
        ("mb_built_version", ctypes.c_long, []),
        ("mb_init", None, [ctypes.c_char_p]),
        ("mb_free", None, [ctypes.c_void_p]),
        ("mb_strerror", ctypes.c_char_p, [ctypes.c_int]),
        ("mb_job_lines", ctypes.c_int, [ctypes.c_uint32, ctypes.POINTER(ctypes.c_void_p)]),
        ("mb_all_job_lines", ctypes.c_int, [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                                            ctypes.POINTER(ctypes.c_void_p)]),
        ("mb_update_job", ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32,
                                         ctypes.c_int, ctypes.c_char_p, ctypes.c_int]),
    ):  # fmt: skip
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib
