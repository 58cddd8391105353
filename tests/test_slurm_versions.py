"""The Slurm release a site runs, read from ``scontrol show config``, and whether mig_batch is tested on it."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mig_batch.slurm.versions import TESTED_RELEASES, release_note, release_of, version_in

SHOW_CONFIG = "Configuration data as of 2026-11-29T08:00:00\nSLURM_CONF              = /etc/slurm/slurm.conf\n" \
              "SLURM_VERSION           = {}\nSlurmctldHost[0]        = ctl\n"  # fmt: skip


@pytest.mark.parametrize(("version", "release"), [("22.05.8", "22.05"), ("24.11.5", "24.11"), ("26.05.0-1", "26.05"),
                                                  ("25.11", "25.11"), ("8.0.1", "08.00"), ("banana", None)])
def test_the_release_of_a_version(version, release):
    assert release_of(version) == release


@given(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99))
def test_every_version_of_a_release_has_that_release(major, minor, patch):
    assert release_of(f"{major}.{minor:02d}.{patch}") == f"{major:02d}.{minor:02d}"


def test_a_tested_release_and_an_untested_one_are_named_as_such():
    assert version_in(SHOW_CONFIG.format("22.05.8")) == "22.05.8"
    assert "22.05" in TESTED_RELEASES and "a release mig_batch is tested on" in release_note("22.05.8")
    assert all(r in TESTED_RELEASES for r in ("22.05", "24.11", "26.05"))  # the release matrix
    note = release_note(version_in(SHOW_CONFIG.format("23.11.10")))
    assert note.startswith("Slurm 23.11.10, not a release mig_batch is tested on") and "24.11" in note
    assert "not reported" in release_note(version_in("Configuration data as of ...\nSlurmUser = slurm\n"))
