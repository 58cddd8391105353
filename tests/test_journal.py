"""The node's journal: one append-only file shared by the agent and a hook's in-process fallback."""

from __future__ import annotations

import errno
import json
import os
import random

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


def test_the_agent_takes_an_earlier_releases_files_into_the_log_and_others_read_them_as_they_are(tmp_path):
    old, other = entry("7", "MIG-old"), entry("6", "MIG-six")
    (tmp_path / "7.json").write_text(json.dumps(vars(old)))
    (tmp_path / "6.json").write_text(json.dumps(vars(other)))
    (tmp_path / "9.tmp").write_text("half")
    (tmp_path / "8.json").write_text("{torn")  # unreadable: left where it is, with a warning
    (tmp_path / "5.json").mkdir()  # not a file at all: the same
    (tmp_path / "4.json").write_text(json.dumps(vars(entry(""))))  # no job: the same
    hook = Journal(tmp_path)  # a hook's fallback while an older agent may still run: reads, keeps the files
    assert hook.entries() == [other, old] and hook.held_ids(0) == {1}
    hook.remove("6")
    assert not (tmp_path / "6.json").exists() and hook.entries() == [old]
    assert (tmp_path / "7.json").exists() and (tmp_path / "9.tmp").exists()
    agent = Journal(tmp_path, adopt_old_files=True)
    assert agent.entries() == [old]
    assert sorted(os.listdir(tmp_path)) == ["4.json", "5.json", "8.json", LOG_NAME]
    assert Journal(tmp_path).get("7") == old


def test_a_line_a_crash_cut_short_is_skipped_and_the_next_line_starts_on_its_own(tmp_path):
    Journal(tmp_path).add(entry("1"))
    with open(tmp_path / LOG_NAME, "a") as f:
        f.write('{"add": {"job": "2", "gpu"')  # the writer died here
    journal = Journal(tmp_path)
    assert [e.job for e in journal.entries()] == ["1"]
    journal.add(entry("3"))
    assert [e.job for e in Journal(tmp_path).entries()] == ["1", "3"]


def test_a_line_cut_short_under_a_writer_that_keeps_the_file_open_costs_it_no_entry(tmp_path):
    agent_side = Journal(tmp_path)
    agent_side.add(entry("1"))
    with open(tmp_path / LOG_NAME, "a") as f:
        f.write('{"add": {"job": "2", "gpu"')  # a hook's fallback killed mid-line
    agent_side.add(entry("3"))
    assert [e.job for e in Journal(tmp_path).entries()] == ["1", "3"]


def test_a_rewrite_that_fails_leaves_the_line_written_and_the_caller_unharmed(tmp_path, monkeypatch):
    monkeypatch.setattr(journal_module, "COMPACT_MIN_LINES", 10)
    rewrites = []

    def disk_full(path, text, mode):
        rewrites.append(path)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_module, "write_file", disk_full)  # the rewrite cannot write its file
    journal = Journal(tmp_path)
    for n in range(30):
        journal.add(entry(str(n)))
        journal.remove(str(n))
    journal.add(entry("kept"))
    assert rewrites and [e.job for e in Journal(tmp_path).entries()] == ["kept"]


def test_a_log_emptied_in_place_is_read_again_from_its_start(tmp_path):
    agent_side, hook_side = Journal(tmp_path), Journal(tmp_path)
    agent_side.add(entry("1"))
    assert agent_side.entries() == [entry("1")]
    (tmp_path / LOG_NAME).write_text("")  # an operator's `: > entries.log`
    assert agent_side.entries() == []
    hook_side.add(entry("2"))
    assert [e.job for e in agent_side.entries()] == ["2"]


def test_writers_in_processes_of_their_own_lose_nothing_while_they_rewrite_the_log(tmp_path, monkeypatch):
    """Three processes add and remove their own entries at once, rewriting the log often: each one's
    survivors are in the file, and nothing else is."""
    monkeypatch.setattr(journal_module, "COMPACT_MIN_LINES", 8)
    children, (go_read, go_write) = [], os.pipe()
    for who in range(3):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                journal, rng, live = Journal(tmp_path), random.Random(who), set()
                os.read(go_read, 1)  # all start together
                for n in range(6000):
                    job = f"{who}-{rng.randrange(40)}"
                    if job in live:
                        journal.remove(job)
                        live.discard(job)
                    else:
                        journal.add(entry(job, f"MIG-{job}-{n}"))
                        live.add(job)
                mine = {e.job for e in journal.entries() if e.job.startswith(f"{who}-")}
                code = 0 if mine == live else 2
                with open(tmp_path / f"expected-{who}", "w") as f:
                    f.write("\n".join(sorted(live)))
            finally:
                os._exit(code)
        children.append(pid)
    os.write(go_write, b"go!")
    assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children] == [0, 0, 0]
    expected = set()
    for who in range(3):
        expected |= set(filter(None, (tmp_path / f"expected-{who}").read_text().split("\n")))
    assert {e.job for e in Journal(tmp_path).entries()} == expected


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


def test_an_earlier_releases_file_never_outlives_the_logs_newer_record_of_its_job(tmp_path):
    (tmp_path / "7.json").write_text(json.dumps(vars(entry("7", "MIG-old"))))
    (tmp_path / "8.json").write_text(json.dumps(vars(entry("8", "MIG-stale"))))
    hook = Journal(tmp_path)  # read both files before the agent started
    newer = Journal(tmp_path)
    newer.add(entry("8", "MIG-new"))  # the new release made job 8 again: its old file goes
    agent = Journal(tmp_path, adopt_old_files=True)
    assert agent.entries() == [entry("7", "MIG-old"), entry("8", "MIG-new")]
    agent.remove("7")
    assert hook.get("7") is None and hook.entries() == [entry("8", "MIG-new")]
    assert os.listdir(tmp_path) == [LOG_NAME]
    (tmp_path / "9.json").write_text(json.dumps(vars(entry("9"))))  # an earlier release's hook, late
    agent.look_for_old_files()
    assert [e.job for e in agent.entries()] == ["8", "9"] and os.listdir(tmp_path) == [LOG_NAME]


def test_a_line_naming_no_job_is_skipped(tmp_path):
    journal = Journal(tmp_path)
    journal.add(entry("1"))
    with open(tmp_path / LOG_NAME, "a") as f:
        f.write(json.dumps({"add": {**vars(entry("x")), "job": 5}}) + "\n")
        f.write(json.dumps({"add": vars(entry("a/b"))}) + "\n")
    journal.add(entry("2"))
    assert [e.job for e in Journal(tmp_path).entries()] == ["1", "2"]
    assert [e.job for e in journal.entries()] == ["1", "2"]
