"""``migsub status [JOBID...]``: the user's own MIG jobs, without root, from what Slurm shows the job's owner.

Per job: its request (the tag job_submit.lua wrote into the AdminComment), and either where it runs (the
``place=`` mig-batchd wrote there, with the node's report: GPU, profile, GPU instance and the instance's
UUID) or why it waits (the note mig-batchd writes into the tag while the job waits, ``;waits=...``; before one
is written, Slurm's own reason). Read with one ``squeue --me`` (or ``squeue -j JOBID,...``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mig_batch.batch.system import MANAGED_PREFIX
from mig_batch.cli.output import Table, console, emit, fail
from mig_batch.entry import DEBUG_HELP, CommandParser
from mig_batch.errors import MigBatchError
from mig_batch.htcondor.attrs import TAG_ATTR

FIELD_END = "\x1f"  # after each free-text field (a reason, a comment may hold "|")
RECORD_END = "\x1e"
# squeue -O: the job as squeue names it to users (JobArrayID: 12, an array's task 12_3, its pending tasks
# 12_[4-9%2]), its state, Slurm's reason, the tag with mig-batchd's note (admin_comment: the name 22.05's -O knows)
SQUEUE_FORMAT = (",".join(f"{f}:{FIELD_END}" for f in ("JobArrayID", "State", "Reason"))
                 + f",admin_comment:{RECORD_END}")  # fmt: skip
ARRAY_WAITS = "an array's tasks not yet split off: mig-batchd places them a few at a time, within the array's limit"
SQUEUE_TIMEOUT_S = 60


class StatusError(ValueError):
    pass


def parse_records(text: str) -> list[tuple[str, str, str, str]]:
    """(job, state, Slurm's reason, tag) per record of ``squeue -h -O SQUEUE_FORMAT``."""
    out = []
    for record in text.split(RECORD_END):
        if not record.strip():
            continue
        fields = [f.strip() for f in record.lstrip("\n").split(FIELD_END)]
        if len(fields) != 4:
            raise StatusError(f"squeue printed an unexpected record: {record!r}")
        job, state, reason, tag = fields
        out.append((job, state, reason, tag))
    return out


def status_row(job: str, state: str, reason: str, tag_text: str,
               nodes: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any] | None:  # fmt: skip
    """One MIG job as ``migsub status`` shows it; None for a job that is not a MIG job. ``nodes``: the site
    config's inventory (node -> its GPUs' models), where there is one: the memory slices the job counts
    against its limits (Slurm's slice GRES) are read from it. Pure."""
    from mig_batch.batch.tags import parse_place, parse_report, parse_seen, parse_tag, wait_note
    from mig_batch.request import format_mib

    if not tag_text.startswith(MANAGED_PREFIX):
        return None
    row: dict[str, Any] = {"job": job, "state": state, "request": "", "waits": None, "placement": None,
                           "slices": None, "events": [vars(e) for e in parse_seen(tag_text)]}  # fmt: skip
    try:
        tag = parse_tag(tag_text)
        request = tag.request()
        row["request"] = f"{request.describe()}" + (f" on {tag.model}" if tag.model else "")
        if tag.moldable:
            floor = f" (memory floor {format_mib(request.memory_mib)})" if request.memory_mib is not None else ""
            row["request"] = f"moldable {tag.moldable}{floor}"
        place = parse_place(tag_text)
        report = parse_report(tag_text)
    except ValueError as exc:  # a tag this migsub cannot read (a newer mig_batch's): shown as it is
        row["request"] = f"unreadable tag: {exc}"
        return row
    if place is not None:
        ranks = report.ranks() if report is not None else ()
        spots, held = [], []
        for rank, (gpu, profile, _start) in enumerate(place.ranks()):
            made = ranks[rank] if rank < len(ranks) else None
            if made is not None:
                gpu, profile = made.gpu, made.profile  # where the node made it (replaced: elsewhere on the node)
            held.append((gpu, profile))
            spots.append({"rank": rank, "gpu": gpu, "profile": profile, "gpu_instance": made.gi_id if made else None,
                          "uuid": made.uuid if made else None})  # fmt: skip
        row["placement"] = {"node": place.node, "instances": spots,
                            "made": report.kind if report is not None else None}  # fmt: skip
        row["slices"] = _slices(place.node, held, nodes or {})
        if report is not None and report.kind == "requeue":
            row["waits"] = f"its node could not make the instance ({report.reason}); mig-batchd places it again"
        elif state == "PENDING" and reason.startswith(("Assoc", "QOS")) and ("GRES" in reason or "TRES" in reason):
            row["waits"] = f"over a limit: its slices count against its account's or QOS's limit ({reason})"
        elif state == "PENDING":
            row["waits"] = "placed: starting" if reason in ("", "None") else f"placed: {reason}"
    elif state == "PENDING" and "_[" in job:  # the array's record of pending tasks carries no note
        row["waits"] = ARRAY_WAITS
    elif state == "PENDING":
        row["waits"] = wait_note(tag_text) or f"mig-batchd has not placed it yet ({reason}; no reason published yet)"
    return row


def _slices(node: str, spots: list[tuple[int, str]], nodes: Mapping[str, Sequence[str]]) -> int | None:
    """The memory slices of the job's instances, by its node's GPU models; None where the inventory does not say."""
    from mig_batch.mig.models import UnknownModelError, get_model

    models = nodes.get(node)
    total = 0
    for gpu, profile in spots:
        try:
            model = get_model(models[gpu]) if models is not None and 0 <= gpu < len(models) else None
        except UnknownModelError:
            model = None
        if model is None or not model.has_profile(profile):
            return None
        total += model.profile(profile).memory_slices
    return total


def site_nodes() -> Mapping[str, Sequence[str]] | None:
    """The site config's inventory, None without one (migsub status runs without a site config)."""
    from mig_batch.config import config_path, load_config

    path = config_path()
    if "MIG_BATCH_CONFIG" not in os.environ and not path.exists():
        return None
    config = load_config(path)
    return config.nodes or None


def squeue(jobs: Sequence[str]) -> str:
    for job in jobs:
        if not job.replace("_", "").isdigit():
            raise StatusError(f"job id {job!r} is not a Slurm job id; give numbers such as 1234 (or 1234_5)")
    args = ["squeue", "-h", "-O", SQUEUE_FORMAT]
    args += ["-j", ",".join(jobs)] if jobs else ["--me"]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S,
                              env={**os.environ, "SLURM_TIME_FORMAT": "%s"})  # fmt: skip
    except FileNotFoundError:
        raise StatusError("no squeue on PATH: migsub status reads Slurm's queue (--backend htcondor: HTCondor's)") \
            from None
    except subprocess.TimeoutExpired:
        raise StatusError(f"squeue did not answer in {SQUEUE_TIMEOUT_S} s; is slurmctld up?") from None
    if proc.returncode != 0:
        raise StatusError(f"squeue failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


# HTCondor's JobStatus as the rows say it: idle and held jobs wait (mig-batchd holds, or leaves unmatched, the
# jobs it has not placed)
CONDOR_STATES = {1: "PENDING", 2: "RUNNING", 3: "REMOVED", 4: "COMPLETED", 5: "PENDING", 6: "RUNNING", 7: "SUSPENDED"}


CONDOR_Q_ARGS = ("-json", "-attributes", f"ClusterId,ProcId,JobStatus,HoldReason,{TAG_ATTR}")


def parse_condor_json(text: str) -> list[tuple[str, str, str, str]]:
    """(job, state, HTCondor's hold reason, tag) per job of ``condor_q -json`` (nothing at all: no job)."""
    try:
        ads = json.loads(text) if text.strip() else []
        return [(f"{ad['ClusterId']}.{ad['ProcId']}", CONDOR_STATES.get(ad.get("JobStatus", 0), "UNKNOWN"),
                 str(ad.get("HoldReason", "")), str(ad.get(TAG_ATTR, ""))) for ad in ads]  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        raise StatusError(f"condor_q printed what is not its JSON: {exc}") from None


def condor_q(jobs: Sequence[str]) -> list[tuple[str, str, str, str]]:
    """(job, state, HTCondor's hold reason, tag) of the user's jobs (or ``jobs``), from ``condor_q -json``."""
    for job in jobs:
        if not job.replace(".", "", 1).isdigit():
            raise StatusError(f"job id {job!r} is not an HTCondor job id; give cluster.proc (12.0) or a cluster (12)")
    args = ["condor_q", *jobs, *CONDOR_Q_ARGS]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=SQUEUE_TIMEOUT_S)
    except FileNotFoundError:
        raise StatusError("no condor_q on PATH: migsub status --backend htcondor reads the schedd's queue") from None
    except subprocess.TimeoutExpired:
        raise StatusError(f"condor_q did not answer in {SQUEUE_TIMEOUT_S} s; is the schedd up?") from None
    if proc.returncode != 0:
        raise StatusError(f"condor_q failed ({proc.returncode}): {proc.stderr.strip()}")
    return parse_condor_json(proc.stdout)


def queue_records(backend: str | None, jobs: Sequence[str]) -> list[tuple[str, str, str, str]]:
    """The jobs' records from the batch system named, else the one whose command is here (Slurm first)."""
    if backend is None:
        backend = "htcondor" if shutil.which("squeue") is None and shutil.which("condor_q") is not None else "slurm"
    return condor_q(jobs) if backend == "htcondor" else parse_records(squeue(jobs))


def main(argv: Sequence[str]) -> int:
    p = CommandParser(prog="migsub status", description="your MIG jobs: request, where each runs or why it waits")
    p.add_argument("jobs", nargs="*", metavar="JOBID", help="these jobs (default: all of yours)")
    p.add_argument("--backend", choices=("slurm", "htcondor"),
                   help="the batch system to ask (default: Slurm where squeue is on PATH, else HTCondor)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    args = p.parse_args(list(argv))
    try:
        records = queue_records(args.backend, args.jobs)
        nodes = site_nodes()
        rows = [r for r in (status_row(*rec, nodes=nodes) for rec in records) if r is not None]
    except (StatusError, MigBatchError) as exc:
        return fail(str(exc))

    def render(data: list[dict[str, Any]]) -> None:
        if not data:
            console.print("no MIG jobs" + (f" among {', '.join(args.jobs)}" if args.jobs else " of yours in the queue"))
            return
        table = Table()
        for col in ("job", "state", "request", "slices", "where it runs / why it waits"):
            table.add_column(col)
        for r in data:
            where = []
            if r["placement"]:
                for spot in r["placement"]["instances"]:
                    uuid = f" {spot['uuid']}" if spot["uuid"] else ""
                    where.append(f"{r['placement']['node']} GPU {spot['gpu']} {spot['profile']}{uuid}")
            if r["waits"]:
                where.append(r["waits"])
            for e in r["events"]:  # what happened before: a requeue, a refused pin
                when = time.strftime("%H:%M:%S", time.localtime(e["time"]))
                where.append(f"earlier, {when}: {e['kind']}" + (f" ({e['detail']})" if e["detail"] else ""))
            slices = "" if r["slices"] is None else str(r["slices"])
            table.add_row(r["job"], r["state"], r["request"], slices, "; ".join(where))
        console.print(table)

    emit(rows, args.json, render)
    return 0
