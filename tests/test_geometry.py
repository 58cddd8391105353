"""MIG placement rules, configuration enumeration and canonical form."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mig_batch.mig.configs import (
    apply_symmetry,
    canonical,
    is_maximal,
    maximal_configurations,
    partition_label,
    reachable_configurations,
    symmetries,
)
from mig_batch.mig.geometry import (
    Configuration,
    PlacementError,
    feasible_starts,
    format_mask,
    parse_configuration,
    parse_mask,
    place,
    remove,
)
from mig_batch.mig.models import all_models, get_model

MODELS = sorted(all_models().values(), key=lambda m: m.name)


@st.composite
def model_and_ops(draw):
    """A model and a random sequence of place attempts / removals."""
    model = draw(st.sampled_from(MODELS))
    names = [p.name for p in model.profiles]
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["place", "remove"]), st.sampled_from(names), st.integers(0, model.memory_slices)
            ),
            max_size=40,
        )
    )
    return model, ops


def check_valid(model, config):
    """No overlap, allowed starts only, per-profile instance limits respected."""
    used = 0
    for inst in config.instances:
        p = model.profile(inst.profile)
        assert inst.start in p.starts
        assert not p.window(inst.start) & used
        used |= p.window(inst.start)
        assert config.count(inst.profile) <= p.max_instances
    assert used == config.mask(model)


@given(model_and_ops())
def test_random_place_remove_sequences_stay_valid(data):
    model, ops = data
    config = Configuration()
    for op, name, start in ops:
        if op == "place":
            allowed = start in feasible_starts(model, config, name)
            try:
                after = place(model, config, name, start)
            except PlacementError:
                assert not allowed
                continue
            assert allowed
            assert remove(after, name, start) == config  # remove undoes place
            config = after
        elif config.instances:
            victim = config.instances[start % len(config.instances)]
            config = remove(config, victim.profile, victim.start)
        check_valid(model, config)


def test_place_errors_say_why():
    a100 = get_model("A100-40GB")
    config = place(a100, Configuration(), "3g.20gb", 4)
    with pytest.raises(PlacementError, match="overlaps allocated memory slices 4, 5") as err:
        place(a100, config, "2g.10gb", 4)
    assert err.value.reason == "overlap"
    with pytest.raises(PlacementError, match="allowed starts: 0, 4") as err:
        place(a100, Configuration(), "3g.20gb", 2)
    assert err.value.reason == "bad-start"
    with_me = place(a100, Configuration(), "1g.5gb+me", 0)
    with pytest.raises(PlacementError, match="at most 1 1g.5gb\\+me") as err:
        place(a100, with_me, "1g.5gb+me", 3)
    assert err.value.reason == "max-instances"
    with pytest.raises(PlacementError, match="no 1g.5gb instance starts at memory slice 2"):
        remove(with_me, "1g.5gb", 2)


@pytest.mark.parametrize(
    ("model_name", "profiles", "reachable", "maximal", "canonical_maximal"),
    [
        # GRMU §5.1: 723 configurations and 78 terminal ones for the A100 with its six profiles.
        ("A100-40GB", None, 723, 78, None),
        ("H100-80GB", None, 723, 78, None),
        # MIG-DRL §2 / §4.1: 19 partitions of the 7-slice GPUs with profiles of 1, 2, 3, 4 and 7 slices;
        # the three pairs 2-1-1-x ~ 1-1-2-x are equivalent (16 classes: 19 - 3).
        ("A100-80GB", ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"], None, 19, 16),
        # MIG-DRL: 5 partitions of the A30, 2-1-1 ~ 1-1-2.
        ("A30-24GB", None, None, 5, 4),
    ],
)
def test_configuration_counts_match_the_papers(model_name, profiles, reachable, maximal, canonical_maximal):
    model = get_model(model_name)
    if reachable is not None:
        assert len(reachable_configurations(model, profiles)) == reachable
    found = maximal_configurations(model, profiles)
    assert len(found) == maximal
    if canonical_maximal is not None:
        assert len({canonical(model, c, profiles) for c in found}) == canonical_maximal


def test_every_enumerated_configuration_is_valid_and_rebuildable(model):
    for config in reachable_configurations(model):
        check_valid(model, config)
        rebuilt = Configuration()
        for inst in config.instances:  # reachable by placing its instances one by one
            rebuilt = place(model, rebuilt, inst.profile, inst.start)
        assert rebuilt == config


def test_maximal_configurations_admit_nothing_more(model):
    reachable = reachable_configurations(model)
    maximal = set(maximal_configurations(model))
    for config in reachable:
        assert (config in maximal) == is_maximal(model, config)


def test_mig_drl_equivalent_pairs_share_a_canonical_form():
    model = get_model("A100-80GB")
    profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    pairs = [
        ("2g.20gb@0,1g.10gb@2,1g.10gb@3,3g.40gb@4", "1g.10gb@0,1g.10gb@1,2g.20gb@2,3g.40gb@4"),
        ("2g.20gb@0,1g.10gb@2,1g.10gb@3,2g.20gb@4,1g.10gb@6", "1g.10gb@0,1g.10gb@1,2g.20gb@2,2g.20gb@4,1g.10gb@6"),
    ]
    for high, low in pairs:
        a, b = parse_configuration(model, high), parse_configuration(model, low)
        assert canonical(model, a, profiles) == canonical(model, b, profiles) == a
    assert partition_label(model, parse_configuration(model, pairs[0][0])) == "2-1-1-3"
    # 3-1-1-1 and 1-1-1-1-3 are NOT equivalent: slice 7 cannot host a 1-slice instance
    left = parse_configuration(model, "3g.40gb@0,1g.10gb@4,1g.10gb@5,1g.10gb@6")
    right = parse_configuration(model, "1g.10gb@0,1g.10gb@1,1g.10gb@2,1g.10gb@3,3g.40gb@4")
    assert canonical(model, left, profiles) != canonical(model, right, profiles)


def test_symmetries_preserve_validity(model):
    for perm in symmetries(model.name):
        for config in list(reachable_configurations(model))[:200]:
            image = apply_symmetry(model, config, perm)
            check_valid(model, image)
            assert canonical(model, image) == canonical(model, config)


def test_mask_parsing_and_formatting():
    assert parse_mask("11000100", 8) == 0b00100011
    assert parse_mask("0,1,5", 8) == 0b00100011
    assert format_mask(0b00100011, 8) == "11000100"
    with pytest.raises(ValueError, match="out of range 0..7"):
        parse_mask("0,9", 8)
    with pytest.raises(ValueError, match="cannot read occupancy"):
        parse_mask("abc", 8)
