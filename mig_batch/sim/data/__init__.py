"""The data the simulators and benchmarks read: what ships with mig_batch, what may not, and where each comes from.

Shipped (this folder, README.md: source, licence, attribution): the Philly job run-time sample (CC-BY-4.0) that
``simulate flex`` draws durations from. Not shipped, for their terms: the Alibaba GPU cluster trace 2023
(research and study use) and the Rodinia task times (no licence stated); a command that needs one and cannot
find it raises :class:`MissingDataError`: the file, where it comes from, the option that points at it (exit 2).
"""

from __future__ import annotations

from pathlib import Path

from mig_batch.errors import MigBatchError

DATA_DIR = Path(__file__).resolve().parent
PHILLY_SAMPLE = DATA_DIR / "philly_runtime.csv.gz"  # philly/philly_runtime.csv of ../shared/data, gzipped

TRACE_DIR = "../shared/data/alibaba-gpu-2023"  # the default of --trace-dir: a checkout beside the project's data
TRACE_SOURCE = ("the Alibaba GPU cluster trace 2023: the csv folder cluster-trace-gpu-v2023/csv of "
                "https://github.com/alibaba/clusterdata (for research or study use only, so mig_batch does not "
                "ship it)")  # fmt: skip

RODINIA_DIR = "../shared/data/mig-tasks/rodinia_A100"
RODINIA_FILES = "<size>g_A100.csv (1g, 2g, 3g, 4g, 7g)"
RODINIA_SOURCE = ("measured by Villarrubia et al. (FAR, MIG-DRL): MIG_scheduler/rodinia_times/ in "
                  "https://github.com/Jorgitou98/task-scheduling, which states no licence, so mig_batch does not "
                  "ship them")  # fmt: skip


class MissingDataError(MigBatchError):
    """A command needs a data file that mig_batch does not ship and that is not where it looked."""


def missing_trace(what: str, names: str, folder: Path) -> MissingDataError:
    """``what`` (a command) needs the trace's ``names`` in ``folder``, which lacks them."""
    return MissingDataError(
        f"{what} needs {names} in {folder}, which is not there; it comes from {TRACE_SOURCE}. Download that folder "
        "and point --trace-dir (or $MIG_BATCH_TRACE_DIR) at it"
    )
