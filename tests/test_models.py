"""GPU model data against NVIDIA's documented profile tables.

Source: NVIDIA Multi-Instance GPU User Guide, section "Supported MIG Profiles"
(docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html): the profile tables
(name, fraction of memory, fraction of SMs, number of instances) and the placement diagrams of A30,
A100 and H100; GPU instance profile ids as `nvidia-smi mig -lgip` prints them on A100/H100 (19, 20,
15, 14, 9, 5, 0) and on A30 (14, 21, 5, 6, 0). H100-94GB, H200 and B200 placements are inferred from
the H100 layout (the guide documents only their names and memory fractions).
"""

import itertools
from fractions import Fraction

import pytest
import yaml

from mig_batch.mig.models import ModelError, UnknownModelError, all_models, get_model, load_model_file, parse_model

# name: (memory fraction, compute slices, max instances, starts, nvidia-smi id)
A100_40GB = {
    "1g.5gb": (Fraction(1, 8), 1, 7, (0, 1, 2, 3, 4, 5, 6), 19),
    "1g.5gb+me": (Fraction(1, 8), 1, 1, (0, 1, 2, 3, 4, 5, 6), 20),
    "1g.10gb": (Fraction(2, 8), 1, 4, (0, 2, 4, 6), 15),
    "2g.10gb": (Fraction(2, 8), 2, 3, (0, 2, 4), 14),
    "3g.20gb": (Fraction(4, 8), 3, 2, (0, 4), 9),
    "4g.20gb": (Fraction(4, 8), 4, 1, (0,), 5),
    "7g.40gb": (Fraction(1), 7, 1, (0,), 0),
}
A30_24GB = {
    "1g.6gb": (Fraction(1, 4), 1, 4, (0, 1, 2, 3), 14),
    "1g.6gb+me": (Fraction(1, 4), 1, 1, (0, 1, 2, 3), 21),
    "2g.12gb": (Fraction(2, 4), 2, 2, (0, 2), 5),
    "2g.12gb+me": (Fraction(2, 4), 2, 1, (0, 2), 6),
    "4g.24gb": (Fraction(1), 4, 1, (0,), 0),
}
SEVEN_SLICE_NAMES = {
    # the guide's names for the same seven profiles, in A100-40GB order
    "A100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-80GB": ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-94GB": ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
    "H200-141GB": ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
    "B200-180GB": ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
}
EXPECTED = {"A100-40GB": A100_40GB, "A30-24GB": A30_24GB}
for _model, _names in SEVEN_SLICE_NAMES.items():
    EXPECTED[_model] = dict(zip(_names, A100_40GB.values(), strict=True))


def test_every_documented_model_is_present():
    assert set(all_models()) == set(EXPECTED)


@pytest.mark.parametrize("model_name", sorted(EXPECTED))
def test_profiles_match_nvidia_table(model_name):
    model = get_model(model_name)
    table = EXPECTED[model_name]
    assert [p.name for p in model.profiles] == list(table)
    for name, (mem_fraction, compute, max_instances, starts, profile_id) in table.items():
        p = model.profile(name)
        assert Fraction(p.memory_slices, model.memory_slices) == mem_fraction, name
        assert p.compute_slices == compute, name
        assert p.max_instances == max_instances, name
        assert p.starts == starts, name
        assert p.profile_id == profile_id, name


@pytest.mark.parametrize("model_name", sorted(EXPECTED))
def test_memory_grows_with_memory_slices(model_name):
    model = get_model(model_name)
    by_slices = sorted(model.base_profiles, key=lambda p: p.memory_slices)
    for small, big in itertools.pairwise(by_slices):
        if small.memory_slices < big.memory_slices:
            assert small.memory_mib < big.memory_mib
        else:
            assert small.memory_mib == big.memory_mib


def test_lookup_ignores_case_dashes_and_aliases():
    assert get_model("a100-40gb").name == "A100-40GB"
    assert get_model("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert get_model("h100 nvl").name == "H100-94GB"
    with pytest.raises(UnknownModelError) as err:
        get_model("V100")
    assert "A100-40GB" in str(err.value) and "V100" in str(err.value)


def _minimal(**override):
    doc = {
        "model": "T-1",
        "memory_slices": 4,
        "compute_slices": 4,
        "profiles": [
            {
                "name": "1g.1gb",
                "nvml_profile": "1_SLICE",
                "profile_id": 1,
                "compute_slices": 1,
                "memory_slices": 1,
                "memory_mib": 1024,
                "starts": [0, 1, 2, 3],
                "max_instances": 4,
            },
        ],
    }
    doc.update(override)
    return doc


def test_valid_minimal_model_parses():
    model = parse_model(_minimal(), "t.yaml")
    assert model.profile("1g.1gb").window(2) == 0b0100


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("memory_slices"), "t.yaml (model T-1): missing field 'memory_slices'"),
        (lambda d: d["profiles"][0].update(starts=[0, 4]), "profile 1g.1gb: start 4 puts 1 memory slices outside 0..3"),
        (
            lambda d: d["profiles"][0].update(nvml_profile="5_SLICE"),
            "profile 1g.1gb: field 'nvml_profile' must be one of",
        ),
        (lambda d: d["profiles"][0].update(memory_slices="two"), "profile 1g.1gb: field 'memory_slices' must be int"),
        (lambda d: d["profiles"][0].pop("memory_mib"), "profile 1g.1gb: missing field 'memory_mib'"),
        (lambda d: d["profiles"].append(dict(d["profiles"][0])), "profile names appear twice: 1g.1gb"),
        (lambda d: d["profiles"][0].update(media_extension_of="2g.2gb"), "'media_extension_of' names no base profile"),
        (lambda d: d.update(placement_verified=True), "unknown field(s) placement_verified; known: model,"),
        (lambda d: d["profiles"][0].update(maxinstances=4), "profile 1g.1gb: unknown field(s) maxinstances; known:"),
        (lambda d: d.update(placements_verified="yes"), "field 'placements_verified' must be true or false"),
    ],
)
def test_invalid_model_names_file_profile_and_field(change, message):
    doc = _minimal()
    change(doc)
    with pytest.raises(ModelError) as err:
        parse_model(doc, "t.yaml")
    assert message in str(err.value)


def test_site_directory_adds_a_model(tmp_path, monkeypatch):
    (tmp_path / "t1.yaml").write_text(yaml.safe_dump(_minimal()))
    monkeypatch.setenv("MIG_BATCH_GPU_DIRS", str(tmp_path))
    assert get_model("t-1").memory_slices == 4
    assert "A100-40GB" in all_models()


def test_a_site_model_file_may_end_in_yml(tmp_path, monkeypatch):
    (tmp_path / "t1.yml").write_text(yaml.safe_dump(_minimal()))
    monkeypatch.setenv("MIG_BATCH_GPU_DIRS", str(tmp_path))
    assert get_model("t-1").memory_slices == 4


def test_broken_yaml_is_reported_with_its_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: [unclosed\n")
    with pytest.raises(ModelError, match=r"bad.yaml: not valid YAML"):
        load_model_file(path)
