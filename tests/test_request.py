"""Request translation: units, compute shares, explicit profiles, GRES strings, moldable requests."""

import pytest

from mig_batch.mig.models import get_model
from mig_batch.request import (
    MigRequest,
    RequestError,
    parse_compute,
    parse_duration,
    parse_gres,
    parse_memory,
    parse_moldable,
    translate,
)

A100_40 = get_model("A100-40GB")
A100_80 = get_model("A100-80GB")
H100 = get_model("H100-80GB")
A30 = get_model("A30-24GB")


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("18G", 18 * 1024),
        ("18GiB", 18 * 1024),
        ("18g", 18 * 1024),
        ("18000M", 18000),
        ("1.5T", 1536 * 1024),
        ("18GB", 17167),
        ("512MB", 489),
        ("20 GiB", 20480),
        ("1K", 1),
    ],
)
def test_parse_memory(text, mib):
    assert parse_memory(text) == mib


@pytest.mark.parametrize("text", ["18", "18X", "G", "-5G", "0G", "18 gigs", ""])
def test_parse_memory_rejects_bad_units(text):
    with pytest.raises(RequestError, match="accepted: a number with a unit: 18G, 18GiB, 18GB, 18000M"):
        parse_memory(text)


def test_parse_compute():
    assert parse_compute("0.3").fraction == pytest.approx(0.3)
    assert parse_compute("30%").fraction == pytest.approx(0.3)
    assert parse_compute("2g").slices == 2
    for bad in ("2", "0", "1.5", "abc", "0g"):
        with pytest.raises(RequestError, match="compute"):
            parse_compute(bad)


@pytest.mark.parametrize(
    ("model", "request_", "expected"),
    [
        # memory alone: fewest memory slices that hold it, then fewest compute slices
        (A100_40, MigRequest(memory_mib=parse_memory("4G")), "1g.5gb"),
        (A100_40, MigRequest(memory_mib=parse_memory("8G")), "1g.10gb"),  # not 2g.10gb: same memory, less compute
        (A100_40, MigRequest(memory_mib=parse_memory("18G")), "3g.20gb"),
        (A100_40, MigRequest(memory_mib=parse_memory("20G")), "7g.40gb"),  # 20 GiB > 19.62 GiB of 3g.20gb
        (H100, MigRequest(memory_mib=parse_memory("18G")), "1g.20gb"),
        (H100, MigRequest(memory_mib=parse_memory("10GB")), "1g.10gb"),  # 9.31 GiB <= 9.75 GiB
        # compute alone and with memory
        (A100_40, MigRequest(compute=parse_compute("0.3")), "3g.20gb"),  # 2/7 = 0.286 < 0.3 <= 3/7
        (A100_40, MigRequest(compute=parse_compute("2g")), "2g.10gb"),
        (A100_80, MigRequest(memory_mib=parse_memory("18G"), compute=parse_compute("0.3")), "3g.40gb"),
        (A30, MigRequest(compute=parse_compute("3g")), "4g.24gb"),
        # explicit and acceptable lists
        (A100_40, MigRequest(profiles=("4g.20gb",)), "4g.20gb"),
        (A100_40, MigRequest(profiles=("7g.40gb", "2g.10gb", "3g.40gb")), "2g.10gb"),
        (A100_40, MigRequest(profiles=("2g.10gb", "3g.20gb"), memory_mib=parse_memory("12G")), "3g.20gb"),
        # media extensions only when asked for
        (H100, MigRequest(media=True), "1g.10gb+me"),
        (A30, MigRequest(media=True, compute=parse_compute("2g")), "2g.12gb+me"),
        (H100, MigRequest(memory_mib=parse_memory("1G")), "1g.10gb"),
    ],
)
def test_translate_picks_smallest_fitting_profile(model, request_, expected):
    assert translate(request_, model).name == expected


def test_impossible_request_names_the_largest_profile():
    with pytest.raises(RequestError) as err:
        translate(MigRequest(memory_mib=parse_memory("50G")), A100_40)
    assert "the largest is 7g.40gb (39.50 GiB, 7/7 compute)" in str(err.value)
    with pytest.raises(RequestError, match="the largest is 4g.24gb"):
        translate(MigRequest(compute=parse_compute("5g")), A30)


def test_unknown_profile_lists_the_models_profiles():
    with pytest.raises(RequestError, match="A30-24GB has no MIG profile 3g.40gb; its profiles are: 1g.6gb"):
        translate(MigRequest(profiles=("3g.40gb",)), A30)


def test_explicit_profile_too_small_for_memory():
    with pytest.raises(RequestError, match="the largest is 7g.40gb"):
        translate(MigRequest(profiles=("1g.5gb",), memory_mib=parse_memory("8G")), A100_40)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("gpu:3g.40gb:1", MigRequest(profiles=("3g.40gb",))),
        ("gres:gpu:1g.10gb:1", MigRequest(profiles=("1g.10gb",))),
        ("mig:3g.40gb", MigRequest(profiles=("3g.40gb",))),
        ("mig:20G", MigRequest(memory_mib=20480)),
        ("mig:3g", MigRequest(compute=parse_compute("3g"))),
        ("mig:1g.10gb+me", MigRequest(profiles=("1g.10gb+me",))),
    ],
)
def test_parse_gres(spec, expected):
    assert parse_gres(spec) == expected


@pytest.mark.parametrize("spec", ["gpu", "mig", "gpu:20G", "mig:lots", "tpu:1", "mig:3g.40gb:0"])
def test_parse_gres_rejects(spec):
    with pytest.raises(RequestError):
        parse_gres(spec)


def test_gres_translates_per_model():
    request = parse_gres("mig:20G")
    assert translate(request, H100).name == "3g.40gb"  # 20 GiB > 19.62 GiB of 1g.20gb
    assert translate(request, get_model("H200-141GB")).name == "1g.35gb"


def test_parse_duration():
    assert parse_duration("90") == 90
    assert parse_duration("2.5m") == 150
    assert parse_duration("1h30m") == 5400
    assert parse_duration("01:30:00") == 5400
    assert parse_duration("1:30") == 90
    with pytest.raises(RequestError, match="accepted: 90, 90s"):
        parse_duration("soon")


def test_moldable_candidates():
    request = parse_moldable("1g=300,2g=160,3g=110,7g.40gb=60", memory="8G")
    # 1g with 8 GiB -> 1g.10gb; 2g -> 2g.10gb; 3g -> 3g.20gb; explicit 7g.40gb
    assert request.candidates(A100_40) == {"1g.10gb": 300, "2g.10gb": 160, "3g.20gb": 110, "7g.40gb": 60}
    # on the A30 there is no 3g and no 7g.40gb; 1g.6gb lacks 8 GiB, so 1g drops out too
    assert request.candidates(A30) == {"2g.12gb": 160}
    with pytest.raises(RequestError, match="none of the moldable sizes"):
        parse_moldable("7g.40gb=60").candidates(A30)
    with pytest.raises(RequestError, match="needs a size and a time"):
        parse_moldable("3g")


def test_moldable_on_a_mixed_site_keeps_the_models_that_can_run_a_size():
    from mig_batch.mig.models import get_model
    from mig_batch.request import RequestError, moldable_per_model, parse_moldable

    models = [get_model("A30-24GB"), get_model("A100-80GB")]
    per_model = moldable_per_model(parse_moldable("7g.80gb=1h"), models)
    assert per_model == {"A100-80GB": {"7g.80gb": 3600.0}}  # A30 has no 7g: left out, not a refusal
    with pytest.raises(RequestError, match="A30-24GB.*A100-80GB|A100-80GB.*A30-24GB"):
        moldable_per_model(parse_moldable("7g.141gb=1h"), models)  # no model runs any size


def test_a_moldable_size_no_model_of_the_site_runs_is_refused_by_name():
    from mig_batch.mig.models import get_model
    from mig_batch.request import RequestError, moldable_per_model, parse_moldable

    models = [get_model("A30-24GB"), get_model("A100-80GB")]
    with pytest.raises(RequestError, match="'9g.90gb' runs on no GPU model"):
        moldable_per_model(parse_moldable("1g=1h,9g.90gb=5m"), models)
    assert set(moldable_per_model(parse_moldable("1g=1h,4g=20m"), models)) == {"A30-24GB", "A100-80GB"}


def test_parse_gres_count_asks_for_instances():
    assert parse_gres("mig:1g.10gb:4") == MigRequest(profiles=("1g.10gb",), count=4)
    assert parse_gres("mig:5G:2").count == 2 and parse_gres("mig:5G").count == 1


# --- round-up: the chosen profile holds much more than asked -------------------------------------------------


@pytest.mark.parametrize(
    ("model", "memory", "compute", "chosen", "warning"),
    [
        # the cases: just over a profile's size, the next one holds about twice
        ("A100-80GB", "20G", None, "3g.40gb", "3g.40gb (38.80 GiB, 3/7 compute) chosen (1.9x the memory); "
                                              "2g.20gb holds 19.40 GiB, 614 MiB short"),
        ("H200-141GB", "18G", None, "1g.35gb", "(1.8x the memory); 1g.18gb holds 16.00 GiB, 2.00 GiB short"),
        ("A100-40GB", "20G", None, "7g.40gb", "(2.0x the memory); 4g.20gb holds 19.62 GiB, 384 MiB short"),
        ("A100-40GB", None, "0.15", "2g.10gb", "(1.9x the compute); 1g.10gb has 1/7 compute, 0.7% of the GPU short"),
        ("A100-40GB", "11G", "1g", "3g.20gb", "(1.8x the memory and 3.0x the compute); 2g.10gb holds 9.62 GiB"),
        ("A30-24GB", None, "3g", "4g.24gb", None),  # 1.33x: within the rule
        ("A100-80GB", "30G", None, "3g.40gb", None),  # 1.29x
        ("A100-40GB", "1G", None, "1g.5gb", None),  # the smallest profile: nothing holds less
        ("A100-40GB", None, "1g", "1g.5gb", None),
        ("A100-40GB", "5G", "3g", "3g.20gb", None),  # 3.9x the memory, but 3g forced the size: 2g.10gb lacks compute
    ],
)
def test_round_up_names_the_profile_that_just_missed(model, memory, compute, chosen, warning):
    from mig_batch.request import round_up

    gpu = get_model(model)
    request = MigRequest(memory_mib=parse_memory(memory) if memory else None,
                         compute=parse_compute(compute) if compute else None)  # fmt: skip
    profile = translate(request, gpu)
    assert profile.name == chosen
    found = round_up(request, gpu, profile)
    if warning is None:
        assert found is None
    else:
        assert found is not None and warning in found.message() and found.message().startswith(f"{model}: ")


def test_round_up_is_not_told_for_a_profile_asked_by_name():
    from mig_batch.request import round_up

    request = MigRequest(profiles=("3g.40gb",), memory_mib=parse_memory("1G"))
    assert round_up(request, A100_80, translate(request, A100_80)) is None


def test_round_up_rule_is_one_table():
    from mig_batch.request import ROUND_UP_RULE, round_up

    request = MigRequest(memory_mib=parse_memory("26G"))  # 3g.40gb holds 38.8 GiB: 1.49x
    assert round_up(request, A100_80, translate(request, A100_80)) is None
    ROUND_UP_RULE["factor"], old = 1.4, ROUND_UP_RULE["factor"]
    try:
        assert round_up(request, A100_80, translate(request, A100_80)) is not None
    finally:
        ROUND_UP_RULE["factor"] = old


# --- static-MIG forms -------------------------------------------------------------------------------------------

SITE = [p.name for p in A100_80.profiles]


@pytest.mark.parametrize(
    ("option", "value", "profile", "count"),
    [
        ("--gres", "gpu:3g.40gb:1", "3g.40gb", 1),
        ("--gres", "gpu:3g.40gb", "3g.40gb", 1),
        ("--gres", "gres/gpu:1g.10gb:4", "1g.10gb", 4),  # as Slurm's TRES strings write it
        ("--gres", "GPU:3G.40GB:2", "3g.40gb", 2),
        ("--gpus", "1g.10gb:2", "1g.10gb", 2),
        ("--gpus", "gpu:1g.10gb:2", "1g.10gb", 2),
        ("--gpus-per-node", "2g.20gb:3", "2g.20gb", 3),
        # not MIG requests: left with their meaning (whole GPUs as the site has them)
        ("--gres", "gpu:1", None, None),
        ("--gres", "gpu", None, None),
        ("--gres", "gpu:a100:2", None, None),
        ("--gres", "gpu:3g.20gb:1", None, None),  # an A100-40GB profile: not this site's
        ("--gpus", "2", None, None),
        ("--gpus-per-node", "a100:1", None, None),
        ("--gres", "nvme:1", None, None),
    ],
)
def test_static_mig_forms(option, value, profile, count):
    from mig_batch.request import static_mig_request

    found = static_mig_request(option, value, SITE)
    if profile is None:
        assert found is None
    else:
        assert found == MigRequest(profiles=(profile,), count=count)


def test_static_mig_form_refusals():
    from mig_batch.request import static_mig_request

    with pytest.raises(RequestError, match="give at least 1 .--gpus=1g.10gb:2 asks for two"):
        static_mig_request("--gpus", "1g.10gb:0", SITE)
    with pytest.raises(RequestError, match="--gpus-per-task has no static-MIG form"):
        static_mig_request("--gpus-per-task", "1g.10gb:1", SITE)
