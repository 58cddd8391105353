"""`mig-batch bench controller --rounds`: the order of the bursts alternates and the ratios are taken per
round, then their median (no Slurm needed)."""

import pytest

from mig_batch.bench.controller import BurstRun, median_ratios, ratios, round_order


def _run(mode: str, jobs_per_s: float) -> BurstRun:
    return BurstRun(mode, 100, 100, 1.0, 100 / jobs_per_s)


def test_rounds_alternate_their_order_and_the_ratios_median_is_taken_per_round():
    assert round_order(0) == ("bare", "noop", "mig", "slots") and round_order(1) == ("slots", "mig", "noop", "bare")
    rounds = [[_run("bare", 40), _run("noop", 60), _run("mig", 45)],
              [_run("bare", 30), _run("noop", 50), _run("mig", 45)],
              [_run("bare", 50), _run("noop", 40), _run("mig", 36)]]  # fmt: skip
    assert ratios(rounds[0]) == pytest.approx({"mig/bare": 45 / 40, "mig/noop": 0.75})
    assert median_ratios(rounds) == {"mig/bare": (pytest.approx(45 / 40), 3), "mig/noop": (pytest.approx(0.9), 3)}
    assert ratios([_run("noop", 60)]) == {}
    assert ratios([_run("noop", 60), _run("mig", 45), _run("slots", 54)]) == pytest.approx(
        {"mig/noop": 0.75, "slots/noop": 0.9})
    nothing_done = BurstRun("noop", 100, 0, 1.0, 5.0)  # a base that completed nothing gives no ratio
    assert median_ratios([[_run("mig", 45), nothing_done], rounds[0]]) == {
        "mig/bare": (pytest.approx(45 / 40), 1),
        "mig/noop": (pytest.approx(0.75), 1),
    }
