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


# --- a GPU node's install: mig_batch alone, no extra ------------------------------------------------------------

HEAVY = ("numpy", "rich", "matplotlib", "ortools", "pandas")  # the extras' modules: none of them on a node

# what the node agent does on a Prolog and an Epilog, run by the node venv's Python: a job pinned by the controller
# (the in-memory batch system) gets its MIG instance made through pynvml on the emulated driver, then destroyed
AGENT_ROUND = """
import sys
from pathlib import Path
from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.system import Pin
from mig_batch.batch.tags import Placed, parse_tag, placed_tag
from mig_batch.config import load_config
from mig_batch.factory import open_backend
from mig_batch.node.agent import NodeAgent
from mig_batch.node.journal import Journal

config = load_config(sys.argv[1])
batch = FakeBatch(["n1"])
tag = "mig-batch:v1;req=4g.20gb"
job = batch.add(tag, job_id="4242")
batch.pin_and_release([Pin(job, "n1", placed_tag(parse_tag(tag), Placed("n1", 0, "4g.20gb", 0)))])
batch.start(job)
agent = NodeAgent("n1", open_backend(config, "n1"), Journal(config.node_dir / "journal"), batch, config.job_dir)
made = agent.prolog(job)
print(made.report.kind, " ".join((config.job_dir / job).read_text().split()))
print(agent.epilog(job))
print(" ".join(sorted(name for name in sys.modules if name.split(".")[0] in {heavy})))
"""


def _link_distributions(requirements: list[str], site: Path) -> list[str]:
    """Link the installed distributions ``requirements`` name (and only those) into ``site``: a node's venv
    made offline from this interpreter's packages. Returns the distributions linked."""
    from importlib.metadata import distribution

    linked = []
    for requirement in requirements:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
        dist = distribution(name)
        for top in sorted({Path(str(f)).parts[0] for f in dist.files or []} - {"..", "__pycache__"}):
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
        linked.append(dist.metadata["Name"])
    return linked


def _wheel_requirements(wheel: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The wheel's Requires-Dist: (the base ones, the ones of each extra)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    base, extras = [], {}
    for line in lines:
        if line.startswith("Requires-Dist: "):
            requirement, _, marker = line.removeprefix("Requires-Dist: ").partition(";")
            extra = re.search(r"extra == ['\"]([\w-]+)['\"]", marker)
            (extras.setdefault(extra.group(1), []) if extra else base).append(requirement.strip())
    return base, extras


@pytest.fixture(scope="module")
def node_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed and only its base dependencies (no extra): a GPU node's."""
    env_dir = tmp_path_factory.mktemp("node") / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    site = Path(sysconfig.get_paths(vars={"base": str(env_dir), "platbase": str(env_dir)})["purelib"])
    base, _ = _wheel_requirements(wheel)
    _link_distributions(base, site)
    _run(sys.executable, "-m", "pip", "--python", env_dir / "bin" / "python", "install", "-q", "--no-deps",
         "--no-index", wheel, cwd=env_dir.parent)  # fmt: skip
    return env_dir


def test_a_node_needs_only_pyyaml_and_nvidia_ml_py(wheel: Path) -> None:
    base, extras = _wheel_requirements(wheel)
    assert sorted(re.split(r"[<>=]", r)[0].lower() for r in base) == ["nvidia-ml-py", "pyyaml"], base
    names = {extra: {re.split(r"[<>=]", r)[0].lower() for r in reqs} for extra, reqs in extras.items()}
    assert {"numpy", "rich"} <= names["controller"] and not names["controller"] & {"ortools", "matplotlib"}
    assert names["controller"] | {"ortools", "matplotlib"} <= names["sim"], names["sim"]
    assert names["sim"] <= names["test"], "CI's pip install '.[test]' must bring the sim extra: the suite runs it"


def _node_run(venv_dir: Path, *command: str | Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MIG_BATCH_GPU_DIRS", "MIG_BATCH_CONFIG")}
    program = command[0] if isinstance(command[0], Path) else venv_dir / "bin" / command[0]
    return subprocess.run([str(program), *map(str, command[1:])], capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})}, cwd=cwd or venv_dir.parent)  # fmt: skip


def test_the_node_venv_has_no_extra(node_venv: Path) -> None:
    """Not vacuous: the extras' modules are not importable there, and pip finds the base dependencies met."""
    found = _node_run(node_venv, "python", "-c", "import importlib.util as u; print([m for m in "
                      f"{HEAVY!r} if u.find_spec(m)])")  # fmt: skip
    assert found.returncode == 0 and found.stdout.strip() == "[]", found.stdout + found.stderr
    check = subprocess.run([sys.executable, "-m", "pip", "--python", node_venv / "bin" / "python", "check"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr


def _node_site(tmp_path: Path) -> Path:
    import yaml

    site = yaml.safe_load((REPO / "etc" / "mig-batch.yaml").read_text())
    site.update(state=str(tmp_path / "state.db"), job_dir=str(tmp_path / "jobs"), node_dir=str(tmp_path / "node"),
                agent_socket=str(tmp_path / "agent.sock"))  # fmt: skip
    config = tmp_path / "mig-batch.yaml"
    config.write_text(yaml.safe_dump(site))
    return config


def test_the_agents_hooks_doctor_and_migsub_run_on_a_node_install(node_venv: Path, tmp_path: Path) -> None:
    config = _node_site(tmp_path)
    for program in ("mig-batch-agent", "mig-batch-htcondor-agent", "mig-batch"):
        proc = _node_run(node_venv, program, "--help")
        assert proc.returncode == 0 and "usage:" in proc.stdout, f"{program}: {proc.stdout}{proc.stderr}"
    proc = _node_run(node_venv, "mig-batch", "doctor", "--help")
    assert proc.returncode == 0 and "--role" in proc.stdout, proc.stdout + proc.stderr
    # doctor on a node with no agent and no driver: failed checks (exit 1), each with its fix; not an error
    proc = _node_run(node_venv, "mig-batch", "doctor", "--role", "node", "--config", config, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = json.loads(proc.stdout)
    assert checks and "ModuleNotFoundError" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    # the hooks' slow path (the agent is down): never fails the job's node, and imports no extra on its way
    hook = _node_run(node_venv, "python", "-I", "-m", "mig_batch.slurm.hooks", "prolog",
                     env={"MIG_BATCH_CONFIG": str(config), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"})  # fmt: skip
    assert hook.returncode == 0, hook.stdout + hook.stderr
    assert "ModuleNotFoundError" not in hook.stderr and "ImportError" not in hook.stderr, hook.stderr
    # a submit host's migsub
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n#MIG --gpu-mem 18G\ntrue\n")
    proc = _node_run(node_venv, "migsub", "--dry-run", job, env={"MIG_BATCH_CONFIG": str(config)})
    assert proc.returncode == 0 and "sbatch" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(not shutil.which("cc"), reason="the emulated libnvidia-ml is built with the system cc")
def test_the_node_agent_makes_and_destroys_an_instance_from_a_node_install(node_venv: Path, tmp_path: Path) -> None:
    from mig_batch.gpu import nvml_emu

    config = _node_site(tmp_path)
    driver = nvml_emu.library_env(nvml_emu.build_library(), nvml_emu.make_node(tmp_path / "gpus", "n1",
                                                                               ["A100-40GB"]))  # fmt: skip
    proc = _node_run(node_venv, "python", "-c", AGENT_ROUND.replace("{heavy}", repr(set(HEAVY))), config, env=driver)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made, destroyed, heavy = [*proc.stdout.splitlines(), ""][:3]
    assert made.startswith("made export CUDA_VISIBLE_DEVICES=MIG-"), proc.stdout
    assert destroyed.startswith("destroyed"), proc.stdout
    assert heavy == "", f"the agent loaded {heavy}"
    assert nvml_emu.live_instances(tmp_path / "gpus") == []
    probe = _node_run(node_venv, "mig-batch", "node", "probe", "--json", env=driver)
    assert probe.returncode == 0 and "A100" in probe.stdout, probe.stdout + probe.stderr
    # the hooks' slow path gets past the driver to Slurm (which does not know job 7 here): no import on its way fails
    hook = _node_run(node_venv, "python", "-I", "-m", "mig_batch.slurm.hooks", "prolog",
                     env={**driver, "MIG_BATCH_CONFIG": str(config), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"})
    assert hook.returncode == 0 and "GpuBackendError" not in hook.stderr, hook.stdout + hook.stderr
    assert "ModuleNotFoundError" not in hook.stderr and "ImportError" not in hook.stderr, hook.stderr


@pytest.mark.parametrize(("command", "extra"), [
    (["mig-batch", "simulate", "placement", "--runs", "1"], "sim"),
    (["mig-batch", "simulate", "flex", "--quick"], "sim"),
    (["mig-batch", "plan", "queue.yaml"], "sim"),
    (["mig-batch", "bench", "planner"], "sim"),
    (["mig-batch", "bench", "pass"], "controller"),
    (["mig-batchd", "--once"], "controller"),
])  # fmt: skip
def test_a_command_that_needs_an_extra_says_which_on_a_node_install(
    node_venv: Path, tmp_path: Path, command: list[str], extra: str
) -> None:
    proc = _node_run(node_venv, *command, env={"MIG_BATCH_CONFIG": str(_node_site(tmp_path))}, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"needs the {extra} extra" in proc.stderr and f"pip install 'mig-batch[{extra}]'" in proc.stderr, proc.stderr
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bench_install_size_measures_a_node_venv_from_the_wheel(wheel: Path, tmp_path: Path) -> None:
    """Offline here (no index: the wheel alone, --no-deps); the real figures need pip's index (README)."""
    proc = subprocess.run([sys.executable, "-m", "mig_batch.cli.main", "bench", "install-size", "--wheel", str(wheel),
                           "--roles", "node", "--keep", str(tmp_path / "venvs"), "--pip-args", "--no-index --no-deps",
                           "--json"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (node,) = json.loads(proc.stdout)
    assert node["role"] == "node" and node["requirement"] == wheel.name
    installed = tmp_path / "venvs" / "node"
    assert any(installed.glob("lib/python3*/site-packages/mig_batch/cli/main.py"))
    own = sum(f.stat().st_size for f in installed.glob("lib/python3*/site-packages/mig_batch/**/*") if f.is_file())
    # what the wheel added is mig_batch itself (its files, with the bytecode pip compiles): the difference of the
    # two venvs' sizes, to within the bytecode
    assert own / 1e6 <= node["packages_mb"] <= 3 * own / 1e6, (own, node)
    assert node["total_mb"] > node["packages_mb"] > 0
    assert node["largest"][0][0] in ("pip", "mig_batch", "setuptools"), node["largest"]
    bad = subprocess.run([sys.executable, "-m", "mig_batch.cli.main", "bench", "install-size", "--wheel",
                          str(tmp_path / "nope.whl")], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "not a wheel file" in bad.stderr, bad.stderr
