"""`migsub status`: the user's MIG jobs from what squeue shows their owner (no root): the request, where each
runs (node, GPU, profile, UUID) or why it waits; at the subprocess edge with a stand-in squeue."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mig_batch.cli.migsub import main
from mig_batch.cli.migsub_status import FIELD_END, RECORD_END, SQUEUE_FORMAT

F, R = FIELD_END, RECORD_END
RUNNING = "mig-batch:v1;req=20480M;place=gpu02/1/3g.40gb@4;node=made:1/3g.40gb@4/2/MIG-5f0c"
TWO = ("mig-batch:v1;req=1g.10gb;n=2;place=gpu01/0/1g.10gb@0;spots=0/1g.10gb@0,0/1g.10gb@1;"
       "node=made:0/1g.10gb@0/7/MIG-aaa;ranks=0/1g.10gb@1/8/MIG-bbb")  # fmt: skip
QUEUE = (
    f"11{F}RUNNING{F}None{F}{RUNNING}{R}\n"
    f"12{F}PENDING{F}JobHeldUser{F}mig-batch:v1;req=3g.40gb;waits=fragmented: no GPU has 4 free slices in a row{R}\n"
    f"13{F}PENDING{F}JobHeldUser{F}mig-batch:v1;req=2g{R}\n"
    f"14{F}RUNNING{F}None{F}{R}\n"  # not a MIG job
    f"15{F}RUNNING{F}None{F}{TWO}{R}\n"
)


def fake_squeue(folder: Path, text: str, code: int = 0) -> None:
    (folder / "queue").write_text(text)
    exe = folder / "squeue"
    exe.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {folder}/args\ncat {folder}/queue\nexit {code}\n')
    exe.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return tmp_path


def test_status_shows_placement_and_reasons(bin_dir, capsys):
    fake_squeue(bin_dir, QUEUE)
    assert main(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert (bin_dir / "args").read_text().split("\n")[:-1] == ["-h", "-O", SQUEUE_FORMAT, "--me"]
    assert [r["job"] for r in rows] == ["11", "12", "13", "15"]
    running, fragmented, unplaced, two = rows
    assert running["request"] == "20.00 GiB GPU memory" and running["waits"] is None
    assert running["placement"] == {"node": "gpu02", "made": "made", "instances": [
        {"rank": 0, "gpu": 1, "profile": "3g.40gb", "gpu_instance": 2, "uuid": "MIG-5f0c"}]}
    assert fragmented["waits"] == "fragmented: no GPU has 4 free slices in a row"
    assert unplaced["waits"] == "mig-batchd has not placed it yet (JobHeldUser; no reason published yet)"
    assert unplaced["request"] == "compute 2g"
    assert [(s["rank"], s["uuid"]) for s in two["placement"]["instances"]] == [(0, "MIG-aaa"), (1, "MIG-bbb")]
    assert two["request"] == "2 x (1g.10gb)"


def test_status_table_and_job_ids(bin_dir, capsys):
    fake_squeue(bin_dir, QUEUE)
    assert main(["status", "11", "12"]) == 0
    out = capsys.readouterr().out
    assert (bin_dir / "args").read_text().split("\n")[3:5] == ["-j", "11,12"]
    assert "gpu02 GPU 1 3g.40gb MIG-5f0c" in out and "fragmented: no GPU has 4 free slices" in out


@pytest.mark.parametrize(
    ("argv", "queue", "code", "message"),
    [
        (["status", "12;rm"], "", 0, "job id '12;rm' is not a Slurm job id; give numbers such as 1234"),
        (["status"], "", 1, "squeue failed (1)"),
        (["status"], "garbage", 0, "squeue printed an unexpected record"),
    ],
)
def test_status_errors(bin_dir, capsys, argv, queue, code, message):
    fake_squeue(bin_dir, queue, code)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_status_without_squeue(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["status"]) == 2
    assert "no squeue on PATH" in capsys.readouterr().err


def test_slices_counted_from_the_site_inventory(bin_dir, monkeypatch, capsys):
    config = bin_dir / "site.yaml"
    config.write_text(f"state: {bin_dir}/state.db\nnodes: {{gpu01: [A100-40GB], gpu02: [A100-80GB, A100-80GB]}}\n")
    monkeypatch.setenv("MIG_BATCH_CONFIG", str(config))
    fake_squeue(bin_dir, QUEUE)
    assert main(["status", "--json"]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["11"]["slices"] == 4  # 3g.40gb on gpu02's second GPU, an A100-80GB
    assert rows["15"]["slices"] == 4  # 2 x 1g.10gb on gpu01's A100-40GB: 2 memory slices each
    assert rows["12"]["slices"] is None  # not placed


def test_status_row_reads_every_kind_of_tag():
    from mig_batch.cli.migsub_status import status_row

    moldable = status_row("21", "PENDING", "JobHeldUser", "mig-batch:v1;req=8192M;moldable=1g:300,3g:110")
    assert moldable is not None and moldable["request"] == "moldable 1g:300,3g:110 (memory floor 8.00 GiB)"
    replaced = status_row("22", "RUNNING", "None", "mig-batch:v1;req=1g.10gb;place=gpu01/0/1g.10gb@0;"
                                                      "node=replaced:0/1g.10gb@3/9/MIG-ccc", {"gpu01": ["A100-80GB"]})
    assert replaced is not None and replaced["placement"]["made"] == "replaced" and replaced["slices"] == 1
    requeued = status_row("23", "PENDING", "JobHeldUser", "mig-batch:v1;req=1g.10gb;place=gpu01/0/1g.10gb@0;"
                                                             "node=requeue:no room on GPU 0")
    assert requeued is not None and requeued["waits"].startswith("its node could not make the instance (no room")
    unreadable = status_row("24", "PENDING", "JobHeldUser", "mig-batch:v1;n=2")
    assert unreadable is not None and unreadable["request"].startswith("unreadable tag:")
    assert status_row("25", "RUNNING", "None", "(null)") is None


def fake_condor_q(folder: Path, ads: list[dict], code: int = 0) -> None:
    (folder / "queue").write_text(json.dumps(ads) if ads else "")
    exe = folder / "condor_q"
    exe.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {folder}/args\ncat {folder}/queue\nexit {code}\n')
    exe.chmod(0o755)


def test_status_on_htcondor_reads_the_schedds_queue(bin_dir, capsys):
    fake_condor_q(bin_dir, [
        {"ClusterId": 31, "ProcId": 0, "JobStatus": 2, "MigBatchTag": RUNNING},
        {"ClusterId": 32, "ProcId": 0, "JobStatus": 1,
         "MigBatchTag": "mig-batch:v1;req=1g.10gb;waits=no room: every GPU that could hold 1g.10gb is busy"},
        {"ClusterId": 33, "ProcId": 0, "JobStatus": 2},  # not a MIG job
    ])  # fmt: skip
    assert main(["status", "--backend", "htcondor", "--json", "31", "32.0", "33"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert (bin_dir / "args").read_text().split("\n")[:4] == ["31", "32.0", "33", "-json"]
    assert [r["job"] for r in rows] == ["31.0", "32.0"]
    assert rows[0]["placement"]["instances"][0]["uuid"] == "MIG-5f0c"
    assert rows[1]["waits"] == "no room: every GPU that could hold 1g.10gb is busy"


@pytest.mark.parametrize("ads, code, says", [
    ("not json", 0, "condor_q printed what is not its JSON"),
    ([], 1, "condor_q failed (1)"),
])  # fmt: skip
def test_status_on_htcondor_refuses_what_it_cannot_read(bin_dir, capsys, ads, code, says):
    if isinstance(ads, str):
        (bin_dir / "queue").write_text(ads)
        exe = bin_dir / "condor_q"
        exe.write_text(f"#!/bin/sh\ncat {bin_dir}/queue\nexit {code}\n")
        exe.chmod(0o755)
    else:
        fake_condor_q(bin_dir, ads, code)
    assert main(["status", "--backend", "htcondor"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err


def test_status_on_htcondor_refuses_a_slurm_style_id(bin_dir, capsys):
    fake_condor_q(bin_dir, [])
    assert main(["status", "--backend", "htcondor", "12_3"]) == 2
    assert "cluster.proc" in capsys.readouterr().err
