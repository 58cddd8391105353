"""`mig-batch translate`: the static-MIG request forms (--gres gpu:<profile>[:n], --gpus, --gpus-per-node), plain
--gres gpu:1 left with its meaning, and the round-up warning (--strict refuses)."""

from __future__ import annotations

import json

import pytest

from mig_batch.cli.main import main


def translate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict | None, str]:
    code = main(["translate", "--json", *argv])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), " ".join(captured.err.split())


@pytest.mark.parametrize(
    ("argv", "profile", "count"),
    [
        (["--gres", "gpu:3g.40gb:1"], "3g.40gb", 1),
        (["--gres", "gpu:3g.40gb"], "3g.40gb", 1),
        (["--gres", "mig:1g.10gb:4"], "1g.10gb", 4),
        (["--gpus", "1g.10gb:2"], "1g.10gb", 2),
        (["--gpus-per-node", "2g.20gb:3"], "2g.20gb", 3),
        (["--gpus=4g.40gb:1"], "4g.40gb", 1),
    ],
)
def test_static_mig_forms(capsys, argv, profile, count):
    code, data, _ = translate(capsys, "--gpu", "A100-80GB", *argv)
    assert code == 0 and data is not None
    assert data["count"] == count and [r["profile"] for r in data["results"]] == [profile]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gres", "gpu:1"], "--gres gpu:1 is not a MIG request: it asks for whole GPUs, as the site has them today"),
        (["--gpus", "2"], "--gpus 2 is not a MIG request"),
        (["--gres", "gpu:a100:1"], "A MIG request names a profile: --gres=gpu:<profile>[:n], --gpus=<profile>[:n]"),
        (["--gpus", "1g.10gb:0"], "give at least 1"),
        (["--gpus", "1g.10gb:1", "--mem", "8G"], "--gpus cannot be combined with --mem"),
        (["--gpus", "1g.10gb:1", "--gres", "gpu:1g.10gb"], "cannot be combined"),
        (["--gpu", "A30-24GB", "--gres", "gpu:3g.40gb:1"], "A30-24GB has no MIG profile 3g.40gb"),
    ],
)
def test_refused_forms(capsys, argv, message):
    code, _, err = translate(capsys, *argv)
    assert code == 2 and message in err, err


def test_round_up_is_told_and_strict_refuses(capsys):
    warning = ("A100-80GB: 20.00 GiB GPU memory asked, 3g.40gb (38.80 GiB, 3/7 compute) chosen (1.9x the memory); "
               "2g.20gb holds 19.40 GiB, 614 MiB short")  # fmt: skip
    code, data, err = translate(capsys, "--gpu", "A100-80GB", "--mem", "20G")
    assert code == 0 and data is not None
    assert data["results"][0]["round_up"] == warning and f"warning: {warning}" in err
    code, _, err = translate(capsys, "--gpu", "A100-80GB", "--mem", "20G", "--strict")
    assert code == 2 and f"--strict: the request rounds up: {warning}" in err
    code, data, err = translate(capsys, "--gpu", "A100-80GB", "--mem", "18G", "--strict")
    assert code == 0 and data is not None and data["results"][0]["round_up"] is None and "warning" not in err
    code, data, err = translate(capsys, "--gpu", "A100-80GB", "--gres", "gpu:7g.80gb", "--strict")  # by name: never
    assert code == 0 and data is not None and data["results"][0]["round_up"] is None
