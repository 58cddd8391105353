"""The text the controller and the nodes exchange through the batch system's operator-only fields.

The managed-job tag job_submit.lua writes into AdminComment (operator-only), and its parser:

``mig-batch:v1;req=<spec>[;n=<instances>][;compute=<share>][;moldable=<size>:<s>,...][;model=<GPU model>][;atomize=1;
ckpt=<dir>;smin=<s>;smax=<s>[;deadline=<epoch>][;chain=<first job>]][;place=<node>/<gpu>/<profile>@<start>]
[;spots=<gpu>/<profile>@<start>,...]``
where ``spec`` is what followed ``mig:`` in ``--gres`` (3g.40gb, 20480M, 20G, 3g); ``moldable`` lists
sizes with predicted seconds (migsub --moldable; ``spec`` is then its memory floor or smallest size);
the atomize fields mark a subjob chain (migsub --atomize), ``chain`` a later job of one (the runner
submits one job per subjob). ``n`` asks for that many instances on one node, one per task (absent: one;
a tag without it parses as before). ``place`` (and ``window``, a subjob's granted seconds) is the controller's
decision, written when it pins the job (a multi-instance job's ``place`` is its rank 0 and ``spots`` lists
every rank's spot, all in one write): the node agent reads it from there, never from a field a user can
set. ``;place=...;slot=<id>`` is written by job_submit.lua instead, at submission, when it binds the job to
a prompt slot that mig-batchd decided ahead (docs/slurm.md "Prompt slots"). ``node=`` is the node's
report, appended by the agent in the Prolog (:class:`NodeReport`). A node's own field carries its agent's
state (:class:`AgentTag`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mig_batch.batch.system import MANAGED_PREFIX
from mig_batch.mig.models import get_model
from mig_batch.request import MigRequest, MoldableRequest, RequestError, parse_compute, parse_gres, translate

RANK_SEPARATOR = "#"


def rank_key(job: str, rank: int) -> str:
    """A multi-instance job's rank as the view, the store and the node's journal name it: the job
    itself for rank 0, ``job#r`` after."""
    return job if rank == 0 else f"{job}{RANK_SEPARATOR}{rank}"


def job_of(key: str) -> str:
    """The job a :func:`rank_key` names (a job id has no ``#``)."""
    return key.partition(RANK_SEPARATOR)[0]


@dataclass(frozen=True)
class Atomize:
    checkpoint_dir: str
    min_s: float
    max_s: float
    deadline: float | None = None
    chain: str | None = None  # a later job of this chain (named by its first job), one per subjob


@dataclass(frozen=True)
class JobTag:
    spec: str
    compute: str | None = None
    model: str | None = None
    atomize: Atomize | None = None
    moldable: str | None = None  # "1g:300,3g.40gb:110": sizes with predicted seconds
    instances: int = 1  # instances on one node, one per task (Flex-MIG's one-to-many)

    def moldable_request(self) -> MoldableRequest | None:
        if not self.moldable:
            return None
        times = {size: float(seconds) for size, _, seconds in (e.partition(":") for e in self.moldable.split(","))}
        return MoldableRequest(times, self.request().memory_mib)

    def request(self) -> MigRequest:
        base = parse_gres(f"mig:{self.spec}")
        compute = parse_compute(self.compute) if self.compute else base.compute
        return MigRequest(base.memory_mib, compute, base.profiles, base.media, self.instances)

    def text(self) -> str:
        parts = [f"{MANAGED_PREFIX}v1", f"req={self.spec}"]
        if self.instances != 1:
            parts.append(f"n={self.instances}")
        if self.compute:
            parts.append(f"compute={self.compute}")
        if self.moldable:
            parts.append(f"moldable={self.moldable}")
        if self.model:
            parts.append(f"model={self.model}")
        if self.atomize:
            a = self.atomize
            parts += ["atomize=1", f"ckpt={a.checkpoint_dir}", f"smin={a.min_s:g}", f"smax={a.max_s:g}"]
            if a.deadline is not None:
                parts.append(f"deadline={a.deadline:.0f}")
            if a.chain is not None:
                parts.append(f"chain={a.chain}")
        return ";".join(parts)


@functools.lru_cache(maxsize=4096)  # a pass reads every queued job's tag; most queued jobs share a few
def parse_tag(text: str) -> JobTag:
    if not text.startswith(MANAGED_PREFIX):
        raise ValueError(f"not a mig_batch tag: {text!r}")
    fields = dict(part.split("=", 1) for part in text[len(MANAGED_PREFIX) :].split(";") if "=" in part)
    if "req" not in fields:
        raise ValueError(f"mig_batch tag without req=: {text!r}")
    atomize = None
    if fields.get("atomize") == "1":
        try:
            atomize = Atomize(fields["ckpt"], float(fields["smin"]), float(fields["smax"]),
                              float(fields["deadline"]) if fields.get("deadline") else None,
                              fields.get("chain") or None)  # fmt: skip
        except (KeyError, ValueError):
            raise ValueError(f"mig_batch tag with atomize=1 needs ckpt=, smin= and smax=: {text!r}") from None
    try:
        instances = int(fields.get("n", "1"))
    except ValueError:
        instances = 0
    if instances < 1:
        raise ValueError(f"mig_batch tag with n= not a positive number of instances: {text!r}")
    counted = _spec_count(fields["req"])  # req=1g.10gb:4 (HTCondor's +MigRequest) names its own count
    if "n" not in fields and counted is not None:
        instances = counted
    elif counted not in (None, 1, instances):
        raise ValueError(f"mig_batch tag whose req={fields['req']} asks for {counted} instances but n={instances}: "
                         f"give the count once (req=1g.10gb:4, or req=1g.10gb;n=4): {text!r}")  # fmt: skip
    return JobTag(fields["req"], fields.get("compute") or None, fields.get("model") or None, atomize,
                  fields.get("moldable") or None, instances)  # fmt: skip


def _spec_count(spec: str) -> int | None:
    """The instance count a request spec names (``1g.10gb:4`` -> 4, ``1g.10gb`` -> 1); None when the
    spec is unreadable (the controller reports that as unplaceable)."""
    try:
        return parse_gres(f"mig:{spec}").count
    except RequestError:
        return None


PLACE_FIELD = ";place="  # the controller's decision (or a prompt slot's)
WAITS_FIELD = ";waits="  # why a held job waits, for its owner: the last field of a tag not yet placed


def wait_note(text: str) -> str:
    """The reason a job's tag shows its owner ("" for none)."""
    _, found, note = text.partition(WAITS_FIELD)
    return note if found else ""


def with_wait_note(text: str, reason: str) -> str:
    """The tag ``text`` showing ``reason`` instead of its note (none for ""): kept short, on one line, without
    the ``;`` that separates fields. A pin writes the tag again without it."""
    head = text.partition(WAITS_FIELD)[0]
    note = " ".join(reason.replace(";", ",").split())
    if len(note) > WAIT_NOTE_MAX:
        note = note[: WAIT_NOTE_MAX - 3] + "..."
    return f"{head}{WAITS_FIELD}{note}" if note else head


WAIT_NOTE_MAX = 200
SEEN_FIELD = "seen"  # what happened to the job before its placement (requeues, refused pins), for its owner
SEEN_MAX = 5  # the newest events a tag shows


@dataclass(frozen=True)
class Seen:
    """One event of a job's past its owner may read in its tag: what, when (epoch s) and why."""

    kind: str
    time: float
    detail: str = ""

    def text(self) -> str:
        detail = " ".join(self.detail.replace(";", " ").replace(",", " ").replace("=", ":").split())[:120]
        return f"{self.kind}@{int(self.time)}" + (f" {detail}" if detail else "")


def with_seen(text: str, seen: Sequence[Seen]) -> str:
    """``text`` (a tag about to be pinned) showing the newest ``SEEN_MAX`` of ``seen`` (none: as it is)."""
    kept = [part for part in text.split(";") if not part.startswith(f"{SEEN_FIELD}=")]
    shown = [s.text() for s in seen[-SEEN_MAX:]]
    return ";".join([*kept, f"{SEEN_FIELD}=" + ",".join(shown)]) if shown else ";".join(kept)


def parse_seen(text: str) -> list[Seen]:
    """The events a tag shows (see :func:`with_seen`); [] for none or an unreadable field."""
    found = []
    for item in _fields(text).get(SEEN_FIELD, "").split(","):
        head, _, detail = item.strip().partition(" ")
        kind, at, when = head.partition("@")
        if kind and at and when.isdigit():
            found.append(Seen(kind, float(when), detail))
    return found


@dataclass(frozen=True)
class Placed:
    """The controller's decision as the node reads it."""

    node: str
    gpu: int
    profile: str
    start: int
    window_s: float | None = None  # a subjob's granted window
    subjob: int | None = None  # a subjob's run number in its chain
    spots: tuple[tuple[int, str, int], ...] = ()  # a multi-instance job: (gpu, profile, start) per rank

    def ranks(self) -> tuple[tuple[int, str, int], ...]:
        """Every rank's (gpu, profile, start): one for a single-instance job."""
        return self.spots or ((self.gpu, self.profile, self.start),)


def placed_tag(tag: JobTag, place: Placed) -> str:
    window = f";window={place.window_s:.3f}" if place.window_s is not None else ""
    window += f";subjob={place.subjob}" if place.subjob is not None else ""
    if len(place.spots) > 1:
        window += ";spots=" + ",".join(f"{g}/{p}@{s}" for g, p, s in place.spots)
    return f"{tag.text()};place={place.node}/{place.gpu}/{place.profile}@{place.start}{window}"


def _spot(text: str) -> tuple[int, str, int]:
    where, _, start = text.rpartition("@")
    gpu, _, profile = where.partition("/")
    return int(gpu), profile, int(start)


def _fields(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(";") if "=" in part)


def parse_place(text: str) -> Placed | None:
    """The decision in a pinned job's tag; None before the controller pinned it."""
    fields = _fields(text)
    if "place" not in fields:
        return None
    try:
        where, _, start = fields["place"].rpartition("@")
        node, gpu, profile = where.split("/")
        window = float(fields["window"]) if "window" in fields else None
        subjob = int(fields["subjob"]) if "subjob" in fields else None
        spots = tuple(_spot(item) for item in fields["spots"].split(",")) if fields.get("spots") else ()
        return Placed(node, int(gpu), profile, int(start), window, subjob, spots)
    except ValueError:
        raise ValueError(f"mig_batch tag with an unreadable place=: {text!r}") from None


def parse_slot(text: str) -> int | None:
    """The prompt slot job_submit.lua bound a job to at its submission (``;slot=<id>`` after its ``place=``);
    None for a job mig-batchd placed."""
    if ";slot=" not in text:  # every pass asks this of every job: the common answer without a split
        return None
    try:
        return int(_fields(text)["slot"])
    except (KeyError, ValueError):
        raise ValueError(f"mig_batch tag with an unreadable slot=: {text!r}") from None


REPORT_KINDS = ("made", "replaced", "requeue")


@dataclass(frozen=True)
class NodeReport:
    """What the node did for a job: its instance made as decided, made elsewhere on the node
    (``replaced``: the decided spot was taken), or nothing fits there (``requeue``)."""

    kind: str
    gpu: int = -1
    profile: str = ""
    start: int = -1
    gi_id: int = -1
    uuid: str = ""
    reason: str = ""
    more: tuple[NodeReport, ...] = ()  # a multi-instance job: ranks 1..N-1 (this report is rank 0)

    def spot(self) -> str:
        return f"{self.gpu}/{self.profile}@{self.start}/{self.gi_id}/{self.uuid}"

    def ranks(self) -> tuple[NodeReport, ...]:
        return (self, *self.more) if self.kind != "requeue" else ()

    def text(self) -> str:
        if self.kind == "requeue":
            return f"node=requeue:{_clean(self.reason)}"
        more = ";ranks=" + ",".join(r.spot() for r in self.more) if self.more else ""
        return f"node={self.kind}:{self.spot()}{more}"


def _clean(text: str) -> str:
    return text.replace(";", ",").replace("=", ":").replace("\n", " ")[:300]


def with_report(text: str, report: NodeReport) -> str:
    """``text`` (a pinned tag) with the node's report in place of any earlier one."""
    kept = [part for part in text.split(";") if not part.startswith(("node=", "ranks="))]
    return ";".join([*kept, report.text()])


def parse_report(text: str) -> NodeReport | None:
    value = _fields(text).get("node")
    if value is None:
        return None
    kind, _, rest = value.partition(":")
    if kind == "requeue":
        return NodeReport(kind, reason=rest)
    try:
        if kind not in REPORT_KINDS:
            raise ValueError(kind)
        more = _fields(text).get("ranks")
        ranks = tuple(_report_spot(kind, item) for item in more.split(",")) if more else ()
        first = _report_spot(kind, rest)
        return NodeReport(kind, first.gpu, first.profile, first.start, first.gi_id, first.uuid, more=ranks)
    except ValueError:
        raise ValueError(f"mig_batch tag with an unreadable node report: {text!r}") from None


def _report_spot(kind: str, text: str) -> NodeReport:
    gpu, spot, gi_id, uuid = text.split("/")
    profile, _, start = spot.partition("@")
    return NodeReport(kind, int(gpu), profile, int(start), int(gi_id), uuid)


@dataclass(frozen=True)
class AgentTag:
    """What a node's agent publishes in the node's operator-only field: since when it runs and when it
    last reconciled (no MIG job is placed on a node that has not reconciled since it came back), and its
    problems: how many since it started and the last one (``problem``), so that an epilog that could not
    destroy or a reconcile that found strays reaches the controller's events (a job's own field may be
    gone or unwritable by then)."""

    started: float
    reconciled: float
    strays: int = 0  # instances it found with no live job and destroyed, in its last reconcile
    problems: int = 0  # problems since it started: the controller records each new count once
    problem: NodeProblem | None = None  # the last one
    mig_off: tuple[int, ...] = ()  # GPUs with MIG mode off: nothing can be placed on them

    def text(self) -> str:
        text = f"{MANAGED_PREFIX}agent;started={self.started:.3f};reconciled={self.reconciled:.3f};strays={self.strays}"
        if self.mig_off:
            text += f";migoff={','.join(map(str, self.mig_off))}"
        if self.problem is not None:
            text += f";problems={self.problems};problem={self.problem.text()}"
        return text


@dataclass(frozen=True)
class NodeProblem:
    """A problem of a node's hook or reconcile worth an operator's attention."""

    hook: str  # epilog | reconcile | prolog
    job: str  # "" when no job is concerned (a reconcile)
    reason: str

    def text(self) -> str:
        return f"{self.hook}:{self.job}:{_clean(self.reason)}"


def parse_problem(text: str) -> NodeProblem | None:
    hook, _, rest = text.partition(":")
    job, sep, reason = rest.partition(":")
    return NodeProblem(hook, job, reason) if hook and sep else None


def parse_agent_tag(text: str) -> AgentTag | None:
    if not text.startswith(f"{MANAGED_PREFIX}agent"):
        return None
    fields = _fields(text)
    try:
        problem = parse_problem(fields["problem"]) if "problem" in fields else None
        mig_off = tuple(int(g) for g in fields["migoff"].split(",")) if fields.get("migoff") else ()
        return AgentTag(float(fields["started"]), float(fields["reconciled"]), int(fields.get("strays", 0)),
                        int(fields.get("problems", 0)), problem, mig_off)  # fmt: skip
    except (KeyError, ValueError):
        return None


def moldable_times(tag: JobTag, models: Iterable[str]) -> dict[str, dict[str, float]] | str:
    """A moldable tag's options on each of ``models``: profile -> predicted seconds, or the reason
    it fits none of them."""
    out: dict[str, dict[str, float]] = {}
    errors: list[str] = []
    try:
        request = tag.moldable_request()
        assert request is not None, "not a moldable tag"
        for name in sorted(set(models) & ({get_model(tag.model).name} if tag.model else set(models))):
            try:
                out[name] = request.candidates(get_model(name))
            except RequestError as exc:
                errors.append(str(exc))
    except (RequestError, ValueError, KeyError) as exc:
        errors.append(str(exc))
    return out or ("; ".join(errors) or f"no GPU of model {tag.model} here")


def profiles_by_model(tag: JobTag, models: Iterable[str]) -> dict[str, str] | str:
    """The profile the tagged request gets on each of ``models`` (restricted to the tag's model),
    or, when it fits none of them, the reason. A moldable request gets its fastest size."""
    if tag.moldable:
        times = moldable_times(tag, models)
        if isinstance(times, str):
            return times
        return {m: min(options, key=lambda p: (options[p], p)) for m, options in times.items()}
    candidates = set(models)
    errors: list[str] = []
    out: dict[str, str] = {}
    try:
        if tag.model:
            candidates &= {get_model(tag.model).name}
        request = tag.request()
        for name in sorted(candidates):
            try:
                out[name] = translate(request, get_model(name)).name
            except RequestError as exc:
                errors.append(str(exc))
    except (RequestError, ValueError, KeyError) as exc:
        errors.append(str(exc))
    return out or ("; ".join(errors) or f"no GPU of model {tag.model} here")
