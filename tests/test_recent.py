"""The learning policies' window of recent jobs: each job counted once while it keeps coming back."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mig_batch.placement.base import PlacementRequest
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.policies import make_policy
from mig_batch.placement.recent import RecentJobs

MODEL = "A100-80GB"


@given(st.lists(st.integers(0, 30), max_size=200), st.integers(1, 8))
def test_each_job_counts_once_and_the_window_holds_the_latest_new_jobs(tries, window):
    recent: RecentJobs[int] = RecentJobs(window, remember=64)  # more than the distinct jobs: none forgotten
    first_seen = []
    for job in tries:
        added = recent.add(str(job), lambda job=job: job)
        assert (added is None) == (job in first_seen)
        if added is not None:
            left = first_seen[-window] if len(first_seen) >= window else None
            first_seen.append(job)
            assert added == (job, left)
    assert recent.new_jobs == len(first_seen) and list(recent.values) == first_seen[-window:]


def test_a_job_that_keeps_coming_back_is_remembered_and_a_forgotten_one_counts_again():
    recent: RecentJobs[str] = RecentJobs(1, remember=2)
    for job in ("waits", "a", "waits", "b", "waits", "c"):  # each try of "waits" makes it the newest
        recent.add(job, lambda job=job: job)
    assert recent.new_jobs == 4  # waits, a, b, c
    assert recent.add("a", lambda: "a") == ("a", "c")  # forgotten (two others tried since): new again
    assert RecentJobs(None).add("x", lambda: 1) == (1, None) and not RecentJobs(None).values
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="window must be a whole number of jobs, at least 1"):
            RecentJobs(bad)


def test_a_job_whose_value_cannot_be_made_is_not_taken_as_tried():
    recent: RecentJobs[int] = RecentJobs(2)

    def unknown() -> int:
        raise KeyError("no such profile")

    with pytest.raises(KeyError):
        recent.add("j", unknown)
    assert recent.add("j", lambda: 1) == (1, None)  # counted at its next try


def test_mix_over_every_job_weighs_all_of_them():
    """``window=None``: the whole-GPU share is over every job so far, not over an empty window."""
    from mig_batch.placement.lexicographic import MixAware

    policy = MixAware(window=None)
    cluster = Cluster.homogeneous(MODEL, 4)
    for j, profile in enumerate(["1g.10gb", "1g.10gb", "7g.80gb"]):
        policy.decide(cluster, PlacementRequest.single(f"j{j}", MODEL, profile))
    assert policy.whole_recent == 1 and not policy.fit_first()  # 1 of 3 jobs < 40%: waste-first
    policy.decide(cluster, PlacementRequest.single("j3", MODEL, "7g.80gb"))
    assert policy.fit_first()  # 2 of 4
    with pytest.raises(ValueError, match="whole_share must be a share of the requests, from 0 to 1"):
        MixAware(whole_share=1.5)


@pytest.mark.parametrize("name", ["emfi", "mecc", "lex", "mix"])
def test_every_learning_policy_counts_a_job_tried_again_after_its_window_once(name):
    """The four learning policies share the one window (emfi: every job): a job waiting while others pass
    counts once."""
    settings = {"emfi": {}, "mecc": {"window": 2}, "lex": {"order": ("ev",), "mix_window": 2},
                "mix": {"window": 2}}[name]  # fmt: skip
    policy = make_policy(name, **settings)
    cluster = Cluster.homogeneous(MODEL, 1)
    for job in ("waits", "a", "b", "waits", "c", "waits"):
        policy.decide(cluster, PlacementRequest.single(job, MODEL, "7g.80gb" if job == "waits" else "1g.10gb"))
    window = {"emfi": "jobs", "mecc": "jobs", "lex": "mix", "mix": "recent"}[name]
    assert getattr(policy, window).new_jobs == 4
