"""The GPU model cache never serves a stale model: an edited, replaced or added file is seen."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from mig_batch.mig import model_cache
from mig_batch.mig.models import _load_all, get_model


def _minimal() -> dict:
    """A valid one-profile GPU model document."""
    profile = {"name": "1g.1gb", "nvml_profile": "1_SLICE", "profile_id": 1, "compute_slices": 1,
               "memory_slices": 1, "memory_mib": 1024, "starts": [0, 1, 2, 3], "max_instances": 4}  # fmt: skip
    return {"model": "T-1", "memory_slices": 4, "compute_slices": 4, "profiles": [profile]}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MIG_BATCH_CACHE_DIR", str(folder))
    return folder


def counted_parse(path):
    counted_parse.calls.append(path.name)
    return yaml.safe_load(path.read_text())


def load(paths):
    counted_parse.calls = []
    return model_cache.load_documents(paths, counted_parse), counted_parse.calls


def test_a_second_load_parses_nothing_and_an_edit_is_parsed_again(tmp_path, cache):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("x: 1\n")
    b.write_text("y: 2\n")
    assert load([a, b]) == ([{"x": 1}, {"y": 2}], ["a.yaml", "b.yaml"])
    assert load([a, b]) == ([{"x": 1}, {"y": 2}], [])
    before = a.stat()
    a.write_text("x: 7\n")  # same size; then the old modification time put back, as a careful copy would
    os.utime(a, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert load([a, b]) == ([{"x": 7}, {"y": 2}], ["a.yaml"])


def test_a_file_replaced_by_another_is_parsed(tmp_path, cache):
    a = tmp_path / "a.yaml"
    a.write_text("x: 1\n")
    load([a])
    other = tmp_path / "other"
    other.write_text("x: 2\n")
    os.replace(other, a)
    assert load([a]) == ([{"x": 2}], ["a.yaml"])


@pytest.mark.parametrize("damage", [b"", b"garbage", b"\xe3\x01\x02"])
def test_a_damaged_cache_means_parsing(tmp_path, cache, damage):
    a = tmp_path / "a.yaml"
    a.write_text("x: 1\n")
    load([a])
    (cache / model_cache.CACHE_FILE).write_bytes(damage)
    assert load([a]) == ([{"x": 1}], ["a.yaml"])
    assert load([a]) == ([{"x": 1}], [])  # rewritten


def test_a_cache_file_others_may_write_is_not_trusted(tmp_path, cache):
    a = tmp_path / "a.yaml"
    a.write_text("x: 1\n")
    load([a])
    assert (cache / model_cache.CACHE_FILE).stat().st_mode & 0o777 == 0o600
    (cache / model_cache.CACHE_FILE).chmod(0o666)
    assert load([a]) == ([{"x": 1}], ["a.yaml"])


def test_an_unwritable_or_switched_off_cache_still_loads(tmp_path, monkeypatch):
    a = tmp_path / "a.yaml"
    a.write_text("x: 1\n")
    (tmp_path / "file").write_text("")
    for setting in (str(tmp_path / "file" / "below"), ""):
        monkeypatch.setenv("MIG_BATCH_CACHE_DIR", setting)
        assert load([a]) == ([{"x": 1}], ["a.yaml"])


def test_an_edited_model_file_is_seen_by_get_model(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("MIG_BATCH_GPU_DIRS", str(tmp_path))
    path = tmp_path / "t1.yaml"
    path.write_text(yaml.safe_dump(_minimal()))
    _load_all.cache_clear()
    assert get_model("T-1").profile("1g.1gb").memory_mib == 1024
    doc = _minimal()
    doc["profiles"][0]["memory_mib"] = 2048
    path.write_text(yaml.safe_dump(doc))
    _load_all.cache_clear()  # a new process: only the file cache is left
    assert get_model("T-1").profile("1g.1gb").memory_mib == 2048
    _load_all.cache_clear()


def test_fresh_processes_see_an_edit(tmp_path, cache):
    """End to end, as the CLI runs: the second process reads the cache, the third sees the edit."""
    path = tmp_path / "t1.yaml"
    path.write_text(yaml.safe_dump(_minimal()))
    code = ("import sys; from mig_batch.mig.models import get_model; "
            "print(get_model('T-1').profile('1g.1gb').memory_mib, 'yaml' in sys.modules)")  # fmt: skip
    env = {**os.environ, "MIG_BATCH_GPU_DIRS": str(tmp_path), "MIG_BATCH_CACHE_DIR": str(cache)}

    def run():
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True, timeout=60).stdout.split()  # fmt: skip

    assert run() == ["1024", "True"]  # parsed: PyYAML loaded
    assert run() == ["1024", "False"]  # from the cache: PyYAML not even imported
    doc = _minimal()
    doc["profiles"][0]["memory_mib"] = 4096
    path.write_text(yaml.safe_dump(doc))
    assert run() == ["4096", "True"]
