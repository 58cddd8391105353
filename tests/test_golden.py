"""Golden files: what the installers generate (job_submit.lua for two site configs, the Slurm hook shims, the
slice accounting lines, the HTCondor config with its job transforms, the job wrapper, the systemd units),
compared with tests/golden/ so that a change to what we generate shows up as a diff in review.

Regenerate (then review ``git diff tests/golden`` before committing; docs/development.md):
    MIG_BATCH_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest -rs tests/test_golden.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

import mig_batch
from mig_batch.config import SiteConfig, load_config
from mig_batch.htcondor import install as htcondor_installing
from mig_batch.mig.models import GpuModel, all_models, get_model
from mig_batch.resources import resource_path
from mig_batch.slurm import install as slurm_installing

GOLDEN_DIR = Path(__file__).parent / "golden"
SITES_DIR = GOLDEN_DIR / "sites"  # the site configs the files are generated from (inputs, not golden files)
REGENERATE = os.environ.get("MIG_BATCH_REGENERATE_GOLDEN") == "1"

# Fixed inputs in place of the values `mig-batch ... install` takes from the host it runs on
HOOK_PYTHON = "/opt/mig-batch/bin/python"  # --python (default: sys.executable)
CONFIG_PATH = "/etc/mig-batch/mig-batch.yaml"  # --config, resolved
INSTALL_DIR = "/etc/slurm"  # stands for the temporary DEST the files are written into
# the installed package's directory (the Python hook client's path is written into the shims)
PACKAGE_DIR = str(Path(mig_batch.__file__).resolve().parent)
PACKAGE_DIR_MARK = "@MIG_BATCH_PACKAGE_DIR@"
HTCONDOR_CONTROLLER = "mig-batch@$(UID_DOMAIN)"  # --controller's default
HTCONDOR_AGENT_IDENTITY = "mig-batch-agent@$(UID_DOMAIN)"  # --agent-identity
HTCONDOR_PYTHON = "/usr/bin/python3"  # --python's default
HTCONDOR_WRAPPER_DIR = "/usr/local/libexec/mig-batch"  # --wrapper-dir's default
SLICE_GRES = "mig_slices"


def default_site() -> SiteConfig:
    return load_config(resource_path("etc", "mig-batch.yaml"))


def site(name: str) -> SiteConfig:
    return load_config(SITES_DIR / f"{name}.yaml")


def site_models(config: SiteConfig) -> list[GpuModel]:
    """The models the installers generate for, as the CLI picks them: the inventory's, or every model."""
    if not config.nodes:
        return list(all_models().values())
    return [get_model(m) for m in sorted({m for models in config.nodes.values() for m in models})]


def slurm_install(config: SiteConfig, hook_client_kind: str, dest: Path) -> dict[str, str]:
    """What `mig-batch slurm install DEST --config ... --hook-client KIND` writes for ``config``: each file's
    name and text. Nothing is compiled: the C hook client stands at DEST/mig-batch-hook (its compiled-in
    paths become the file ``hook-client-paths``), and the Slurm API helper is left out."""
    compiled_paths: dict[str, str] = {}

    def compile_hook_client(dest: Path, compiler: str | None = None, paths: dict | None = None):
        compiled_paths.update(paths or {})
        (dest / slurm_installing.HOOK_BINARY).write_bytes(b"")  # a stand-in: nothing is compiled here
        return dest / slurm_installing.HOOK_BINARY, ""

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slurm_installing, "build_hook_client", compile_hook_client)
        patch.setattr(slurm_installing, "build_slurm_library", lambda *args, **kwargs: (None, "not built here"))
        patch.setattr(slurm_installing, "file_system_type", lambda path: "ext4")  # DEST on this host's own disk
        written, _ = slurm_installing.install(
            dest, HOOK_PYTHON, CONFIG_PATH, str(config.job_dir), str(config.agent_socket), site_models(config),
            config.nodes, config.slice_gres, config.flex.leaf_requests, hook_client_kind, config.slurm_bin,
            str(config.slots_file) if config.prompt_slots else "")  # fmt: skip
    files = {path.name: path.read_text() for path in written if path.name != slurm_installing.HOOK_BINARY}
    if compiled_paths:
        files["hook-client-paths"] = "".join(f"{key}={value}\n" for key, value in compiled_paths.items())
    return {name: text.replace(str(dest), INSTALL_DIR).replace(PACKAGE_DIR, PACKAGE_DIR_MARK)
            for name, text in files.items()}  # fmt: skip


def htcondor_install(config: SiteConfig, dest: Path) -> dict[str, str]:
    """What `mig-batch htcondor install DEST --config ... --agent-identity ...` writes for ``config``."""
    written = htcondor_installing.install(dest, site_models(config), HTCONDOR_CONTROLLER, [HTCONDOR_AGENT_IDENTITY],
                                          HTCONDOR_PYTHON, str(config.agent_socket), config.htcondor_agent_file,
                                          HTCONDOR_WRAPPER_DIR, nodes=config.nodes)  # fmt: skip
    return {path.name: path.read_text() for path in written}


def generate_all(work: Path) -> dict[str, str]:
    """Every golden file's path under tests/golden and the text generated for it now."""
    generated: dict[str, str] = {}

    def add(folder: str, files: dict[str, str]) -> None:
        generated.update({f"{folder}/{name}": text for name, text in files.items()})

    # the shipped default site: every model, no prompt slots; the shims of both hook client kinds
    add("slurm/default-site", slurm_install(default_site(), "c", work / "default-c"))
    python_shims = slurm_install(default_site(), "python", work / "default-python")
    add("slurm/default-site-python-hooks", {n: t for n, t in python_shims.items() if n in slurm_installing.SHIMS})
    # a site with an inventory, prompt slots and Flex-MIG's finer requests (job_submit.lua differs)
    slots_flex = site("slurm-slots-flex")
    slots_flex_lua = slurm_install(slots_flex, "c", work / "slots-flex")[slurm_installing.SUBMIT_MODULE]
    add("slurm/slots-flex-site", {slurm_installing.SUBMIT_MODULE: slots_flex_lua})
    # slice accounting (slice_gres: not with prompt slots): the lines install writes for that site's inventory
    slurm_lines, gres_lines = slurm_installing.slice_accounting_conf(slots_flex.nodes, SLICE_GRES)
    add("slurm/slice-accounting", {"slurm.conf.mig-batch": slurm_lines, "gres.conf.mig-batch": gres_lines})
    add("htcondor", htcondor_install(site("htcondor"), work / "htcondor"))
    # the Slurm units ship as they are (docs/slurm.md: copied to /etc/systemd/system/)
    add("systemd", {unit: resource_path("etc", "systemd", unit).read_text()
                    for unit in ("mig-batchd.service", "mig-batch-agent.service")})  # fmt: skip
    return generated


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, str]:
    return generate_all(tmp_path_factory.mktemp("golden"))


def golden_names() -> list[str]:
    """The golden files the test compares (known without generating: the parametrization needs them)."""
    shims = slurm_installing.SHIMS
    return sorted([
        *(f"slurm/default-site/{name}" for name in (*shims, "job_submit.lua", slurm_installing.SUBMIT_MODULE,
                                                    "hook-client-paths")),
        *(f"slurm/default-site-python-hooks/{name}" for name in shims),
        f"slurm/slots-flex-site/{slurm_installing.SUBMIT_MODULE}",
        "slurm/slice-accounting/slurm.conf.mig-batch",
        "slurm/slice-accounting/gres.conf.mig-batch",
        *(f"htcondor/{name}" for name in ("mig-batch-schedd.conf", "mig-batch-execute.conf",
                                          htcondor_installing.WRAPPER, htcondor_installing.UNIT)),
        "systemd/mig-batchd.service",
        "systemd/mig-batch-agent.service",
    ])  # fmt: skip


def compare_or_regenerate(name: str, text: str) -> None:
    path = GOLDEN_DIR / name
    expected = path.read_text() if path.exists() else None
    if REGENERATE:
        if expected == text:
            pytest.skip(f"regenerate mode, nothing checked: {name} already matched (left as it was)")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.skip(f"regenerate mode, nothing checked: rewrote {name}; review `git diff tests/golden`, then run "
                    "again without MIG_BATCH_REGENERATE_GOLDEN")  # fmt: skip
    if expected is None:
        pytest.fail(
            f"no golden file {name}: generate it with MIG_BATCH_REGENERATE_GOLDEN=1 (docs/development.md)",
            pytrace=False,
        )
    elif expected != text:
        diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True), text.splitlines(keepends=True),
                                            f"tests/golden/{name} (expected)", f"{name} (generated now)"))  # fmt: skip
        pytest.fail(
            f"{name} differs from its golden file:\n{diff}\nIf the change is meant, regenerate with "
            "MIG_BATCH_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest -rs tests/test_golden.py and review "
            "the diff",
            pytrace=False,
        )


@pytest.mark.parametrize("name", golden_names())
def test_generated_file_matches_its_golden_file(name, generated):
    if name not in generated:
        pytest.fail(f"nothing generates {name} any more: remove it from golden_names() and tests/golden", pytrace=False)
    compare_or_regenerate(name, generated[name])


def test_every_generated_file_has_a_golden_name_and_every_golden_file_is_generated(generated):
    on_disk = {str(path.relative_to(GOLDEN_DIR)) for path in GOLDEN_DIR.rglob("*")
               if path.is_file() and SITES_DIR not in path.parents}  # fmt: skip
    assert sorted(generated) == golden_names(), "the files generated and golden_names() differ: add or remove one"
    if not REGENERATE:
        stale, missing = sorted(on_disk - set(golden_names())), sorted(set(golden_names()) - on_disk)
        assert not stale, f"golden files nothing generates (remove them): {stale}"
        assert not missing, f"golden files not there (regenerate, docs/development.md): {missing}"
