"""SlurmCli's rules for the libslurm helper, with the helper faked (its answers and errors as Slurm gives them)
and Slurm's commands faked at the subprocess edge: what goes through which, what is sent again and what not.
The real helper against a real Slurm: tests/test_slurm_native.py."""

import pytest

from mig_batch.batch.system import JobState, Pin
from mig_batch.slurm import commands
from mig_batch.slurm.commands import SlurmCli, SlurmError
from mig_batch.slurm.native import SlurmApiError

UNREACHABLE, TIMED_OUT, REFUSED, QOS_THRESHOLD = 1800, 5004, 2017, 2108  # slurm_errno.h of 22.05
HELD = ("{job}|{job}|N/A|PENDING|0|0||1795407940|N/A|N/A|UNLIMITED|0|JobHeldAdmin\x1f1|gpu|N/A|(null)|"
        "{tag}\x1e\n")
RELEASED = ("{job}|{job}|N/A|PENDING|4294901759|0||1795407940|N/A|N/A|UNLIMITED|0|Priority\x1f1|gpu|N/A|(null)|"
            "{tag}\x1e\n")


class FakeApi:
    """Answers like the helper; ``errors`` maps (call, job) to the Slurm error code it raises."""

    def __init__(self, errors=None, records=None):
        self.errors, self.records, self.calls = errors or {}, records or {}, []

    def _maybe_fail(self, call, job):
        self.calls.append((call, job))
        code = self.errors.get((call, job))
        if code is not None:
            raise SlurmApiError(code, f"error {code} for job {job}")

    def update_job(self, job_id, nodes=None, admin_comment=None, time_limit_min=None, start_now=False,
                   tres_per_node=None, release=False):  # fmt: skip
        self._maybe_fail("release" if release and nodes is None and admin_comment is None else
                         "pin" if nodes is not None else "update", job_id)  # fmt: skip

    def job_lines(self, job_id):
        self._maybe_fail("read", str(job_id))
        return self.records.get(str(job_id), "")

    def all_job_lines(self, since=0):
        self._maybe_fail("all", "")
        return "".join(self.records.values()), 1


@pytest.fixture
def scontrol(tmp_path):
    """A fake scontrol and squeue logging each call; returns the log's lines."""
    calls = tmp_path / "calls"
    (tmp_path / "scontrol").write_text(f'#!/bin/sh\necho "scontrol $* $(cat)" >> {calls}\n')
    (tmp_path / "squeue").write_text(f'#!/bin/sh\necho "squeue $*" >> {calls}\n')
    for name in ("scontrol", "squeue"):
        (tmp_path / name).chmod(0o755)
    return lambda: calls.read_text().split("\n")[:-1] if calls.exists() else []  # squeue's format holds \x1e


def test_answered_codes_are_slurms_word_on_the_job_the_rest_are_not():
    assert SlurmApiError(REFUSED, "").answered and SlurmApiError(QOS_THRESHOLD, "").answered
    for code in (-1, 110, 1000, UNREACHABLE, 1900, 5000, TIMED_OUT, 6000):
        assert not SlurmApiError(code, "").answered, code


def test_a_pin_slurm_did_not_answer_is_failed_not_sent_again_and_the_rest_go_through_commands(tmp_path, scontrol):
    api = FakeApi({("pin", "2"): TIMED_OUT})
    cli = SlurmCli(bin_dir=str(tmp_path), api=api)
    failed = cli.pin_and_release([Pin(j, "n1", "mig-batch:v1;x") for j in ("1", "2", "3", "4")])
    assert list(failed) == ["2"]  # its fate is unknown: decided again next pass if still held
    assert api.calls == [("pin", "1"), ("pin", "2")]  # then the helper rests
    text = "\n".join(scontrol())  # one scontrol with both pins on its stdin, then their release
    assert "update jobid=3 " in text and "update jobid=4 " in text and "scontrol release 3,4" in text
    assert "jobid=2" not in text and "release 2" not in text
    cli.set_job_tag("5", "mig-batch:v1;y")  # paused: straight to the commands, the helper not tried again
    assert api.calls[-1] == ("pin", "2") and "jobid=5" in scontrol()[-1]


def test_a_refused_pin_is_failed_and_the_others_go_on_through_the_helper(tmp_path, scontrol):
    api = FakeApi({("pin", "2"): REFUSED})
    failed = SlurmCli(bin_dir=str(tmp_path), api=api).pin_and_release([Pin(j, "n1", "t") for j in "123"])
    assert list(failed) == ["2"] and scontrol() == []
    # after a refusal the job is read: was it released with the pin all the same (a later limit check)?
    assert api.calls == [("pin", "1"), ("pin", "2"), ("read", "2"), ("pin", "3")]


def test_a_pin_refused_after_its_release_counts_as_pinned_only_when_the_job_is_released_with_the_tag(tmp_path):
    """slurmctld checks QOS thresholds and partition access after the release within the same RPC."""
    tag = "mig-batch:v1;place=n1/0/1g.10gb@0"
    records = {"1": RELEASED.format(job=1, tag=tag), "2": HELD.format(job=2, tag="mig-batch:v1"),
               "3": RELEASED.format(job=3, tag="another")}  # fmt: skip
    api = FakeApi({("pin", j): QOS_THRESHOLD for j in "123"}, records)
    failed = SlurmCli(bin_dir=str(tmp_path), api=api).pin_and_release([Pin(j, "n1", tag) for j in "123"])
    assert sorted(failed) == ["2", "3"]


def test_a_timed_pin_is_released_in_a_second_rpc(tmp_path):
    api = FakeApi()
    SlurmCli(bin_dir=str(tmp_path), api=api).pin_and_release([Pin("1", "n1", "t", time_limit_min=5),
                                                               Pin("2", "n1", "t")])  # fmt: skip
    assert api.calls == [("pin", "1"), ("release", "1"), ("pin", "2")]


def test_a_read_slurm_did_not_answer_goes_to_squeue_and_an_answered_error_is_raised(tmp_path, scontrol):
    cli = SlurmCli(bin_dir=str(tmp_path), api=FakeApi({("read", "7"): TIMED_OUT}))
    read = " ".join(("squeue", *commands.SQUEUE_ARGS, commands.ARRAY_UNIQUE, "-O", commands.FORMAT, "-j", "7"))
    assert cli.job("7") is None and scontrol() == [read]
    with pytest.raises(SlurmError, match="2108"):
        SlurmCli(bin_dir=str(tmp_path), api=FakeApi({("read", "7"): QOS_THRESHOLD})).job("7")
    record = HELD.format(job=8, tag="mig-batch:v1")
    assert SlurmCli(api=FakeApi(records={"8": record})).job("8").state == JobState.HELD


def test_release_sends_every_job_before_it_reports_a_refusal(tmp_path, scontrol):
    api = FakeApi({("release", "1"): REFUSED, ("release", "3"): UNREACHABLE})
    with pytest.raises(SlurmError, match="error 2017 for job 1"):
        SlurmCli(bin_dir=str(tmp_path), api=api).release(["1", "2", "3", "4"])
    assert api.calls == [("release", j) for j in "123"] and scontrol() == ["scontrol release 3,4 "]


def test_the_poll_falls_back_to_squeue_when_slurm_does_not_answer(tmp_path, scontrol):
    cli = SlurmCli(bin_dir=str(tmp_path), api=FakeApi({("all", ""): UNREACHABLE}))
    assert cli.jobs() == [] and scontrol()[0].startswith("squeue --local")


def test_a_poll_parses_only_lines_it_has_not_seen_and_keeps_only_this_polls_jobs():
    api = FakeApi(records={"1": HELD.format(job=1, tag="a"), "2": HELD.format(job=2, tag="b")})
    cli = SlurmCli(api=api)
    first = {j.job_id: j for j in cli.jobs()}
    api.records["2"] = RELEASED.format(job=2, tag="b")
    api.records["3"] = HELD.format(job=3, tag="c")
    del api.records["1"]
    second = {j.job_id: j for j in cli.jobs()}
    assert sorted(second) == ["2", "3"] and second["2"].state == JobState.PENDING and first["2"].state == JobState.HELD
    api.records["4"] = HELD.format(job=4, tag="d")
    third = {j.job_id: j for j in cli.jobs()}
    assert third["3"] is second["3"] and sorted(cli._parsed) == sorted(r.strip() for r in api.records.values())


def test_squeue_and_sinfo_run_without_the_settings_their_users_may_have_in_the_environment(tmp_path, monkeypatch):
    """SQUEUE_ARRAY would print each pending task of an array apart, all under one JobID; SQUEUE_USERS and
    SINFO_PARTITION would leave records out: mig-batchd's view of the queue must not depend on them."""
    seen = tmp_path / "env"
    for name in ("squeue", "sinfo"):
        (tmp_path / name).write_text(f"#!/bin/sh\nenv >> {seen}\n")
        (tmp_path / name).chmod(0o755)
    for key in ("SQUEUE_ARRAY", "SQUEUE_USERS", "SINFO_PARTITION", "SCONTROL_ALL"):
        monkeypatch.setenv(key, "1")
    cli = SlurmCli(bin_dir=str(tmp_path))
    assert cli.jobs() == [] and cli.nodes() == []
    names = {line.partition("=")[0] for line in seen.read_text().splitlines()}
    assert "PATH" in names and not {n for n in names if n.startswith(("SQUEUE_", "SINFO_", "SCONTROL_"))}


def test_a_squeue_without_array_unique_is_read_without_it_from_then_on(tmp_path):
    """Slurm 23.02 removed ``--array-unique`` (and keeps an array's own task records apart without it)."""
    calls = tmp_path / "calls"
    (tmp_path / "squeue").write_text(f"""#!/bin/sh
echo "squeue $*" >> {calls}
case " $* " in *" --array-unique "*) echo "squeue: unrecognized option '--array-unique'" >&2; exit 1;; esac
""")
    (tmp_path / "squeue").chmod(0o755)
    cli = SlurmCli(bin_dir=str(tmp_path))
    assert cli.jobs() == [] and cli.job("7") is None
    assert SlurmCli(bin_dir=str(tmp_path)).jobs() == []  # a second one in this process asks no more
    lines = calls.read_text().split("\n")[:-1]  # the format holds \x1e
    assert [ARRAY in line for line in lines] == [True, False, False, False], lines
    assert all(f" {commands.EVERY_TASK} " in line for line in lines[1:])


def test_a_squeue_that_fails_otherwise_is_an_error_and_keeps_the_option(tmp_path):
    calls = tmp_path / "calls"
    script = f"#!/bin/sh\necho \"$*\" >> {calls}\necho 'squeue: error: no slurmctld' >&2\nexit 1\n"
    (tmp_path / "squeue").write_text(script)
    (tmp_path / "squeue").chmod(0o755)
    cli = SlurmCli(bin_dir=str(tmp_path))
    for _ in range(2):
        with pytest.raises(SlurmError, match="no slurmctld"):
            cli.jobs()
    assert [ARRAY in line for line in calls.read_text().split("\n")[:-1]] == [True, True]


def test_the_jobs_of_an_unchanged_poll_are_the_folded_ones_squeue_gave(tmp_path):
    """The helper library's "nothing changed" returns the last poll's jobs: one per record, even where that
    poll was squeue's, a line per pending task."""
    held = "9|9|{t}|PENDING|0|0||1795407940|N/A|N/A|1-02:03:00|0:0|JobHeldUser\x1f1|gpu|N/A|(null)|(null)\x1e\n"
    refuse = ("""case " $* " in *" --array-unique "*) """
              """echo "squeue: unrecognized option '--array-unique'" >&2; exit 1;; esac""")
    records = "".join(held.format(t=t) for t in (1, 2, 5))
    (tmp_path / "squeue").write_text(f"#!/bin/sh\n{refuse}\nprintf '{records}'\n")
    (tmp_path / "squeue").chmod(0o755)
    api = FakeApi({("all", ""): TIMED_OUT})
    cli = SlurmCli(bin_dir=str(tmp_path), api=api)
    first = cli.jobs()  # the library does not answer: squeue, folded
    api.errors.clear()
    api.all_job_lines = lambda since=0: (None, since)  # back, and nothing changed
    cli._api_paused_until = 0.0
    assert [(j.job_id, j.array_tasks) for j in first] == [("9", (range(1, 3), range(5, 6)))]
    assert cli.jobs() == first


ARRAY = " " + commands.ARRAY_UNIQUE
