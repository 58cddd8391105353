"""The SQLite store (WAL): decisions, instances, events. This module owns every SQL statement.

Schema versioned by ``PRAGMA user_version``; opening a newer database than this code knows is an
error, an older one is migrated. A decision is written before the controller acts on it, and every
write is a single transaction, so a crash between two steps leaves a state the next pass resumes.

decisions: job -> request, node, GPU, profile, start and a state:
  decided  -> recorded, not yet applied to the batch system
  released -> pinned to the node and released
  running  -> the batch system runs it
  requeue  -> the prolog could not place it; the controller requeues and places it again
  ended    -> finished (its slot is free once the epilog destroyed the instance)
instances: what the prolog created for a job (node, GPU, profile, start, uuid, GI id); the epilog
deletes the row after destroying the instance.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
ACTIVE = ("decided", "released", "running", "requeue")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (
    job TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    node TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    model TEXT NOT NULL,
    profile TEXT NOT NULL,
    start INTEGER NOT NULL,
    state TEXT NOT NULL,
    policy TEXT NOT NULL,
    decided_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_state ON decisions(state);
CREATE TABLE IF NOT EXISTS instances (
    job TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    profile TEXT NOT NULL,
    start INTEGER NOT NULL,
    gi_id INTEGER NOT NULL,
    uuid TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    job TEXT,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""


class StateError(RuntimeError):
    pass


@dataclass(frozen=True)
class Decision:
    job: str
    request: str
    node: str
    gpu: int
    model: str
    profile: str
    start: int
    state: str
    policy: str


@dataclass(frozen=True)
class InstanceRecord:
    job: str
    node: str
    gpu: int
    profile: str
    start: int
    gi_id: int
    uuid: str


class Store:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=30000")
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StateError(f"{self.path} has schema {version}; this mig_batch knows up to {SCHEMA_VERSION}")
        if version < SCHEMA_VERSION:
            with self._tx() as db:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # decisions
    def record_decision(self, d: Decision) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO decisions VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(job) DO UPDATE SET "
                "request=excluded.request, node=excluded.node, gpu=excluded.gpu, model=excluded.model, "
                "profile=excluded.profile, start=excluded.start, state=excluded.state, policy=excluded.policy, "
                "updated_at=excluded.updated_at",
                (d.job, d.request, d.node, d.gpu, d.model, d.profile, d.start, d.state, d.policy, now, now),
            )
            self._event(db, d.job, "decided", {"node": d.node, "gpu": d.gpu, "profile": d.profile, "start": d.start})

    def set_state(self, job: str, state: str, **detail: Any) -> None:
        with self._tx() as db:
            db.execute("UPDATE decisions SET state=?, updated_at=? WHERE job=?", (state, time.time(), job))
            self._event(db, job, state, detail)

    def decision(self, job: str) -> Decision | None:
        row = self.db.execute(f"SELECT {_DECISION_COLS} FROM decisions WHERE job=?", (job,)).fetchone()
        return Decision(*row) if row else None

    def decisions(self, states: tuple[str, ...] = ACTIVE) -> list[Decision]:
        marks = ",".join("?" * len(states))
        rows = self.db.execute(
            f"SELECT {_DECISION_COLS} FROM decisions WHERE state IN ({marks}) ORDER BY decided_at", states
        ).fetchall()
        return [Decision(*r) for r in rows]

    def count_decisions(self, job: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM events WHERE job=? AND kind='decided'", (job,)).fetchone()[0])

    # instances
    def record_instance(self, r: InstanceRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO instances VALUES (?,?,?,?,?,?,?,?)",
                (r.job, r.node, r.gpu, r.profile, r.start, r.gi_id, r.uuid, time.time()),
            )
            self._event(db, r.job, "instance-created", {"node": r.node, "gpu": r.gpu, "profile": r.profile,
                                                         "start": r.start, "uuid": r.uuid})  # fmt: skip

    def instance(self, job: str) -> InstanceRecord | None:
        row = self.db.execute(f"SELECT {_INSTANCE_COLS} FROM instances WHERE job=?", (job,)).fetchone()
        return InstanceRecord(*row) if row else None

    def instances(self, node: str | None = None) -> list[InstanceRecord]:
        if node is None:
            rows = self.db.execute(f"SELECT {_INSTANCE_COLS} FROM instances").fetchall()
        else:
            rows = self.db.execute(f"SELECT {_INSTANCE_COLS} FROM instances WHERE node=?", (node,)).fetchall()
        return [InstanceRecord(*r) for r in rows]

    def forget_instance(self, job: str, **detail: Any) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM instances WHERE job=?", (job,))
            self._event(db, job, "instance-destroyed", detail)

    # events
    def event(self, job: str | None, kind: str, **detail: Any) -> None:
        with self._tx() as db:
            self._event(db, job, kind, detail)

    def events(self, job: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT time, job, kind, detail FROM events WHERE 1=1", []
        if job is not None:
            sql, args = sql + " AND job=?", [*args, job]
        if kind is not None:
            sql, args = sql + " AND kind=?", [*args, kind]
        rows = self.db.execute(sql + " ORDER BY id", args).fetchall()
        return [{"time": t, "job": j, "kind": k, **json.loads(d)} for t, j, k, d in rows]

    @staticmethod
    def _event(db: sqlite3.Connection, job: str | None, kind: str, detail: dict[str, Any]) -> None:
        db.execute("INSERT INTO events (time, job, kind, detail) VALUES (?,?,?,?)",
                   (time.time(), job, kind, json.dumps(detail)))  # fmt: skip


_DECISION_COLS = "job, request, node, gpu, model, profile, start, state, policy"
_INSTANCE_COLS = "job, node, gpu, profile, start, gi_id, uuid"
