"""The default placement policy (issue 51 point 4): one name everywhere, the one docs/placement.md
measured best, and a real check that it serves at least what MFI serves on generated workloads."""

import re
from pathlib import Path

import pytest

from mig_batch.config import SiteConfig, load_config
from mig_batch.mig.models import get_model
from mig_batch.placement.cluster import Cluster
from mig_batch.placement.default import DEFAULT_POLICY
from mig_batch.placement.policies import make_policy, policy_names
from mig_batch.sim.engine import run_online
from mig_batch.sim.heldout import dirichlet_mixes, halves, scale_load, synthetic_trace
from mig_batch.sim.workloads import MFI_DISTRIBUTIONS, mfi_arrivals
from mig_batch.yaml_text import parse_yaml

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"The default placement policy is \*\*`([a-z0-9-]+)`\*\*")


def test_one_default_everywhere(tmp_path: Path) -> None:
    assert DEFAULT_POLICY in policy_names()
    assert SiteConfig().policy == DEFAULT_POLICY
    empty = tmp_path / "empty.yaml"
    empty.write_text("state: /tmp/x.db\n")
    assert load_config(empty).policy == DEFAULT_POLICY
    pinned = tmp_path / "mfi.yaml"
    pinned.write_text("policy: mfi\n")  # MFI stays selectable by name
    assert load_config(pinned).policy == "mfi"


def test_shipped_config_and_docs_name_the_default() -> None:
    config, docs = REPO / "etc" / "mig-batch.yaml", REPO / "docs" / "placement.md"
    if not config.is_file() or not docs.is_file():
        pytest.skip("needs a checkout (etc/, docs/)")
    assert parse_yaml(config.read_text())["policy"] == DEFAULT_POLICY
    named = MARKER.findall(docs.read_text())
    assert named == [DEFAULT_POLICY], f"docs/placement.md names {named} as the measured default"


def served(policy: str, mix: dict[str, float], gpus: int, seeds: range) -> int:
    """Accepted memory slices over ``seeds`` in MFI's fill protocol (nothing leaves, 130 % demand)."""
    model = get_model("A100-80GB")
    total = 0
    for seed in seeds:
        arrivals = mfi_arrivals(model, gpus, mix, seed, 1.3, departures=False)
        (snap,) = run_online(Cluster.homogeneous(model.name, gpus), make_policy(policy), model.name, arrivals, (1.3,))
        total += snap.accepted_slices
    return total


@pytest.mark.parametrize("mix", ["uniform", "skew-small", "bimodal"])
def test_default_serves_at_least_what_mfi_serves(mix: str) -> None:
    """Generated workloads (fill protocol, 16 A100-80GB, seeds 1..4, 512 slices): the default must not serve
    less than MFI. Here `mix` serves 508-509 slices and MFI 490-500; `rr`, `wf-bi` and `mcc` (380-470) would
    fail, so would `emfi` on bimodal (493 vs 497). Not on every mix: on the held-out Dirichlet mix ``dir1``
    `mix` serves less than MFI (452 vs 468 here; docs/placement.md, "The default policy")."""
    shares = MFI_DISTRIBUTIONS[mix]
    assert served(DEFAULT_POLICY, shares, 16, range(1, 5)) >= served("mfi", shares, 16, range(1, 5))


def test_heldout_generators_are_fixed() -> None:
    """The held-out workloads are functions of their seeds only, and keep every pod."""
    assert synthetic_trace(101, pods=50) == synthetic_trace(101, pods=50)
    assert synthetic_trace(101, pods=50) != synthetic_trace(102, pods=50)
    mixes = dirichlet_mixes()
    assert len(mixes) == 6 and all(abs(sum(m.values()) - 1) < 1e-3 for m in mixes.values())
    pods = synthetic_trace(7, pods=40)
    faster = scale_load(pods, 2.0)
    assert [a.duration for a in faster] == [a.duration for a in pods]
    assert all(f.slot == round(a.slot / 2) for f, a in zip(faster, pods, strict=True))
    first, second = halves(pods)
    assert len(first) + len(second) == 40 and first[0].slot == 0 and second[0].slot == 0
