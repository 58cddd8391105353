"""``mig-batch slurm ...`` (install, gen-lua), ``mig-batch htcondor install``, ``mig-batch status`` and
``mig-batch offers``."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from mig_batch.cli.output import Table, console, emit
from mig_batch.config import ConfigError, SiteConfig, load_config
from mig_batch.mig.models import all_models, get_model
from mig_batch.slurm.install import HOOK_KINDS


def register(sub: argparse._SubParsersAction) -> None:
    slurm = sub.add_parser("slurm", help="Slurm integration: generate job_submit.lua, install the hooks")
    kinds = slurm.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND", required=True)
    g = kinds.add_parser("gen-lua", help="print job_submit.lua with the profile table of the site's GPU models")
    g.add_argument("--config", help="site config (default: MIG_BATCH_CONFIG or /etc/mig-batch/mig-batch.yaml)")
    g.add_argument("--all-models", action="store_true", help="every model of etc/gpus, not only the inventory's")
    g.set_defaults(handler=cmd_gen_lua)
    i = kinds.add_parser("install", help="write job_submit.lua and the Prolog/Epilog/TaskProlog into DEST")
    i.add_argument("dest", type=Path, help="directory (e.g. /etc/slurm)")
    i.add_argument("--config", required=True, help="the site config the hooks will use")
    i.add_argument("--python", default=sys.executable, help="the Python that has mig_batch (default: this one)")
    i.add_argument("--hook-client", choices=HOOK_KINDS, default="auto",
                   help="direct: the hook client compiled here (plugins/slurm/mig-batch-hook.c) is the Prolog, Epilog "
                        "and TaskProlog themselves (no shell per job); c: shell shims run it, and the Python client "
                        "where it cannot run (for a DEST shared by nodes that differ); python: shims run the "
                        "standard-library client (~10 ms a start); auto (default): direct when a C compiler is found "
                        "and DEST is on this host's own disk, c on a network file system, else python")
    _add_site_file_options(i, "slurm")
    i.set_defaults(handler=cmd_install)
    u = kinds.add_parser("uninstall", help="remove what `slurm install` wrote into DEST and put back the site's files")
    u.add_argument("dest", type=Path, help="the directory installed into (it holds .mig-batch-manifest.json)")
    u.add_argument("--dry-run", action="store_true", help="say what would be removed and put back; change nothing")
    u.add_argument("--force", action="store_true",
                   help="also remove files changed since the install (each kept as NAME.mig-batch-changed~)")
    u.set_defaults(handler=cmd_uninstall, installer="slurm")
    htc = sub.add_parser("htcondor",
                         help="HTCondor integration: write the schedd and execute-node policy, the job wrapper")
    htc_kinds = htc.add_subparsers(dest="htcondor_command", metavar="SUBCOMMAND", required=True)
    h = htc_kinds.add_parser("install", help="write the schedd policy, the execute-node config, the job wrapper and "
                             "the node agent's systemd unit into DEST")  # fmt: skip
    h.add_argument("dest", type=Path, help="directory (copy its files to the schedd's and the nodes' config.d)")
    h.add_argument("--config", required=True, help="the site config (its nodes: give the GPU models)")
    h.add_argument("--controller", default="mig-batch@$(UID_DOMAIN)",
                   help="mig-batchd's HTCondor identity, made a queue superuser (default: %(default)s)")
    h.add_argument("--agent-identity", default="",
                   help="the node agents' identity when not the controller's (also a queue superuser)")
    h.add_argument("--python", default="/usr/bin/python3",
                   help="the Python the job wrapper runs with on the nodes (standard library only; "
                   "default: %(default)s)")  # fmt: skip
    h.add_argument("--wrapper-dir", default="/usr/local/libexec/mig-batch",
                   help="where the nodes keep the job wrapper (default: %(default)s)")
    _add_site_file_options(h, "htcondor")
    h.set_defaults(handler=cmd_htcondor_install)
    hu = htc_kinds.add_parser("uninstall",
                              help="remove what `htcondor install` wrote into DEST and put back the site's files")
    hu.add_argument("dest", type=Path, help="the directory installed into (it holds .mig-batch-manifest.json)")
    hu.add_argument("--dry-run", action="store_true", help="say what would be removed and put back; change nothing")
    hu.add_argument("--force", action="store_true",
                    help="also remove files changed since the install (each kept as NAME.mig-batch-changed~)")
    hu.set_defaults(handler=cmd_uninstall, installer="htcondor")
    s = sub.add_parser("status", help="every GPU's MIG slices and the jobs on them")
    s.add_argument("--config", help="site config")
    s.add_argument("--json", action="store_true")
    s.set_defaults(handler=cmd_status)
    o = sub.add_parser("offers", help="subjob chains (SJA): recent gap offers, every chain's reply, the grants")
    o.add_argument("--config", help="site config")
    o.add_argument("--last", type=int, default=20, help="how many offers (newest first)")
    o.add_argument("--json", action="store_true")
    o.set_defaults(handler=cmd_offers)


def _add_site_file_options(parser: argparse.ArgumentParser, system: str) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print a unified diff of every file against what DEST holds; write nothing")
    parser.add_argument("--force", action="store_true",
                        help="replace files of the site's own that differ (each kept beside as NAME.mig-batch-old~; "
                             f"`mig-batch {system} uninstall DEST` puts them back)")  # fmt: skip


def _print_report(report, dry_run: bool) -> None:
    for diff in report.diffs:
        sys.stdout.write(diff)
    for line in report.lines:
        print(line)
    if dry_run:
        print("dry run: nothing was changed")


def cmd_uninstall(args: argparse.Namespace) -> int:
    if args.installer == "slurm":
        from mig_batch.slurm.install import uninstall
    else:
        from mig_batch.htcondor.install import uninstall
    if not args.dest.is_dir():
        raise ValueError(f"{args.dest} is not a directory; give the directory `mig-batch {args.installer} install` "
                         "wrote into")  # fmt: skip
    _print_report(uninstall(args.dest.absolute(), force=args.force, dry_run=args.dry_run), args.dry_run)
    return 0


def _models(config: SiteConfig | None, every: bool):
    if every or config is None or not config.nodes:
        return list(all_models().values())
    return [get_model(m) for m in sorted({m for models in config.nodes.values() for m in models})]


def cmd_gen_lua(args: argparse.Namespace) -> int:
    from mig_batch.slurm.install import job_submit_lua

    config = None if args.all_models else _maybe_config(args.config)
    sys.stdout.write(job_submit_lua(_models(config, args.all_models), config.nodes if config else None,
                                    bool(config and config.flex.leaf_requests),
                                    str(config.slots_file) if config and config.prompt_slots else "",
                                    config.slice_gres if config else ""))  # fmt: skip
    return 0


def _maybe_config(path: str | None) -> SiteConfig | None:
    try:
        return load_config(path)
    except ConfigError:
        if path:
            raise
        return None  # no site config yet: every model


def check_hook_python(python: str) -> None:
    """The shims run ``python`` as root with a minimal PATH: it must be an absolute path to an executable
    that can import mig_batch, or every Prolog would fail on the node."""
    path = Path(python)
    if not path.is_absolute():
        raise ValueError(f"--python {python!r} must be an absolute path (the hooks run with a minimal PATH)")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise ValueError(f"--python {python} is not an executable file; give the Python that has mig_batch "
                         f"installed (default: {sys.executable})")  # fmt: skip
    try:
        proc = subprocess.run([python, "-c", "import mig_batch"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"--python {python} could not be run: {exc}") from None
    if proc.returncode != 0:
        raise ValueError(f"--python {python} cannot import mig_batch; install mig_batch into it or give the Python "
                         f"that has it (default: {sys.executable})")  # fmt: skip


def cmd_install(args: argparse.Namespace) -> int:
    from mig_batch.batch.site_files import Report
    from mig_batch.slurm.install import install

    check_hook_python(args.python)
    config = load_config(args.config)
    dest = Path(args.dest).absolute()  # the paths written into the hooks and printed are absolute
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} is not a directory; give the directory slurm.conf is in (e.g. /etc/slurm)")
    created = not dest.exists()
    report = Report()
    _, which = install(dest, args.python, str(Path(args.config).resolve()), str(config.job_dir),
                       str(config.agent_socket), _models(config, False), config.nodes, config.slice_gres,
                       config.flex.leaf_requests, args.hook_client, config.slurm_bin,
                       str(config.slots_file) if config.prompt_slots else "", force=args.force,
                       dry_run=args.dry_run, report=report)  # fmt: skip
    _print_report(report, args.dry_run)
    console.print(which, highlight=False)
    if created and not args.dry_run:  # a typo (/etc/slrum) would otherwise install where slurm.conf never looks
        console.print(f"note: {dest} did not exist and was created: slurm.conf's Prolog, Epilog, TaskProlog "
                      "and job_submit.lua must be there for Slurm to run them", highlight=False)  # fmt: skip
    return 0


IDENTITY_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@$()")


def cmd_htcondor_install(args: argparse.Namespace) -> int:
    from mig_batch.htcondor.install import install

    for flag, value in (("--controller", args.controller), ("--agent-identity", args.agent_identity)):
        if value and not set(value) <= IDENTITY_CHARS:
            raise ValueError(f"{flag} {value!r} is not an HTCondor identity (user@DOMAIN: letters, digits, . _ - @)")
    for flag, value in (("--python", args.python), ("--wrapper-dir", args.wrapper_dir)):
        if not value.startswith("/"):
            raise ValueError(f"{flag} {value!r} must be an absolute path (the starter runs the wrapper without PATH)")
    if args.dest.exists() and not args.dest.is_dir():
        raise ValueError(f"{args.dest} is not a directory; give a directory for the files")
    config = load_config(args.config)
    if not config.nodes:
        raise ConfigError(f"{config.path}: no nodes: (node: [GPU models]); the schedd's check needs the site's models")
    from mig_batch.batch.site_files import Report

    agents = [args.agent_identity] if args.agent_identity else []
    report = Report()
    install(args.dest.absolute(), _models(config, False), args.controller, agents, args.python,
            str(config.agent_socket), config.htcondor_agent_file, args.wrapper_dir, force=args.force,
            dry_run=args.dry_run, report=report, nodes=config.nodes)  # fmt: skip
    _print_report(report, args.dry_run)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import time

    from mig_batch.batch.tags import rank_key
    from mig_batch.controller.health import FRESH, health_path, node_state, read_health
    from mig_batch.state import ACTIVE, MIG_OFF, Store

    config = load_config(args.config)
    with Store.reading(config.state) as store:
        decisions: dict[tuple[str, int], list] = {}
        for d in store.decisions(ACTIVE):
            spots = store.spots(d.job)  # a job over several instances: every rank, rank r as job#r
            for rank, (gpu, profile, start) in enumerate(spots):
                key = rank_key(d.job, rank)
                decisions.setdefault((d.node, gpu), []).append(dataclasses.replace(d, job=key, gpu=gpu,
                                                                                   profile=profile, start=start))
            if not spots:
                decisions.setdefault((d.node, d.gpu), []).append(d)
        instances = {r.job: r for r in store.instances()}
        mig_off = {node: set(e.get("gpus", [])) for node, e in store.newest_node_events(MIG_OFF).items()}
    models = {name: get_model(name) for name in {m for ms in config.nodes.values() for m in ms}}
    health, now = read_health(health_path(config.state)), time.time()
    gpus = []
    for node in sorted(config.nodes):
        seen, read_at = node_state(health, node, now)  # only a node mig-batchd read lately shows free slices
        agent_at = ((health or {}).get("nodes", {}).get(node) or {}).get("reconciled")
        for index, model_name in enumerate(config.nodes[node]):
            model = models[model_name]
            jobs = []
            for d in sorted(decisions.get((node, index), []), key=lambda d: d.start):
                inst = instances.get(d.job)
                jobs.append({"job": d.job, "profile": d.profile, "start": d.start,
                             "size": model.profile(d.profile).memory_slices, "state": d.state,
                             "uuid": inst.uuid if inst else None})  # fmt: skip
            used = sum(j["size"] for j in jobs)
            gpus.append({"node": node, "gpu": index, "model": model.name, "slices": model.memory_slices,
                         "mig_mode": "off" if index in mig_off.get(node, ()) else "on", "jobs": jobs,
                         "node_state": seen, "node_read_at": read_at, "agent_reconciled_at": agent_at,
                         "free_slices": max(model.memory_slices - used, 0) if seen == FRESH else None,
                         "last_good_pass": (health or {}).get("last_good_pass"),
                         "failing_since": (health or {}).get("failing_since"),
                         "error": (health or {}).get("error") or None})  # fmt: skip
    emit(gpus, args.json, _render_status)
    return 0


def cmd_offers(args: argparse.Namespace) -> int:
    from mig_batch.state import Store

    if args.last <= 0:
        raise ValueError(f"--last must be a positive number of offers (got {args.last})")
    config = load_config(args.config)
    with Store.reading(config.state) as store:
        data = {"chains": [vars(c) for c in store.chains()], "offers": store.offers(args.last)}
    emit(data, args.json, _render_offers)
    return 0


def _render_offers(data: dict) -> None:
    chains = Table(title="subjob chains")
    for column in ("job", "state", "subjobs", "failures", "service (slice-s)", "last size (MiB)", "checkpoints"):
        chains.add_column(column)
    for c in data["chains"]:
        chains.add_row(c["job"], c["state"], str(c["subjobs"]), str(c["failures"]), f"{c['attained']:.0f}",
                       f"{c['last_mib']:.0f}" if c["last_mib"] else "-", c["checkpoint_dir"])  # fmt: skip
    console.print(chains)
    offers = Table(title="offers (newest first)")
    for column in ("id", "gap", "opens", "window (s)", "replies", "granted"):
        offers.add_column(column)
    for o in data["offers"]:
        later = o["opens"] - o["time"]
        replies = "; ".join(_reply_text(r) for r in o["replies"]) or ("published (opens later)" if later > 0 else "-")
        offers.add_row(str(o["id"]), f"{o['node']}/{o['gpu']} {o['profile']}@{o['start']}",
                       f"in {later:.0f} s" if later > 0 else "now", f"{o['closes'] - o['opens']:.0f}", replies,
                       o["granted"] or "-")  # fmt: skip
    console.print(offers)


def _reply_text(r: dict) -> str:
    if r["interested"]:
        return f"{r['job']}: {r['profile']} for {r['duration']:.0f} s ({r['basis']} {r['bound_mib']:.0f} MiB)"
    return f"{r['job']}: declines ({r['reason']})"


def _render_status(gpus: list[dict]) -> None:
    import time

    from mig_batch.controller.health import FRESH, age_text

    now = time.time()
    first = gpus[0] if gpus else {}
    if first.get("last_good_pass") is None:
        console.print("mig-batchd: no good pass recorded (it has not run here, or not since this release); "
                      "free slices are unknown", highlight=False, markup=False)  # fmt: skip
    else:
        console.print(f"mig-batchd: last good pass {age_text(now - first['last_good_pass'])} ago", highlight=False)
    if first.get("failing_since") is not None:
        console.print(f"mig-batchd: passes failing for {age_text(now - first['failing_since'])}: {first['error']}",
                      highlight=False, markup=False, soft_wrap=True)  # fmt: skip
    table = Table(title="MIG slices per GPU (memory slices; letters are jobs; ? unknown: node not read lately)")
    for col in ("node", "GPU", "model", "slices", "read", "jobs"):
        table.add_column(col)
    for g in gpus:
        state, read_at = g.get("node_state", FRESH), g.get("node_read_at")
        read = state if read_at is None else f"{state} ({age_text(now - read_at)} ago)"
        if g.get("agent_reconciled_at"):
            read += f", agent {age_text(now - g['agent_reconciled_at'])}"
        cells = ["·" if state == FRESH else "?"] * g["slices"]
        legend = []
        for n, job in enumerate(g["jobs"]):
            mark = chr(ord("a") + n % 26)
            for s in range(job["start"], job["start"] + job["size"]):
                cells[s] = mark
            legend.append(f"{mark}={job['job']} {job['profile']}@{job['start']} ({job['state']})")
        if g["mig_mode"] == "off":
            cells = ["x"] * g["slices"]
            legend.insert(0, f"MIG mode off: no MIG job is placed here (enable: nvidia-smi -i {g['gpu']} -mig 1)")
        table.add_row(g["node"], str(g["gpu"]), g["model"], "".join(cells), read, ", ".join(legend))
    console.print(table)
