"""migsub: #MIG directives, command-line precedence, errors that name the line, the sbatch command."""

import json
import os

import pytest

from mig_batch.cli.migsub import main
from mig_batch.subjob import next_job_spec


def script(tmp_path, body):
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n" + body)
    return path


def dry_run(capsys, *argv):
    assert main(["--dry-run", "--json", *argv]) == 0  # options before the script, as with sbatch
    return json.loads(capsys.readouterr().out)


def test_directives_translate_per_model(tmp_path, capsys):
    job = script(
        tmp_path, "#SBATCH --time=10\n#MIG --gpu-mem 18G\n#MIG --gpu-compute 0.3\npython train.py\n#MIG --mig 7g.80gb\n"
    )
    out = dry_run(capsys, str(job), "--epochs", "3")
    assert out["profiles"]["A100-80GB"] == "3g.40gb"  # the #MIG after the first command line is ignored
    assert out["sbatch"][:3] == ["sbatch", "--parsable", "--gres=mig:18432M"]
    assert out["sbatch"][-3:] == [str(job), "--epochs", "3"]


def test_command_line_overrides_directives(tmp_path, capsys):
    job = script(tmp_path, "#MIG --mig 1g.10gb\n")
    out = dry_run(capsys, "--mig", "2g.20gb", "--gpu", "h100-80gb", str(job))
    assert out["profiles"] == {"H100-80GB": "2g.20gb"}
    assert "--constraint=H100-80GB" in out["sbatch"]


def test_moldable(tmp_path, capsys):
    job = script(tmp_path, "#MIG --moldable 1g=300,3g=110 --gpu-mem 8G\n")
    out = dry_run(capsys, "--gpu", "A100-40GB", str(job))
    assert out["profiles"]["A100-40GB"] == {"1g.10gb": 300.0, "3g.20gb": 110.0}
    assert "--gres=mig:8192M" in out["sbatch"]  # the memory floor
    assert "--comment=mig-batch:moldable=1g:300,3g:110" in out["sbatch"]  # seconds, as job_submit.lua reads them
    job = script(tmp_path, "#MIG --moldable 3g.40gb=2m,2g=5m,7g=1m30s\n")
    out = dry_run(capsys, str(job))
    assert "--gres=mig:2g" in out["sbatch"]  # no memory floor: its smallest size
    assert "--comment=mig-batch:moldable=3g.40gb:120,2g:300,7g:90" in out["sbatch"]


def test_errors_name_directive_and_line(tmp_path, capsys):
    job = script(tmp_path, "#SBATCH -N1\n#MIG --gpu-mem 18\n")
    assert main(["--dry-run", str(job)]) == 2
    err = capsys.readouterr().err
    assert "job.sh line 3: #MIG --gpu-mem 18" in err and "a unit is required" in err

    job = script(tmp_path, "#MIG --gpu-memory 18G\n")
    assert main(["--dry-run", str(job)]) == 2
    assert "line 2" in capsys.readouterr().err

    job = script(tmp_path, "#SBATCH --gres=gpu:1\n#MIG --mig 3g.40gb\n")
    assert main(["--dry-run", str(job)]) == 2
    assert "asks for GPUs too" in capsys.readouterr().err

    job = script(tmp_path, "echo hi\n")
    assert main(["--dry-run", str(job)]) == 2
    assert "say what the job needs" in capsys.readouterr().err


def test_impossible_everywhere_names_largest_profile(tmp_path, capsys):
    job = script(tmp_path, "#MIG --gpu-mem 500G\n")
    assert main(["--dry-run", str(job)]) == 2
    assert "the largest is" in capsys.readouterr().err


def test_missing_script(tmp_path, capsys):
    assert main(["--dry-run", str(tmp_path / "nope.sh")]) == 2
    assert "cannot read job script" in capsys.readouterr().err


def fake_sbatch(folder, job_id, exit_code=0):
    """A stand-in for sbatch that records its arguments and stdin (the real one runs in the e2e tests)."""
    exe = folder / "sbatch"
    exe.write_text(f"#!/bin/sh\necho \"$@\" > {folder}/args\ncat > {folder}/stdin\necho {job_id}\nexit {exit_code}\n")
    exe.chmod(0o755)
    return exe


def test_a_chain_leaves_its_submission_and_the_runner_submits_the_next_job(tmp_path, monkeypatch, capsys):
    from mig_batch.subjob.runner import submit_next_job

    job = tmp_path / "train.sh"
    job.write_text("#!/bin/bash\n#SBATCH --output=out.log\npython train.py\n")
    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    fake_sbatch(tmp_path, "41")
    assert main(["--atomize", "--checkpoint-dir", str(ckpt), "--gpu-mem", "6G", str(job)]) == 0
    assert capsys.readouterr().out.strip() == "41"
    spec = json.loads(next_job_spec(ckpt).read_text())
    assert "--output=out.log" in spec["script"] and spec["sbatch"][0] == "sbatch"

    fake_sbatch(tmp_path, "42")
    monkeypatch.setenv("MIG_BATCH_CHECKPOINT_DIR", str(ckpt))
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.delenv("MIG_BATCH_CHAIN", raising=False)
    assert submit_next_job() == "42"
    args = (tmp_path / "args").read_text()
    assert f"ckpt={ckpt}" in args and ";chain=41" in args  # names the chain's first job
    assert (tmp_path / "stdin").read_text() == spec["script"]
    monkeypatch.setenv("MIG_BATCH_CHAIN", "41")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert submit_next_job() == "42" and ";chain=41" in (tmp_path / "args").read_text()

    fake_sbatch(tmp_path, "", exit_code=1)  # refused: the runner says so, mig-batchd requeues instead
    assert submit_next_job() is None
    assert "requeues this one" in capsys.readouterr().err


# --- directives and options: the command line wins field by field -------------------------------------------

# (#MIG lines, command line, the sbatch command's options before the script); every run on an A100-80GB
PRECEDENCE = [
    # the issue's case: an explicit profile replaces the directives' memory/compute request
    ("#MIG --gpu-mem 18G", ["--mig", "1g.10gb", "--instances", "4"],
     "--gres=mig:1g.10gb:4 --ntasks-per-node=4 --nodes=1"),
    ("#MIG --mig 1g.10gb --instances 4", ["--gpu-mem", "18G"],  # a size replaces the profile; the count stays
     "--gres=mig:18432M:4 --ntasks-per-node=4 --nodes=1"),
    ("#MIG --gpu-mem 18G --gpu-compute 0.3", ["--gpu-mem", "30G"],  # same kind: field by field
     "--gres=mig:30720M --comment=mig-batch:compute=0.3"),
    ("#MIG --gpu-mem 18G --gpu-compute 0.3", ["--gpu-compute", "2g"],
     "--gres=mig:18432M --comment=mig-batch:compute=2g"),
    ("#MIG --moldable 1g=300,3g=110 --gpu-mem 8G", ["--mig", "3g.40gb"], "--gres=mig:3g.40gb"),
    ("#MIG --moldable 1g=300,3g=110", ["--gpu-mem", "8G"],  # --gpu-mem: the moldable job's memory floor
     "--gres=mig:8192M --comment=mig-batch:moldable=1g:300,3g:110"),
    ("#MIG --moldable 1g=300,3g=110", ["--gpu-compute", "2g"], "--gres=mig:2g --comment=mig-batch:compute=2g"),
    ("#MIG --mig 1g.10gb --gpu-compute 1g", ["--moldable", "1g=60,2g=30"],
     "--gres=mig:1g --comment=mig-batch:moldable=1g:60,2g:30"),
    ("#MIG --mig 1g.10gb --instances 2", ["--instances", "3"], "--gres=mig:1g.10gb:3 --ntasks-per-node=3 --nodes=1"),
    ("#MIG --gpu-mem 18G", ["--gres=gpu:1g.10gb:2"], "--gres=mig:1g.10gb:2 --ntasks-per-node=2 --nodes=1"),
    ("#MIG --gpu-mem 18G", ["--gpus", "2g.20gb:1"], "--gres=mig:2g.20gb"),
    ("#MIG --gpu-mem 18G", ["-G", "1g.10gb:2"], "--gres=mig:1g.10gb:2 --ntasks-per-node=2 --nodes=1"),  # -G: --gpus
    ("#MIG --mig 1g.10gb", ["--gpus-per-node=3g.40gb:1"], "--gres=mig:3g.40gb"),
    ("#MIG --mig 7g.80gb", ["--gres", "mig:20G"], "--gres=mig:20480M"),
    ("#MIG --mig 1g.10gb", ["--gres=gpu:2g.20gb,nvme:1"], "--gres=mig:2g.20gb,nvme:1"),  # other GRES kept beside it
    ("#MIG --mig 1g.10gb\n#MIG --mig 2g.20gb", [], "--gres=mig:2g.20gb"),  # among directives, the later line wins
]


@pytest.mark.parametrize(("directives", "argv", "expected"), PRECEDENCE)
def test_options_override_directives_field_by_field(tmp_path, capsys, directives, argv, expected):
    job = script(tmp_path, f"#MIG --gpu A100-40GB\n{directives}\n")
    out = dry_run(capsys, "--gpu", "A100-80GB", *argv, str(job))  # the command line's --gpu wins too
    assert out["sbatch"] == ["sbatch", "--parsable", *expected.split(), "--constraint=A100-80GB", str(job)]


def test_sbatch_options_pass_through_unchanged(tmp_path, monkeypatch, capsys):
    """At the subprocess edge: what sbatch is run with, word for word."""
    job = script(tmp_path, "#MIG --mig 1g.10gb\n#SBATCH --time=10\necho hi\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    fake_sbatch(tmp_path, "77")
    argv = ["-p", "gpu", "--account=proj", "--qos", "high", "--mail-type=END,FAIL", "-J", "my run", "--hold",
            "--gpu", "A100-80GB", "--exclusive", "-t30", "--array=1-4%2", str(job), "--epochs", "3"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == "77"
    assert (tmp_path / "args").read_text() == (
        f"--parsable --gres=mig:1g.10gb --constraint=A100-80GB -p gpu --account=proj --qos high "
        f"--mail-type=END,FAIL -J my run --hold --exclusive -t30 --array=1-4%2 {job} --epochs 3\n"
    )


def test_after_double_dash_every_option_is_the_batch_systems(tmp_path, capsys):
    job = script(tmp_path, "#MIG --mig 1g.10gb\n")
    out = dry_run(capsys, "--gpu", "A100-80GB", "--", "--deadline", "now+1hour", "--json", "--instance", "x",
                  str(job))  # fmt: skip
    assert out["sbatch"][-6:] == ["--deadline", "now+1hour", "--json", "--instance", "x", str(job)]
    assert "deadline" not in out["options"]
    out = dry_run(capsys, "--gpu", "A100-80GB", "--mpi=pmix", "--mem-per-gpu=8G", "--gpu-bind=closest", str(job))
    assert out["passthrough"] == ["--mpi=pmix", "--mem-per-gpu=8G", "--gpu-bind=closest"]  # sbatch's, near or not


def test_dry_run_shows_the_final_command(tmp_path, capsys):
    job = script(tmp_path, "#MIG --gpu-mem 18G\n")
    assert main(["--dry-run", "--gpu", "A100-80GB", "--mig", "1g.10gb", "-p", "gpu", "--qos=high", str(job)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "A100-80GB: 1g.10gb",
        f"sbatch command: sbatch --parsable --gres=mig:1g.10gb --constraint=A100-80GB -p gpu --qos=high {job}",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gres=gpu:1"], "--gres=gpu:1 asks for whole GPUs, not a MIG instance; migsub submits MIG jobs"),
        (["--gpus", "2"], "--gpus 2 asks for whole GPUs"),
        (["--gres=gpu:a100:1"], "with one of this site's profiles (1g.5gb, 1g.5gb+me, 1g.6gb,"),
        (["--gpus-per-task=1g.10gb:1"], "asks for whole GPUs"),
        (["--mig", "1g.10gb", "--gres=gpu:2g.20gb"], "--mig and --gres=gpu:2g.20gb both give the request"),
        (["--gpus=1g.10gb:1", "--gres=gpu:2g.20gb"], "the MIG request is given twice"),
        (["--gpus=1g.10gb:0"], "give at least 1"),
        (["--mig", "1g.10gb", "-C", "a100"], "migsub writes --constraint=<model> for --gpu"),
        (["--gpu-compute", "2g", "--comment=mine"], "leave --comment out"),
        (["--mig", "1g.10gb", "--ntasks=3", "--instances", "2"], "'command line --ntasks=3' contradicts --instances 2"),
        (["--mig", "1g.10gb", "--backend", "htcondor", "-p", "gpu"], "-p gpu: options for sbatch; on HTCondor"),
        (["--mig", "1g.10gb", "--deadline", "1h"], "--deadline: --deadline needs --atomize (sbatch's own --deadline "
                                                    "goes after --: migsub ... -- --deadline=TIME job.sh)"),
        (["--gpu-memory", "18G"], "--gpu-memory is not a migsub option; did you mean --gpu-mem? (an option of "
                                  "sbatch's of that name goes after --"),
        (["--mig", "1g.10gb", "--instance", "2"], "did you mean --instances?"),
        (["--mig", "1g.10gb", "-p"], "no batch script: {job} was read as the value of -p, which migsub passes to "
                                     "sbatch; write -pVALUE"),
    ],
)
def test_refused_options_say_what_would_be_accepted(tmp_path, capsys, argv, message):
    job = script(tmp_path, "#MIG --gpu A100-80GB\n")
    if "-C" in argv:
        argv = [*argv, "--gpu", "A100-80GB"]
    assert main(["--dry-run", *argv, str(job)]) == 2
    err = capsys.readouterr().err
    assert message.format(job=job) in " ".join(err.split()), err


def test_static_mig_forms_in_sbatch_lines_are_refused_with_the_way(tmp_path, capsys):
    job = script(tmp_path, "#SBATCH --gpus=1g.10gb:2\n")
    assert main(["--dry-run", str(job)]) == 2
    assert "#MIG --mig PROFILE --instances N, or --gres=gpu:PROFILE:N on migsub's command line" in " ".join(
        capsys.readouterr().err.split())


# --- round-up: told, or refused with --strict ------------------------------------------------------------------


def test_round_up_is_told_and_strict_refuses(tmp_path, capsys):
    job = script(tmp_path, "#MIG --gpu-mem 20G\n")
    out = dry_run(capsys, "--gpu", "A100-80GB", str(job))
    warning = ("A100-80GB: 20.00 GiB GPU memory asked, 3g.40gb (38.80 GiB, 3/7 compute) chosen (1.9x the memory); "
               "2g.20gb holds 19.40 GiB, 614 MiB short")  # fmt: skip
    assert out["round_up"] == {"A100-80GB": warning}
    assert main(["--dry-run", "--gpu", "A100-80GB", str(job)]) == 0
    assert f"warning: {warning}" in " ".join(capsys.readouterr().err.split())

    assert main(["--dry-run", "--strict", "--gpu", "A100-80GB", str(job)]) == 2
    assert f"--strict: the request rounds up: {warning}" in " ".join(capsys.readouterr().err.split())
    strict = script(tmp_path, "#MIG --gpu-mem 20G --strict\n")
    assert main(["--dry-run", "--gpu", "A100-80GB", str(strict)]) == 2
    assert "line 2: #MIG --gpu-mem 20G --strict: the request rounds up" in " ".join(capsys.readouterr().err.split())
    out = dry_run(capsys, "--strict", "--gpu", "A100-80GB", "--gpu-mem", "19G", str(job))  # 2g.20gb: fits well
    assert out["round_up"] == {} and out["profiles"] == {"A100-80GB": "1g.20gb"}
