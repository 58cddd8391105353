"""The NVML suite on the lowest nvidia-ml-py pyproject allows and on the newest tested, each in its own
process that finds the emulated libnvidia-ml by name on LD_LIBRARY_PATH, the way it finds a driver's."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mig_batch.gpu import nvml_emu

VERSIONS = ("12.535.161", "13.615.71")  # pyproject's lower bound; the newest on the package index when tested
REPO = Path(__file__).resolve().parents[1]


def _installed(version: str) -> Path:
    """nvidia-ml-py ``version`` in a directory of its own (cached between runs)."""
    target = nvml_emu._cache_root().parent / "nvidia-ml-py" / version
    if (target / "pynvml.py").exists():
        return target
    partial = target.with_name(f"{version}.partial-{os.getpid()}")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial),
                           f"nvidia-ml-py=={version}"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, f"pip could not install nvidia-ml-py=={version}:\n{done.stderr}"
    os.replace(partial, target)
    return target


def test_pyproject_allows_the_lowest_version_tested():
    assert f'"nvidia-ml-py>={VERSIONS[0]}"' in (REPO / "pyproject.toml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_nvml_suite_on_nvidia_ml_py(version, tmp_path):
    library = nvml_emu.build_library()
    env = {**os.environ, **nvml_emu.library_env(library, tmp_path), "PYTHONPATH": str(_installed(version))}
    which = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, pynvml; "
                            "print(m.version('nvidia-ml-py'), pynvml.__file__)"],
                           env=env, capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert which.stdout.split()[0] == version, which.stdout + which.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_nvml_emu.py", "tests/test_gpu_backends.py", "-k", "nvml_emu or nvml-emu"],
                         env=env, capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0 and "skipped" not in summary, run.stdout[-4000:] + run.stderr[-2000:]


@pytest.mark.slow
def test_slurm_jobs_on_the_lowest_nvidia_ml_py_skip_a_gpu_with_mig_mode_off(tmp_path):
    """The node agents and hooks of a real local Slurm on the lowest nvidia-ml-py; one of the node's two
    GPUs has MIG mode off: every job runs on the other, none is lost, and status says why."""
    import json

    from harness.slurm_cluster import LocalCluster, MigTestbed
    from test_slurm_e2e import assert_no_overlap_and_no_leak, by_mig_uuid, job_runs, job_script, submit, wait_done

    from mig_batch.state import Store

    if LocalCluster.available() is not None:
        pytest.skip(str(LocalCluster.available()))
    lowest = _installed(VERSIONS[0])
    with MigTestbed(tmp_path / "bed", nodes={"n1": ["A100-80GB", "A100-80GB"]}, mig_off={"n1": [1]},
                    node_pythonpath=str(lowest), hook_client="c",  # the shell shims' way (others: direct)
                    slurm_api=False) as bed:  # and Slurm's commands for the per-job calls (others: libslurm)
        (bed.root / "out").mkdir()
        seen = bed.in_node("n1", str(bed.node_python), "-c",
                           "import importlib.metadata as m, pynvml; print(m.version('nvidia-ml-py'), pynvml.__file__)")
        assert seen.stdout.split() == [VERSIONS[0], str(lowest / "pynvml.py")], seen.stdout + seen.stderr
        jobs = [submit(bed, job_script(bed, f"j{n}", "#MIG --mig 3g.40gb", seconds=1.0)) for n in range(5)]
        wait_done(bed, jobs, timeout=180)
        lives = by_mig_uuid(bed)
        for job, (cvd, _begin, _end) in job_runs(bed, jobs).items():
            assert cvd.startswith("MIG-") and lives[cvd].gpu == 0, f"job {job} saw {cvd!r}"
        assert_no_overlap_and_no_leak(bed)
        status = bed.cluster.run(sys.executable, "-m", "mig_batch.cli.main", "status", "--json", "--config",
                                 str(bed.controller_config))  # fmt: skip
        assert [g["mig_mode"] for g in json.loads(status.stdout)] == ["on", "off"]
        assert Store(bed.store_path).events(kind="mig-off", node="n1")[-1]["gpus"] == [1]
