"""Site configuration (etc/mig-batch.yaml): one dataclass, validated on load with clear errors."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mig_batch.errors import MigBatchError
from mig_batch.mig.models import UnknownModelError, get_model
from mig_batch.placement.default import DEFAULT_POLICY
from mig_batch.yaml_text import NotTextError, YAMLError, load_yaml_file, shown, shown_name

TYPE_CHECKING = False  # typing costs ~2 ms at every start (migsub reads this config); annotations are strings
if TYPE_CHECKING:
    from typing import Any

DEFAULT_PATH = Path("/etc/mig-batch/mig-batch.yaml")
BACKENDS = ("nvml",)  # tests run it on the emulated libnvidia-ml (mig_batch.gpu.nvml_emu)
MAX_CONFIG_BYTES = 2 << 20  # a nodes: table of 10,000 nodes of 8 GPUs is 1 MiB (an anchor, &eight, shortens it)


def live_policies() -> list[str]:
    """Placement policies a running controller may use (imported on a config load: migsub starts without)."""
    from mig_batch.placement.policies import policy_names

    return [p for p in policy_names() if p != "grmu"]  # grmu migrates running jobs: not live yet


class ConfigError(MigBatchError, ValueError):
    pass


@dataclass(frozen=True)
class AtomizeConfig:
    """Subjob chains (SJA): how gaps are offered and granted."""

    grant_policy: str = "efficiency"  # efficiency | fairness | deadline
    eps: float = 0.05  # admission risk: Pr(subjob peak memory > its instance) <= eps
    hysteresis: float = 0.25  # shrink below the last subjob's size only when it frees this share
    offer_horizon_s: float = 3600.0  # how far ahead gaps are derived
    checkpoint_margin_s: float = 30.0  # the job is told to checkpoint this long before its window closes
    grace_s: float = 10.0  # after the window: then SIGTERM; Slurm's time limit covers window + grace
    max_failures: int = 3  # consecutive failed subjobs before a chain is given up
    # live defragmentation at checkpoint boundaries (mig_batch.atomize.defrag, docs/atomize.md)
    live_defrag: bool = False  # grants go where they keep most capacity free; windows kept for blocked jobs
    defrag_max_steered: int = 4  # blocked rigid jobs per pass whose window is kept from chain grants
    defrag_max_hold_s: float = 1800.0  # a chain waiting this long is offered the kept windows too


MOLDABLE_PLANNERS = ("eft", "far", "auto")  # mig_batch.planner.live.LIVE_PLANNERS
DEFAULT_MOLDABLE_PLANNER = "auto"  # the measured best (docs/moldable.md, "The default planner")


@dataclass(frozen=True)
class MoldableConfig:
    """Moldable jobs (migsub --moldable): how the size is chosen (mig_batch.placement.moldable)."""

    min_gain: float = 0.1  # wait, or take a larger profile, only to finish at least this share sooner
    max_reservations: int = 16  # waiting moldable jobs per pass that look ahead and hold a reservation
    # eft: each job in queue order gets the size that finishes first (min_gain, max_reservations); far | auto:
    # the waiting jobs are planned together first (mig_batch.planner.live), within planner_budget_s per pass
    planner: str = DEFAULT_MOLDABLE_PLANNER
    planner_budget_s: float = 1.0


@dataclass(frozen=True)
class FlexConfig:
    """Jobs over several MIG instances (docs/flex.md)."""

    # Flex-MIG's finer requests: a compute/memory demand no single instance meets (or --instances auto)
    # becomes N leaves of one node; off by default, since such a job must run over several instances
    leaf_requests: bool = False


FENCE_MODES = ("capabilities", "off")


@dataclass(frozen=True)
class FenceConfig:
    """Each job fenced to its own MIG instance on the GPU nodes (mig_batch/node/fence.py, docs/security.md)."""

    # capabilities: the instance's capability device nodes are made the job owner's only; off: every local
    # user may open every instance (nvidia-modprobe's default)
    mode: str = "capabilities"
    capabilities: str = "/proc/driver/nvidia/capabilities"  # the driver's per-instance capability files
    devices: str = "/dev/nvidia-caps"  # where the capability device nodes are (root's, 0755)
    proc_devices: str = "/proc/devices"  # where the nvidia-caps major is listed


@dataclass(frozen=True)
class SiteConfig:
    state: Path = Path("/var/lib/mig-batch/state.db")
    policy: str = DEFAULT_POLICY  # the measured best (docs/placement.md "The default policy"); mfi by name
    multi_policy: str = "mfi"  # jobs over several instances: mfi (ours, packs) | flex-mig (round-robin baseline)
    poll_interval_s: float = 1.0
    gpu_backend: str = "nvml"
    job_dir: Path = Path("/run/mig-batch/jobs")
    node_dir: Path = Path("/var/lib/mig-batch/node")  # on each GPU node: the agent's journal (root, 0700)
    agent_socket: Path = Path("/run/mig-batch/agent.sock")  # on each GPU node: where the hooks ask the agent
    reconcile_interval_s: float = 60.0  # on each GPU node: how often the agent reconciles with the batch system
    retention_days: float = 30.0  # mig-batchd forgets ended jobs' decisions and events this old; 0: never
    # Slurm: placements decided ahead per request job_submit.lua binds a job to at its submission, which then
    # starts without a hold (docs/slurm.md "Prompt slots"); 0: off, every MIG job waits held for mig-batchd
    prompt_slots: int = 0
    slots_file: Path = Path("/run/mig-batch/slots")  # on the controller host: where job_submit.lua reads them
    nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    slurm_bin: str = ""
    slurm_library: str = ""  # the helper `mig-batch slurm install` builds: per-job Slurm calls without a process
    batch_system: str = ""  # slurm | htcondor; "": the one found (migsub, mig-batchd)
    htcondor_config: str = ""  # HTCondor: the client config (CONDOR_CONFIG) of mig-batchd and the node agent
    htcondor_agent_file: str = "/run/mig-batch/htcondor-agent.ad"  # HTCondor: the file the startd cron publishes
    slice_gres: str = ""  # Slurm GRES that counts each job's MIG memory slices (e.g. mig_slices); "": off
    # mig-batchd's OpenMetrics endpoint: "[host:]port" ("": off; no host: localhost); the node agent's textfile
    metrics_listen: str = ""
    metrics_textfile: str = ""  # on each GPU node: a node-exporter textfile collector file the agent writes
    atomize: AtomizeConfig = field(default_factory=AtomizeConfig)
    moldable: MoldableConfig = field(default_factory=MoldableConfig)
    flex: FlexConfig = field(default_factory=FlexConfig)
    fence: FenceConfig = field(default_factory=FenceConfig)
    path: str = "<defaults>"


def config_path(explicit: str | os.PathLike | None = None) -> Path:
    return Path(explicit or os.environ.get("MIG_BATCH_CONFIG") or DEFAULT_PATH)


def load_config(explicit: str | os.PathLike | None = None) -> SiteConfig:
    path = config_path(explicit)
    try:
        raw: Any = load_yaml_file(path, "the mig_batch config", MAX_CONFIG_BYTES)
    except PermissionError as exc:
        raise ConfigError(f"cannot read the mig_batch config {path}: {exc.strerror} (users' migsub and the "
                          f"subjob runner read it too: make it readable by all, e.g. mode 0644)") from None  # fmt: skip
    except OSError as exc:
        raise ConfigError(f"cannot read the mig_batch config {path}: {exc.strerror}") from None
    except (YAMLError, NotTextError) as exc:  # each names the file, the line and what is accepted
        raise ConfigError(str(exc)) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of settings (setting: value lines), got {shown(raw)}")
    known = set(SiteConfig.__dataclass_fields__) - {"path"}
    unknown = sorted(shown_name(key) for key in set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    from mig_batch.placement.multi import MULTI_POLICIES

    policy = raw.get("policy", DEFAULT_POLICY)  # checked before any str(): a value a user wrote may be long
    if policy not in live_policies():
        raise ConfigError(f"{path}: policy {shown(policy)} is not one of {', '.join(live_policies())}")
    multi_policy = raw.get("multi_policy", "mfi")
    if multi_policy not in MULTI_POLICIES:
        raise ConfigError(f"{path}: multi_policy {shown(multi_policy)} is not one of {', '.join(MULTI_POLICIES)}")
    backend = raw.get("gpu_backend", "nvml")
    if backend not in BACKENDS:
        raise ConfigError(f"{path}: gpu_backend {shown(backend)} is not one of {', '.join(BACKENDS)}")
    nodes: dict[str, tuple[str, ...]] = {}
    listed = raw.get("nodes") or {}
    if not isinstance(listed, dict):
        raise ConfigError(f"{path}: nodes must map each GPU node's name to its GPU models in index order, e.g. "
                          f"nodes: {{gpu01: [A100-80GB, A100-80GB]}} (got {shown(listed)})")  # fmt: skip
    canonical: dict[str, str] = {}  # each model name as written -> the model's name: looked up once, not per GPU
    for node, models in listed.items():
        if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
            raise ConfigError(f"{path}: nodes.{shown_name(node)} must be a list of GPU models, e.g. [A100-80GB, "
                              f"A100-80GB] (got {shown(models)})")  # fmt: skip
        try:
            for m in models:
                if m not in canonical:
                    canonical[m] = get_model(m).name
            nodes[str(node)] = tuple(canonical[m] for m in models)
        except UnknownModelError as exc:
            raise ConfigError(f"{path}: nodes.{shown_name(node)}: {exc}") from None
    interval = _seconds(raw, "poll_interval_s", 1.0, path)
    if raw.get("prompt_slots") and raw.get("slice_gres"):  # a slot's job is not pinned: nothing would set its GRES
        raise ConfigError(f"{path}: prompt_slots needs slice_gres off (job_submit.lua does not count the slices of "
                          "a job it binds to a slot); set one of them to 0 or empty")  # fmt: skip
    if raw.get("prompt_slots") and raw.get("batch_system") == "htcondor":
        raise ConfigError(f"{path}: prompt_slots is for Slurm (job_submit.lua binds jobs to them); HTCondor's "
                          "jobs wait for mig-batchd: set prompt_slots to 0")  # fmt: skip
    return SiteConfig(
        state=_path(raw, "state", SiteConfig.state, path),
        policy=policy,
        multi_policy=multi_policy,
        poll_interval_s=interval,
        gpu_backend=backend,
        job_dir=_path(raw, "job_dir", SiteConfig.job_dir, path),
        node_dir=_path(raw, "node_dir", SiteConfig.node_dir, path),
        agent_socket=_path(raw, "agent_socket", SiteConfig.agent_socket, path),
        reconcile_interval_s=_seconds(raw, "reconcile_interval_s", SiteConfig.reconcile_interval_s, path),
        retention_days=_retention_days(raw, path),
        prompt_slots=_prompt_slots(raw, path),
        slots_file=_path(raw, "slots_file", SiteConfig.slots_file, path),
        nodes=nodes,
        slurm_bin=_text(raw, "slurm_bin", "", path),
        slurm_library=_text(raw, "slurm_library", "", path),
        batch_system=_batch_system(raw, path),
        htcondor_config=_text(raw, "htcondor_config", "", path),
        htcondor_agent_file=_text(raw, "htcondor_agent_file", SiteConfig.htcondor_agent_file, path),
        slice_gres=_slice_gres(raw, path),
        metrics_listen=_metrics_listen(raw, path),
        metrics_textfile=_text(raw, "metrics_textfile", "", path),
        atomize=_atomize(raw.get("atomize") or {}, path),
        moldable=_moldable(raw.get("moldable") or {}, path),
        flex=_section(raw.get("flex") or {}, path, "flex", FlexConfig),
        fence=_fence(raw.get("fence") or {}, path),
        path=str(path),
    )


BATCH_SYSTEMS = ("slurm", "htcondor")


def listen_address(text: str) -> tuple[str, int]:
    """``[host:]port`` (``[v6]:port`` too) as (host, port); no host: localhost. ValueError naming the form."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]") if sep else ""
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text[:64]!r} is not [host:]port with a port from 1 to 65535 (e.g. 9810, 0.0.0.0:9810)")
    return host or "localhost", int(port)


def _metrics_listen(raw: dict, path: Path) -> str:
    text = _text(raw, "metrics_listen", "", path) if not isinstance(raw.get("metrics_listen"), int) \
        else str(raw["metrics_listen"])  # fmt: skip
    if text:
        try:
            listen_address(text)
        except ValueError as exc:
            raise ConfigError(f"{path}: metrics_listen: {exc}") from None
    return text


def _text(raw: dict, key: str, default: str, path: Path) -> str:
    """A text setting; left out or empty: ``default``."""
    value = raw.get(key)
    return default if value is None or value == "" else _typed(value, str, f"{path}: {key}")


def _path(raw: dict, key: str, default: Path, path: Path) -> Path:
    """A path setting; left out: ``default``; given empty or not as text: an error naming it."""
    if key not in raw:
        return default
    value = raw[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: {key} must be a path (got {shown(value)}); leave it out for {default}")
    return Path(value)


def _batch_system(raw: dict, path: Path) -> str:
    value = _text(raw, "batch_system", "", path)
    if value and value not in BATCH_SYSTEMS:
        raise ConfigError(f"{path}: batch_system {shown(value)} is not one of {', '.join(BATCH_SYSTEMS)} (or leave "
                          "it out)")  # fmt: skip
    return value


def _slice_gres(raw: dict, path: Path) -> str:
    value = _text(raw, "slice_gres", "", path)
    if value and not re.fullmatch(r"[a-z][a-z0-9_]*", value):
        raise ConfigError(f"{path}: slice_gres {shown(value)} must be a GRES name (lower-case letters, digits, _; "
                          f"e.g. mig_slices) or empty to turn slice accounting off")  # fmt: skip
    return value


def _seconds(raw: dict, key: str, default: float, path: Path) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{path}: {key} must be a number of seconds (got {shown(value)})")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{path}: {key} must be positive and finite (got {shown(value)})")
    return float(value)


def _retention_days(raw: dict, path: Path) -> float:
    value = raw.get("retention_days", SiteConfig.retention_days)
    # under a day, a requeued job's decision could go while Slurm still delays its start (minutes)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not (value == 0 or value >= 1):  # fmt: skip
        raise ConfigError(f"{path}: retention_days must be a number of days, at least 1, or 0 to keep every "
                          f"ended job's decision and events (got {shown(value)})")  # fmt: skip
    return float(value)


MAX_PROMPT_SLOTS = 1000  # per request; job_submit.lua reads the whole file at each MIG submission


def _prompt_slots(raw: dict, path: Path) -> int:
    value = raw.get("prompt_slots", SiteConfig.prompt_slots)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PROMPT_SLOTS:
        raise ConfigError(f"{path}: prompt_slots must be a whole number of slots per request from 0 (off) to "
                          f"{MAX_PROMPT_SLOTS} (got {shown(value)})")  # fmt: skip
    return value


def _section(raw: Any, path: Path, name: str, cls: type) -> Any:
    """A settings section as ``cls``: known keys only, each converted to its default's type."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {name} must be a mapping of settings (got {shown(raw)})")
    known = set(cls.__dataclass_fields__)
    unknown = sorted(shown_name(key) for key in set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown {name} setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for key, f in cls.__dataclass_fields__.items():
        if key in raw:
            values[key] = _typed(raw[key], type(f.default), f"{path}: {name}.{key}")
    return cls(**values)


_KINDS = {bool: "true or false", int: "a whole number", float: "a finite number", str: "text"}


def _typed(value: Any, kind: type, where: str) -> Any:
    """``value`` as ``kind`` where YAML gave it that type (an int for a float too); else an error naming
    what is accepted. No coercion: 2.7 is not a count, "yes" is not true."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind) or \
            (kind is float and not math.isfinite(value)):  # fmt: skip
        raise ConfigError(f"{where} must be {_KINDS.get(kind, kind.__name__)} (got {shown(value)})")
    return value


def _moldable(raw: Any, path: Path) -> MoldableConfig:
    config = _section(raw, path, "moldable", MoldableConfig)
    if not 0 <= config.min_gain < 1:
        raise ConfigError(f"{path}: moldable.min_gain must lie in [0, 1) (got {config.min_gain})")
    if config.max_reservations < 0:
        raise ConfigError(f"{path}: moldable.max_reservations must be 0 or more (got {config.max_reservations})")
    if config.planner not in MOLDABLE_PLANNERS:
        raise ConfigError(f"{path}: moldable.planner must be one of {', '.join(MOLDABLE_PLANNERS)} "
                          f"(got {shown(config.planner)})")  # fmt: skip
    if not 0 < config.planner_budget_s <= 60:
        raise ConfigError(f"{path}: moldable.planner_budget_s must lie in (0, 60] seconds "
                          f"(got {config.planner_budget_s})")  # fmt: skip
    return config


def _atomize(raw: Any, path: Path) -> AtomizeConfig:
    from mig_batch.atomize.protocol import GRANT_POLICIES

    config = _section(raw, path, "atomize", AtomizeConfig)
    if config.defrag_max_steered < 0:
        raise ConfigError(f"{path}: atomize.defrag_max_steered must be 0 or more (got {config.defrag_max_steered})")
    if config.grant_policy not in GRANT_POLICIES:
        raise ConfigError(f"{path}: atomize.grant_policy {shown(config.grant_policy)} is not one of "
                          f"{', '.join(GRANT_POLICIES)}")  # fmt: skip
    if not 0 < config.eps < 1:
        raise ConfigError(f"{path}: atomize.eps must lie strictly between 0 and 1 (got {config.eps})")
    if not 0 <= config.hysteresis < 1:
        raise ConfigError(f"{path}: atomize.hysteresis must lie in [0, 1) (got {config.hysteresis})")
    for name in ("offer_horizon_s", "checkpoint_margin_s", "grace_s", "defrag_max_hold_s"):
        if getattr(config, name) < 0 or (name == "offer_horizon_s" and config.offer_horizon_s <= 0):
            raise ConfigError(f"{path}: atomize.{name} must be a positive number of seconds")
    return config


def _fence(raw: Any, path: Path) -> FenceConfig:
    config = _section(raw, path, "fence", FenceConfig)
    if config.mode not in FENCE_MODES:
        raise ConfigError(f"{path}: fence.mode {shown(config.mode)} is not one of {', '.join(FENCE_MODES)}")
    for name in ("capabilities", "devices", "proc_devices"):
        if not getattr(config, name).startswith("/"):
            raise ConfigError(f"{path}: fence.{name} must be an absolute path (got {shown(getattr(config, name))})")
    return config
