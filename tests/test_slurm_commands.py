"""The Slurm adapter's parsing of squeue's one-record-per-job format (records as Slurm 22.05 printed them)."""

import itertools
import math

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from mig_batch.batch.system import After, Awaits, JobState
from mig_batch.slurm.commands import (
    JOB_HEAD,
    NODE_HEAD,
    SlurmError,
    _limit_s,
    array_tasks,
    fold_array_lines,
    job_in,
    parse_dependency,
    parse_job_line,
    parse_node_line,
    records,
    stdin_safe,
)

FAILED = ("2|2|N/A|FAILED|4294901758|0|n1|1795407940|1795407942|1795407942|UNLIMITED|768|NonZeroExitCode\x1f1|gpu|"
          "1795407940|(null)|(null)")
KILLED = ("3|3|N/A|FAILED|4294901757|0|n1|1795407940|1795407942|1795407942|UNLIMITED|9|JobLaunchFailure\x1f1|gpu|"
          "1795407940|(null)|(null)")
HELD = ("4|4|N/A|PENDING|0|0||1795407940|N/A|N/A|1-02:03:00|0|JobHeldUser\x1f4|gpu,debug|N/A|(null)|"
        "mig-batch:v1;gres=mig:1g.10gb")
RUNNING = "1|1|N/A|RUNNING|4294901759|1000|n1|1795407940|1795407942|NONE|30:00|0|None\x1f1|gpu|1795407942|(null)|x"


def test_a_finished_job_has_its_exit_status_and_times():
    job = parse_job_line(FAILED)
    assert (job.job_id, job.state, job.exit_status, job.node, job.admin_tag) == ("2", JobState.FINISHED, 3, "n1", "")
    assert job.start_time == 1795407942.0 and job.end_time == 1795407942.0 and job.time_limit_s == math.inf


def test_an_array_tasks_record_names_its_array_and_a_plain_job_none():
    task = parse_job_line(FAILED.replace("2|2|N/A|", "12|9|3|"))  # task 3 of array 9, record 12
    pending = parse_job_line(HELD.replace("4|4|N/A|", "9|9|4-7%2|"))
    assert (task.job_id, task.array, task.array_tasks) == ("12", "9", (range(3, 4),))
    assert (pending.job_id, pending.array, pending.array_tasks) == ("9", "9", (range(4, 8),))
    assert parse_job_line(FAILED).array == "" and parse_job_line(FAILED).array_tasks == ()


def test_a_signal_is_reported_as_128_plus_it():
    assert parse_job_line(KILLED).exit_status == 128 + 9


@pytest.mark.parametrize(("printed", "status"), [("3:0", 3), ("0:9", 128 + 9), ("0:0", 0), ("255:0", 255)])
def test_the_exit_code_as_slurm_23_02_and_later_print_it_reads_as_the_wait_status_did(printed, status):
    """24.11 and 26.05 print EXIT:SIGNAL where 22.05 printed the wait status (768, 9: above)."""
    assert parse_job_line(FAILED.replace("|768|", f"|{printed}|")).exit_status == status


def test_a_held_job_has_no_forecast_start_and_its_tag():
    job = parse_job_line(HELD)
    assert job.state == JobState.HELD and job.start_time == 0.0 and job.node == ""
    assert job.admin_tag == "mig-batch:v1;gres=mig:1g.10gb" and job.time_limit_s == 26 * 3600 + 3 * 60
    assert job.cpus == 4 and job.partitions == ("gpu", "debug")  # pending: every partition it named
    assert job.not_before == 0.0 and job.after == ()


def test_a_waiting_jobs_begin_time_and_dependencies():
    job = parse_job_line(HELD.replace("|N/A|(null)|", "|1795500000|afterok:12(unfulfilled),after:13+5(unfulfilled)|"))
    assert job.not_before == 1795500000.0
    assert job.after == (After("12", Awaits.SUCCESS), After("13", Awaits.START, 300.0))
    running = parse_job_line(RUNNING.replace("|1795407942|(null)|", "|1795407942|afterok:12(unfulfilled)|"))
    assert running.not_before == 0.0 and running.after == ()  # started: what it waited for is past


@pytest.mark.parametrize(("priority", "reason", "counted"), [
    ("0", "JobHeldUser", True),  # held: mig-batchd places it only once its begin time comes
    ("4294901759", "BeginTime", True),  # released: slurmctld says it is not yet time
    ("4294901759", "Resources", False),  # released: past by slurmctld's clock, whatever this host's says
])  # fmt: skip
def test_a_released_jobs_begin_time_counts_only_while_slurm_waits_for_it(priority, reason, counted):
    line = HELD.replace("|PENDING|0|", f"|PENDING|{priority}|").replace("|JobHeldUser\x1f", f"|{reason}\x1f")
    job = parse_job_line(line.replace("|N/A|(null)|", "|1795500000|(null)|"))
    assert job.not_before == (1795500000.0 if counted else 0.0)


@pytest.mark.parametrize(("text", "after"), [
    ("(null)", ()),
    ("afterany:7(unfulfilled),afternotok:8(failed)", (After("7", Awaits.END), After("8", Awaits.NEVER))),
    ("afterany:7_*(unfulfilled),afterok:8_2(unfulfilled)",  # every task of array 7, task 2 of array 8
     (After("7_*", Awaits.END, array="7"), After("8_2", Awaits.SUCCESS, array="8", task=2))),
    ("after:7_*+2(unfulfilled)", (After("7_*", Awaits.START, 120.0, array="7"),)),
    ("aftercorr:9(unfulfilled)", (After("9", Awaits.SUCCESS),)),
    ("afterok:12(unfulfilled)?afterok:13(unfulfilled)", ()),  # one of several: Slurm's to judge
    ("afterok:12(failed)?afterok:13(unfulfilled)", ()),  # one may still be met
    ("afterok:12(failed)?afterany:13_*(failed)", (After("12", Awaits.NEVER),)),  # none can be
    ("afterok:8_2(failed),afterany:7_*(unfulfilled)",  # an array task's: final too
     (After("8_2", Awaits.NEVER), After("7_*", Awaits.END, array="7"))),
    ("afterok:8_*(failed)", (After("8_*", Awaits.NEVER),)),
    ("singleton(unfulfilled),afterok:12(unfulfilled)", (After("12", Awaits.SUCCESS),)),
    ("expand:5(unfulfilled)", ()),
    ("expand:5(failed)", (After("5", Awaits.NEVER),)),
])  # fmt: skip
def test_dependencies_as_slurm_prints_them(text, after):
    assert parse_dependency(text) == after


@pytest.mark.parametrize(("text", "tasks"), [
    ("3", (3,)),
    ("4-6,11,13-19:3%2", (4, 5, 6, 11, 13, 16, 19)),  # %2: at most two run at once
    ("1-10:2", (1, 3, 5, 7, 9)),
])  # fmt: skip
def test_an_array_records_tasks_as_slurm_prints_them(text, tasks):
    assert tuple(t for r in array_tasks(text) for t in r) == tasks


@given(st.lists(st.integers(0, 2000), min_size=1, max_size=60, unique=True))
def test_tasks_slurm_cut_short_all_count_as_the_records(tasks):
    """squeue cuts the pending tasks' text at 64 characters ("..."): every task it lists stays the record's,
    and so does every task it may have cut off, so that a job waiting for one of them waits."""
    tasks = sorted(tasks)
    runs: list[list[int]] = []
    for t in tasks:  # consecutive tasks as one range, as Slurm's bit_fmt writes them
        if runs and runs[-1][1] == t - 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    full = ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
    shown = full if len(full) <= 61 else full[:60] + "..."  # bit_fmt into 64 bytes, then the dots over its end
    ranges = array_tasks(shown)
    for t in tasks:
        assert any(t in r for r in ranges)
    if shown == full:
        assert {t for r in ranges for t in r} == set(tasks)


@given(st.text(max_size=1100) | st.text(alphabet=st.characters(max_codepoint=127), max_size=1100))
@example("a" * 999)
@example("a" * 1000)
def test_a_word_is_stdin_safe_when_scontrol_would_keep_it_verbatim(word):
    """Printable ASCII without blanks or quotes, under 1000 characters: nothing else goes on scontrol's stdin."""
    keeps = all(33 <= ord(c) <= 126 and c not in "\"'" for c in word) and len(word) < 1000
    assert stdin_safe(word) == keeps


def test_a_revoked_federated_job_is_finished_here():
    """A federation's sibling record that will never run on this cluster: its slot must not stay taken."""
    assert parse_job_line(HELD.replace("|PENDING|", "|REVOKED|")).state == JobState.FINISHED


@pytest.mark.parametrize("flag", ["CONFIGURING", "STOPPED", "SIGNALING", "RESIZING", "STAGE_OUT", "COMPLETING"])
def test_a_state_flag_of_a_job_on_its_node_is_running(flag):
    """squeue prints the flag instead of the base state. A job whose Prolog runs (CONFIGURING under
    PrologFlags=Alloc) read as waiting would let its node's reconcile destroy the instance just made."""
    assert parse_job_line(RUNNING.replace("|RUNNING|", f"|{flag}|")).state == JobState.RUNNING


@pytest.mark.parametrize("flag", ["REQUEUED", "REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD", "STAGE_IN"])
def test_a_state_flag_of_a_waiting_job_is_held_at_priority_0(flag):
    job = parse_job_line(HELD.replace("|PENDING|", f"|{flag}|"))
    assert job.state == JobState.HELD and job.start_time == 0.0


def test_a_running_job():
    job = parse_job_line(RUNNING)
    assert job.state == JobState.RUNNING and job.user_id == 1000 and job.end_time == 0.0 and job.time_limit_s == 1800


@given(st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), min_size=1))
def test_any_admin_comment_comes_back_whole(comment):
    before = RUNNING.removesuffix("x")  # every field but the admin comment
    assert parse_job_line(before + comment).admin_tag == ("" if comment == "(null)" else comment)


@given(st.text(alphabet=st.characters(blacklist_characters="\n\r\x1f", blacklist_categories=("Cs",))),
       st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), min_size=1))
def test_a_reason_with_any_text_leaves_every_other_field_whole(reason, comment):
    """A job's Reason is free text (Slurm's message of a failed Prolog, ...): a "|" in it must not shift the
    CPUs, partitions, begin time, dependencies and admin comment after it."""
    line = HELD.replace("JobHeldUser\x1f", reason + "\x1f").replace("mig-batch:v1;gres=mig:1g.10gb", comment)
    job = parse_job_line(line)
    assert (job.reason, job.cpus, job.partitions, job.after) == (reason, 4, ("gpu", "debug"), ())
    assert job.admin_tag == ("" if comment == "(null)" else comment)


def test_a_line_break_in_a_free_text_field_stays_in_its_record():
    """An administrator's note or Slurm's message over several lines (or with a Unicode line separator, a
    line break to str.splitlines) is one record still, not a poll that fails on every pass."""
    odd = HELD.replace("JobHeldUser\x1f", "Prolog error\non n1\x1f").replace(
        "mig-batch:v1;gres=mig:1g.10gb", "site note\u2028line 2\nline 3|")
    text = odd + "\x1e\n" + RUNNING + "\x1e\n"
    assert [j.job_id for j in map(parse_job_line, records(text, JOB_HEAD))] == ["4", "1"]
    job = job_in(text, "4")
    assert (job.admin_tag, job.reason, job.cpus) == ("site note\u2028line 2\nline 3|", "Prolog error\non n1", 4)
    nodes = "n1|idle|0/16/0/16|gpu|a\nb|\x1e\nn2|idle|0/16/0/16|gpu|(null)\x1e\n"
    assert [parse_node_line(r).agent_tag for r in records(nodes, NODE_HEAD)] == ["a\nb|", ""]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))), st.sampled_from(["\x1e\n", "\x1e\n\x1e\n", ""]))
def test_an_admin_comment_holding_the_record_end_stays_whole(comment, end):
    """An administrator's comment is any text, the record's end included: the records after it must stay
    whole, and not fail every poll. (A continuation that reads as a record's head still fails: that takes
    a comment made to look like one.)"""
    comment += end
    after_ends = comment.split("\x1e\n")[1:]
    assume(not any(JOB_HEAD.match(p) or NODE_HEAD.match(p) for p in after_ends))
    text = HELD.replace("mig-batch:v1;gres=mig:1g.10gb", comment) + "\x1e\n" + RUNNING + "\x1e\n"
    jobs = [parse_job_line(r) for r in records(text, JOB_HEAD)]
    assert [j.job_id for j in jobs] == ["4", "1"]
    assert jobs[0].admin_tag == ("" if comment == "(null)" else comment) and jobs[1].admin_tag == "x"
    nodes = f"n1|idle|0/16/0/16|gpu|{comment}\x1e\nn2|idle|0/16/0/16|gpu|(null)\x1e\n"
    assert [parse_node_line(r).node for r in records(nodes, NODE_HEAD)] == ["n1", "n2"]


def test_a_short_line_is_an_error_naming_it():
    with pytest.raises(SlurmError, match="unexpected record"):
        parse_job_line("1|1|N/A|RUNNING|5")


@pytest.mark.parametrize(("text", "seconds"), [("5:00", 300), ("1:00:00", 3600), ("2-00:00:30", 172830),
                                               ("UNLIMITED", math.inf), ("INVALID", math.inf)])  # fmt: skip
def test_time_limits(text, seconds):
    assert _limit_s(text) == seconds


def test_node_lines_as_sinfo_prints_them():
    up = parse_node_line("n1|mixed|3/13/0/16|gpu|(null)")
    assert (up.node, up.up, up.cpus_idle, up.agent_tag, up.partitions) == ("n1", True, 13, "", ("gpu",))
    assert not parse_node_line("n2|idle+drain|0/0/16/16|gpu|(null)").up
    down = parse_node_line("n3|down|0/0/16/16|gpu|mig-batch:agent;started=1;reconciled=2;strays=0")
    assert not down.up and down.agent_tag == "mig-batch:agent;started=1;reconciled=2;strays=0"
    assert not parse_node_line("n4|idle+not_responding|0/16/0/16|gpu|(null)").up


def test_a_node_in_several_partitions_is_one_node_with_all_of_them(monkeypatch):
    from mig_batch.slurm.commands import SlurmCli

    cli = SlurmCli()
    lines = "n1|mixed|3/13/0/16|gpu|(null)\x1e\nn2|idle|0/16/0/16|gpu|(null)\x1e\nn1|mixed|3/13/0/16|debug|(null)\x1e\n"
    monkeypatch.setattr(cli, "_run", lambda *args, **kwargs: lines)
    assert {n.node: n.partitions for n in cli.nodes()} == {"n1": ("gpu", "debug"), "n2": ("gpu",)}


def test_pin_sets_the_slice_gres_and_keeps_the_jobs_other_gres():
    from mig_batch.slurm.commands import with_slices

    assert with_slices("", "mig_slices", 4) == "gres:mig_slices:4"
    assert with_slices("gres:tmp:10,gres:mig_slices:A100:2", "mig_slices", 8) == "gres:tmp:10,gres:mig_slices:8"
    assert with_slices("gres:mig_slicesx:1", "mig_slices", 1) == "gres:mig_slicesx:1,gres:mig_slices:1"


def test_slice_accounting_conf_counts_each_nodes_memory_slices():
    from mig_batch.slurm.install import slice_accounting_conf

    slurm, gres = slice_accounting_conf({"a": ["A100-80GB", "A30-24GB"], "b": ["H100-80GB"]}, "mig_slices")
    assert "NodeName=a Name=mig_slices Count=12" in gres and "NodeName=b Name=mig_slices Count=8" in gres
    assert "GresTypes=mig,mig_slices" in slurm and "AccountingStorageTRES=gres/mig_slices" in slurm
    assert "# NodeName=a ... Gres=mig_slices:12" in slurm


def test_install_writes_the_slice_accounting_snippets_only_when_asked(tmp_path):
    from mig_batch.mig.models import get_model
    from mig_batch.slurm.install import install

    models = [get_model("A100-80GB")]
    plain, _ = install(tmp_path / "plain", "/usr/bin/python3", "/c.yaml", "/j", "/s", models, {"g1": ["A100-80GB"]})
    assert not any(p.name.endswith(".mig-batch") for p in plain)
    install(tmp_path / "acct", "/usr/bin/python3", "/c.yaml", "/j", "/s", models, {"g1": ["A100-80GB"]}, "mig_slices")
    assert "NodeName=g1 Name=mig_slices Count=8" in (tmp_path / "acct" / "gres.conf.mig-batch").read_text()


def test_pins_go_in_chunks_each_released_as_soon_as_it_is_pinned_and_a_refused_pin_is_not_released(tmp_path):
    """Slurm's scontrol faked at the subprocess edge: it logs each call (its stdin's pins, a pin in argv, or
    the release) in order and refuses job 7's pin as Slurm words it. Job 9's tag has a blank: its pin goes
    through its own process (scontrol would keep the quotes of a quoted value read from stdin)."""
    from mig_batch.batch.system import Pin
    from mig_batch.slurm.commands import PIN_CHUNK, SlurmCli

    calls = tmp_path / "calls"
    (tmp_path / "scontrol").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = release ]; then echo "release $2" >> {calls}; exit 0; fi\n'
        f'if [ "$1" = update ]; then echo "argv $2" >> {calls}; exit 0; fi\n'
        f"pins=$(sed -n 's/^update jobid=\\([0-9]*\\) .*/\\1/p' | tr '\\n' ,)\n"
        f'echo "pin $pins" >> {calls}\n'
        'case ",$pins" in *,7,*) echo "Job has already finished for job 7" >&2 ;; esac\n'
    )  # fmt: skip
    (tmp_path / "scontrol").chmod(0o755)
    jobs = [str(j) for j in range(1, 2 * PIN_CHUNK + 5)]
    tags = {j: "mig-batch:v1;node=requeue:no room" if j == "9" else "mig-batch:v1;x" for j in jobs}
    failed = SlurmCli(bin_dir=str(tmp_path)).pin_and_release([Pin(j, "n1", tags[j]) for j in jobs])
    assert list(failed) == ["7"] and "already finished" in failed["7"]
    lines = calls.read_text().splitlines()
    chunks = [jobs[i : i + PIN_CHUNK] for i in range(0, len(jobs), PIN_CHUNK)]
    expected = []
    for chunk in chunks:
        expected += ["argv jobid=9"] if "9" in chunk else []
        expected.append(f"pin {','.join(j for j in chunk if j != '9')},")
        expected.append(f"release {','.join(j for j in chunk if j != '7')}")
    assert lines == expected


def test_group_commit_runs_every_item_once_and_gives_each_caller_its_own_error():
    import threading
    import time

    from mig_batch.slurm.commands import GroupCommit

    runs: list[list[int]] = []

    def run(items):
        runs.append(items)
        time.sleep(0.01)  # callers pile up behind a run under way
        return {i: ValueError(f"item {item}") for i, item in enumerate(items) if item % 5 == 0}

    batcher, results = GroupCommit(run), {}

    def call(n):
        try:
            batcher.submit(n)
            results[n] = None
        except ValueError as exc:
            results[n] = str(exc)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(item for batch in runs for item in batch) == list(range(40))
    assert results == {n: (f"item {n}" if n % 5 == 0 else None) for n in range(40)}
    assert len(runs) < 40  # calls were combined


def test_concurrent_job_tags_share_one_scontrol_and_a_refused_one_fails_alone(tmp_path):
    """Slurm's scontrol faked at the subprocess edge. scontrol keeps quotes in values it reads from stdin,
    so a tag with a blank or a quote goes through its own process, word for word."""
    import threading

    from mig_batch.slurm.commands import SlurmCli, SlurmError

    calls = tmp_path / "calls"
    (tmp_path / "scontrol").write_text(
        "#!/bin/sh\n"
        f'if [ $# -gt 0 ]; then echo "argv $*" >> {calls}; sleep 0.2; exit 0; fi\n'
        f"sleep 0.2; cat >> {calls}\n"  # stdin: the batched updates
        f"grep -q 'jobid=13 ' {calls} && echo 'Job has already finished for job 13' >&2; exit 0\n"
    )  # fmt: skip
    (tmp_path / "scontrol").chmod(0o755)
    cli, errors = SlurmCli(bin_dir=str(tmp_path)), {}

    def tag(job):
        return f'mig-batch:v1;node=requeue:no room on n{job} ("full")' if job == "14" else f"mig-batch:v1;n={job}"

    def report(job):
        try:
            cli.set_job_tag(job, tag(job))
        except SlurmError as exc:
            errors[job] = str(exc)

    first = threading.Thread(target=report, args=("10",))
    first.start()
    while not calls.exists():  # the first caller's own run is under way; the rest queue behind it
        pass
    threads = [threading.Thread(target=report, args=(str(j),)) for j in range(11, 16)]
    for t in threads:
        t.start()
    for t in [first, *threads]:
        t.join(10)
    lines = calls.read_text().splitlines()
    assert lines[0] == "argv update jobid=10 admincomment=mig-batch:v1;n=10"
    assert f"argv update jobid=14 admincomment={tag('14')}" in lines
    stdin = [line for line in lines if not line.startswith("argv ")]
    assert sorted(stdin) == sorted(f"update jobid={j} admincomment=mig-batch:v1;n={j}" for j in (11, 12, 13, 15))
    assert list(errors) == ["13"] and "already finished" in errors["13"]


def _fake_interactive_scontrol(tmp_path, prompt: bool = True):
    """Slurm's scontrol faked at the subprocess edge: with arguments it logs them; without, it is the
    interactive one reading a pipe (prompt, echo, errors on stderr) and ends after its third command."""
    calls = tmp_path / "calls"
    (tmp_path / "scontrol").write_text(
        "#!/bin/sh\n"
        f'if [ $# -gt 0 ]; then echo "argv $*" >> {calls}; exit 0; fi\n'
        f"echo start >> {calls}\n"
        + ("printf 'scontrol: '\n" if prompt else "cat > /dev/null; exit 0\n")
        + "n=0\n"
        "while IFS= read -r line; do\n"
        '  echo "$line"\n'
        f'  echo "$line" >> {calls}\n'
        '  case "$line" in *jobid=13\\ *) echo "Job has already finished for job 13" >&2 ;; esac\n'
        "  n=$((n + 1)); [ $n -ge 3 ] && exit 0\n"
        "  printf 'scontrol: '\n"
        "done\n"
    )  # fmt: skip
    (tmp_path / "scontrol").chmod(0o755)
    return calls


def test_a_session_sends_each_update_as_a_line_and_a_broken_one_is_resent_through_a_process(tmp_path):
    from mig_batch.slurm.commands import SlurmCli, SlurmError

    calls = _fake_interactive_scontrol(tmp_path)
    cli, errors = SlurmCli(bin_dir=str(tmp_path), session=True), {}
    for job in range(10, 16):
        try:
            cli.set_job_tag(str(job), f"mig-batch:v1;n={job}")
        except SlurmError as exc:
            errors[job] = str(exc)
    cli.set_node_tag("n1", "mig-batch:agent;started=1")
    update = "update jobid={0} admincomment=mig-batch:v1;n={0}".format
    assert calls.read_text().splitlines() == [
        "start", update(10), update(11), update(12), f"argv {update(12)}",  # it ended without an answer: resent
        "start", update(13), update(14), update(15), f"argv {update(15)}",
        "start", "update nodename=n1 comment=mig-batch:agent;started=1",
    ]  # fmt: skip
    assert list(errors) == [13] and "already finished" in errors[13]


def test_a_scontrol_without_a_prompt_is_tried_once_then_every_update_runs_its_own(tmp_path):
    from mig_batch.slurm.commands import SlurmCli

    calls = _fake_interactive_scontrol(tmp_path, prompt=False)
    cli = SlurmCli(bin_dir=str(tmp_path), session=True, timeout=0.5)
    for job in ("1", "2"):
        cli.set_job_tag(job, "mig-batch:v1;x")
    assert calls.read_text().splitlines() == ["start", "argv update jobid=1 admincomment=mig-batch:v1;x",
                                              "argv update jobid=2 admincomment=mig-batch:v1;x"]  # fmt: skip


def test_a_session_that_cannot_start_falls_back_to_a_process_and_its_failure_is_slurms(tmp_path):
    """An scontrol the session cannot start (here: not executable) is an update never sent: it goes
    through a process of its own, whose failure is a SlurmError (the agent publishes it), not an OSError."""
    from mig_batch.slurm.commands import SlurmCli, SlurmError

    (tmp_path / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "scontrol").chmod(0o644)
    with pytest.raises(SlurmError, match="Permission denied"):
        SlurmCli(bin_dir=str(tmp_path), session=True).set_job_tag("1", "mig-batch:v1;x")


@given(st.sets(st.integers(1, 60), min_size=1), st.integers(0, 3))
def test_an_arrays_pending_tasks_printed_a_line_each_fold_into_its_record(tasks, own_records):
    """``squeue --array`` (Slurm 23.02 and later) prints each pending task of the record on its own line under the
    record's id; tasks with records of their own keep their ids."""
    ordered = sorted(tasks)
    apart, pending = ordered[:own_records], ordered[own_records:]
    lines = [HELD.replace("4|4|N/A|", f"{100 + t}|9|{t}|") for t in apart]
    lines += [HELD.replace("4|4|N/A|", f"9|9|{t}|") for t in reversed(pending)]
    jobs = {j.job_id: j for j in fold_array_lines(map(parse_job_line, lines))}
    assert sorted(jobs) == sorted([f"{100 + t}" for t in apart] + (["9"] if pending else []))
    if pending:
        record = jobs["9"].array_tasks
        assert [t for r in record for t in r] == pending
        assert all(a.stop < b.start for a, b in itertools.pairwise(record))  # as few ranges as can be
    assert job_in("\x1e\n".join(lines) + "\x1e\n", "9") == jobs.get("9")


def test_an_arrays_task_records_are_named_so_that_slurm_acts_on_that_task_alone(tmp_path):
    """Slurm's commands faked at the subprocess edge. Array 30's own record stands for its one task left
    (7): by the id 30 Slurm would update, release or cancel every task of the array, so each call names it
    30_7; a task split off into a record of its own (20) keeps its id; the array's record of pending tasks
    (12: 5-9, at most 3 at once) has its next tasks split off by one update."""
    from dataclasses import replace

    from mig_batch.batch.system import Pin
    from mig_batch.slurm.commands import RECORD_END, SlurmCli

    def record(job, array, tasks, tag):
        head = HELD.replace("4|4|N/A|", f"{job}|{array}|{tasks}|").rpartition("|")[0]
        return f"{head}|{tag}{RECORD_END}"

    listing = "\n".join([record(12, 12, "5-9%3", "mig-batch:v1;req=1g.10gb"), record(20, 12, 3, "mig-batch:v1;a"),
                         record(30, 30, 7, "mig-batch:v1;b")]) + "\n"  # fmt: skip
    (tmp_path / "listing").write_text(listing)
    calls = tmp_path / "calls"
    for command in ("scontrol", "scancel"):
        (tmp_path / command).write_text(f'#!/bin/sh\necho "{command} $*" >> {calls}\ncat >> {calls}\n')
        (tmp_path / command).chmod(0o755)
    (tmp_path / "squeue").write_text(f"#!/bin/sh\ncat {tmp_path / 'listing'}\n")
    (tmp_path / "squeue").chmod(0o755)
    cli = SlurmCli(bin_dir=str(tmp_path))
    jobs = {j.job_id: j for j in cli.jobs()}
    assert jobs["12"].array_limit == 3 and jobs["12"].task_count == 5
    assert jobs["20"].task_count == 1 and jobs["30"].task_count == 1
    cli.set_job_tag("30", "mig-batch:v1;c")
    cli.set_job_tag("20", "mig-batch:v1;d")
    cli.cancel("30")
    cli.hold("20")
    cli.release(["30", "20"])
    failed = cli.pin_and_release([Pin("30", "n1", "mig-batch:v1;b;place=n1/0/1g.10gb@0")])
    cli.split_array(jobs["12"], [5, 6, 8])
    said = calls.read_text().splitlines()
    assert said[:5] == ["scontrol update jobid=30_7 admincomment=mig-batch:v1;c",
                        "scontrol update jobid=20 admincomment=mig-batch:v1;d", "scancel 30_7", "scontrol hold 20",
                        "scontrol release 30_7,20"]  # fmt: skip
    assert "scontrol update jobid=30_7 nodelist=n1 admincomment=mig-batch:v1;b;place=n1/0/1g.10gb@0" in said
    assert said[-1] == "scontrol update jobid=12_[5-6,8] admincomment=mig-batch:v1;req=1g.10gb"
    assert failed == {}
    # once the listing shows the array's record standing for several tasks again, it is no task's name
    (tmp_path / "listing").write_text(listing.replace("30|30|7|", "30|30|7-8|"))
    cli.jobs()
    cli.set_job_tag("30", "mig-batch:v1;e")
    assert calls.read_text().splitlines()[-1] == "scontrol update jobid=30 admincomment=mig-batch:v1;e"
    assert replace(jobs["30"], array_tasks=(range(7, 9),)).task_count == 2


@pytest.mark.parametrize("text, limit", [("1-40%8", 8), ("5-9", 0), ("3", 0), ("1-3,7%2", 2), ("4-9...", 0)])
def test_an_arrays_limit_is_read_from_its_pending_tasks(text, limit):
    from mig_batch.slurm.commands import array_limit

    assert array_limit(text) == limit


def test_on_slurm_23_02_and_later_an_arrays_limit_is_read_from_its_folded_record(tmp_path, monkeypatch):
    """squeue --array (23.02 and later: no --array-unique) prints each pending task on a line of its own,
    without the array's %N; SlurmCli reads the limit from one more squeue of those arrays, folded. Every
    squeue runs with SLURM_BITSTR_LEN=0: a cut task list would name no task."""
    from mig_batch.slurm import commands
    from mig_batch.slurm.commands import RECORD_END, SlurmCli

    def record(job, array, tasks):
        head = HELD.replace("4|4|N/A|", f"{job}|{array}|{tasks}|").rpartition("|")[0]
        return f"{head}|mig-batch:v1;req=1g.10gb{RECORD_END}"

    every_task = "\n".join([record(12, 12, 5), record(12, 12, 6), record(12, 12, 7), record(20, 12, 3)]) + "\n"
    (tmp_path / "every").write_text(every_task)
    (tmp_path / "squeue").write_text(
        "#!/bin/sh\n"
        f'echo "$SLURM_BITSTR_LEN $*" >> {tmp_path / "args"}\n'
        'case "$*" in *--array-unique*) echo "squeue: unrecognized option \'--array-unique\'" >&2; exit 1;; esac\n'
        f'case "$*" in *--array*) cat {tmp_path / "every"};; *) printf "12|5-7%%2|\\n20|3|\\n";; esac\n'
    )  # fmt: skip
    (tmp_path / "squeue").chmod(0o755)
    monkeypatch.setattr(commands, "_REFUSE_ARRAY_UNIQUE", set())
    jobs = {j.job_id: j for j in SlurmCli(bin_dir=str(tmp_path)).jobs()}
    assert jobs["12"].array_tasks == (range(5, 8),) and jobs["12"].array_limit == 2
    assert jobs["20"].array_limit == 0
    calls = [line for line in (tmp_path / "args").read_text().split("\n") if line]  # (its separators: \x1e)
    assert len(calls) == 3 and all(line.startswith("0 ") for line in calls), calls
    assert calls[-1].endswith("-j 12 -O JobID:|,ArrayTaskID:|"), calls
