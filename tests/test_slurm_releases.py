"""The Slurm release matrix: the end-to-end modules that exercise Slurm's surface, run on each release the
images of ``harness.slurm_image`` carry (Debian trixie: 24.11 on Python 3.13, sid: 26.05 on Python 3.14),
with that release's daemons, commands and libslurm, mig_batch installed from this checkout's wheel into the
image's Python. The host's own Slurm (22.05 on Debian 12) runs the whole suite.

The releases run side by side (the subset mostly waits on Slurm), their images built at the start of the
session (tests/conftest.py) while the host's tests run. Each run writes its counts and wall time to
``results-<release>.txt`` in the images' cache directory (docs/slurm.md, "Slurm versions").
"""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harness.slurm_image import RELEASES, ReleaseRun, SlurmImage, build_wheel, cache_dir

from mig_batch.slurm.versions import release_of

CHECKOUT = Path(__file__).resolve().parents[1]
# the 30-mixed-jobs audit, forged placement, arrays and dependencies, controller SIGKILL (test_slurm_e2e);
# libslurm through the helper library; accounting; prompt slots; Flex-MIG; controller down, node killed, agent
# killed and a chain requeued by an operator (test_failures_e2e: a chain without PyTorch, which the images
# lack); each job fenced to its instance, two users
E2E_SUBSET = ("tests/test_slurm_e2e.py", "tests/test_slurm_native.py", "tests/test_slurm_accounting.py",
              "tests/test_prompt_slots_e2e.py", "tests/test_flex_e2e.py", "tests/test_failures_e2e.py",
              "tests/test_fence_e2e.py")  # fmt: skip
# what the images lack on purpose, and the fast tests skip: PyTorch, the HTCondor bindings (their own matrix:
# docs/htcondor.md), hatchling (the packaging tests), a GPU, the papers' data under ../shared/data
IMAGE_SKIPS = ("'torch'", "'classad2'", "'htcondor2'", "hatchling", "no NVIDIA driver here", "../shared/data")
WHY_NOT = SlurmImage.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]


def run_release(release: str, wheel: Path, root: Path, fast_first: bool) -> dict[str, object]:
    """The e2e subset and the fast tests (the rest of the suite but its slow tests) with the image's Python; one
    release runs its fast tests first, the other last, so that they share the CPU with the other's subset."""
    image = SlurmImage.for_release(release, CHECKOUT / "pyproject.toml")
    fast = ("-m", "not slow", *(f"--ignore={m}" for m in E2E_SUBSET), "tests")
    with ReleaseRun(root, image, CHECKOUT, wheel) as run:
        found = {"version": run.run("slurmd", "-V").stdout.split()[-1], "image": image.version()}
        for name, args in (("fast", fast), ("e2e", E2E_SUBSET))[:: -1 if not fast_first else 1]:
            found[name] = run.pytest(*args)
    lines = [f"Slurm {found['version']} ({found['image']}), started in {run.timings['start']:.0f} s"]
    lines += [f"{name}: {found[name].summary()}" for name in ("e2e", "fast")]  # type: ignore[attr-defined]  # Results
    (cache_dir() / f"results-{release}.txt").write_text("\n".join(lines) + "\n")
    return found


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    wheel = build_wheel(CHECKOUT, tmp_path_factory.mktemp("wheel"))
    with ThreadPoolExecutor(len(RELEASES)) as pool:
        runs = {r: pool.submit(run_release, r, wheel, tmp_path_factory.mktemp(f"slurm-{r}"), fast_first=i % 2 == 1)
                for i, r in enumerate(sorted(RELEASES))}  # fmt: skip
        return {release: run.result() for release, run in runs.items()}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_e2e_subset_passes_unskipped_on(release, matrix):
    found = matrix[release]
    results, summary = found["e2e"], f"Slurm {found['version']}: {found['e2e'].summary()}"
    assert release_of(found["version"]) == release, summary
    assert results.returncode == 0 and results.failed == 0, f"{summary}\n{results.output}"
    assert results.skipped == 0, f"{summary}\n" + "\n".join(results.skipped_why)
    modules = [Path(m).stem for m in E2E_SUBSET]
    assert all(results.passed_in.get(m, 0) > 0 for m in modules), f"{summary}: {results.passed_in}"


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_fast_tests_pass_on_the_images_python(release, matrix):
    found = matrix[release]
    results, summary = found["fast"], f"{found['image']}: {found['fast'].summary()}"
    assert results.returncode == 0 and results.failed == 0, f"{summary}\n{results.output}"
    unexpected = [why for why in results.skipped_why if not any(known in why for known in IMAGE_SKIPS)]
    assert not unexpected, f"{summary}\n" + "\n".join(unexpected)
    assert results.passed >= 1000, summary
