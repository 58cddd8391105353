"""``mig-batch node probe`` over the emulated libnvidia-ml: every model matches itself, a doctored model
file has each differing field named, and an unknown GPU gets a model file that loads and validates."""

import json

import yaml

from mig_batch.cli.main import main
from mig_batch.gpu.nvml_emu import EmulatedGpu
from mig_batch.mig.models import all_models, builtin_gpu_dir, load_model_file, parse_model


def _probe(capsys, *extra):
    code = main(["node", "probe", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_every_model_matches_what_its_emulated_driver_says(nvml_emu_node, capsys):
    names = sorted(all_models())
    nvml_emu_node(names, mig_enabled=False)  # MIG off: the driver still answers every profile question
    code, data = _probe(capsys)
    assert [g["model"] for g in data["gpus"]] == names
    assert data["differences"] == 0 and code == 0
    assert all(len(g["profiles"]) == len(all_models()[g["model"]].profiles) for g in data["gpus"])


def test_a_doctored_model_file_has_each_difference_named(nvml_emu_node, tmp_path, monkeypatch, capsys):
    nvml_emu_node(["A100-40GB"])  # the emulated driver answers from the shipped model
    doc = yaml.safe_load((builtin_gpu_dir() / "a100-40gb.yaml").read_text())
    by_name = {p["name"]: p for p in doc["profiles"]}
    by_name["1g.5gb"].update(memory_mib=5000, max_instances=6, sms=99)
    by_name["2g.10gb"]["starts"] = [0, 2, 4, 6]
    by_name["3g.20gb"]["profile_id"] = 8
    doc["profiles"].remove(by_name["1g.5gb+me"])
    site = tmp_path / "site-gpus"
    site.mkdir()
    (site / "a100-40gb.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("MIG_BATCH_GPU_DIRS", str(site))
    code, data = _probe(capsys)
    named = {(d["profile"], d["field"], json.dumps(d["model"]), json.dumps(d["driver"]))
             for d in data["gpus"][0]["differences"]}  # fmt: skip
    assert named == {
        ("1g.5gb", "memory_mib", "5000", "4864"),
        ("1g.5gb", "max_instances", "6", "7"),
        ("1g.5gb", "sms", "99", "16"),
        ("2g.10gb", "starts", "[0, 2, 4, 6]", "[0, 2, 4]"),
        ("3g.20gb", "profile_id", "8", "9"),
        ("1g.5gb+me", "nvml_profile", "null", '"1_SLICE_REV1"'),  # the driver offers it, the model lacks it
    }
    assert code == 1


UNKNOWN = {
    "model": "MADE-UP-96GB",
    "memory_slices": 4,
    "compute_slices": 4,
    "profiles": [
        {"name": "1g.24gb", "nvml_profile": "1_SLICE", "profile_id": 14, "compute_slices": 1, "memory_slices": 1,
         "memory_mib": 24064, "starts": [0, 1, 2, 3], "max_instances": 4, "sms": 46},
        {"name": "1g.24gb+me", "media_extension_of": "1g.24gb", "nvml_profile": "1_SLICE_REV1", "profile_id": 21,
         "compute_slices": 1, "memory_slices": 1, "memory_mib": 24064, "starts": [0, 1, 2, 3], "max_instances": 1},
        {"name": "2g.48gb", "nvml_profile": "2_SLICE", "profile_id": 5, "compute_slices": 2, "memory_slices": 2,
         "memory_mib": 48896, "starts": [0, 2], "max_instances": 2, "sms": 94},
        {"name": "4g.96gb", "nvml_profile": "4_SLICE", "profile_id": 0, "compute_slices": 4, "memory_slices": 4,
         "memory_mib": 97920, "starts": [0], "max_instances": 1, "sms": 188},
    ],
}  # fmt: skip


def test_an_unknown_gpu_gets_a_model_file_that_loads(nvml_emu_node, tmp_path, monkeypatch, capsys):
    made_up = parse_model(UNKNOWN)
    nvml_emu_node([EmulatedGpu(made_up, False, "NVIDIA RTX PRO 6000 Blackwell Server Edition")])
    code, data = _probe(capsys)
    assert data["gpus"][0]["model"] is None and code == 1  # nothing knows it, nothing written
    out = tmp_path / "written"
    out.mkdir()
    code, data = _probe(capsys, "--write-model", str(out))
    assert code == 0
    written = load_model_file(out / "rtx-pro-6000-blackwell-server-edition-96gb.yaml")  # raises if invalid
    assert data["gpus"][0]["written"] == written.path
    assert (written.memory_slices, written.compute_slices) == (4, 4)
    keep = ("nvml_profile", "profile_id", "compute_slices", "memory_slices", "memory_mib", "starts", "max_instances")
    fields = [[getattr(p, k) for k in keep] for p in written.profiles]
    assert fields == [[getattr(p, k) for k in keep] for p in made_up.profiles]
    assert written.profile("1g.24gb+me").media_extension_of == "1g.24gb"
    monkeypatch.setenv("MIG_BATCH_GPU_DIRS", str(out))  # the site installs it: the GPU now maps, with no difference
    code, data = _probe(capsys)
    assert (code, data["gpus"][0]["model"], data["differences"]) == (0, written.name, 0)


def test_bad_arguments_and_a_missing_driver_are_refused_plainly(nvml_emu_library, tmp_path, monkeypatch, capsys):
    assert main(["node", "probe", "--write-model", str(tmp_path / "absent")]) == 2
    assert "not a writable directory" in capsys.readouterr().err
    monkeypatch.delenv("MIG_BATCH_NVML_EMU_DIR", raising=False)
    assert main(["node", "probe"]) == 2
    assert "cannot read the GPUs through NVML" in capsys.readouterr().err
