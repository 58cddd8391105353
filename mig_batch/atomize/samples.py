"""Memory samples of past subjobs on disk: ``<checkpoint dir>/.mig-batch/memory/<job>.<run>.csv``.

The runner appends ``seconds,MiB`` lines while the subjob runs; the controller reads every file of a
chain into a :class:`MemoryProfile`. Lines that are not two numbers are skipped (a subjob killed
mid-write leaves at most one torn line), and a file is read only up to ``max_files`` newest.
"""

from __future__ import annotations

from pathlib import Path

from mig_batch.atomize.profiles import MemoryProfile, ProfileError, Trajectory


def samples_dir(checkpoint_dir: Path | str) -> Path:
    return Path(checkpoint_dir) / ".mig-batch" / "memory"


def samples_file(checkpoint_dir: Path | str, job: str, run: int) -> Path:
    return samples_dir(checkpoint_dir) / f"{job}.{run}.csv"


def read_trajectory(path: Path) -> Trajectory | None:
    times, mib = [], []
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(",")
        try:
            t, m = float(parts[0]), float(parts[1])
        except (ValueError, IndexError):
            continue
        if times and t < times[-1]:
            continue
        times.append(t)
        mib.append(m)
    try:
        return Trajectory(tuple(times), tuple(mib)) if times else None
    except ProfileError:
        return None


def read_profile(checkpoint_dir: Path | str, max_files: int = 200) -> MemoryProfile:
    directory = samples_dir(checkpoint_dir)
    if not directory.is_dir():
        return MemoryProfile(())
    files = sorted(directory.glob("*.csv"), key=lambda p: p.stat().st_mtime)[-max_files:]
    trajectories = [t for t in map(read_trajectory, files) if t is not None]
    return MemoryProfile(tuple(trajectories))
