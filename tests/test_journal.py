"""The node's journal: one append-only file shared by the agent and a hook's in-process fallback."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from mig_batch.node import journal as journal_module
from mig_batch.node.journal import LOG_NAME, Entry, Journal


def entry(job: str, uuid: str = "MIG-a", gpu: int = 0) -> Entry:
    return Entry(job, gpu, 1, "1g.10gb", 0, uuid, 1.0)


def test_jobs_leave_no_file_of_their_own_and_the_log_is_rewritten_when_mostly_dead(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_module, "COMPACT_MIN_LINES", 40)
    agent_side, hook_side = Journal(tmp_path), Journal(tmp_path)
    hook_side.add(entry("kept", "MIG-k"))
    for n in range(100):
        agent_side.add(entry(str(n)))
        agent_side.remove(str(n))
    assert os.listdir(tmp_path) == [LOG_NAME]
    assert len((tmp_path / LOG_NAME).read_text().splitlines()) < 45  # rewritten, not 201 lines
    hook_side.add(entry("late", "MIG-l"))  # its descriptor was on the file the rewrite replaced
    assert [e.job for e in agent_side.entries()] == ["kept", "late"]
    assert [e.job for e in Journal(tmp_path).entries()] == ["kept", "late"]


def test_entries_an_earlier_version_kept_as_files_are_taken_into_the_log(tmp_path):
    old = entry("7", "MIG-old")
    (tmp_path / "7.json").write_text(json.dumps(vars(old)))
    (tmp_path / "8.json").write_text("{torn")
    (tmp_path / "9.tmp").write_text("half")
    journal = Journal(tmp_path)
    assert journal.entries() == [old]
    assert os.listdir(tmp_path) == [LOG_NAME]
    assert Journal(tmp_path).get("7") == old


def test_a_line_a_crash_cut_short_is_skipped_and_the_next_line_starts_on_its_own(tmp_path):
    Journal(tmp_path).add(entry("1"))
    with open(tmp_path / LOG_NAME, "a") as f:
        f.write('{"add": {"job": "2", "gpu"')  # the writer died here
    journal = Journal(tmp_path)
    assert [e.job for e in journal.entries()] == ["1"]
    journal.add(entry("3"))
    assert [e.job for e in Journal(tmp_path).entries()] == ["1", "3"]


def test_a_removal_by_a_writer_that_never_read_the_entry_still_removes_it(tmp_path):
    agent_side, hook_side = Journal(tmp_path), Journal(tmp_path)
    agent_side.add(entry("5"))
    hook_side.remove("5")  # a hook's fallback Epilog: its journal opened before the entry was added
    assert agent_side.get("5") is None and Journal(tmp_path).entries() == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.sampled_from("abcd"), st.integers(0, 3)), max_size=60))
def test_writers_interleaved_leave_the_file_each_would_read_alike(tmp_path_factory, steps):
    """Any interleaving of adds, removes and rewrites by three writers: every writer, and a fresh reader,
    sees what the changes in their order leave."""
    directory = tmp_path_factory.mktemp("journal")
    writers, model = [Journal(directory) for _ in range(3)], {}
    old = journal_module.COMPACT_MIN_LINES
    journal_module.COMPACT_MIN_LINES = 6
    try:
        for who, adding, job, gpu in steps:
            if adding:
                model[job] = entry(job, f"MIG-{job}{gpu}", gpu)
                writers[who].add(model[job])
            else:
                model.pop(job, None)
                writers[who].remove(job)
    finally:
        journal_module.COMPACT_MIN_LINES = old
    expected = [model[job] for job in sorted(model)]
    assert all(w.entries() == expected for w in writers)
    assert Journal(directory).entries() == expected
