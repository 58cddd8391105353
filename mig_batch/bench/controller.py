"""``mig-batch bench controller``: the same burst of jobs through a local Slurm three ways, timed from
the first submission to the last job *completed*:

  bare      Slurm alone, no Prolog/Epilog
  noop      Slurm with Prolog and Epilog shell scripts that only exit 0 (what any site plugin pays)
  mig       MIG jobs through mig_batch: job_submit.lua, mig-batchd, the node agents, the hooks; each job
            waits held until mig-batchd pins and releases it (the default)
  slots     the same with prompt slots (``prompt_slots``): job_submit.lua binds most jobs to a slot
            mig-batchd decided ahead, and they start without the hold

With ``array`` the burst is one job array of that many tasks (``sbatch --array=0-N``) instead of that many
jobs, without the slots way (an array's tasks take no prompt slot).

With ``rounds`` above one the three bursts run again, every other round in reverse order, so that a
machine whose speed drifts during a run does not always favour the same way; the ratios are then
reported per round and as their median.

Each run starts a fresh cluster of the same shape (slurmd processes, CPUs, emulated GPUs) in a
temporary directory that is removed afterwards. Reported: jobs per second each way and the ratios
mig/bare and mig/noop, and the machine's CPU time per job during each burst (every process: Slurm,
munge, the hooks, the agents, mig-batchd and the submitting loop; niced work excluded). On a testbed
where all of them share the cores, the CPU a job costs is what bounds the rate.

The local Slurm comes from the test harness (``tests/harness/slurm_cluster.py``), which is not in the
wheel: the bench runs from a checkout of the repository, or from an installed mig_batch pointed at one.
"""

from __future__ import annotations

import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from mig_batch.errors import MigBatchError

HARNESS = Path("tests", "harness", "slurm_cluster.py")  # LocalCluster and MigTestbed, in a checkout only
MODES = ("bare", "noop", "mig", "slots")
MIG_MODES = ("mig", "slots")
DEFAULT_PROMPT_SLOTS = 64  # the slots mode's prompt_slots: more than a pass's arrivals at the bench's rate


@dataclass(frozen=True)
class BurstRun:
    mode: str
    jobs: int
    completed: int
    submit_s: float  # submitting the burst
    total_s: float  # first submission to the last job completed
    cpu_s: float = 0.0  # the machine's busy CPU time over the burst (niced work excluded); 0: unknown

    @property
    def jobs_per_s(self) -> float:
        return self.completed / self.total_s if self.total_s else 0.0

    @property
    def cpu_ms_per_job(self) -> float:
        return self.cpu_s / self.completed * 1e3 if self.completed else 0.0


class NoCheckout(MigBatchError):
    """No checkout of the repository to take the local Slurm's test harness from."""


def find_checkout(given: Path | None = None) -> Path | None:
    """The checkout whose test harness the bench runs on: ``given``; else the one this package runs from
    (an editable install, or the source tree on the path); else the working directory, if it is one."""
    candidates = [given] if given is not None else [Path(__file__).resolve().parents[2], Path.cwd()]
    return next((c.resolve() for c in candidates if (c / HARNESS).is_file()), None)


def load_slurm_harness(checkout: Path | None = None) -> ModuleType:
    """The checkout's ``harness.slurm_cluster`` (LocalCluster, MigTestbed), imported with the checkout's
    tests/ on the path as pytest puts it there; the module a test run imported already is the one used."""
    found = find_checkout(checkout)
    if found is None:
        source_tree = Path(__file__).resolve().parents[2]
        where = (f"{checkout} has no {HARNESS}" if checkout is not None
                 else f"found none beside this package ({source_tree}) or in the working directory")  # fmt: skip
        raise NoCheckout(
            f"bench controller runs a local Slurm through the test harness of a mig-batch checkout ({HARNESS}, not "
            f"in the wheel): {where}. Run it from a checkout of the repository with its tests/ folder, or pass "
            "--checkout DIR; it also needs root, and slurm-wlm and munge (apt-get install slurm-wlm munge)")
    tests = str(found / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    return importlib.import_module("harness.slurm_cluster")


def busy_cpu_s() -> float:
    """Seconds of CPU the machine has spent busy since boot, niced work excluded (Linux /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return 0.0
    user, _nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


ARRAY_MODES = ("bare", "noop", "mig")


def _burst(run, script: Path, jobs: int, gres: list[str], timeout_s: float,
           array: bool = False) -> tuple[int, float, float, float]:  # fmt: skip
    """Submit ``jobs`` copies of ``script`` (or one array of ``jobs`` tasks); wait until none is queued.
    (completed, submit s, total s, CPU s)."""
    cpu0, t0 = busy_cpu_s(), time.perf_counter()
    if array:
        run("sbatch", "--parsable", f"--array=0-{jobs - 1}", *gres, "-o", "/dev/null", str(script))
    else:
        for _ in range(jobs):
            run("sbatch", "--parsable", *gres, "-o", "/dev/null", str(script))
    submit_s = time.perf_counter() - t0
    while time.perf_counter() - t0 < timeout_s:
        if not run("squeue", "-h", "-o", "%i").stdout.split():
            break
        time.sleep(0.2)
    total_s, cpu_s = time.perf_counter() - t0, busy_cpu_s() - cpu0
    left = sum(len(_tasks(i)) for i in run("squeue", "-h", "-o", "%i").stdout.split())
    return jobs - left, submit_s, total_s, cpu_s


def _tasks(squeue_id: str) -> range:
    """The tasks one squeue line stands for: ``12_[3-9%8]`` is 7, any other line 1."""
    inside = squeue_id.partition("_[")[2].partition("%")[0].rstrip("]")
    first, _, last = inside.partition("-")
    return range(int(first), int(last or first) + 1) if first.isdigit() and (not last or last.isdigit()) else range(1)


def bench_mode(mode: str, jobs: int, gpus_per_node: int, nodes: int, timeout_s: float = 900,
               prompt_slots: int = DEFAULT_PROMPT_SLOTS, fence: bool = True,
               checkout: Path | None = None, array: bool = False) -> BurstRun:  # fmt: skip
    """One burst; ``fence``: the MIG modes' agents fence each job to its instance (docs/security.md);
    ``checkout``: where the test harness is (see :func:`find_checkout`)."""
    harness = load_slurm_harness(checkout)
    root = Path(tempfile.mkdtemp(prefix=f"mig-batch-bench-{mode}-"))
    names = [f"n{i + 1}" for i in range(nodes)]
    script = root / "job.sh"
    bed = cluster = None
    try:
        script.write_text("#!/bin/sh\ntrue\n")
        if mode in MIG_MODES:
            bed = harness.MigTestbed(root, nodes={n: ["A100-80GB"] * gpus_per_node for n in names},
                                     reconcile_interval_s=60, prompt_slots=prompt_slots if mode == "slots" else 0,
                                     fence=fence)  # fmt: skip
            bed.start()
            run, gres = bed.cluster.run, ["--gres=mig:1g.10gb"]
        else:
            extra = ""
            if mode == "noop":
                hook = root / "noop-hook"
                hook.write_text("#!/bin/sh\nexit 0\n")
                hook.chmod(0o755)
                extra = f"Prolog={hook}\nEpilog={hook}\n"
            cluster = harness.LocalCluster(root, nodes=tuple(names), extra_conf=extra).start()
            run, gres = cluster.run, []
        completed, submit_s, total_s, cpu_s = _burst(run, script, jobs, gres, timeout_s, array)
        return BurstRun(mode, jobs, completed, submit_s, total_s, cpu_s)
    finally:
        slurm = bed.cluster if bed is not None else cluster
        if slurm is not None:
            slurm.run("scancel", "--full", "-u", "root", check=False)
        for c in (bed, cluster):
            if c is not None:
                c.stop()
        shutil.rmtree(root, ignore_errors=True)


def round_order(index: int, modes: tuple[str, ...] = MODES) -> tuple[str, ...]:
    """The order of the bursts in round ``index``: reversed every other round."""
    return modes if index % 2 == 0 else tuple(reversed(modes))


def bench_controller(jobs: int = 1000, gpus_per_node: int = 48, nodes: int = 3, modes: tuple[str, ...] = MODES,
                     rounds: int = 1, prompt_slots: int = DEFAULT_PROMPT_SLOTS, fence: bool = True,
                     checkout: Path | None = None, array: bool = False) -> Iterator[list[BurstRun]]:  # fmt: skip
    """Each round's bursts as the round ends (in ``modes`` order whatever order they ran in)."""
    for index in range(rounds):
        ran = {mode: bench_mode(mode, jobs, gpus_per_node, nodes, prompt_slots=prompt_slots, fence=fence,
                                checkout=checkout, array=array)
               for mode in round_order(index, modes)}  # fmt: skip
        yield [ran[mode] for mode in modes]


def ratios(runs: list[BurstRun]) -> dict[str, float]:
    """``mig/bare``, ``mig/noop``, ``slots/bare`` and ``slots/noop`` in jobs per second, for the modes a round has."""
    by_mode = {r.mode: r for r in runs}
    return {f"{mode}/{base}": by_mode[mode].jobs_per_s / by_mode[base].jobs_per_s
            for mode in MIG_MODES if mode in by_mode
            for base in ("bare", "noop") if base in by_mode and by_mode[base].jobs_per_s}  # fmt: skip


def median_ratios(rounds: list[list[BurstRun]]) -> dict[str, tuple[float, int]]:
    """Each ratio's median over the rounds that have it (a base that completed nothing has none), and
    how many rounds that is."""
    per_round = [ratios(runs) for runs in rounds]
    keys = sorted({key for r in per_round for key in r})
    return {key: (statistics.median(values), len(values))
            for key in keys if (values := [r[key] for r in per_round if key in r])}  # fmt: skip
