"""Prompt slots: placements mig-batchd decides ahead, per request, for the next jobs that ask for it.

job_submit.lua binds a new MIG job whose request matches an open slot to it at submission (its tag gets
``place=`` and ``slot=``, its node is required, and it is not held), so the job starts as soon as Slurm
schedules it, with no hold, no pin and no release. mig-batchd records the binding at its next pass
(``Controller._adopt``). This module holds the pieces without the controller's state: which requests get
slots, and the file job_submit.lua reads (docs/slurm.md "Prompt slots").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from mig_batch.batch.tags import JobTag
from mig_batch.safe_files import write_file
from mig_batch.state import SlotRecord

SLOTS_HEADER = "mig-batch-slots 1"
SLOT_PREFIX = "~slot"  # a slot's key in the view: never a job id
REQUEST_KEPT_S = 600.0  # a request's slots are kept this long after a job last asked for it
# A withdrawn slot's spot is freed only when a listing this much younger than the file without it shows no
# job bound to it: Slurm runs job_submit.lua under a read lock and creates the job after it, under a write
# lock that readers may delay, so a job bound from the old file can appear in a later listing.
WITHDRAWN_GRACE_S = 30.0
# A slot no job took in this long is withdrawn (and made again, with a new id): job_submit.lua may have
# bound a submission that never became a job (sbatch --test-only, a submission Slurm refused after it).
SLOT_LIFETIME_S = 120.0
REWRITE_EVERY_S = 30.0  # the file is written again this often: job_submit.lua trusts none older than its load


def slot_key(slot_id: int) -> str:
    return f"{SLOT_PREFIX}{slot_id}"


def takes_slots(tag: JobTag) -> bool:
    """Whether job_submit.lua may bind a job with this tag to a slot: one instance, neither moldable nor a
    subjob chain (their sizes and windows are decided when they are placed), and no GPU model named (that
    is a constraint on the node, which job_submit.lua leaves to mig-batchd)."""
    return tag.instances == 1 and tag.moldable is None and tag.atomize is None and tag.model is None


def slots_text(slots: Iterable[SlotRecord], listed_at: float, cpus: Mapping[str, int],
               partitions: Mapping[str, Iterable[str]]) -> str:  # fmt: skip
    """The file job_submit.lua reads: a header with the time of the listing the slots were decided after,
    then per open slot ``<id> <request> <node> <gpu> <profile> <start> <cpus> <partitions>``: ``cpus`` the
    node's CPUs, the most a job bound to it may ask for (``-``: unknown), ``partitions`` the node's (``-``:
    any). A job bound to a node whose CPUs are all held waits there for one, as a job mig-batchd places
    when every node is full does."""
    lines = [f"{SLOTS_HEADER} {int(listed_at)}"]
    for s in slots:
        room = cpus.get(s.node)
        parts = ",".join(sorted(partitions.get(s.node, ()))) or "-"
        lines.append(f"{s.id} {s.request} {s.node} {s.gpu} {s.profile} {s.start} "
                     f"{'-' if room is None else room} {parts}")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_slots_file(path: Path, text: str) -> None:
    """Replace the file at once (job_submit.lua reads it at any moment); readable by slurmctld's user, in a
    directory it can enter when this makes it (mig-batchd's unit runs with UMask=0077)."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True)
        path.parent.chmod(0o755)
    write_file(path, text, 0o644)
