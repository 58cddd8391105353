"""Fragmentation score F (MFI Alg. 1), Configuration Capability CC (GRMU eq. 1), and their tables.

Worked examples are computed by hand in the comments; profile sets are the base profiles.
"""

from mig_batch.mig.geometry import Configuration, free_starts, parse_configuration
from mig_batch.mig.models import get_model
from mig_batch.mig.scores import FragVariant, configuration_capability, fragmentation_score, max_cc_start
from mig_batch.mig.tables import build_tables, tables_for


def test_mfi_worked_example_gpu2():
    # MFI §V.B, Fig. 3a, GPU 2 on an A100-80GB: 2g.20gb at slices 0-1 and 1g.10gb at slice 5;
    # allocated {0, 1, 5}, 5 slices free, so 7g.80gb (8 slices) is skipped by line 5 of Alg. 1.
    a100 = get_model("A100-80GB")
    mask = parse_configuration(a100, "2g.20gb@0,1g.10gb@5").mask(a100)
    # Partly-free reading (the paper's text): 1g.20gb@4 (+2), 2g.20gb@4 (+2), 3g.40gb@0 and @4 (+4 +4),
    # 4g.40gb@0 (+4); windows fully allocated (1g.20gb@0, 2g.20gb@0, single slices) do not count.
    assert fragmentation_score(a100, mask, FragVariant.PARTIAL) == 2 + 2 + 8 + 4 == 16
    # As printed: every window touching an allocated slice counts:
    # 1g.10gb@0,1,5 (3 x 1) + 1g.20gb@0,4 (2 x 2) + 2g.20gb@0,4 (2 x 2) + 3g.40gb@0,4 (2 x 4) + 4g.40gb@0 (4)
    assert fragmentation_score(a100, mask, FragVariant.PRINTED) == 3 + 4 + 4 + 8 + 4 == 23
    # CC: free starts 1g.10gb {2,3,4,6} + 1g.20gb {2,6} + 2g.20gb {2} = 7
    assert configuration_capability(a100, mask) == 4 + 2 + 1 == 7


def test_empty_and_full_gpus():
    a100 = get_model("A100-40GB")
    assert fragmentation_score(a100, 0) == 0
    assert configuration_capability(a100, 0) == 7 + 4 + 3 + 2 + 1 + 1 == 18
    assert fragmentation_score(a100, a100.full_mask) == 0  # nothing fits, so nothing is "fragmented"
    assert configuration_capability(a100, a100.full_mask) == 0


def test_single_misplaced_1g_on_empty_a100():
    # MFI §V.B: 1g.10gb at index 1 blocks 4g.40gb. Printed F on A100-80GB with slice 1 allocated
    # (7 free): 1g.10gb@1 (1) + 1g.20gb@0 (2) + 2g.20gb@0 (2) + 3g.40gb@0 (4) + 4g.40gb@0 (4) = 13;
    # 7g.80gb needs 8 > 7 free slices and is skipped.
    a100 = get_model("A100-80GB")
    assert fragmentation_score(a100, 0b10) == 13
    assert fragmentation_score(a100, 0b10, FragVariant.PARTIAL) == 2 + 2 + 4 + 4


def test_nvidia_default_placement_of_two_1g5gb():
    # GRMU §5: on an empty A100-40GB, 1g.5gb at 6 leaves CC 14 (blocks 1g.5gb@6, 1g.10gb@6, 3g@4, 7g);
    # any other start leaves 13 or less. The second then ties at 4 and 5 (CC 11) and takes 4, the
    # "blocks 4 and 6" outcome GRMU describes.
    a100 = get_model("A100-40GB")
    assert max_cc_start(a100, 0, "1g.5gb") == 6
    assert configuration_capability(a100, 1 << 6) == 14
    assert max_cc_start(a100, 1 << 6, "1g.5gb") == 4
    assert configuration_capability(a100, 1 << 6 | 1 << 4) == configuration_capability(a100, 1 << 6 | 1 << 5) == 11
    assert max_cc_start(a100, a100.full_mask, "1g.5gb") is None


def test_tables_equal_direct_computation_for_every_mask(model):
    tables = build_tables(model)
    base = model.base_profiles
    for mask in range(1 << model.memory_slices):
        for variant in FragVariant:
            assert tables.frag[variant][mask] == fragmentation_score(model, mask, variant)
        assert tables.cc[mask] == configuration_capability(model, mask)
        for k, profile in enumerate(base):
            starts = free_starts(profile, mask)
            assert tables.free_starts[k][mask] == starts
            for variant in FragVariant:
                expected = tuple((s, fragmentation_score(model, mask | profile.window(s), variant)) for s in starts)
                assert tables.frag_after[variant][k][mask] == expected
            assert tables.cc_after[k][mask] == tuple(
                (s, configuration_capability(model, mask | profile.window(s))) for s in starts
            )


def test_media_extension_profiles_use_their_base_geometry():
    tables = tables_for("H100-80GB")
    assert tables.index("1g.10gb+me") == tables.index("1g.10gb")
    assert tables.window("1g.10gb+me", 3) == 1 << 3


def test_configuration_mask_is_union_of_instances():
    a30 = get_model("A30-24GB")
    config = Configuration.of(("2g.12gb", 2), ("1g.6gb", 0))
    assert config.mask(a30) == 0b1101
