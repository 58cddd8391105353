import os
import tempfile

# the GPU model cache of test runs (and their subprocesses) goes to a fresh folder, not ~/.cache
os.environ.setdefault("MIG_BATCH_CACHE_DIR", tempfile.mkdtemp(prefix="mig-batch-test-cache-"))

import pytest
from hypothesis import HealthCheck, settings

from mig_batch.mig.models import all_models

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")

MODEL_NAMES = sorted(all_models())


@pytest.fixture(params=MODEL_NAMES)
def model(request):
    return all_models()[request.param]


@pytest.fixture(scope="session")
def nvml_emu_library():
    """The emulated libnvidia-ml.so.1, loaded so that pynvml's own ``CDLL("libnvidia-ml.so.1")`` finds it.

    Found by name when its directory was on LD_LIBRARY_PATH at process start (the subprocess runs of
    test_nvml_versions); otherwise preloaded by absolute path. Skips where this process already holds
    a real driver's library (a GPU machine): a process keeps the first libnvidia-ml it loaded.
    """
    import os

    from mig_batch.gpu import nvml_emu

    library = nvml_emu.build_library()
    if str(library.parent) not in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        try:
            nvml_emu.preload(library)
        except RuntimeError as exc:
            pytest.skip(str(exc))
    return library


@pytest.fixture
def nvml_emu_node(nvml_emu_library, tmp_path, monkeypatch):
    """make(models, mig_enabled=True) -> (NvmlNode over a fresh emulated node, its directory)."""
    from mig_batch.gpu import nvml_emu
    from mig_batch.gpu.nvml import NvmlNode

    opened = []

    def make(models, mig_enabled=True, node="n1"):
        directory = tmp_path / f"nvml-{node}"
        gpus = [m if isinstance(m, nvml_emu.EmulatedGpu) else nvml_emu.EmulatedGpu(all_models()[m], mig_enabled)
                for m in models]  # fmt: skip
        nvml_emu.make_node(directory, node, gpus)
        monkeypatch.setenv(nvml_emu.NODE_ENV, str(directory))
        backend = NvmlNode()
        opened.append(backend)
        return backend, directory

    yield make
    for backend in opened:
        backend.close()


@pytest.fixture
def nvml_emu_creator(nvml_emu_node):
    """``nvml_emu_node`` for tests that create MIG instances: NVML lets only root do that, the emulated
    library too (as the driver does), so they skip for other users; CI runs as root."""
    import os

    if os.geteuid() != 0:
        pytest.skip("NVML creates MIG instances for root only, the emulated library too")
    return nvml_emu_node


def pytest_collection_finish(session):
    """The chroot images this session's tests will need, built (or restored) in the background from its start:
    debootstrap, apt and pip mostly wait on the network while the first tests run. A test that needs one waits
    for it on the image's lock (or builds it itself, and reports why it could not, where this build failed).
    The Slurm release matrix starts whole (tests/test_slurm_releases.py): its runs mostly wait on Slurm."""
    import os

    if os.geteuid() != 0 or session.config.option.collectonly:
        return
    from pathlib import Path

    names = {item.path.name for item in session.items}
    images = []
    if "test_slurm_releases.py" in names:
        from harness.slurm_image import Matrix, SlurmImage

        if SlurmImage.available() is None:  # the release runs, with their images, beside the host's tests
            Matrix.start(Path(__file__).resolve().parents[1])
    if any(name.startswith("test_htcondor") for name in names):
        from harness.htcondor_pool import SUITE, Image

        suites = [SUITE, "trixie"] if "test_htcondor_bindings_range.py" in names else [SUITE]
        images += [Image(suite=suite) for suite in dict.fromkeys(suites)]
    import threading

    for image in images:
        threading.Thread(target=_build_quietly, args=(image,), daemon=True).start()


def _build_quietly(image):
    import contextlib

    with contextlib.suppress(Exception):  # built again, and reported, by the test that needs it
        image.ensure()
