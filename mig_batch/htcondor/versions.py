"""Which HTCondor releases mig_batch supports and is tested on: the Python bindings (``htcondor2.version()``)
and the pool's daemons (a daemon ad's ``CondorVersion``). Light: no bindings import here, so ``doctor`` and
the tests read it without them. See docs/htcondor.md, "Bindings"."""

from __future__ import annotations

import re

# The bindings mig_batch starts with: the 24.0 LTS on, below 26 (the [htcondor] extra's range, pyproject.toml).
# Any other release is refused at start (adapter.check_bindings): untried, and the bindings' API moves between
# series (24.0's Schedd.submit fails a description without queue arguments: adapter.HTCondorBatch.submit).
BINDINGS_FROM, BINDINGS_BELOW = (24, 0), (26, 0)
BINDINGS_RANGE = f"htcondor>={BINDINGS_FROM[0]}.{BINDINGS_FROM[1]},<{BINDINGS_BELOW[0]}"
# the bindings releases (MAJOR.MINOR) the HTCondor test modules ran with against the test pool (docs/htcondor.md)
TESTED_BINDINGS = ("24.0", "24.12", "25.0", "25.14")
# the daemons' releases the test pool has run the HTCondor tests on (tests/harness/htcondor_pool.py: sid's minicondor;
# trixie's 23.9.6 with MIG_BATCH_HTCONDOR_SUITE=trixie and in tests/test_htcondor_bindings_range.py)
TESTED_DAEMONS = ("23.9", "25.14")

_CONDOR_VERSION = re.compile(r"\$CondorVersion:\s*(\d+\.\d+\.\d+)")
_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.|$)")


def version_in(text: str) -> str | None:
    """``$CondorVersion: 24.0.24 2026-09-24 BuildID: ... $`` (bindings' ``version()``, an ad's ``CondorVersion``)
    -> ``24.0.24``; None when the text names none."""
    found = _CONDOR_VERSION.search(text)
    return found.group(1) if found else None


def release_of(version: str) -> tuple[int, int] | None:
    """``24.0.24`` -> ``(24, 0)``; None for a text that is not a version."""
    found = _RELEASE.match(version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _name(release: tuple[int, int]) -> str:
    return f"{release[0]}.{release[1]}"


def supported_bindings(version: str | None) -> bool:
    """Whether mig_batch starts with bindings of ``version`` (the range, tested or not)."""
    release = release_of(version) if version else None
    return release is not None and BINDINGS_FROM <= release < BINDINGS_BELOW


def refusal(version_text: str) -> str:
    """Why bindings whose ``version()`` says ``version_text`` are refused, and what to install."""
    have = version_in(version_text) or repr(version_text[:60])
    return (f"HTCondor Python bindings {have} are not a release mig_batch supports ({_name(BINDINGS_FROM)} or "
            f"later, below {_name(BINDINGS_BELOW)}; tested: {', '.join(TESTED_BINDINGS)}): "
            f"pip install '{BINDINGS_RANGE}'")  # fmt: skip


def bindings_note(version: str | None) -> str:
    """What a sysadmin should know of the bindings ``version``: supported, tested, or neither."""
    tested = ", ".join(TESTED_BINDINGS)
    if version is None:
        return f"bindings of no known version (mig_batch is tested with {tested})"
    if not supported_bindings(version):
        return f"bindings {version}, which mig_batch refuses (it takes {BINDINGS_RANGE})"
    release = release_of(version)
    if release is not None and _name(release) in TESTED_BINDINGS:
        return f"bindings {version}, a release mig_batch is tested with"
    return f"bindings {version}, in the supported range but not tested (tested: {tested}; see docs/htcondor.md)"


def daemons_note(version: str | None, who: str = "daemons") -> str:
    """What a sysadmin should know of the pool's ``who`` (schedd, collector) at ``version``."""
    tested = ", ".join(TESTED_DAEMONS)
    if version is None:
        return f"{who} of no reported version (mig_batch is tested against {tested})"
    release = release_of(version)
    if release is not None and _name(release) in TESTED_DAEMONS:
        return f"{who} {version}, a release mig_batch is tested against"
    return f"{who} {version}, not a release mig_batch is tested against (tested: {tested}; see docs/htcondor.md)"


def pool_versions(condor_config: str = "") -> tuple[str | None, dict[str, str | None], str]:
    """What this host's bindings and pool say: the bindings' version (None: no bindings), each daemon's
    version (``collector``, ``schedd``: what their ads report; left out when the collector has no such ad)
    and why the pool could not be asked ("" when it could). ``condor_config``: the client config to ask
    with (this process's CONDOR_CONFIG otherwise)."""
    import os
    import warnings

    if condor_config:
        os.environ["CONDOR_CONFIG"] = condor_config  # read at the bindings' import (one config per process)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CONDOR_CONFIG is unset": the collector query below says what matters
            import htcondor2
    except ImportError as exc:
        return None, {}, f"no HTCondor bindings: {exc}"
    if condor_config:
        htcondor2.reload_config()  # imported earlier in this process with another config
    bindings = version_in(htcondor2.version())
    daemons: dict[str, str | None] = {}
    try:
        collector = htcondor2.Collector()
        for who, ad_type in (("collector", htcondor2.AdType.Collector), ("schedd", htcondor2.AdType.Schedd)):
            ads = collector.query(ad_type, projection=["Name", "CondorVersion"])
            if ads:  # left out when none answers: the collector knows no such daemon
                found = sorted({version_in(str(ad.get("CondorVersion", ""))) or "" for ad in ads})
                daemons[who] = ", ".join(v for v in found if v) or None
    except Exception as exc:  # the bindings raise HTCondorException and others; any is the finding
        return bindings, daemons, f"the collector does not answer: {type(exc).__name__}: {exc}"
    return bindings, daemons, ""
