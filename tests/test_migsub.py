"""migsub: #MIG directives, command-line precedence, errors that name the line, the sbatch command."""

import json
import os

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
