"""The Slurm release matrix: the end-to-end modules that exercise Slurm's surface, run on each release the
images of ``harness.slurm_image`` carry (Debian trixie: 24.11 on Python 3.13, sid: 26.05 on Python 3.14),
with that release's daemons, commands and libslurm, mig_batch installed from this checkout's wheel into the
image's Python. The host's own Slurm (22.05 on Debian 12) runs the whole suite.

The releases run side by side (the subset mostly waits on Slurm), started with their images at the start of
the session (tests/conftest.py) while the host's tests run. With MIG_BATCH_RELEASE_FAST_TESTS=1 each also runs
the fast tests (the suite but its slow tests) on its image's Python: CPU that CI's two cores, busy with the
host's tests then, are spared. Each run writes its counts and wall
time to ``results-<release>.txt`` in the images' cache directory (docs/slurm.md, "Slurm versions").
"""

import os
from pathlib import Path

import pytest
from harness.slurm_image import E2E_SUBSET, FAST_ENV, RELEASES, Matrix, SlurmImage

from mig_batch.slurm.versions import release_of

CHECKOUT = Path(__file__).resolve().parents[1]
# what the images lack on purpose, and the fast tests skip: PyTorch, the HTCondor bindings (their own matrix:
# docs/htcondor.md), hatchling (the packaging tests), a GPU, the papers' data under ../shared/data
IMAGE_SKIPS = ("'torch'", "'classad2'", "'htcondor2'", "hatchling", "no NVIDIA driver here", "../shared/data")
WHY_NOT = SlurmImage.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_e2e_subset_passes_unskipped_on(release):
    found = Matrix.start(CHECKOUT).results(release)
    results, summary = found["e2e"], f"Slurm {found['version']}: {found['e2e'].summary()}"
    assert release_of(found["version"]) == release, summary
    assert results.returncode == 0 and results.failed == 0, f"{summary}\n{results.output}"
    assert results.skipped == 0, f"{summary}\n" + "\n".join(results.skipped_why)
    modules = [Path(m).stem for m in E2E_SUBSET]
    assert all(results.passed_in.get(m, 0) > 0 for m in modules), f"{summary}: {results.passed_in}"


@pytest.mark.skipif(os.environ.get(FAST_ENV) != "1", reason=f"the images' fast tests run with {FAST_ENV}=1")
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_fast_tests_pass_on_the_images_python(release):
    found = Matrix.start(CHECKOUT).results(release)
    results, summary = found["fast"], f"{found['image']}: {found['fast'].summary()}"
    assert results.returncode == 0 and results.failed == 0, f"{summary}\n{results.output}"
    unexpected = [why for why in results.skipped_why if not any(known in why for known in IMAGE_SKIPS)]
    assert not unexpected, f"{summary}\n" + "\n".join(unexpected)
    assert results.passed >= 1000, summary
