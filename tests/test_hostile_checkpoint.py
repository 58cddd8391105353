"""A user's checkpoint folder, read by root mig-batchd, holds whatever its owner put there (issue 45, point 4):
FIFOs, links to devices, links out of the folder, huge files, nan. Each costs at most that user's chain."""

import dataclasses
import json
import logging
import os
import resource
import subprocess
import sys
import textwrap
import time

import pytest

from mig_batch.atomize.samples import ReadLimits, parse_trajectory, read_samples, samples_dir
from mig_batch.config import SiteConfig
from mig_batch.controller.chains import ChainDriver
from mig_batch.state import ChainRecord, Store

# One pass of the real controller over the fake batch system: two chains whose folders are hostile, then
# another user's plain MIG job. Run in a child process with a timeout and an address-space limit, so that a
# regression (a blocking FIFO, /dev/zero read to the end) fails the test instead of hanging it or eating the
# host.
PASS = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from mig_batch.batch.fake import FakeBatch
    from mig_batch.batch.tags import parse_place
    from mig_batch.config import SiteConfig
    from mig_batch.controller.daemon import Controller
    from mig_batch.state import ChainRecord, Store

    root = Path(sys.argv[1])
    site = SiteConfig(state=root / "state.db", nodes={"n1": ("A100-80GB",)})
    batch, uid = FakeBatch(["n1"]), os.getuid()
    tag = "mig-batch:v1;req=6144M;atomize=1;ckpt={};smin=30;smax=300"
    chains = [batch.add(tag.format(root / name), user_id=uid) for name in ("fifo", "zero")]
    other = batch.add("mig-batch:v1;req=1g.10gb", user_id=uid + 1)
    c = Controller(site, Store(site.state), batch)
    t0 = time.monotonic()
    stats = c.step()
    elapsed = time.monotonic() - t0
    print(json.dumps({"elapsed": elapsed, "errors": stats.errors,
                      "placed": parse_place(batch.job(other).admin_tag) is not None,
                      "chains": [c.store.chain(j).state if c.store.chain(j) else None for j in chains]}))
""")


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_a_fifo_and_a_dev_zero_link_in_checkpoint_folders_cost_the_pass_nothing(tmp_path):
    os.mkfifo(_mkdir(samples_dir(tmp_path / "fifo")) / "x.csv")
    _mkdir(samples_dir(tmp_path / "zero"))
    (samples_dir(tmp_path / "zero") / "x.csv").symlink_to("/dev/zero")
    try:
        done = subprocess.run([sys.executable, "-c", PASS, str(tmp_path)], capture_output=True, text=True,
                              timeout=30, preexec_fn=_limit_memory)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the controller pass did not end in 30 s: a checkpoint folder blocked it")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["elapsed"] < 1.0, result
    assert result["placed"] and not result["errors"], result  # the other user's job, in that same pass
    assert result["chains"] == ["granted", "granted"], result  # on their declared memory, no profile
    # the FIFO and the link to /dev/zero are both refused at the listing, never opened; one line each
    assert done.stderr.count("'x.csv': not a regular file") == 2, done.stderr[-3000:]


def _mkdir(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def _samples(ckpt, files: dict[str, str]):
    d = _mkdir(samples_dir(ckpt))
    for i, (name, text) in enumerate(files.items()):
        (d / name).write_text(text)
        os.utime(d / name, (1000 + i, 1000 + i))  # oldest first, as written
    return d


def test_nan_inf_and_negative_samples_are_rejected(tmp_path):
    _samples(tmp_path, {"1.0.csv": "0,100\n1,nan\n2,inf\n3,-5\n-1,50\nnan,7\ninf,1\n4,1e999\n5,200\n"})
    got = read_samples(tmp_path, os.getuid())
    assert not got.refused
    (t,) = got.profile.trajectories
    assert t.times == (0.0, 5.0) and t.mib == (100.0, 200.0)
    assert parse_trajectory("0,nan\n1,-inf\n") is None


@pytest.mark.parametrize("link", [".mig-batch", "memory", "1.0.csv"])
def test_a_symbolic_link_anywhere_below_the_checkpoint_dir_is_not_followed(tmp_path, link):
    elsewhere = _samples(tmp_path / "elsewhere", {"1.0.csv": "0,100\n1,300\n"})  # readable, were it followed
    ckpt = _mkdir(tmp_path / "ckpt")
    if link == ".mig-batch":
        (ckpt / ".mig-batch").symlink_to(elsewhere.parent)
    elif link == "memory":
        (_mkdir(ckpt / ".mig-batch") / "memory").symlink_to(elsewhere)
    else:
        (_mkdir(samples_dir(ckpt)) / "1.0.csv").symlink_to(elsewhere / "1.0.csv")
    got = read_samples(ckpt, os.getuid())
    assert got.profile.trajectories == ()
    assert len(got.refused) == 1
    assert ("symbolic link" if link != "1.0.csv" else "not a regular file") in got.refused[0]


def test_an_oversized_file_is_refused_after_a_capped_read_and_the_chain_budget_keeps_the_newest(tmp_path):
    line = "1,100\n"
    _samples(tmp_path, {"old.csv": line * 10, "mid.csv": line * 10, "huge.csv": line * 1000, "new.csv": line * 10})
    limits = ReadLimits(max_file_bytes=100, max_total_bytes=200)
    got = read_samples(tmp_path, os.getuid(), limits)
    # newest first: new (60 bytes) read; huge costs its capped read (101 bytes of the budget, not 6000) and is
    # refused; mid then overruns the budget, and neither it nor old is read
    assert len(got.profile.trajectories) == 1
    assert any("huge.csv" in r and "larger than 100 bytes" in r for r in got.refused), got.refused
    assert any("older files not read" in r for r in got.refused), got.refused
    assert len(read_samples(tmp_path, os.getuid(), ReadLimits(max_file_bytes=100)).profile.trajectories) == 3
    assert len(read_samples(tmp_path, os.getuid(), ReadLimits(max_files=2)).profile.trajectories) == 2


def test_files_and_directories_of_another_uid_are_refused(tmp_path):
    _samples(tmp_path, {"1.0.csv": "0,100\n"})
    assert len(read_samples(tmp_path, os.getuid()).profile.trajectories) == 1
    assert len(read_samples(tmp_path).profile.trajectories) == 1  # owner unknown: not checked
    got = read_samples(tmp_path, os.getuid() + 1)
    assert got.profile.trajectories == () and "not by the job's owner" in got.refused[0]


def test_no_folder_yet_is_an_empty_profile_and_a_relative_one_is_refused(tmp_path):
    assert read_samples(tmp_path / "none", os.getuid()) == read_samples(tmp_path, os.getuid())
    assert not read_samples(tmp_path).refused and read_samples(tmp_path).profile.trajectories == ()
    assert "not absolute" in read_samples("ckpt").refused[0]


def test_a_folder_of_many_fifos_is_one_short_reason_and_never_blocks(tmp_path):
    d = _mkdir(samples_dir(tmp_path))
    for i in range(50):
        os.mkfifo(d / f"{i}.csv")
    t0 = time.monotonic()
    got = read_samples(tmp_path, os.getuid(), ReadLimits(max_entries=40))
    assert time.monotonic() - t0 < 1.0
    assert len(got.refused) == 6 and got.refused[-1].startswith("and ")


def test_a_chains_refused_folder_is_logged_once_and_its_chain_goes_on_without_a_profile(tmp_path, caplog):
    elsewhere = _samples(tmp_path / "elsewhere", {"1.0.csv": "0,100\n"})
    (_mkdir(tmp_path / "ckpt") / ".mig-batch").symlink_to(elsewhere.parent)
    site = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",)})
    driver = ChainDriver(site, Store(site.state), None)
    record = ChainRecord("7", str(tmp_path / "ckpt"), 6144.0, 30.0, 300.0, None, 0.0, "waiting", 0, 0, 0.0, None)
    with caplog.at_level(logging.WARNING, logger="mig-batchd"):
        for subjobs in range(3):  # each ended subjob reads the folder again
            assert driver.history(dataclasses.replace(record, subjobs=subjobs), os.getuid()).trajectories == ()
    warnings = [r for r in caplog.records if "symbolic link" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is None
