"""``migsub``: submit a batch script with a MIG request.

Options come from the command line and from ``#MIG`` directive lines at the top of the script
(``#MIG --gpu-mem 18G``); the command line wins field by field, and a request kind given on the command
line (a profile, a size, a moldable list) replaces the directives' other kinds (:data:`REPLACES`,
docs/request-translation.md "migsub: directives and options"). Every option migsub does not know goes to
the batch system unchanged (``-p gpu``, ``--account=x``; after ``--`` even one migsub knows). ``#SBATCH``
lines stay in the script for sbatch to read; migsub only checks that they do not ask for GPUs a second
way. Like sbatch, directives are read until the first line that is neither blank nor a comment.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mig_batch.cli.output import console, err_console, fail
from mig_batch.entry import DEBUG_HELP, CommandParser, run_guarded
from mig_batch.errors import MigBatchError
from mig_batch.mig.models import GpuModel, Profile, UnknownModelError, all_models, get_model
from mig_batch.request import (
    STATIC_MIG_FORMS,
    MigRequest,
    MoldableRequest,
    RequestError,
    moldable_per_model,
    parse_compute,
    parse_duration,
    parse_memory,
    parse_moldable,
    size_order,
    translate_any,
)
from mig_batch.subjob import SLURM_SIGNAL_MARGIN_S, next_job_spec
from mig_batch.yaml_text import shown as shown_value  # "shown" names a local below

TYPE_CHECKING = False  # typing costs ~2 ms at every start; the names below are for annotations only
if TYPE_CHECKING:
    from mig_batch.config import SiteConfig
    from mig_batch.leaves import LeafChoice


class DirectiveError(MigBatchError, ValueError):
    pass


def _option_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="migsub", description="Submit a batch job that needs a MIG instance. Options migsub does "
                      "not know (-p gpu, --account=x, ...) go to sbatch unchanged; after --, every option does.",
                      allow_abbrev=False)  # fmt: skip
    p.add_argument("--mig", metavar="PROFILE", help="explicit MIG profile, e.g. 3g.40gb")
    p.add_argument("--gpu-mem", metavar="SIZE", help="GPU memory the job needs, e.g. 18G")
    p.add_argument("--gpu-compute", metavar="SHARE", help="compute share: 0.3, 30%% or 2g")
    p.add_argument("--gpu", metavar="MODEL", help="GPU model the job must run on, e.g. A100-80GB")
    p.add_argument("--instances", metavar="N",
                   help="N instances of that size on one node, one per task; auto: as many leaves as the compute "
                   "and memory need (Flex-MIG, where the site enables flex.leaf_requests)")  # fmt: skip
    p.add_argument("--moldable", metavar="SIZES", help="sizes with predicted times: 1g=300,2g=160,3g=110")
    p.add_argument("--atomize", action="store_true", help="run as a chain of checkpointed subjobs in gaps (SJA)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="--atomize: where the chain's checkpoints live")
    p.add_argument("--subjob-min", metavar="DURATION", help="--atomize: shortest useful subjob (default 60s)")
    p.add_argument("--subjob-max", metavar="DURATION", help="--atomize: longest subjob (default 1h)")
    p.add_argument("--deadline", metavar="DURATION", help="--atomize: finish within this long (deadline policy)")
    p.add_argument("--backend", choices=("slurm", "htcondor"),
                   help="the batch system (default: the site config's batch_system, else the one found)")
    p.add_argument("--strict", action="store_true",
                   help="refuse a request whose profile holds over 1.5x the memory or compute asked (else a warning)")
    p.add_argument("--dry-run", action="store_true", help="show the translation and the submit command only")
    p.add_argument("--json", action="store_true", help="print the dry run as JSON")
    return p


ATOMIZE_OPTIONS = ("checkpoint_dir", "subjob_min", "subjob_max", "deadline")
DIRECTIVE_OPTIONS = ("mig", "gpu_mem", "gpu_compute", "gpu", "moldable", *ATOMIZE_OPTIONS, "instances")


@dataclass
class JobSpec:
    script: Path
    script_args: list[str]
    options: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # option -> where it was set
    passthrough: list[str] = field(default_factory=list)  # the batch system's options from the command line
    other_gres: str = ""  # the GRES of a --gres list other than the GPU request (nvme:1), kept beside it


def read_directives(script: Path) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """``#MIG`` options (with their line) and ``#SBATCH`` lines (and ``#CONDOR`` lines, HTCondor's submit
    commands, which :func:`condor_lines` reads) from the script's header."""
    try:
        lines = script.read_text(errors="surrogateescape").splitlines()  # sbatch takes any bytes
    except OSError as exc:
        raise DirectiveError(f"cannot read job script {script}: {exc.strerror}") from None
    parser = _option_parser()
    options: dict[str, str] = {}
    sources: dict[str, str] = {}
    sbatch_lines: list[str] = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break
        where = f"{script} line {number}: {stripped}"
        if stripped.startswith(("#SBATCH", "#CONDOR")):
            sbatch_lines.append(stripped)
        elif stripped.startswith("#MIG"):
            try:
                words = shlex.split(stripped[len("#MIG") :])
            except ValueError as exc:
                raise DirectiveError(f"{where}: {exc}") from None
            namespace, unknown = parser.parse_known_args(words)
            if unknown:
                raise DirectiveError(
                    f"{where}: unknown option {' '.join(unknown)}; #MIG accepts --mig, --gpu-mem, "
                    f"--gpu-compute, --gpu, --instances, --moldable, --atomize, --checkpoint-dir, --subjob-min, "
                    f"--subjob-max, --deadline, --strict (the batch system's options go in #SBATCH lines)"
                )
            if namespace.atomize:
                options["atomize"], sources["atomize"] = "1", where
            if namespace.strict:
                options["strict"], sources["strict"] = "1", where
            for key in DIRECTIVE_OPTIONS:
                value = getattr(namespace, key)
                if value is not None:
                    options[key], sources[key] = value, where
    return options, sources, sbatch_lines


# sbatch's options that take no value, or only one written --opt=value (getopt's optional arguments): any
# other option migsub does not know takes the next word as its value, unless written --opt=value or -pVALUE.
SBATCH_FLAGS = frozenset({
    "--contiguous", "--exclusive", "--get-user-env", "--hold", "--ignore-pbs", "--immediate", "--no-kill",
    "--no-requeue", "--overcommit", "--oversubscribe", "--parsable", "--quiet", "--reboot", "--requeue",
    "--spread-job", "--test-only", "--usage", "--use-min-nodes", "--verbose", "--version", "--wait", "--nice",
    "--propagate", "--help", "--json", "--yaml",
})  # fmt: skip
SBATCH_SHORT_FLAGS = frozenset("HIkOQsvVW")


@dataclass
class SplitArgv:
    own: list[str]  # migsub's options, then the script and its arguments: what argparse reads
    passthrough: list[str]  # the batch system's options, in the order given
    took: tuple[str, str] | None = None  # the last (option, word) where an option took the next word as its value
    script: bool = False  # whether a script was found
    before_dash: int | None = None  # how many passthrough words came before a "--" (None: no "--")


def split_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> SplitArgv:
    """Sort the words before the script into migsub's options and the batch system's, as sbatch reads them:
    ``migsub [options] script [args...]``. After ``--`` every option is the batch system's, even one whose
    name migsub also has (sbatch's ``--deadline``, ``--json``)."""
    known = parser._option_string_actions
    out = SplitArgv([], [])
    ours = True
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--" and ours:
            ours = False
            out.before_dash = len(out.passthrough)
        elif word == "-" or not word.startswith("-"):  # the script: it and everything after it are migsub's
            out.own += words[i:]
            out.script = True
            break
        elif ours and word.partition("=")[0] in known:
            action = known[word.partition("=")[0]]
            out.own.append(word)
            if action.nargs != 0 and "=" not in word and i + 1 < len(words):
                out.own.append(words[i + 1])
                i += 1
        else:
            out.passthrough.append(word)
            long = word.startswith("--")
            takes = (word not in SBATCH_FLAGS and "=" not in word) if long else \
                (len(word) == 2 and word[1] not in SBATCH_SHORT_FLAGS)  # fmt: skip
            if takes and i + 1 < len(words):
                out.passthrough.append(words[i + 1])
                out.took = (word, words[i + 1])
                i += 1
        i += 1
    return out


def option_words(words: Sequence[str]) -> list[tuple[str, str, int]]:
    """(option, value, how many words) for each option in the batch system's words: ``--gres=x``,
    ``--gres x``, ``-G x``, ``-Gx``, or a flag with an empty value."""
    out, i = [], 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=")
        if eq or (word.startswith("--") and word in SBATCH_FLAGS):
            out.append((name, value, 1))
        elif not word.startswith("--") and len(word) > 2:  # -pgpu
            out.append((word[:2], word[2:], 1))
        elif (word.startswith("--") or word[1:] not in SBATCH_SHORT_FLAGS) and i + 1 < len(words):
            out.append((word, words[i + 1], 2))
            i += 1
        else:
            out.append((word, "", 1))
        i += 1
    return out


# The request kind an option on the command line gives replaces these fields of the #MIG directives
# (the table in docs/request-translation.md); any other field is replaced only by itself.
REPLACES: dict[str, tuple[str, ...]] = {
    "mig": ("gpu_mem", "gpu_compute", "moldable"),
    "gpu_mem": ("mig",),  # a #MIG --moldable stays: --gpu-mem is then its memory floor
    "gpu_compute": ("mig", "moldable"),
    "moldable": ("mig", "gpu_compute"),
}


def override(options: dict[str, str], sources: dict[str, str], given: dict[str, str],
             given_sources: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:  # fmt: skip
    """The #MIG directives' ``options`` with the command line's ``given`` over them, field by field; a
    request kind given replaces the directives' other kinds (:data:`REPLACES`)."""
    merged, where = dict(options), dict(sources)
    for key in given:
        for dropped in REPLACES.get(key, ()):
            if dropped not in given:
                merged.pop(dropped, None)
                where.pop(dropped, None)
    return merged | given, where | given_sources


_GPU_OPTIONS = {"--gres": "--gres", "--gpus": "--gpus", "-G": "--gpus", "--gpus-per-node": "--gpus-per-node",
                "--gpus-per-task": "", "--gpus-per-socket": ""}  # fmt: skip


def request_fields(request: MigRequest) -> dict[str, str]:
    """A request read from a --gres/--gpus form as migsub's own fields."""
    out: dict[str, str] = {}
    if request.profiles:
        out["mig"] = request.profiles[0]
    if request.memory_mib is not None:
        out["gpu_mem"] = f"{request.memory_mib}M"
    if request.compute is not None:
        c = request.compute
        out["gpu_compute"] = f"{c.slices}g" if c.slices is not None else f"{c.fraction:g}"
    if request.count != 1:
        out["instances"] = str(request.count)
    return out


def gpu_requests(passthrough: list[str], profiles: Mapping[str, Profile]
                 ) -> tuple[dict[str, str], dict[str, str], list[str], str]:  # fmt: skip
    """The MIG request the batch system's options carry in a static-MIG form (``--gres=gpu:3g.40gb:1``,
    ``--gpus=1g.10gb:2``, ``--gpus-per-node=...``, where the profile is one of the site's) or as
    ``--gres=mig:...``: (migsub's fields, where each came from, the options left to pass on, the other GRES
    of a --gres list). Any other GPU request is refused: migsub submits MIG jobs."""
    from mig_batch.request import parse_gres, static_mig_request

    fields: dict[str, str] = {}
    where: dict[str, str] = {}
    rest: list[str] = []
    other_gres: list[str] = []
    position = 0
    for name, value, count in option_words(passthrough):
        words = passthrough[position : position + count]
        position += count
        if name not in _GPU_OPTIONS:
            rest += words
            continue
        shown = " ".join(words)
        form = _GPU_OPTIONS[name]
        for item in value.split(",") if form == "--gres" else [value]:
            request = None
            if form == "--gres" and item.lower().removeprefix("gres:").removeprefix("gres/").startswith("mig:"):
                request = parse_gres(item)
            elif form == "--gres" and not item.lower().removeprefix("gres:").removeprefix("gres/").startswith("gpu"):
                other_gres.append(item)
                continue
            elif form:
                request = static_mig_request(form, item, profiles)
            if request is None:
                forms = ", ".join(f"{o}={f}" for o, f in STATIC_MIG_FORMS.items())
                raise DirectiveError(f"{shown} asks for whole GPUs, not a MIG instance; migsub submits MIG jobs: "
                                     f"give --mig PROFILE, --gpu-mem SIZE or --gpu-compute SHARE, or a static-MIG "
                                     f"form ({forms}) with one of this site's profiles "
                                     f"({', '.join(p.name for p in sorted(profiles.values(), key=size_order))})"
                                     "; for a whole GPU use sbatch")  # fmt: skip
            if fields:
                raise DirectiveError(f"{shown}: the MIG request is given twice on the command line "
                                     f"({where[next(iter(fields))]} too); give it once")  # fmt: skip
            fields = request_fields(request)
            where = dict.fromkeys(fields, shown)
    return fields, where, rest, ",".join(other_gres)


def build_request(options: dict[str, str], sources: dict[str, str]) -> MigRequest | MoldableRequest:
    def checked(key: str, parse):  # errors name the directive or option that carried the value
        try:
            return parse(options[key])
        except RequestError as exc:
            raise DirectiveError(f"{sources[key]}: {exc}") from None

    if "instances" in options:
        instances_of(options, sources)  # refuses --instances with --moldable
    if "moldable" in options:
        if "mig" in options:
            raise DirectiveError(f"{sources['mig']}: --mig and --moldable exclude each other")
        return checked("moldable", lambda v: parse_moldable(v, options.get("gpu_mem")))
    if not any(k in options for k in ("mig", "gpu_mem", "gpu_compute")):
        raise DirectiveError("say what the job needs: --mig PROFILE, --gpu-mem SIZE, --gpu-compute SHARE or --moldable")
    return MigRequest(
        memory_mib=checked("gpu_mem", parse_memory) if "gpu_mem" in options else None,
        compute=checked("gpu_compute", parse_compute) if "gpu_compute" in options else None,
        profiles=(options["mig"].lower(),) if "mig" in options else (),
        count=instances_of(options, sources),
    )


def instances_of(options: dict[str, str], sources: dict[str, str]) -> int:
    """``--instances N``: a whole number of at least 1 (1 when not given, and for ``auto`` until the leaves
    are counted)."""
    if "instances" not in options:
        return 1
    text = options["instances"].strip()
    if text.lower() != "auto" and (not text.isdigit() or len(text) > 6 or int(text) < 1):  # int() of 6 digits at most
        raise DirectiveError(f"{sources['instances']}: must be a whole number of at least 1, or auto; "
                             f"got {shown_value(options['instances'])}")  # fmt: skip
    for other in ("moldable", "atomize"):
        if other in options:
            raise DirectiveError(f"{sources['instances']}: --instances and --{other} exclude each other")
    return 1 if text.lower() == "auto" else int(text)


def unknown_profile(request: MigRequest, models: Sequence[GpuModel], sources: dict[str, str]) -> None:
    """Refuse ``--mig`` with a name no model has (a typo reads better so than as an unmet request)."""
    names = {p.name: p for m in models for p in m.profiles}
    for name in request.profiles:
        if name not in names:
            known = ", ".join(p.name for p in sorted(names.values(), key=size_order))
            of = ", ".join(m.name for m in models)
            raise DirectiveError(f"{sources['mig']}: {shown_value(name)} is not a MIG profile of {of}; they have "
                                 f"{known}")  # fmt: skip


def wants_auto(options: dict[str, str]) -> bool:
    return options.get("instances", "").strip().lower() == "auto"


def leaf_options(request: MigRequest, options: dict[str, str], sources: dict[str, str], models: list,
                 config: SiteConfig | None) -> tuple[dict[str, str], dict[str, str], LeafChoice]:  # fmt: skip
    """Flex-MIG's finer request: the options of the N leaves it becomes (``--mig LEAF --instances N``, and
    ``--gpu MODEL`` where another model has the same leaf in another count). Refused when the site has not
    enabled ``flex.leaf_requests`` or no node holds the leaves."""
    from mig_batch.leaves import choose_leaves, leaves_for, refused_without_setting
    from mig_batch.placement.multi import node_capacity

    auto = wants_auto(options)
    for model in models:  # a request that cannot be over leaves is refused as such on any site
        leaves_for(request, model)
    if config is None or not config.flex.leaf_requests:
        raise refused_without_setting(request, auto)
    capacity = None
    if config.nodes:
        capacity = {}
        for model in models:
            leaf = leaves_for(request, model).leaf.name
            held = [(node_capacity([m for m in gpus if m == model.name], {model.name: leaf}), node)
                    for node, gpus in config.nodes.items()]  # fmt: skip
            most, node = max(held)
            capacity[model.name] = (most, f"on {node}" if most else "")
    choice = choose_leaves(request, models, capacity)
    leaves = {k: v for k, v in options.items() if k not in ("gpu_mem", "gpu_compute", "instances")}
    origin = sources.get("instances") or sources.get("gpu_mem") or sources.get("gpu_compute") or "the request"
    where = {k: v for k, v in sources.items() if k in leaves}
    leaves["mig"], where["mig"] = choice.chosen.leaf.name, origin
    if choice.chosen.count > 1:
        leaves["instances"], where["instances"] = str(choice.chosen.count), origin
    if choice.constrain and "gpu" not in leaves:
        leaves["gpu"], where["gpu"] = choice.chosen.model, origin
    return leaves, where, choice


_TASK_OPTIONS = {"--ntasks-per-node": "per_node", "--ntasks": "tasks", "-n": "tasks", "--nodes": "nodes", "-N": "nodes"}


def task_counts(sbatch_lines: list[str], command_line: Sequence[str] = ()) -> dict[str, tuple[str, str]]:
    """What the script's #SBATCH lines, then the command line's options for sbatch (which win, as in sbatch)
    say about tasks and nodes: kind -> (value, line)."""
    out: dict[str, tuple[str, str]] = {}
    lines: list[tuple[str, list[str]]] = []
    for line in sbatch_lines:
        try:
            lines.append((line, shlex.split(line[len("#SBATCH") :])))
        except ValueError:
            continue
    if command_line:
        lines.append((f"command line {shlex.join(command_line)}", list(command_line)))
    for line, words in lines:
        for i, word in enumerate(words):
            name, eq, value = word.partition("=")
            if name in _TASK_OPTIONS:
                if not eq:
                    value = words[i + 1] if i + 1 < len(words) else ""
                out[_TASK_OPTIONS[name]] = (value, line)
            elif name.startswith("-n") and name[2:].isdigit():
                out["tasks"] = (name[2:], line)
    return out


def check_instances(count: int, sbatch_lines: list[str], request: MigRequest, models: list,
                    command_line: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """The sbatch options a job over ``count`` instances adds (one task per instance, on one node); refused
    when the script's (or the command line's) task count contradicts it or no node of the site holds that many."""
    if count == 1:
        return []
    counts = task_counts(sbatch_lines, command_line)
    nodes = counts.get("nodes", ("1", ""))
    if nodes[0] not in ("1", "1-1"):
        raise DirectiveError(f"'{nodes[1]}': a job over {count} instances runs on one node")
    for kind in ("per_node", "tasks"):
        if kind in counts and counts[kind][0] != str(count):
            raise DirectiveError(f"'{counts[kind][1]}' contradicts --instances {count}: one task per instance "
                                 f"(give {count} tasks, or leave the task count to migsub)")  # fmt: skip
    capacity = site_capacity(request, models)
    if capacity is not None and capacity[0] < count:
        one = dataclasses.replace(request, count=1).describe()
        raise RequestError(f"no node of this site holds {count} instances of {one}; "
                           f"the most is {capacity[0]} ({capacity[1]})")  # fmt: skip
    return [] if counts else [f"--ntasks-per-node={count}", "--nodes=1"]


def site_capacity(request: MigRequest, models: list) -> tuple[int, str] | None:
    """(the most instances of ``request`` one empty node of the site holds, which node); None without an
    inventory in the site config."""
    from mig_batch.placement.multi import node_capacity
    from mig_batch.request import translate

    config = site_config()
    if config is None or not config.nodes:
        return None
    names = {m.name for m in models}
    profiles = {}
    for model in models:
        with contextlib.suppress(RequestError):
            profiles[model.name] = translate(request, model).name
    held = [(node_capacity([m for m in gpus if m in names], profiles), node) for node, gpus in config.nodes.items()]
    most, node = max(held)
    return most, f"on {node}"


def gres_of(options: dict[str, str]) -> str:
    """The GRES string job_submit.lua reads back: the user's request, not yet a profile."""
    count = f":{int(options['instances'])}" if int(options.get("instances", "1")) > 1 else ""
    if "mig" in options:
        return f"mig:{options['mig'].lower()}{count}"
    if "gpu_mem" in options:
        return f"mig:{parse_memory(options['gpu_mem'])}M{count}"
    if "gpu_compute" in options:
        return f"mig:{parse_compute(options['gpu_compute']).slices}g{count}"
    sizes = parse_moldable(options["moldable"]).times  # moldable, no memory floor: its smallest size
    return f"mig:{min(sizes, key=lambda size: (int(size.split('g')[0]), size))}"


def moldable_field(text: str) -> str:
    """The moldable sizes as job_submit.lua reads them: ``size:seconds`` pairs, comma-separated."""
    return ",".join(f"{size}:{seconds:g}" for size, seconds in parse_moldable(text).times.items())


def site_config() -> SiteConfig | None:
    """The site config, or None where there is none (migsub then checks what it can without it). One
    that is there but unreadable or wrong is an error: translating for models the site does not have
    would hide it."""
    from mig_batch.config import config_path, load_config

    path = config_path()
    if "MIG_BATCH_CONFIG" not in os.environ and not path.exists():
        return None
    return load_config(path)


def site_models() -> list:
    """The site's GPU models (inventory of the mig_batch config) when there is one, else every model."""
    config = site_config()
    names = sorted({m for ms in config.nodes.values() for m in ms}) if config and config.nodes else []
    return [get_model(n) for n in names] or sorted(all_models().values(), key=lambda m: m.name)


@dataclass(frozen=True)
class Chain:
    checkpoint_dir: Path
    min_s: float
    max_s: float
    deadline: float | None


def chain_of(options: dict[str, str], sources: dict[str, str]) -> Chain | None:
    """The subjob-chain settings (``--atomize``), checked; None for a monolithic job."""
    if "atomize" not in options:
        stray = [k for k in ATOMIZE_OPTIONS if k in options]
        if stray:
            hint = " (sbatch's own --deadline goes after --: migsub ... -- --deadline=TIME job.sh)" \
                if stray[0] == "deadline" else ""  # fmt: skip
            raise DirectiveError(f"{sources[stray[0]]}: --{stray[0].replace('_', '-')} needs --atomize{hint}")
        return None
    if "moldable" in options:
        raise DirectiveError(f"{sources['atomize']}: --atomize and --moldable exclude each other")
    if "checkpoint_dir" not in options:
        raise DirectiveError(f"{sources['atomize']}: --atomize needs --checkpoint-dir DIR (where the chain resumes)")

    def duration(key: str, default: str) -> float:
        try:
            return parse_duration(options.get(key, default))
        except RequestError as exc:
            raise DirectiveError(f"{sources.get(key, '--' + key.replace('_', '-'))}: {exc}") from None

    low, high = duration("subjob_min", "60s"), duration("subjob_max", "1h")
    if low > high:
        raise DirectiveError(f"{sources.get('subjob_min', '--subjob-min')}: the shortest subjob ({low:g} s) is "
                             f"longer than the longest ({high:g} s)")  # fmt: skip
    deadline = time.time() + duration("deadline", "1s") if "deadline" in options else None
    directory = Path(options["checkpoint_dir"]).expanduser().resolve()
    if ";" in str(directory) or any(c.isspace() for c in str(directory)):
        raise DirectiveError(f"{sources['checkpoint_dir']}: the checkpoint directory may not contain ';' or spaces")
    return Chain(directory, low, high, deadline)


def script_command(script: Path) -> list[str]:
    """How to run ``script`` the way sbatch would: directly when executable, else by its #! line."""
    if os.access(script, os.X_OK):
        return [str(script)]
    first = script.read_text(errors="replace").split("\n", 1)[0]
    interpreter = shlex.split(first[2:]) if first.startswith("#!") else ["/bin/sh"]
    return [*interpreter, str(script)]


def chain_script(spec: JobSpec, chain: Chain, sbatch_lines: list[str]) -> str:
    """The batch script of every subjob: the user's #SBATCH lines, then the runner around the script."""
    runner = [sys.executable, "-m", "mig_batch.subjob.runner"]
    command = [*runner, "--", *script_command(spec.script.resolve()), *spec.script_args]
    return "\n".join(["#!/bin/bash", *sbatch_lines, "#SBATCH --requeue", "#SBATCH --open-mode=append",
                      f"export MIG_BATCH_CHECKPOINT_DIR={shlex.quote(str(chain.checkpoint_dir))}",
                      "trap '' USR1  # until the runner forwards it",
                      "exec " + shlex.join(command), ""])  # fmt: skip


def sbatch_command(spec: JobSpec, chain: Chain | None = None, tasks: Sequence[str] = ()) -> list[str]:
    """The sbatch command: migsub's own options, then the command line's options for sbatch unchanged."""
    gres = gres_of(spec.options) + (f",{spec.other_gres}" if spec.other_gres else "")
    cmd = ["sbatch", "--parsable", f"--gres={gres}", *tasks]
    comment = []
    if "gpu_compute" in spec.options:
        comment.append(f"compute={spec.options['gpu_compute']}")
    if "moldable" in spec.options:
        comment.append(f"moldable={moldable_field(spec.options['moldable'])}")
    if chain is not None:
        comment += ["atomize=1", f"ckpt={chain.checkpoint_dir}", f"smin={chain.min_s:g}", f"smax={chain.max_s:g}"]
        if chain.deadline is not None:
            comment.append(f"deadline={chain.deadline:.0f}")
    if comment:
        cmd.append("--comment=mig-batch:" + ";".join(comment))
    if "gpu" in spec.options:
        cmd.append(f"--constraint={get_model(spec.options['gpu']).name}")
    cmd += spec.passthrough
    if chain is not None:  # the script comes on stdin: the runner around the user's script
        return [*cmd, f"--signal=B:USR1@{SLURM_SIGNAL_MARGIN_S}"]
    return [*cmd, str(spec.script), *spec.script_args]


CONDOR_RESERVED = {"executable", "arguments", "universe"}  # migsub writes these itself


def condor_description(spec: JobSpec, header: list[str]) -> dict[str, str]:
    """The HTCondor submit description of a rigid or moldable job: the request as the attributes the
    schedd's transform turns into the tag (``+MigRequest`` etc.), ``#CONDOR key = value`` lines after."""
    request = gres_of(spec.options).removeprefix("mig:")
    attrs = {"MigRequest": request}
    if "gpu_compute" in spec.options:
        attrs["MigCompute"] = spec.options["gpu_compute"]
    if "moldable" in spec.options:
        attrs["MigMoldable"] = moldable_field(spec.options["moldable"])
    if "gpu" in spec.options:
        attrs["MigModel"] = get_model(spec.options["gpu"]).name
    command = script_command(spec.script.resolve()) + list(spec.script_args)
    name = spec.script.name
    description = {"executable": command[0], "initialdir": os.getcwd(), "output": f"{name}.$(ClusterId).out",
                   "error": f"{name}.$(ClusterId).err", "log": f"{name}.$(ClusterId).log"}  # fmt: skip
    if command[1:]:
        description["arguments"] = '"' + " ".join("'" + a.replace("'", "''").replace('"', '""') + "'"
                                                  for a in command[1:]) + '"'  # fmt: skip
    description |= {f"MY.{attr}": json.dumps(value) for attr, value in attrs.items()}
    for line in header:
        if not line.startswith("#CONDOR"):
            continue
        key, sep, value = line[len("#CONDOR") :].partition("=")
        key = key.strip()
        if not sep or not key:
            raise DirectiveError(f"{spec.script}: '{line}' is not '#CONDOR key = value'")
        if key.lower() in CONDOR_RESERVED or key.lower().removeprefix("my.").removeprefix("+") in {
                a.lower() for a in (*attrs, "MigBatchTag", "MigBatchNode")}:  # fmt: skip
            raise DirectiveError(f"{spec.script}: '{line}' sets {key}, which migsub writes itself")
        description[key] = value.strip()
    return description


def choose_backend(explicit: str | None) -> str:
    """``--backend``, else the site config's ``batch_system``, else the one batch system found here."""
    if explicit:
        return explicit
    config = site_config()
    if config is not None and config.batch_system:
        return config.batch_system
    import shutil

    found = [name for name, present in (("slurm", shutil.which("sbatch") is not None),
                                         ("htcondor", schedd_reachable())) if present]  # fmt: skip
    if len(found) == 1:
        return found[0]
    if not found:
        raise DirectiveError("no batch system found: no sbatch on PATH and no HTCondor schedd answering; "
                             "--dry-run shows the translation")  # fmt: skip
    raise DirectiveError("both Slurm (sbatch) and an HTCondor schedd are here; say which with --backend slurm|htcondor "
                         "or batch_system: in the site config")  # fmt: skip


def schedd_reachable() -> bool:
    """An HTCondor client config and a schedd that its collector knows."""
    if not (os.environ.get("CONDOR_CONFIG") or Path("/etc/condor/condor_config").exists()):
        return False
    try:
        import htcondor2

        htcondor2.Collector().locate(htcondor2.DaemonType.Schedd)
    except Exception:  # no bindings, no collector, no schedd: not this machine's batch system
        return False
    return True


def round_ups(request: MigRequest, results: Mapping[str, object], models: Sequence[GpuModel]) -> dict[str, str]:
    """Per model where the chosen profile holds much more than asked, the warning (request.ROUND_UP_RULE)."""
    from mig_batch.request import round_up

    out = {}
    for model in models:
        chosen = results.get(model.name)
        if isinstance(chosen, Profile):
            found = round_up(request, model, chosen)
            if found is not None:
                out[model.name] = found.message()
    return out




def misspelt(split: SplitArgv, parser: argparse.ArgumentParser) -> None:
    """Refuse an option before ``--`` that is not migsub's but nearly is (``--gpu-memory``): it would go to sbatch,
    which refuses it only at submission, and a dry run would not show the mistake."""
    import difflib

    ours = [o for o in parser._option_string_actions if o.startswith("--")]
    words = split.passthrough[: split.before_dash] if split.before_dash is not None else split.passthrough
    for name, _, _ in option_words(words):
        if not name.startswith("--") or name in SBATCH_FLAGS or name in _GPU_OPTIONS:
            continue
        near = difflib.get_close_matches(name, ours, n=1, cutoff=0.85)
        if near:
            raise DirectiveError(f"{name} is not a migsub option; did you mean {near[0]}? (an option of sbatch's "
                                 f"of that name goes after --: migsub ... -- {name}=VALUE job.sh)")  # fmt: skip


def check_passthrough(passthrough: list[str], options: dict[str, str]) -> None:
    """Refuse options for sbatch that would undo what migsub writes (its --comment, its --constraint)."""
    for name, value, _ in option_words(passthrough):
        if name in ("--constraint", "-C") and "gpu" in options:
            raise DirectiveError(f"{name} {value}: migsub writes --constraint=<model> for --gpu; give one of them")
        if name == "--comment" and any(k in options for k in ("gpu_compute", "moldable", "atomize")):
            raise DirectiveError(f"--comment {value}: migsub writes the job's comment (its MIG request) for "
                                 "--gpu-compute, --moldable and --atomize; leave --comment out")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    return run_guarded(_run, argv, "migsub")


def _run(argv: list[str]) -> int:
    if argv[:1] == ["status"]:  # migsub status [JOBID...]: a script named status is ./status
        from mig_batch.cli.migsub_status import main as status_main

        return status_main(argv[1:])
    parser = _option_parser()
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument("script", type=Path, help="the batch script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    split = split_argv(argv, parser)
    if split.took is not None and not split.script and Path(split.took[1]).is_file():
        option, word = split.took
        attached = f"{option}=VALUE" if option.startswith("--") else f"{option}VALUE"
        return fail(f"no batch script: {word} was read as the value of {option}, which migsub passes to sbatch; "
                    f"write {attached} for an option with a value, or give the script after it")  # fmt: skip
    args = parser.parse_args(split.own)
    try:
        misspelt(split, parser)
        options, sources, sbatch_lines = read_directives(args.script)
        for line in sbatch_lines:
            if "--gres" in line or "--gpus" in line:
                raise DirectiveError(f"{args.script}: '{line}' asks for GPUs too; let migsub request the MIG instance "
                                     "(#MIG --mig PROFILE --instances N, or --gres=gpu:PROFILE:N on migsub's command "
                                     "line)")  # fmt: skip
        profiles = {p.name: p for m in site_models() for p in m.profiles}
        given, given_sources, passthrough, other_gres = gpu_requests(split.passthrough, profiles)
        for key in DIRECTIVE_OPTIONS:
            if getattr(args, key) is not None:
                name = f"--{key.replace('_', '-')}"
                if key in given:
                    raise DirectiveError(f"{name} and {given_sources[key]} both give the request; give it once")
                given[key], given_sources[key] = getattr(args, key), name
        options, sources = override(options, sources, given, given_sources)
        if args.strict:
            options["strict"], sources["strict"] = "1", "--strict"
        request = build_request(options, sources)
        models = [get_model(options["gpu"])] if "gpu" in options else site_models()
        leaf_plans: dict[str, dict[str, object]] = {}
        rounded: dict[str, str] = {}
        if isinstance(request, MoldableRequest):
            per_model = moldable_per_model(request, models)  # a mixed site: the models that can run a size
        else:
            from mig_batch.leaves import SETTING as LEAF_SETTING
            from mig_batch.leaves import needs_leaves

            results = translate_any(request, models)
            per_model = {name: (None if isinstance(p, RequestError) else p.name) for name, p in results.items()}
            config = site_config()
            leaf_site = config is not None and config.flex.leaf_requests
            hint = ""
            if needs_leaves(request, results) and not leaf_site:
                hint = f"; a site that sets {LEAF_SETTING}: true runs it over several leaves (docs/flex.md)"
            if wants_auto(options) or (needs_leaves(request, results) and leaf_site):
                options, sources, leaves = leaf_options(request, options, sources, models, config)
                request = build_request(options, sources)
                if "gpu" in options:
                    models = [get_model(options["gpu"])]
                per_model = {leaves.chosen.model: leaves.chosen.leaf.name}
                leaf_plans = {p.model: {"leaf": p.leaf.name, "count": p.count} for p in leaves.plans}
            if not leaf_plans and isinstance(request, MigRequest):
                rounded = round_ups(request, results, models)
                if rounded and "strict" in options:
                    raise RequestError(f"{sources['strict']}: the request rounds up: " + "; ".join(rounded.values())
                                       + "; ask for what the smaller profile holds, or drop --strict")  # fmt: skip
                for text in rounded.values():
                    err_console.print(f"warning: {text}", highlight=False, markup=False, soft_wrap=True)
            if not any(per_model.values()):
                unknown_profile(request, models, sources)
                if len(models) == 1:
                    raise RequestError(f"{results[models[0].name]}{hint}")
                largest = max(models, key=lambda m: m.largest_profile.memory_mib)
                raise RequestError(
                    f"no MIG profile of {', '.join(m.name for m in models)} satisfies {request.describe()}; "
                    f"the largest is {largest.largest_profile.name} on {largest.name}{hint}"
                )
        if args.atomize:
            options["atomize"], sources["atomize"] = "1", "--atomize"
        chain = chain_of(options, sources)
        tasks = []
        try:
            backend, no_backend = choose_backend(args.backend) if not args.dry_run or args.backend else "slurm", None
        except DirectiveError as exc:  # said after the request's own errors, as before
            backend, no_backend = "", exc
        if isinstance(request, MigRequest):
            instances_of(options, sources)  # --instances with --atomize
            # HTCondor reads no #SBATCH task counts: one process, which starts a rank per instance (docs/htcondor.md)
            slurm_lines = [] if backend == "htcondor" else sbatch_lines
            tasks = check_instances(request.count, slurm_lines, request, models, passthrough)
        check_passthrough(passthrough, options)
        spec = JobSpec(args.script, args.script_args, options, sources, passthrough, other_gres)
        if no_backend is not None:
            raise no_backend
        if backend == "htcondor":
            if passthrough or other_gres:
                raise DirectiveError(f"{shlex.join(passthrough) or '--gres=' + other_gres}: options for sbatch; on "
                                     "HTCondor give submit commands as '#CONDOR key = value' lines in the script")
            description = condor_description(spec, sbatch_lines)
            if chain is not None:  # one HTCondor job runs the chain's subjobs in turn (docs/htcondor.md)
                from mig_batch.htcondor.attrs import chain_description

                try:
                    description = chain_description(description, str(chain.checkpoint_dir), chain.min_s, chain.max_s,
                                                    chain.deadline)  # fmt: skip
                except ValueError as exc:
                    raise DirectiveError(f"{sources['atomize']}: {exc}") from None
            if any(line.startswith("#SBATCH") for line in sbatch_lines):
                # on stderr: stdout holds the job id, or the JSON
                err_console.print(f"note: {args.script}'s #SBATCH lines are Slurm's; HTCondor reads #CONDOR lines",
                                  highlight=False)  # fmt: skip
            return _submit_condor(description, per_model, args)
        command = sbatch_command(spec, chain, tasks)
        stdin = chain_script(spec, chain, sbatch_lines) if chain is not None else None
    except (DirectiveError, RequestError, UnknownModelError) as exc:
        return fail(str(exc))

    if args.dry_run:
        if args.json:
            json.dump({"options": options, "sources": sources, "profiles": per_model, "leaves": leaf_plans,
                       "round_up": rounded, "passthrough": passthrough, "sbatch": command, "script": stdin},
                      sys.stdout, indent=2)  # fmt: skip
            sys.stdout.write("\n")
        else:
            for name, chosen in per_model.items():
                shown = f"{options.get('instances', '1')} x {chosen} (leaves)" if leaf_plans else chosen
                console.print(f"{name}: {shown if chosen else '[red]no profile fits[/]'}", highlight=False)
            console.print("sbatch command: " + shlex.join(command), highlight=False, soft_wrap=True)
            if stdin is not None:
                console.print("subjob script (on sbatch's stdin):\n" + stdin, highlight=False, markup=False,
                              soft_wrap=True)  # fmt: skip
        return 0
    if chain is not None:  # the runner submits the chain's later jobs the same way
        spec_file = next_job_spec(chain.checkpoint_dir)
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        spec_file.write_text(json.dumps({"sbatch": command, "script": stdin}))
    return submit(command, stdin)


def _submit_condor(description: dict[str, str], per_model: dict, args: argparse.Namespace) -> int:
    if args.dry_run:
        if args.json:
            json.dump({"profiles": per_model, "htcondor": description}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            for name, chosen in per_model.items():
                console.print(f"{name}: {chosen if chosen else '[red]no profile fits[/]'}", highlight=False)
            console.print("HTCondor submit description:\n" + "\n".join(f"{k} = {v}" for k, v in description.items()),
                          highlight=False, markup=False, soft_wrap=True)  # fmt: skip
        return 0
    from mig_batch.batch.system import BatchError
    from mig_batch.factory import Role, open_batch_system

    try:
        job = open_batch_system(None, Role.SUBMITTER, "htcondor").submit([f"{k}={v}" for k, v in description.items()])
    except BatchError as exc:
        return fail(str(exc))
    print(job)
    return 0


def submit(command: list[str], stdin: str | None = None) -> int:
    """Hand the job to the batch system found on PATH; print its id."""
    import shutil

    from mig_batch.batch.system import BatchError
    from mig_batch.factory import Role, open_batch_system
    from mig_batch.slurm.commands import sbatch_args

    if shutil.which(command[0]) is None:
        return fail(f"no batch system found: {command[0]} is not on PATH; --dry-run shows the translation")
    try:
        job = open_batch_system(None, Role.SUBMITTER, "slurm").submit(sbatch_args(command), stdin)
    except BatchError as exc:
        return fail(str(exc))
    print(job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
