"""Queue files for ``mig-batch plan``: YAML with the GPU model and each task's predicted times.

gpu: A100-40GB            # optional; --gpu overrides
tasks:
  - name: cfd
    times: {1g: 7.12, 2g: 2.43, 3g: 2.07, 4g: 1.19, 7g: 1.24}   # or 1: 7.12, ...; seconds
    count: 20             # optional: that many copies (cfd-0, cfd-1, ...)
  - name: lavamd
    times: {2g: 9.95, 3g: 6.51, 4g: 3.46, 7g: 3.51}            # a size left out cannot run it
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mig_batch.errors import MigBatchError
from mig_batch.planner.problem import Task
from mig_batch.yaml_text import NotTextError, YAMLError, load_yaml_file, shown


class QueueFileError(MigBatchError, ValueError):
    pass


def _size(key: Any, where: str) -> int:
    text = str(key).strip().lower() if isinstance(key, str | int) and not isinstance(key, bool) else ""
    if text.endswith("g"):
        text = text[:-1]
    if not text.isdigit() or len(text) > 3 or int(text) < 1:  # no GPU has a thousand compute slices
        raise QueueFileError(f"{where}: size {shown(key)} must be a number of compute slices like 3 or 3g")
    return int(text)


def _time(value: Any, where: str) -> float:
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinite", "oom"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise QueueFileError(f"{where}: time must be a positive number of seconds (or 'inf'), got {shown(value)}")
    return float(value)


MAX_TASKS = 10_000  # one batch; the planners are polynomial but not free, and `count:` multiplies entries
MAX_QUEUE_BYTES = 2 << 20  # MAX_TASKS tasks of one line each are about 1 MiB


def parse_queue(data: Any, source: str = "queue") -> tuple[str | None, list[Task]]:
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise QueueFileError(f"{source}: expected a mapping with a non-empty 'tasks' list, e.g. tasks: [{{name: a, "
                             f"times: {{1g: 100, 2g: 60}}}}] (got {shown(data)})")  # fmt: skip
    gpu = data.get("gpu")
    if gpu is not None and not isinstance(gpu, str):
        raise QueueFileError(f"{source}: gpu must be a GPU model's name, e.g. A100-40GB (got {shown(gpu)})")
    tasks: list[Task] = []
    for i, entry in enumerate(data["tasks"], 1):
        where = f"{source}: task {i}"
        if not isinstance(entry, dict) or not isinstance(entry.get("times"), dict) or not entry["times"]:
            raise QueueFileError(f"{where}: expected 'name' and a 'times' mapping of size -> seconds")
        name = entry.get("name", f"task{i}")
        if not isinstance(name, str | int) or isinstance(name, bool) or len(str(name)) > 200:
            raise QueueFileError(f"{where}: name must be text of at most 200 characters (got {shown(name)})")
        name = str(name)
        times = {_size(k, f"{where} ({name})"): _time(v, f"{where} ({name})") for k, v in entry["times"].items()}
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise QueueFileError(f"{where} ({name}): count must be a positive integer, got {shown(count)}")
        if len(tasks) + count > MAX_TASKS:  # checked before the copies are made: count: 1000000 must not run away
            raise QueueFileError(f"{where} ({name}): the queue would hold {len(tasks) + count} tasks; at most "
                                 f"{MAX_TASKS:,} are planned at once (split the queue or lower count)")  # fmt: skip
        tasks += [Task(name if count == 1 else f"{name}-{k}", times) for k in range(count)]
    return gpu, tasks


def read_queue(path: Path) -> tuple[str | None, list[Task]]:
    try:
        data = load_yaml_file(path, "a queue file", MAX_QUEUE_BYTES)
    except OSError as exc:
        raise QueueFileError(f"cannot read {path}: {exc.strerror}") from exc
    except (YAMLError, NotTextError) as exc:  # each names the file, the line and what is accepted
        raise QueueFileError(str(exc)) from None
    return parse_queue(data, str(path))
