"""The HTCondor bindings range (docs/htcondor.md, "Bindings"), cheaply: the newest 24.0 LTS and 25.0 LTS
bindings, each installed once into a cache (``pip install --target``, reused across runs), drive a real pool,
of sid's minicondor (the test extra's release) and of Debian trixie's 23.9.6. For each, in processes that
import those bindings first (PYTHONPATH): ``check_bindings`` takes them, migsub submits through them (24.0's
Schedd.submit needs the way round in HTCondorBatch.submit), mig-batchd and the node agent (restarted on them)
pin the job and make its instance, and the job runs on it; doctor names the versions. The test extra's own
25.x bindings run every other HTCondor test.

The cache: ``$MIG_BATCH_BINDINGS_CACHE`` or /var/cache/mig-batch/htcondor-bindings, one folder per release;
filling it needs the package index once (about 25 MB a release); the trixie image is built once beside sid's
(``$MIG_BATCH_HTCONDOR_CACHE``, about 50 s)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.htcondor_pool import CONDOR_VERSION, SUITE, Image, LocalPool

from mig_batch.gpu import nvml_emu
from mig_batch.htcondor import versions
from mig_batch.state import Store

WHY_NOT = LocalPool.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]

# the newest release of each LTS series on PyPI when measured (docs/htcondor.md); 25.x is the test extra's pin
RANGE = ("24.0.24", "25.0.14")

SCRIPT = """#!/bin/sh
#MIG --mig 1g.10gb
echo "$CUDA_VISIBLE_DEVICES"
"""


def bindings_dir(version: str) -> Path:
    """The folder holding ``htcondor==version`` (installed there on first use; a half-done install never counts)."""
    cache = Path(os.environ.get("MIG_BATCH_BINDINGS_CACHE", "/var/cache/mig-batch/htcondor-bindings"))
    target = cache / version
    if (target / "htcondor2").is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f".{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(partial),
                           f"htcondor=={version}"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"pip could not install htcondor=={version} into {partial}: {proc.stderr[-2000:]}"
    partial.rename(target)
    return target


@pytest.fixture(scope="module")
def bindings():
    """release -> the folder of its bindings; filled before the pool starts (a failed install costs no pool)"""
    return {version: bindings_dir(version) for version in RANGE}


@pytest.fixture(scope="module", params=list(dict.fromkeys([SUITE, "trixie"])))
def bed(request, bindings, tmp_path_factory):
    """A one-node testbed on the pool of each suite: sid's minicondor (the test extra's release), trixie's 23.9.6"""
    from harness.htcondor_testbed import HTCondorTestbed

    image = Image(suite=request.param)
    if why := LocalPool.available(image):
        pytest.skip(why)
    bed = HTCondorTestbed(tmp_path_factory.mktemp(f"htcondor-range-{request.param}"), nodes={"nodea": ["A100-80GB"]},
                          image=image)  # fmt: skip
    try:
        bed.start()
        yield bed
    finally:
        bed.stop()


def mapped_from(pid: int, folder: Path) -> bool:
    """Whether process ``pid`` has loaded a library from ``folder`` (the bindings' extension module)."""
    try:
        return str(folder) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def wait_for(what, timeout: float, pause: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(pause)
    raise AssertionError(f"not within {timeout}s: {what.__doc__ or what}")


@pytest.mark.parametrize("version", RANGE)
def test_a_release_of_the_range_submits_pins_and_runs_a_job_on_the_pool(bed, bindings, version, monkeypatch):
    folder = bindings[version]
    monkeypatch.setenv("PYTHONPATH", str(folder))  # every process the testbed starts from now imports these first
    started = time.monotonic()
    check = subprocess.run([sys.executable, "-c", "from mig_batch.htcondor.adapter import HTCondorBatch; "
                            "print(HTCondorBatch().htcondor.version())"], env=bed.user_env(), capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert versions.version_in(check.stdout) == version
    bed.stop_controller()
    bed.stop_agent("nodea")
    bed.start_agent("nodea")
    bed.start_controller()
    path = bed.pool.shared / f"range-{version}.sh"
    path.write_text(SCRIPT)
    path.chmod(0o755)
    out = bed.migsub(path).stdout
    assert re.fullmatch(r"\d+\.0\n", out), f"migsub printed more than the job id: {out!r}"  # 24.0 prints the job
    job = out.strip()
    assert mapped_from(bed.agents["nodea"].pid, folder), "the agent does not run on these bindings"
    wait_for(lambda: mapped_from(bed.controller.pid, folder), 30)  # it imports them when it opens the pool

    def ended():
        """the job's decision ended"""
        with Store.reading(bed.store_path) as store:
            decision = store.decision(job)
        return decision if decision is not None and decision.state == "ended" else None

    decision = wait_for(ended, 120, 0.5)
    seen = (bed.pool.shared / f"{path.name}.{job.split('.')[0]}.out").read_text().strip()
    made = [life for life in nvml_emu.lifetimes(bed.gpu_dir("nodea")) if seen in life.mig_uuids]
    assert decision.node == "nodea" and seen.startswith("MIG-") and len(made) == 1, (decision, seen)
    assert made[0].profile == decision.profile == "1g.10gb" and made[0].start == decision.start
    print(f"\n{version}: submitted, pinned and run in {time.monotonic() - started:.1f}s")


@pytest.mark.parametrize("version", [*RANGE[:1], "25.14.1"])  # 25.14.1: the venv's own (the test extra's pin)
def test_doctor_names_the_bindings_and_the_pools_daemons_and_whether_they_are_tested(bed, bindings, version,
                                                                                     monkeypatch):  # fmt: skip
    if version in bindings:
        monkeypatch.setenv("PYTHONPATH", str(bindings[version]))
    env = {**os.environ, "MIG_BATCH_CONFIG": str(bed.config_path)}
    env.pop("CONDOR_CONFIG", None)  # doctor reads the site config's htcondor_config
    doctor = Path(sys.executable).with_name("mig-batch")
    proc = subprocess.run([str(doctor), "doctor", "--role", "controller", "--json"], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)}
    daemons = versions.version_in(bed.pool.image.version())  # the image's condor_version
    pool = "; ".join(versions.daemons_note(daemons, who) for who in ("collector", "schedd"))
    expected = f"bindings {version}, a release mig_batch is tested with; {pool}"
    assert checks["htcondor"]["ok"] and checks["htcondor"]["detail"] == expected, checks["htcondor"]
    if daemons == CONDOR_VERSION:  # the recipe's minicondor (when sid moves on, a later one is named, untested)
        assert pool.count("a release mig_batch is tested against") == 2, pool
