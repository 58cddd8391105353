"""``mig-batch events`` (the controller's event log, readable) and ``mig-batch doctor`` (is this node or
controller set up right, and what to fix). Both stay light: no placement, planner or plotting imports."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from mig_batch.cli.output import Literal, Table, console, emit
from mig_batch.config import SiteConfig, config_path, load_config
from mig_batch.slurm.versions import release_note, version_in
from mig_batch.yaml_text import shown

ROLES = ("controller", "node")
SHIM_MARK = "(filled in by `mig-batch slurm install`)"  # in every hook shim we install
LUA_MARK = 'local PREFIX = "mig-batch:"'  # in our job_submit.lua
HOOKS = {"Prolog": "mig-batch-prolog", "Epilog": "mig-batch-epilog", "TaskProlog": "mig-batch-taskprolog"}
SLURM_TIMEOUT_S = 20.0


def register(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("events", help="the controller's event log: placements, requeues, node problems...",
                       description="The controller's event log (run where the store is): decisions, releases, "
                       "requeues with their reason, node problems (a prolog that could not place a job, an "
                       "epilog that could not destroy, strays a reconcile destroyed), nodes down and back, "
                       "refused requests. Oldest first.")  # fmt: skip
    e.add_argument("--config", help="site config (default: MIG_BATCH_CONFIG or /etc/mig-batch/mig-batch.yaml)")
    e.add_argument("--job", help="only this job's events")
    e.add_argument("--node", help="only events naming this node, or of jobs decided there")
    e.add_argument("--since", type=since_epoch, metavar="AGE|TIME",
                   help="only events since AGE ago (90s, 10m, 1h, 2d) or since TIME (2024-05-01T12:00)")  # fmt: skip
    e.add_argument("--kind", help="only events of this kind (decided, requeued, node-problem, node-down, ...)")
    e.add_argument("--last", type=int, default=200, help="at most this many, the newest (default 200)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(handler=cmd_events)
    d = sub.add_parser("doctor", help="check a controller or node set-up and say what to fix",
                       description="Check a controller or GPU node set-up; for each failed check, what to fix. "
                       "Exit status: 0 when every check passes, 1 when one fails, 2 for bad input.")  # fmt: skip
    d.add_argument("--config", help="site config (default: MIG_BATCH_CONFIG or /etc/mig-batch/mig-batch.yaml)")
    d.add_argument("--role", choices=ROLES,
                   help="what this host is (default: node when its short host name is in the inventory)")  # fmt: skip
    d.add_argument("--node", default=socket.gethostname().split(".")[0],
                   help="this node's Slurm NodeName, for --role node (default: the short host name)")  # fmt: skip
    d.add_argument("--json", action="store_true")
    d.set_defaults(handler=cmd_doctor)


# --- events ---------------------------------------------------------------------------------------

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_epoch(text: str, now: Callable[[], float] = time.time) -> float:
    """argparse type for ``--since``: an age (90s, 10m, 1h, 2d) or a local date-time, as epoch seconds."""
    age = _AGE.fullmatch(text.strip().lower())
    if age:
        return now() - float(age[1]) * _UNIT_S[age[2]]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"cannot read {shown(text)}; accepted: an age (90s, 10m, 1h, 2d) or a "
                                         "date-time (2024-05-01, 2024-05-01T12:00)") from None  # fmt: skip


def cmd_events(args: argparse.Namespace) -> int:
    from mig_batch.state import Store

    if args.last <= 0:
        raise ValueError(f"--last must be a positive number of events (got {args.last})")
    config = load_config(args.config)
    with Store.reading(config.state) as store:
        events = store.events(job=args.job, kind=args.kind, node=args.node, since=args.since, last=args.last)
        kinds = store.event_kinds() if args.kind and not events else None
    emit(events, args.json, _render_events)
    if kinds is not None and args.kind not in kinds and not args.json:  # a typo, most likely
        console.print(f"no event of kind {args.kind!r} was ever recorded here; the store holds "
                      f"{', '.join(kinds) or 'none'}", highlight=False)  # fmt: skip
    return 0


def event_detail(event: dict) -> str:
    """An event's details as ``key=value``, the reason first (what an operator looks for)."""
    rest = {k: v for k, v in event.items() if k not in ("time", "job", "kind", "node", "key")}
    first = {k: rest.pop(k) for k in ("reason", "error") if k in rest}
    return " ".join(f"{k}={v}" for k, v in {**first, **rest}.items() if v is not None)


def _render_events(events: list[dict]) -> None:
    if not events:
        console.print("no events (the filters may be too narrow; the store is read, not Slurm)", highlight=False)
        return
    table = Table(title=f"events, oldest first ({len(events)})")
    for column in ("time", "job", "kind", "node", "detail"):
        table.add_column(column)
    for e in events:
        when = datetime.fromtimestamp(e["time"]).strftime("%Y-%m-%d %H:%M:%S")
        cells = (when, e["job"] or "-", e["kind"], str(e.get("node") or "-"), event_detail(e))
        table.add_row(*(Literal(c) for c in cells))  # a reason's brackets are not markup
    console.print(table)


# --- doctor ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # what to do, when not ok


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = doctor(args.config, args.role, args.node)
    emit([asdict(c) for c in checks], args.json, _render_checks)
    return 0 if all(c.ok for c in checks) else 1


def _render_checks(checks: list[dict]) -> None:
    for c in checks:
        console.print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}", highlight=False, markup=False,
                      soft_wrap=True)  # fmt: skip
        if not c["ok"] and c["fix"]:
            console.print(f"     fix: {c['fix']}", highlight=False, markup=False, soft_wrap=True)
    failed = sum(not c["ok"] for c in checks)
    console.print(f"{len(checks) - failed} passed, {failed} failed", highlight=False)


def doctor(config_file: str | None, role: str | None, node: str) -> list[Check]:
    """Every check of ``role`` (guessed from the inventory when None), in order, for the batch system the
    config names. A config that is missing or cannot be read is bad input (ConfigError: exit status 2, with
    the reason), not a failed check: nothing else can be checked without it."""
    path = config_path(config_file)
    config = load_config(config_file)
    role = role or ("node" if node in config.nodes else "controller")
    checks = [Check("config", True, f"{path} read; role {role}; {len(config.nodes)} node(s) in the inventory")]
    if not config.nodes:
        checks.append(Check("inventory", False, "no nodes in the inventory",
                            "list each GPU node and its GPU models under nodes: in the site config"))  # fmt: skip
    if config.batch_system == "htcondor":
        return checks + htcondor_doctor(config, role, node, path)
    show_config, slurm = slurm_config(config)
    checks.append(slurm)
    if show_config is not None:
        checks.append(check_slurm_library(config))
    if role == "controller":
        checks += [check_store(config.state), check_passes(config), *check_metrics(config)]
        if show_config is not None:
            checks += [check_job_submit(show_config), check_prompt_slots(show_config, config),
                       check_scheduler(show_config)]  # fmt: skip
        return checks
    if node not in config.nodes:
        fix = f"add {node} under nodes: in {path}, or give --node with this node's Slurm NodeName"
        checks.append(Check("inventory", False, f"node {node} is not in the inventory", fix))
    if show_config is not None:
        checks += check_hooks(show_config, config)
    checks.append(check_node_dirs(config, node))
    checks.append(check_fence(config, node))
    checks.append(check_agent(config.agent_socket))
    checks += check_gpus(config, node)
    return checks


def htcondor_doctor(config: SiteConfig, role: str, node: str, path: Path) -> list[Check]:
    """The checks of an HTCondor site (``batch_system: htcondor``): the bindings and the pool (with their
    versions) in place of Slurm's commands; the schedd's policy (transform and submit requirements) as the
    schedd itself has it, and this host's identity a queue superuser; then the store (controller), or the
    node's startd (the job wrapper and the cron that publishes the agent), directories, fence, agent socket
    and GPUs."""
    checks = [check_htcondor(config)]
    facts = condor_facts(config, node if role == "node" else None) if checks[0].ok else None
    if facts is not None:
        checks += [check_schedd_policy(facts), check_identity(facts, role)]
    if role == "controller":
        return [*checks, check_store(config.state), check_passes(config), *check_metrics(config)]
    if node not in config.nodes:
        fix = f"add {node} under nodes: in {path}, or give --node with this node's MigBatchNodeName"
        checks.append(Check("inventory", False, f"node {node} is not in the inventory", fix))
    socket_path = Path(str(config.agent_socket).format(node=node))  # HTCondor's: one per node
    if facts is not None:
        checks += [check_startd(facts, node, config), check_wrapper(facts, node, socket_path)]
    checks.append(check_node_dirs(config, node))
    checks.append(check_fence(config, node))
    checks += [check_agent(socket_path), check_wrapper_socket(socket_path)]
    return checks + check_gpus(config, node)


# what the HTCondor checks read of a daemon's configuration
SCHEDD_KEYS = ("JOB_TRANSFORM_NAMES", "SUBMIT_REQUIREMENT_NAMES", "QUEUE_SUPER_USERS", "PROTECTED_JOB_ATTRS")
STARTD_KEYS = ("USER_JOB_WRAPPER", "STARTD_CRON_JOBLIST")
HTCONDOR_INSTALL_FIX = ("run `mig-batch htcondor install DIR --config ...`, copy {file} into the {who}'s config.d "
                        "(docs/htcondor.md), then condor_reconfig")  # fmt: skip


@dataclass
class CondorFacts:
    """What the pool says of itself to the doctor: the schedd's configuration (its own, asked remotely), who
    this host is to the schedd, and a node's startd (its ad and configuration); why what is missing is."""

    schedd: dict[str, str] | None = None
    identity: str | None = None  # as the schedd authenticated us for WRITE (MyRemoteUserName)
    authorized: bool = False  # ... and whether WRITE was granted
    can_ask: bool = True  # the bindings can ask who we are (htcondor2.ping: 25.0 on)
    startd: dict[str, str] | None = None  # the node's startd's configuration (role node)
    startd_ad: dict[str, str] | None = None
    errors: dict[str, str] = field(default_factory=dict)  # what -> why it could not be read


def condor_facts(config: SiteConfig, node: str | None) -> CondorFacts:
    """Ask the pool through the bindings (loaded with the site's htcondor_config by ``check_htcondor``)."""
    from mig_batch.htcondor.attrs import AGENT_ATTR, NODE_NAME_ATTR

    facts = CondorFacts()
    try:
        import htcondor2

        collector = htcondor2.Collector()
        schedd = collector.locate(htcondor2.DaemonType.Schedd)
    except Exception as exc:  # any failure of the bindings is the finding
        facts.errors["schedd"] = f"{type(exc).__name__}: {exc}"
        return facts
    try:
        remote = htcondor2.RemoteParam(schedd)
        facts.schedd = {k: str(remote.get(k, "")) for k in SCHEDD_KEYS}
    except Exception as exc:
        facts.errors["schedd"] = f"the schedd's configuration could not be read: {type(exc).__name__}: {exc}"
    if not hasattr(htcondor2, "ping"):
        facts.can_ask = False
    try:
        answer = htcondor2.ping(schedd, "WRITE") if facts.can_ask else {}
        facts.identity = str(answer.get("MyRemoteUserName", "")) or None
        facts.authorized = bool(answer.get("AuthorizationSucceeded", False))
    except Exception as exc:
        facts.errors["identity"] = f"{type(exc).__name__}: {exc}"
    if node is None:
        return facts
    try:
        ads = collector.query(htcondor2.AdType.Startd, constraint=f'{NODE_NAME_ATTR} == "{node}"',
                              projection=["Name", "MyAddress", "Machine", NODE_NAME_ATTR, AGENT_ATTR,
                                          "CondorVersion", "AddressV1"])  # fmt: skip
        if not ads:
            facts.errors["startd"] = f"no startd in the collector with {NODE_NAME_ATTR} = \"{node}\""
            return facts
        ad = ads[0]
        facts.startd_ad = {k: str(ad.get(k, "")) for k in ("Name", NODE_NAME_ATTR, AGENT_ATTR, "CondorVersion")}
        remote = htcondor2.RemoteParam(ad)
        facts.startd = {k: str(remote.get(k, "")) for k in STARTD_KEYS}
    except Exception as exc:
        facts.errors["startd"] = f"{type(exc).__name__}: {exc}"
    return facts


def check_schedd_policy(facts: CondorFacts) -> Check:
    """The schedd runs mig_batch's job transforms and submit requirements, and protects the placement
    attributes (``mig-batch-schedd.conf``), as the schedd itself reports its configuration."""
    from mig_batch.htcondor.attrs import PIN_ATTR, TAG_ATTR

    fix = HTCONDOR_INSTALL_FIX.format(file="mig-batch-schedd.conf", who="schedd")
    if facts.schedd is None:
        return Check("schedd policy", False, facts.errors.get("schedd", "the schedd's configuration was not read"),
                     "check that the schedd is up and that this host may read its configuration (READ)")  # fmt: skip
    wanted = {"JOB_TRANSFORM_NAMES": ("MigBatchClear", "MigBatchTag"),
              "SUBMIT_REQUIREMENT_NAMES": ("MigBatchRequest",), "PROTECTED_JOB_ATTRS": (TAG_ATTR, PIN_ATTR)}
    missing = [f"{key} lacks {', '.join(m)}" for key, names in wanted.items()
               if (m := [n for n in names if n not in _words(facts.schedd.get(key, ""))])]  # fmt: skip
    if missing:
        return Check("schedd policy", False, "; ".join(missing), fix)
    return Check("schedd policy", True, "the schedd runs mig_batch's transforms (MigBatchClear, MigBatchTag) and "
                 "submit requirements, and protects the placement attributes")  # fmt: skip


def _words(value: str) -> list[str]:
    return [w for w in re.split(r"[\s,]+", value) if w]


def is_superuser(identity: str, queue_super_users: str) -> bool:
    """Whether ``identity`` (user@domain) is one of QUEUE_SUPER_USERS (entries user@domain, or user alone)."""
    user = identity.split("@")[0]
    return any(entry in (identity, user) for entry in _words(queue_super_users))


def check_identity(facts: CondorFacts, role: str) -> Check:
    """This host's HTCondor identity (mig-batchd's, or the node agent's) authenticates to the schedd for WRITE
    and is a queue superuser: it writes the placement attributes, which only superusers may."""
    who = "mig-batchd" if role == "controller" else "the node agent"
    fix = (f"give {who} the HTCondor identity `mig-batch htcondor install --controller/--agent-identity` made a "
           "queue superuser (a token in the site's htcondor_config), or add its identity to QUEUE_SUPER_USERS; on "
           "25.x also `condor_qusers -add` it")  # fmt: skip
    if not facts.can_ask:  # advice, not a failure: it may well be right
        return Check("identity", True, "not checked: these bindings cannot ask the schedd who we are (htcondor2.ping "
                     "comes with 25.0); `condor_ping -verbose -type schedd WRITE` says it")  # fmt: skip
    if facts.identity is None:
        return Check("identity", False, facts.errors.get("identity", "the schedd named no identity for us"), fix)
    if not facts.authorized:
        return Check("identity", False, f"the schedd knows us as {facts.identity} but refuses WRITE", fix)
    if facts.schedd is not None and not is_superuser(facts.identity, facts.schedd.get("QUEUE_SUPER_USERS", "")):
        return Check("identity", False, f"{facts.identity} is not in the schedd's QUEUE_SUPER_USERS "
                     f"({facts.schedd.get('QUEUE_SUPER_USERS', '')[:200]})", fix)  # fmt: skip
    return Check("identity", True, f"{who} is {facts.identity} to the schedd, a queue superuser")


def check_startd(facts: CondorFacts, node: str, config: SiteConfig) -> Check:
    """The node's startd is in the collector under its MigBatchNodeName, runs the cron job that publishes the
    agent's state, and publishes it (the controller reads the node's freshness there)."""
    from mig_batch.htcondor.attrs import AGENT_ATTR, CRON_JOB

    fix = HTCONDOR_INSTALL_FIX.format(file="mig-batch-execute.conf and the node's own lines", who="node")
    if facts.startd is None or facts.startd_ad is None:
        return Check("startd", False, facts.errors.get("startd", "the node's startd was not found"), fix)
    version = versions_note_of(facts.startd_ad.get("CondorVersion", ""))
    if CRON_JOB not in _words(facts.startd.get("STARTD_CRON_JOBLIST", "")):
        return Check("startd", False, f"{facts.startd_ad['Name']} ({version}) does not run the cron job {CRON_JOB} "
                     "that publishes the agent's state", fix)  # fmt: skip
    if not facts.startd_ad.get(AGENT_ATTR):
        return Check("startd", False, f"{facts.startd_ad['Name']} publishes no {AGENT_ATTR} yet: the agent has "
                     f"not written {config.htcondor_agent_file.format(node=node)}, or the cron has not read it",
                     "start the node agent (systemctl enable --now mig-batch-htcondor-agent)")  # fmt: skip
    return Check("startd", True, f"{facts.startd_ad['Name']} ({version}) publishes the agent's state")


def versions_note_of(version_text: str) -> str:
    from mig_batch.htcondor import versions

    found = versions.version_in(version_text)
    return versions.daemons_note(found, "startd") if found else "version not reported"


def check_wrapper(facts: CondorFacts, node: str, socket_path: Path) -> Check:
    """The startd's USER_JOB_WRAPPER is mig_batch's job wrapper, present here and executable, its Python
    there, asking the agent's socket the site config names for this node."""
    fix = HTCONDOR_INSTALL_FIX.format(file="mig-batch-execute.conf and the wrapper", who="node")
    if facts.startd is None:
        return Check("job wrapper", False, facts.errors.get("startd", "the node's startd was not read"), fix)
    wrapper = facts.startd.get("USER_JOB_WRAPPER", "")
    if not wrapper:
        return Check("job wrapper", False, "the startd has no USER_JOB_WRAPPER: jobs start without a MIG "
                     "instance", fix)  # fmt: skip
    path = Path(wrapper)
    if not path.is_file() or not os.access(path, os.X_OK):
        return Check("job wrapper", False, f"USER_JOB_WRAPPER {wrapper} is not an executable file here", fix)
    text = _head(path, 1 << 16)
    asks = _WRAPPER_SOCKET.search(text)
    if asks is None:
        return Check("job wrapper", False, f"USER_JOB_WRAPPER {wrapper} is not mig_batch's job wrapper", fix)
    first = text.splitlines()[0] if text else ""
    python = first[2:].split()[0] if first.startswith("#!") and first[2:].split() else ""
    if not python or not Path(python).exists():
        return Check("job wrapper", False, f"{wrapper} runs {python or 'no interpreter'}, which does not exist "
                     "here", fix)  # fmt: skip
    asked = asks.group(2).replace("{node}", node)
    if asked != str(socket_path):
        return Check("job wrapper", False, f"{wrapper} asks {asked}; the site config's agent socket for {node} is "
                     f"{socket_path}", fix)  # fmt: skip
    return Check("job wrapper", True, f"{wrapper} (run by {python}) asks {asked}")


_WRAPPER_SOCKET = re.compile(r"""^SOCKET = (['"])(.*?)\1""", re.M)  # the line install.wrapper_text fills in


def check_wrapper_socket(path: Path) -> Check:
    """The agent's socket for the job wrappers: a socket of root's that job users may open (mode 0666); the
    agent checks each caller's job itself."""
    fix = "start the node agent (systemctl enable --now mig-batch-htcondor-agent): it makes the socket"
    try:
        info = path.stat()
    except OSError as exc:
        return Check("wrapper socket", False, f"{path}: {exc.strerror or exc}", fix)
    import stat as stat_module

    if not stat_module.S_ISSOCK(info.st_mode):
        return Check("wrapper socket", False, f"{path} is not a socket", fix)
    mode = info.st_mode & 0o777
    if info.st_uid != 0 and os.geteuid() == 0:
        return Check("wrapper socket", False, f"{path} is owned by uid {info.st_uid}, not root", fix)
    if mode & 0o006 != 0o006:
        return Check("wrapper socket", False, f"{path} is mode {mode:o}: job users cannot open it (the agent "
                     "makes it 0666 and checks each caller)", fix)  # fmt: skip
    return Check("wrapper socket", True, f"{path}: mode {mode:o}, open to job users (the agent checks each caller)")


def check_htcondor(config: SiteConfig) -> Check:
    """The HTCondor bindings are a release mig_batch takes, and the pool's collector and schedd answer; names
    each version found and whether mig_batch is tested with it."""
    from mig_batch.htcondor import versions

    bindings, daemons, error = versions.pool_versions(config.htcondor_config)
    install = f"pip install '{versions.BINDINGS_RANGE}' into mig_batch's Python (the extra mig-batch[htcondor])"
    if bindings is None:
        return Check("htcondor", False, error, install)
    note = versions.bindings_note(bindings)
    if not versions.supported_bindings(bindings):
        return Check("htcondor", False, note, install)
    where = config.htcondor_config or os.environ.get("CONDOR_CONFIG", "") or "HTCondor's default config"
    if error:
        return Check("htcondor", False, f"{note}; {error} (config {where})",
                     "check that the pool's collector is up and reachable from here (condor_status), and "
                     "htcondor_config in the site config")  # fmt: skip
    found = [versions.daemons_note(daemons[who], who) if who in daemons else f"no {who} in the collector"
             for who in ("collector", "schedd")]  # fmt: skip
    if "schedd" not in daemons:
        return Check("htcondor", False, "; ".join([note, *found]),
                     "start the pool's condor_schedd (mig-batchd and migsub need it)")  # fmt: skip
    return Check("htcondor", True, "; ".join([note, *found]))


def slurm_bin(config: SiteConfig, command: str) -> str | None:
    """The path of a Slurm command: from slurm_bin when set, else from PATH."""
    return shutil.which(command, path=config.slurm_bin or None)


def slurm_config(config: SiteConfig) -> tuple[str | None, Check]:
    """``scontrol show config``'s text (None when Slurm does not answer) and the check saying so."""
    where = f"slurm_bin {config.slurm_bin}" if config.slurm_bin else "PATH"
    missing = [c for c in ("squeue", "scontrol") if slurm_bin(config, c) is None]
    if missing:
        return None, Check("slurm", False, f"{', '.join(missing)} not found on {where}",
                           "install Slurm's client commands, or set slurm_bin: in the site config to the "
                           "directory that holds them")  # fmt: skip
    scontrol = slurm_bin(config, "scontrol")
    try:
        proc = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, Check("slurm", False, f"{scontrol} show config failed: {exc}",
                           "check that slurmctld is up and reachable from here")  # fmt: skip
    if proc.returncode != 0:
        why = "; ".join((proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines())[-300:]
        return None, Check("slurm", False, f"{scontrol} show config: {why}",
                           "check that slurmctld is up and reachable from here (scontrol ping)")  # fmt: skip
    return proc.stdout, Check("slurm", True, f"slurmctld answers ({scontrol}); {release_note(version_in(proc.stdout))}")


def check_slurm_library(config: SiteConfig) -> Check:
    """The config's ``slurm_library``: loads here, reads Slurm's configuration, and reaches slurmctld."""
    from mig_batch.slurm.native import SlurmApi, SlurmApiError, probe

    name, path = "slurm_library", config.slurm_library
    if not path:
        return Check(name, True, "not set: each job's Slurm calls start a process (set it to the library "
                     "`mig-batch slurm install` builds)")  # fmt: skip
    fix = ("run `mig-batch slurm install` again on a host like this one (with Slurm's headers: libslurm-dev or "
           "slurm-devel) and point slurm_library at the library it writes, or remove slurm_library from "
           f"{config.path}; meanwhile mig_batch uses Slurm's commands")  # fmt: skip
    conf = os.environ.get("SLURM_CONF", "")
    try:
        probe(path, conf)
        api = SlurmApi.load(path, conf)
        api.job_lines(1)  # any id: an answer about it shows slurmctld is reached through libslurm
    except OSError as exc:
        return Check(name, False, f"{path} cannot be used: {exc}", fix)
    except SlurmApiError as exc:
        if not exc.answered:
            return Check(name, False, f"{path} loads but does not reach slurmctld: {exc}", fix)
    return Check(name, True, f"{path} (built for Slurm {api.built_for}) reaches slurmctld")


def config_values(show_config: str) -> dict[str, str]:
    """``Key = value`` lines of ``scontrol show config``."""
    out = {}
    for line in show_config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def check_hooks(show_config: str, config: SiteConfig | None = None) -> list[Check]:
    """slurm.conf's Prolog, Epilog and TaskProlog: set, existing, executable, and ours: the compiled hook
    client itself (which must run here, be that hook by its name and have ``config``'s paths) or our shims
    (which also name a Python and a hook client that must exist)."""
    values = config_values(show_config)
    checks = []
    for key, shim in HOOKS.items():
        value = values.get(key, "(null)")
        fix = f"run `mig-batch slurm install /etc/slurm --config ...` on this node and set {key}=/etc/slurm/{shim} " \
              "in slurm.conf (then scontrol reconfigure)"  # fmt: skip
        if value in ("", "(null)"):
            checks.append(Check(key, False, f"slurm.conf sets no {key}", fix))
            continue
        paths = [Path(p.strip()) for p in value.split(",") if p.strip()]
        problems, ours = [], None
        for path in paths:
            if not path.is_file():
                problems.append(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
            elif not os.access(path, os.X_OK):
                problems.append(f"{path} is not executable (chmod 755 it)")
            elif _is_elf_binary(path):  # installed direct: the compiled client is the hook
                ours = path
                problems += check_direct_hook(path, key.lower(), config)
            elif SHIM_MARK in _head(path):
                ours = path
                problems += [f"{path} runs {p}, which does not exist" for p in shim_targets(path) if not p.exists()]
                problems += [why for why in [check_hook_binary(path)] if why]
        if ours is None and not problems:
            problems.append(f"{value} is not mig_batch's {shim}")
        if problems:
            checks.append(Check(key, False, "; ".join(problems), fix))
        else:
            checks.append(Check(key, True, f"{ours} is mig_batch's {shim}"))
    return checks


def _head(path: Path, size: int = 4096) -> str:
    try:
        with path.open(errors="replace") as f:
            return f.read(size)
    except OSError:
        return ""


def _is_elf_binary(path: Path) -> bool:
    """An ELF binary (not a script)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def shim_targets(shim: Path) -> list[Path]:
    """The hook clients (the C one, a Python and hook_client.py) and the slow path's Python a Prolog/Epilog
    shim runs (a moved venv breaks every job start)."""
    found = []
    for match in re.finditer(r'^\s*(.+?) (?:prolog|epilog) "\$SLURM_JOB_ID" \S+ (/\S+) (?:-I )?-m ', _head(shim),
                             re.MULTILINE):  # fmt: skip
        found += [*match[1].split(), match[2]]
    return [Path(p) for p in dict.fromkeys(found) if p.startswith("/")]


def check_hook_binary(shim: Path) -> str:
    """Why the compiled hook client a shim runs cannot run on this node ("" when it can or there is none):
    its usage line exits 0 wherever it runs."""
    from mig_batch.slurm.install import HOOK_BINARY

    binary = next((p for p in shim_targets(shim) if p.name == HOOK_BINARY), None)
    if binary is None or not binary.exists():
        return ""
    try:
        proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} cannot run here ({exc}); the shim falls back to the Python client (slower)"
    if proc.returncode != 0:
        return f"{binary} cannot run here (exit {proc.returncode}: {proc.stderr.strip()[-200:]}); the shim falls " \
               "back to the Python client (slower): run `mig-batch slurm install` on a host like this node"  # fmt: skip
    return ""


def check_direct_hook(hook: Path, which: str, config: SiteConfig | None = None) -> list[str]:
    """What is wrong with the compiled client installed as hook ``which`` (prolog, epilog, taskprolog): it
    must run here (else every job start fails, and Slurm drains the node), be that hook by its name, and
    have the site's paths compiled in, the slow path's Python existing."""
    from mig_batch.slurm.install import hook_named

    fix = "run `mig-batch slurm install` on this node (--hook-client c where the directory is shared)"
    if hook_named(hook.name) != which:
        return [f"{hook} is the compiled hook client, which runs as the hook its name holds "
                f"({hook_named(hook.name) or 'none'}), not as the {which}; name it mig-batch-{which}"]  # fmt: skip
    try:
        proc = subprocess.run([str(hook), "settings"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"{hook} cannot run here ({exc}): every job start fails; {fix}"]
    settings = dict(line.partition("=")[::2] for line in proc.stdout.splitlines())
    if proc.returncode != 0 or "python" not in settings:
        return [f"{hook} cannot run here or has no paths compiled in (exit {proc.returncode}); {fix}"]
    problems = [] if Path(settings["python"]).exists() else [f"{hook} runs {settings['python']}, which does not exist"]
    if config is not None:
        wanted = {"socket": str(config.agent_socket), "job_dir": str(config.job_dir)}
        problems += [f"{hook} has {key}={settings.get(key)} compiled in, the site config {value}; {fix}"
                     for key, value in wanted.items() if settings.get(key) != value]  # fmt: skip
    return problems


def check_job_submit(show_config: str) -> Check:
    values = config_values(show_config)
    plugins = values.get("JobSubmitPlugins", "(null)")
    conf = Path(values.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    lua = conf.parent / "job_submit.lua"
    fix = f"run `mig-batch slurm install {conf.parent} --config ...` and set JobSubmitPlugins=lua in slurm.conf"
    if "lua" not in plugins.split(","):
        return Check("job_submit.lua", False, f"JobSubmitPlugins is {plugins}, without lua", fix)
    if not lua.is_file():
        return Check("job_submit.lua", False, f"{lua} does not exist", fix)
    from mig_batch.slurm.install import SUBMIT_MODULE, loader_misplaced, submit_logic_of

    logic = submit_logic_of(lua)
    if logic is None:
        return Check("job_submit.lua", False, f"{lua} neither is mig_batch's nor loads {lua.parent / SUBMIT_MODULE}",
                     fix + " (a site's own job_submit.lua: add its two lines, docs/slurm.md, Install)")  # fmt: skip
    if logic != lua:
        try:
            ours = LUA_MARK in logic.read_text(errors="replace")
        except OSError as exc:
            return Check("job_submit.lua", False, f"{lua} loads {logic}, which cannot be read: {exc.strerror}", fix)
        if not ours:
            return Check("job_submit.lua", False, f"{lua} loads {logic}, which is not mig_batch's submit logic", fix)
        misplaced = loader_misplaced(lua.read_text(errors="replace"))
        if misplaced:
            return Check("job_submit.lua", False, f"{lua}: {misplaced}",
                         "see docs/slurm.md, \"A site's own job_submit.lua\"")  # fmt: skip
        return Check("job_submit.lua", True, f"{lua} loads mig_batch's {logic}, JobSubmitPlugins has lua")
    return Check("job_submit.lua", True, f"{lua} is mig_batch's, JobSubmitPlugins has lua")


_LUA_SLOTS_FILE = re.compile(r'^local SLOTS_FILE = (nil|"(.*)")$', re.M)


def check_prompt_slots(show_config: str, config: SiteConfig) -> Check:
    """job_submit.lua reads the slots file mig-batchd writes (prompt_slots above 0), or none (0); the file and
    its directory open to slurmctld's user."""
    from mig_batch.slurm.install import submit_logic_of

    lua = Path(config_values(show_config).get("SLURM_CONF", "/etc/slurm/slurm.conf")).parent / "job_submit.lua"
    fix = f"run `mig-batch slurm install {lua.parent} --config ...` again, then `scontrol reconfigure`"
    lua = submit_logic_of(lua) or lua  # where the rules are: the module job_submit.lua loads, or itself
    try:
        found = _LUA_SLOTS_FILE.search(lua.read_text(errors="replace"))
    except OSError:
        return Check("prompt slots", config.prompt_slots == 0, f"{lua} cannot be read", fix)
    reads = found.group(2) if found and found.group(1) != "nil" else None
    if not config.prompt_slots:
        if reads is not None:
            return Check("prompt slots", False, f"prompt_slots is 0 but {lua} reads slots from {reads}", fix)
        return Check("prompt slots", True, "off (prompt_slots: 0): every MIG job waits held for mig-batchd")
    if reads != str(config.slots_file):
        return Check("prompt slots", False, f"prompt_slots is {config.prompt_slots} but {lua} reads "
                     f"{reads or 'no slots file'}, not {config.slots_file}", fix)  # fmt: skip
    closed = [p for p in (config.slots_file, config.slots_file.parent) if p.exists() and
              not p.stat().st_mode & (0o004 if p == config.slots_file else 0o001)]  # fmt: skip
    if closed:
        return Check("prompt slots", False, f"slurmctld's user cannot read {config.slots_file}: {closed[0]} is "
                     f"mode {closed[0].stat().st_mode & 0o777:o}", f"chmod o+rx {closed[0]} (mig-batchd writes the "
                     "file 0644 and a directory it makes 0755)")  # fmt: skip
    return Check("prompt slots", True, f"{config.prompt_slots} per request; {lua} reads {config.slots_file}")


SLURM_BATCH_SCHED_DELAY_S = 3  # Slurm's default, and what it takes for a negative value
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")  # what C's atoi reads


def batch_sched_delay(scheduler_parameters: str) -> int:
    """``batch_sched_delay`` as slurmctld 22.05 reads it from SchedulerParameters: the first
    ``batch_sched_delay=`` in any case, its value through C's atoi (no digits: 0)."""
    at = scheduler_parameters.lower().find("batch_sched_delay=")
    if at < 0:
        return SLURM_BATCH_SCHED_DELAY_S
    number = _LEADING_INT.match(scheduler_parameters, at + len("batch_sched_delay="))
    delay = int(number.group(1)) if number else 0
    return delay if delay >= 0 else SLURM_BATCH_SCHED_DELAY_S


def check_scheduler(show_config: str) -> Check:
    """Advice, never a failure: a MIG job starts at the first scheduling pass after mig-batchd releases it,
    and slurmctld runs the pass a release asks for once ``batch_sched_delay`` has passed since its last."""
    delay = batch_sched_delay(config_values(show_config).get("SchedulerParameters", ""))
    if delay <= 1:
        return Check("scheduler", True, f"batch_sched_delay={delay}: a released MIG job starts at slurmctld's next "
                     "scheduling pass, within about a second")  # fmt: skip
    return Check("scheduler", True, f"batch_sched_delay is {delay} s: a MIG job may wait up to {delay} s after its "
                 "release for a scheduling pass; add batch_sched_delay=1 to SchedulerParameters in slurm.conf "
                 "to start it within about a second (docs/slurm.md, Install)")  # fmt: skip


def check_store(path: Path) -> Check:
    """The controller's store: readable with a schema this code knows, or creatable by mig-batchd. Read-only:
    the doctor neither creates nor migrates it."""
    from mig_batch.state import SCHEMA_VERSION

    fix = "set state: in the site config to a file on a writable local disk of the controller host"
    if path.exists():
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error as exc:
            return Check("store", False, f"{path}: {exc}", fix)
        if version > SCHEMA_VERSION:
            return Check("store", False, f"{path} has schema {version}, newer than this mig_batch's {SCHEMA_VERSION}",
                         "install the mig_batch that wrote it")  # fmt: skip
        writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
        return Check("store", writable, f"{path} (schema {version})" + ("" if writable else ", not writable by us"),
                     "" if writable else "run as the user mig-batchd runs as, or fix the file's owner")  # fmt: skip
    parent = next((p for p in path.parents if p.exists()), Path("/"))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return Check("store", False, f"{path} does not exist and {parent} is not writable", fix)
    return Check("store", True, f"{path} does not exist yet; mig-batchd will create it under {parent}")


PASSES_STALE_S = 300.0  # a last good pass older than this, with no failure recorded: mig-batchd is not running


def check_passes(config: SiteConfig, now: float | None = None) -> Check:
    """mig-batchd's passes, from the health file it writes beside the store: failing (since when, why), or
    none lately (not running), or going. No file: it has not run here yet (not a failure)."""
    from mig_batch.controller.health import age_text, health_path, read_health

    now = time.time() if now is None else now
    path = health_path(config.state)
    health = read_health(path)
    if health is None:
        return Check("passes", True, f"mig-batchd has recorded no pass here yet ({path} does not exist)")
    last = health.get("last_good_pass")
    last_text = "never" if not isinstance(last, int | float) else f"{age_text(now - last)} ago"
    since = health.get("failing_since")
    if isinstance(since, int | float):
        return Check("passes", False, f"mig-batchd's passes have failed for {age_text(now - since)} "
                     f"({health.get('failures')} in a row; last good pass {last_text}): {health.get('error')}",
                     "check that the batch system answers (scontrol ping, or condor_q) from this host; journalctl "
                     "-u mig-batchd has a line when it stopped answering and one when it is back")  # fmt: skip
    written = health.get("written")
    quiet = age_text(now - written) if isinstance(written, int | float) else "ever"
    if not isinstance(written, int | float) or now - written > PASSES_STALE_S:
        return Check("passes", False, f"mig-batchd wrote no pass for {quiet} (last good pass {last_text}): it is "
                     "not running", "systemctl status mig-batchd; journalctl -u mig-batchd")  # fmt: skip
    return Check("passes", True, f"last good pass {last_text}")


def check_metrics(config: SiteConfig) -> list[Check]:
    """mig-batchd's metrics endpoint answers (when ``metrics_listen`` is set)."""
    if not config.metrics_listen:
        return []
    import urllib.request

    from mig_batch.config import listen_address

    host, port = listen_address(config.metrics_listen)
    host = "localhost" if host in ("0.0.0.0", "::", "") else host
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            body = answer.read(1 << 22).decode(errors="replace")
    except OSError as exc:
        why = getattr(exc, "reason", None) or exc
        return [Check("metrics", False, f"{url}: {why}", "start mig-batchd (systemctl status mig-batchd); it "
                      "reads metrics_listen at its start")]  # fmt: skip
    if "mig_batch_last_good_pass_timestamp_seconds" not in body:
        return [Check("metrics", False, f"{url} answers, but not with mig-batchd's metrics", "another program "
                      "holds the port: give metrics_listen a free one")]  # fmt: skip
    return [Check("metrics", True, f"{url} serves mig-batchd's metrics")]


def check_node_dirs(config: SiteConfig, node: str) -> Check:
    """job_dir and node_dir (the journal's) as the agent checks them at its start: no user but root may change
    them or a directory above (a user who could would point another job's file, or root's writes, anywhere)."""
    from mig_batch.safe_files import untrusted_dir

    dirs = [Path(str(d).format(node=node)) for d in (config.job_dir, config.node_dir)]
    for path in dirs:
        why = untrusted_dir(path) if path.exists() else ""
        if why:
            return Check("node directories", False, f"{why}: the agent refuses to start",
                         "chown root:root and chmod go-w the directory named: job_dir, node_dir and every "
                         "directory above them must be changeable by root only")  # fmt: skip
    return Check("node directories", True, f"{', '.join(map(str, dirs))}: root's alone (or made by the agent)")


SETUID_MODPROBE = ("/usr/bin/nvidia-modprobe", "/usr/sbin/nvidia-modprobe", "/bin/nvidia-modprobe")


def check_fence(config: SiteConfig, node: str) -> Check:
    """The instance fence can work here: the driver's capabilities, a root-only /dev/nvidia-caps, and no
    setuid nvidia-modprobe allowed to make a job's nodes world-readable again (docs/security.md)."""
    from mig_batch.factory import open_fence
    from mig_batch.node.fence import CapabilityFence

    fence = open_fence(config, node)
    if not isinstance(fence, CapabilityFence):
        return Check("instance fence", True, "fence.mode off: every local user may open every MIG instance on "
                     "this node (set fence.mode: capabilities where users do not trust each other)")  # fmt: skip
    problems = fence.check()
    modify = _device_file_modify(fence.capabilities / "mig" / "config" / "access")
    setuid = [p for p in SETUID_MODPROBE if _setuid_root(Path(p))]
    if modify and setuid:
        problems.append(f"{setuid[0]} is setuid root and the driver lets it modify device files "
                        f"(DeviceFileModify: 1): any user running it makes an instance's nodes 0444 again")  # fmt: skip
    if problems:
        return Check("instance fence", False, "; ".join(problems),
                     "load nvidia with NVreg_ModifyDeviceFiles=0 (or chmod u-s nvidia-modprobe), and "
                     "nv_cap_enable_devfs=1; keep /dev/nvidia-caps root's, mode 0755 (docs/security.md)")  # fmt: skip
    return Check("instance fence", True, f"capabilities under {fence.capabilities}; job nodes in {fence.devices}, "
                 "each its job owner's alone")  # fmt: skip


def _device_file_modify(access: Path) -> bool:
    try:
        return "DeviceFileModify: 1" in access.read_text()
    except OSError:
        return True  # unknown: assume nvidia-modprobe's default


def _setuid_root(path: Path) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    return info.st_uid == 0 and bool(info.st_mode & 0o4000)


def check_agent(path: Path) -> Check:
    """The node agent answers a ping on its socket (only root gets a full answer)."""
    fix = "start the node agent: systemctl enable --now mig-batch-agent (journalctl -u mig-batch-agent says why not)"
    from mig_batch.node.hook_client import ask  # the hooks' own client: doctor asks as they do

    try:
        _ok, line = ask(str(path), "ping", "", timeout_s=5.0)
    except OSError as exc:
        return Check("agent", False, f"no answer on {path}: {exc.strerror or exc}", fix)
    try:
        answer = json.loads(line)
    except ValueError:
        return Check("agent", False, f"{path} answered {line[:100]!r}, not the agent's JSON", fix)
    if answer.get("ok"):
        return Check("agent", True, f"{path}: {answer.get('detail', '')}")
    if "only root" in str(answer.get("detail", "")):
        return Check("agent", True, f"{path}: the agent answers (run doctor as root for its state)")
    return Check("agent", False, f"{path}: {answer.get('detail', answer)}", fix)


def check_gpus(config: SiteConfig, node: str) -> list[Check]:
    """The GPU backend reads this node's GPUs; the inventory's models are there, with MIG mode on."""
    from mig_batch.factory import open_backend

    fix = "install the NVIDIA driver and nvidia-ml-py into mig_batch's Python; nvidia-smi must list the GPUs"
    try:
        gpus = open_backend(config, node).gpus()
    except Exception as exc:  # any failure here is the finding, reported with the fix
        return [Check("gpu backend", False, f"{config.gpu_backend}: {type(exc).__name__}: {exc}", fix)]
    checks = [Check("gpu backend", True, f"{config.gpu_backend}: {len(gpus)} GPU(s)")]
    listed = config.nodes.get(node, ())
    problems = []
    for index, model in enumerate(listed):
        gpu = next((g for g in gpus if g.index == index), None)
        if gpu is None:
            problems.append(f"GPU {index} ({model}) not found")
        elif gpu.model != model:
            problems.append(f"GPU {index} is a {gpu.model}, the inventory says {model}")
        elif not gpu.mig_enabled:
            problems.append(f"GPU {index} has MIG mode off")
    if problems:
        checks.append(Check("mig mode", False, "; ".join(problems),
                            "fix nodes: in the site config to match nvidia-smi -L; turn MIG on with "
                            "`nvidia-smi -i N -mig 1` (then reset the GPU or reboot)"))  # fmt: skip
    elif listed:
        checks.append(Check("mig mode", True, f"{len(listed)} GPU(s) as the inventory lists, MIG mode on"))
    return checks
