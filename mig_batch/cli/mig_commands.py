"""CLI commands over MIG geometry and request translation: gpus, profiles, translate, configs, frag."""

from __future__ import annotations

import argparse

from mig_batch.cli.output import Table, console, emit, err_console
from mig_batch.mig.models import GpuModel, Profile, all_models, get_model
from mig_batch.request import (
    STATIC_MIG_FORMS,
    MigRequest,
    RequestError,
    format_mib,
    none_fits,
    parse_compute,
    parse_gres,
    parse_memory,
    round_up,
    static_mig_request,
    translate_any,
)

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from typing import Any

    from mig_batch.mig.geometry import Configuration

# geometry, configurations and scores are imported in the commands that use them: gpus and translate
# start without them (tests/test_startup.py)


def register(sub: argparse._SubParsersAction) -> None:
    def add(name: str, handler: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print JSON for scripts")
        p.set_defaults(handler=handler)
        return p

    add("gpus", cmd_gpus, "list the known GPU models")
    p = add("profiles", cmd_profiles, "list a GPU model's MIG profiles and their placements")
    p.add_argument("model", help="GPU model, e.g. A100-40GB")
    p = add("translate", cmd_translate, "translate a request into the smallest fitting MIG profile")
    p.add_argument("--gpu", help="GPU model (default: every known model)")
    p.add_argument("--mem", help="GPU memory, e.g. 18G, 18GiB, 18GB, 18000M")
    p.add_argument("--compute", help="compute share: 0.3, 30%% or slices like 2g")
    p.add_argument(
        "--profile", action="append", default=[], help="explicit profile; repeat for a list of acceptable ones"
    )
    p.add_argument("--media", action="store_true", help="need media extensions (+me profiles)")
    p.add_argument("--gres", help="Slurm-style request instead: mig:20G, mig:3g, gpu:3g.40gb:1")
    p.add_argument("--gpus", metavar="PROFILE[:N]", help="static-MIG form, as sbatch --gpus=1g.10gb:2")
    p.add_argument("--gpus-per-node", metavar="PROFILE[:N]", help="static-MIG form, as sbatch --gpus-per-node")
    p.add_argument("--strict", action="store_true",
                   help="exit 2 when a chosen profile holds over 1.5x the memory or compute asked")  # fmt: skip
    p.add_argument("--instances", metavar="auto",
                   help="auto: the fewest leaves (Flex-MIG's rule) that cover --mem and --compute, per model")
    p = add("configs", cmd_configs, "count reachable and maximal MIG configurations and list the maximal ones")
    p.add_argument("model")
    p.add_argument("--profiles", help="comma-separated profile subset (default: all base profiles)")
    p = add("frag", cmd_frag, "fragmentation score F and Configuration Capability CC of an occupancy")
    p.add_argument("model")
    p.add_argument(
        "--state",
        required=True,
        help="instances (3g.40gb@0,1g.10gb@5), a 0/1 string over memory slices (11000100) or allocated slices (0,1,5)",
    )


# ---------------------------------------------------------------------------------------------


def profile_record(model: GpuModel, p: Profile) -> dict[str, Any]:
    return {
        "name": p.name,
        "nvml_profile": p.nvml_profile,
        "profile_id": p.profile_id,
        "compute_slices": p.compute_slices,
        "memory_slices": p.memory_slices,
        "memory_mib": p.memory_mib,
        "starts": list(p.starts),
        "max_instances": p.max_instances,
        "media_extension_of": p.media_extension_of,
    }


def cmd_gpus(args: argparse.Namespace) -> int:
    models = sorted(all_models().values(), key=lambda m: m.name)
    data = [
        {
            "model": m.name,
            "memory_slices": m.memory_slices,
            "compute_slices": m.compute_slices,
            "profiles": [p.name for p in m.profiles],
            "placements_verified": m.placements_verified,
            "memory_source": m.memory_source,
            "file": m.path,
        }
        for m in models
    ]

    def render(rows: list[dict[str, Any]]) -> None:
        table = Table(title="GPU models")
        for col in ("model", "slices (mem/compute)", "profiles", "placements"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                r["model"],
                f"{r['memory_slices']}/{r['compute_slices']}",
                ", ".join(r["profiles"]),
                "verified" if r["placements_verified"] else "[yellow]inferred[/]",
            )
        console.print(table)

    emit(data, args.json, render)
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from mig_batch.mig.render import placement_chart

    model = get_model(args.model)
    data = {
        "model": model.name,
        "memory_slices": model.memory_slices,
        "compute_slices": model.compute_slices,
        "placements_verified": model.placements_verified,
        "memory_source": model.memory_source,
        "source": model.source,
        "profiles": [profile_record(model, p) for p in model.profiles],
    }

    def render(d: dict[str, Any]) -> None:
        table = Table(title=f"MIG profiles of {model.name}")
        for col in ("profile", "NVML profile (id)", "compute", "memory slices", "memory", "starts", "max"):
            table.add_column(col)
        for p in model.profiles:
            table.add_row(
                p.name,
                f"{p.nvml_profile} ({p.profile_id})",
                f"{p.compute_slices}/{model.compute_slices}",
                f"{p.memory_slices}/{model.memory_slices}",
                format_mib(p.memory_mib),
                ",".join(map(str, p.starts)),
                str(p.max_instances),
            )
        console.print(table)
        console.print(placement_chart(model), highlight=False)
        if not model.placements_verified:
            console.print("[yellow]placements inferred, not yet confirmed on a real GPU[/]")
        if model.memory_source not in ("nvidia-smi", "nvml"):  # measured on a real GPU either way
            console.print("[yellow]memory sizes estimated; the NVML backend reads the real ones[/]")

    emit(data, args.json, render)
    return 0


def _request_from_args(args: argparse.Namespace) -> MigRequest:
    forms = [key for key in ("gres", "gpus", "gpus_per_node") if getattr(args, key)]
    if forms:
        option, value = f"--{forms[0].replace('_', '-')}", getattr(args, forms[0])
        if args.mem or args.compute or args.profile or len(forms) > 1:
            raise RequestError(f"{option} cannot be combined with --mem, --compute, --profile or another of "
                               "--gres, --gpus, --gpus-per-node")  # fmt: skip
        if option == "--gres" and value.strip().lower().removeprefix("gres:").removeprefix("gres/").startswith("mig"):
            return parse_gres(value)
        known = {p.name for m in all_models().values() for p in m.profiles}
        request = static_mig_request(option, value, known)
        if request is None:
            raise RequestError(
                f"{option} {value} is not a MIG request: it asks for whole GPUs, as the site has them today (Slurm "
                f"gives them; mig_batch leaves such a job alone). A MIG request names a profile: "
                + ", ".join(f"{o}={f}" for o, f in STATIC_MIG_FORMS.items())
                + ", or asks a size: --gres mig:20G, --gres mig:3g"
            )
        return request
    if not (args.mem or args.compute or args.profile or args.media):
        raise RequestError("say what the job needs: --mem, --compute, --profile, --media or --gres")
    return MigRequest(
        memory_mib=parse_memory(args.mem) if args.mem else None,
        compute=parse_compute(args.compute) if args.compute else None,
        profiles=tuple(p.lower() for p in args.profile),
        media=args.media,
    )


def cmd_translate(args: argparse.Namespace) -> int:
    request = _request_from_args(args)
    if args.instances is not None:
        if args.instances.strip().lower() != "auto":
            raise RequestError(f"translate --instances takes auto (the leaves of Flex-MIG's rule), got "
                               f"{args.instances!r}; for N instances of a size give --gres mig:1g.10gb:N")  # fmt: skip
        return _translate_leaves(request, args)
    models = [get_model(args.gpu)] if args.gpu else sorted(all_models().values(), key=lambda m: m.name)
    by_name = {m.name: m for m in models}
    rows: list[dict[str, Any]] = []
    results = translate_any(request, models)
    if not args.gpu and not any(isinstance(r, Profile) for r in results.values()):
        raise none_fits(request, models)  # an empty table and exit 0 would read as success
    for name, result in results.items():
        if isinstance(result, RequestError):
            if args.gpu:
                raise result
            rows.append({"model": name, "profile": None, "error": str(result)})
        else:
            rows.append(
                {
                    "model": name,
                    "profile": result.name,
                    "memory_mib": result.memory_mib,
                    "compute_slices": result.compute_slices,
                    "memory_slices": result.memory_slices,
                    "error": None,
                    "round_up": (found.message() if (found := round_up(request, by_name[name], result)) else None),
                }
            )
    rounded = [r["round_up"] for r in rows if r.get("round_up")]
    if rounded and args.strict:
        raise RequestError("--strict: the request rounds up: " + "; ".join(rounded)
                           + "; ask for what the smaller profile holds, or drop --strict")  # fmt: skip
    data = {"request": request.describe(), "count": request.count, "results": rows}

    def render(d: dict[str, Any]) -> None:
        table = Table(title=f"request: {d['request']}")
        for col in ("GPU model", "profile", "memory", "compute"):
            table.add_column(col)
        for r in d["results"]:
            if r["error"]:
                table.add_row(r["model"], "[red]none fits[/]", "", "")
            else:
                table.add_row(
                    r["model"], f"[bold]{r['profile']}[/]", format_mib(r["memory_mib"]), f"{r['compute_slices']} slices"
                )
        console.print(table)

    emit(data, args.json, render)
    for text in rounded:  # beside the table or the JSON, on stderr
        err_console.print(f"warning: {text}", highlight=False, markup=False, soft_wrap=True)
    return 0


def _translate_leaves(request: MigRequest, args: argparse.Namespace) -> int:
    from mig_batch.leaves import leaves_for

    models = [get_model(args.gpu)] if args.gpu else sorted(all_models().values(), key=lambda m: m.name)
    rows = []
    for model in models:
        plan = leaves_for(request, model)
        rows.append({"model": model.name, "leaf": plan.leaf.name, "count": plan.count,
                     "compute_slices": plan.total_compute, "memory_mib": plan.total_memory_mib,
                     "asked_compute_slices": plan.compute_slices, "asked_memory_mib": plan.memory_mib})  # fmt: skip
    data = {"request": request.describe(), "leaves": rows}

    def render(d: dict[str, Any]) -> None:
        table = Table(title=f"request: {d['request']}, over leaves (Flex-MIG's rule)")
        for col in ("GPU model", "leaves", "compute", "memory"):
            table.add_column(col)
        for r in d["leaves"]:
            table.add_row(r["model"], f"[bold]{r['count']} x {r['leaf']}[/]", f"{r['compute_slices']} slices",
                          format_mib(r["memory_mib"]))  # fmt: skip
        console.print(table)
        console.print("a job runs over leaves only where the site sets flex.leaf_requests: true (docs/flex.md)")

    emit(data, args.json, render)
    return 0


def cmd_configs(args: argparse.Namespace) -> int:
    from mig_batch.mig.configs import canonical, maximal_configurations, partition_label, reachable_configurations

    model = get_model(args.model)
    names = [n.strip() for n in args.profiles.split(",")] if args.profiles else None
    reachable = reachable_configurations(model, names)
    maximal = maximal_configurations(model, names)
    canon = {canonical(model, c, names) for c in maximal}
    data = {
        "model": model.name,
        "profiles": names or [p.name for p in model.base_profiles],
        "reachable": len(reachable),
        "maximal": len(maximal),
        "maximal_canonical": len(canon),
        "maximal_configurations": [
            {"label": partition_label(model, c), "instances": str(c), "canonical": canonical(model, c, names) == c}
            for c in maximal
        ],
    }

    def render(d: dict[str, Any]) -> None:
        console.print(
            f"[bold]{model.name}[/] over {', '.join(d['profiles'])}: {d['reachable']} reachable configurations "
            f"(empty included), {d['maximal']} maximal, {d['maximal_canonical']} maximal up to equivalence"
        )
        table = Table()
        for col in ("#", "partition", "instances", "canonical"):
            table.add_column(col)
        for i, c in enumerate(d["maximal_configurations"], 1):
            table.add_row(str(i), c["label"], c["instances"], "yes" if c["canonical"] else "")
        console.print(table)

    emit(data, args.json, render)
    return 0


def _parse_state(model: GpuModel, text: str) -> tuple[int, Configuration | None]:
    from mig_batch.mig.geometry import parse_configuration, parse_mask

    if "@" in text:
        config = parse_configuration(model, text)
        return config.mask(model), config
    return parse_mask(text, model.memory_slices), None


def cmd_frag(args: argparse.Namespace) -> int:
    from mig_batch.mig.geometry import format_mask
    from mig_batch.mig.render import configuration_row
    from mig_batch.mig.scores import FragVariant, max_cc_start
    from mig_batch.mig.tables import tables_for

    model = get_model(args.model)
    mask, config = _parse_state(model, args.state)
    tables = tables_for(model.name)
    per_profile = []
    for i, name in enumerate(tables.base_names):
        after = tables.frag_after[FragVariant.PRINTED][i][mask]
        per_profile.append(
            {
                "profile": name,
                "free_starts": list(tables.free_starts[i][mask]),
                "delta_f": {str(s): f - tables.frag[FragVariant.PRINTED][mask] for s, f in after},
                "nvidia_default_start": max_cc_start(model, mask, name),
            }
        )
    data = {
        "model": model.name,
        "occupancy": format_mask(mask, model.memory_slices),
        "instances": str(config) if config else None,
        "F": tables.frag[FragVariant.PRINTED][mask],
        "F_partial": tables.frag[FragVariant.PARTIAL][mask],
        "CC": tables.cc[mask],
        "profiles": per_profile,
    }

    def render(d: dict[str, Any]) -> None:
        if config is not None:
            console.print(configuration_row(model, config), highlight=False)
        console.print(
            f"occupancy {d['occupancy']} (slice 0 first): [bold]F = {d['F']}[/] (MFI Alg. 1 as printed), "
            f"F = {d['F_partial']} (partly-free windows only), [bold]CC = {d['CC']}[/]"
        )
        table = Table()
        for col in ("profile", "free starts", "ΔF per start", "NVIDIA default start"):
            table.add_column(col)
        for r in d["profiles"]:
            table.add_row(
                r["profile"],
                ",".join(map(str, r["free_starts"])) or "-",
                " ".join(f"{s}:{v:+d}" for s, v in r["delta_f"].items()) or "-",
                "-" if r["nvidia_default_start"] is None else str(r["nvidia_default_start"]),
            )
        console.print(table)

    emit(data, args.json, render)
    return 0
