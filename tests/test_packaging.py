"""The built wheel holds everything mig_batch reads at run time and none of the test harness: a regular (not
editable) install, run from outside the checkout, lists the GPU models and writes the Slurm plugin files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("mig_batch/_etc/gpus/a100-80gb.yaml", "mig_batch/_etc/mig-batch.yaml",
           "mig_batch/_etc/slurm/gres.conf.snippet",
           "mig_batch/_etc/systemd/mig-batchd.service", "mig_batch/_etc/systemd/mig-batch-agent.service",
           "mig_batch/_etc/systemd/mig-batch-htcondor-agent.service",
           "mig_batch/_plugins/slurm/job_submit.lua.in", "mig_batch/_wrappers/mig-batch-prolog.in",
           "mig_batch/_wrappers/mig-batch-epilog.in", "mig_batch/_wrappers/mig-batch-taskprolog.in",
           "mig_batch/_wrappers/mig-batch-subjob.in")  # fmt: skip


def _run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"{command} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling (pip install '.[test]')")
    out = tmp_path_factory.mktemp("dist")
    # no build isolation: the test must not need the network; hatchling comes from the test extras
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, REPO, cwd=REPO)
    (built,) = out.glob("mig_batch-*.whl")
    return built


def test_wheel_holds_the_runtime_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in SHIPPED if name not in names]
    assert not missing, f"the wheel lacks {missing}"


def test_wheel_holds_no_test_harness(wheel: Path) -> None:
    """The real-Slurm and HTCondor harnesses serve tests only: they stay in tests/harness, out of the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        defining = [name for name in names if name.endswith(".py") and re.search(
            rb"^class (LocalCluster|MigTestbed|LocalPool|HTCondorTestbed)\b", archive.read(name), re.MULTILINE)]
    harness = [name for name in names if name.startswith("tests/") or "harness" in name.split("/")]
    assert not harness and not defining, f"the wheel holds the test harness: {harness + defining}"


def test_installed_wheel_works_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / "bin"
    # the dependencies come from this interpreter's site-packages (a plain path entry: its .pth files, the
    # editable install of mig_batch among them, are not processed), so no network is needed
    site = Path(sysconfig.get_paths(vars={"base": str(env_dir), "platbase": str(env_dir)})["purelib"])
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: the deps path may hold a mig_batch already (CI installs the wheel there too)
    _run(sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "-q", "--no-deps", "--no-index",
         "--ignore-installed", wheel, cwd=tmp_path)  # fmt: skip
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MIG_BATCH_GPU_DIRS", "MIG_BATCH_CONFIG")}

    where = _run(bin_dir / "python", "-c", "import mig_batch; print(mig_batch.__file__)", cwd=away, env=env)
    assert Path(where.strip()).is_relative_to(env_dir), f"mig_batch came from {where}, not the wheel's install"

    assert _run(bin_dir / "mig-batch", "--version", cwd=away, env=env).strip() == "mig-batch 0.1.0"
    models = json.loads(_run(bin_dir / "mig-batch", "gpus", "--json", cwd=away, env=env))
    assert {"A100-80GB", "H100-80GB", "A30-24GB"} <= {m["model"] for m in models}
    assert all(Path(m["file"]).is_relative_to(env_dir) for m in models)

    lua = _run(bin_dir / "mig-batch", "slurm", "gen-lua", "--all-models", cwd=away, env=env)
    assert '["A100-80GB"]' in lua and "function slurm_job_submit" in lua

    config = away / "mig-batch.yaml"
    config.write_text((REPO / "etc" / "mig-batch.yaml").read_text())
    _run(bin_dir / "mig-batch", "slurm", "install", away / "slurm", "--config", config, cwd=away, env=env)
    written = sorted(p.name for p in (away / "slurm").iterdir())
    compiled = ["mig-batch-hook"] if shutil.which("cc") else []  # the C hook client, from the wheel's source
    # the Slurm API helper, from the wheel's source, where Slurm's headers are
    helper = ["libmig-batch-slurm.so"] if compiled and Path("/usr/include/slurm/slurm.h").exists() else []
    assert written == [".mig-batch-manifest.json", "job_submit.lua", *helper, "mig-batch-epilog", *compiled,
                       "mig-batch-prolog", "mig-batch-subjob", "mig-batch-submit.lua",
                       "mig-batch-taskprolog"]  # fmt: skip
    hooks = [away / "slurm" / f"mig-batch-{name}" for name in ("prolog", "epilog", "taskprolog")]
    from mig_batch.slurm.install import file_system_type, shared_file_system

    if compiled and not shared_file_system(file_system_type(away)):  # own disk: the compiled client is the hooks
        assert all(hook.resolve().name == "mig-batch-hook" for hook in hooks)
        settings = _run(away / "slurm" / "mig-batch-hook", "settings", cwd=away, env=env)
        python = next(line for line in settings.splitlines() if line.startswith("python="))
        assert str(env_dir) in python, "the slow path should run the installed package"
        hooks = []
    for shim in [*hooks, away / "slurm" / "mig-batch-subjob"]:
        text = shim.read_text()
        assert not re.search(r"@[A-Z_]+@", text), f"a placeholder was left unfilled in {shim.name}"
    if hooks:
        assert str(env_dir) in hooks[0].read_text(), "the Prolog shim's slow path should run the installed package"

    # the Slurm bench runs on the checkout's test harness: with none, it says what it needs
    bench = subprocess.run([bin_dir / "mig-batch", "bench", "controller", "--jobs", "1"], cwd=away, env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bench.returncode == 2 and "checkout" in bench.stderr and "tests/" in bench.stderr, bench.stderr
    assert "slurm-wlm" in bench.stderr and "root" in bench.stderr, bench.stderr


@pytest.mark.skipif(not os.environ.get("MIG_BATCH_EXPECT_INSTALLED"), reason="set by CI's run against the wheel")
def test_the_suite_runs_against_the_installed_wheel() -> None:
    """In CI's wheel run, the tests must exercise the installed package, not the checkout next to them."""
    import mig_batch

    source = (REPO / "mig_batch").resolve()  # the venv may sit inside the checkout: compare the package itself
    assert Path(mig_batch.__file__).resolve().parent != source, f"mig_batch came from {mig_batch.__file__}"
    assert (Path(mig_batch.__file__).parent / "_plugins" / "slurm" / "job_submit.lua.in").is_file()
