"""The SQLite store (WAL): decisions, instances, events. This module owns every SQL statement.

Schema versioned by ``PRAGMA user_version``; opening a newer database than this code knows is an
error, an older one is migrated. A decision is written before the controller acts on it, and every
write is a single transaction, so a crash between two steps leaves a state the next pass resumes.

decisions: job -> request, node, GPU, profile, start and a state:
  decided  -> recorded, not yet applied to the batch system
  released -> pinned to the node and released
  running  -> the batch system runs it
  requeue  -> the prolog could not place it; the controller requeues and places it again
  ended    -> finished (its spot is free once the epilog destroyed the instance)
instances: what the prolog created for a job (node, GPU, profile, start, uuid, GI id); the epilog
deletes the row after destroying the instance.
chains (schema 2): atomizable jobs (SJA) and their progress; subjobs: each granted run of a chain
(window, deadline, outcome); chain_jobs (schema 3): the Slurm jobs of a chain, one per subjob, the
first one naming the chain; decision_spots (schema 4): every rank's (GPU, profile, start) of a
multi-instance job (rank 0 is the decision's own spot), written in the decision's transaction, so a
job has all its spots or none; offers and replies: every negotiation round that changed something,
for ``mig-batch offers``. Every statement of the schema may run again: a writer (mig-batchd) runs them all
when it opens the store, so that an index added since (events by job) reaches a store of the same version.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from mig_batch.batch.states import ACTIVE, CHAIN_OVER, DECIDABLE, DecisionState, check_decision
from mig_batch.batch.tags import RANK_SEPARATOR, JobTag, parse_tag, rank_key
from mig_batch.errors import MigBatchError

SCHEMA_VERSION = 4
APPLICATION_ID = 0x4D494742  # "MIGB" in SQLite's header (PRAGMA application_id): the mark of a mig_batch store
INTERRUPTED = ("not-started", "requeued")  # subjob outcomes taken back from it, neither a failure nor a success
MIG_OFF = "mig-off"  # event: a node's agent found these GPUs with MIG mode off (an empty list: none now)
NODE_PROBLEM = "node-problem"  # event: a node's hook or reconcile problem
NOT_A_STORE = "expected the SQLite store mig-batchd writes (with its decisions and events tables): set state: in the " \
              "site config (--config) to its path"  # fmt: skip
READ_BACK = (MIG_OFF, NODE_PROBLEM)  # node events read back (each node's newest): kept by the prune

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
CREATE INDEX IF NOT EXISTS decisions_ended ON decisions(state, updated_at);
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
CREATE TABLE IF NOT EXISTS chains (
    job TEXT PRIMARY KEY,
    checkpoint_dir TEXT NOT NULL,
    declared_mib REAL NOT NULL,
    min_s REAL NOT NULL,
    max_s REAL NOT NULL,
    deadline REAL,
    submitted REAL NOT NULL,
    state TEXT NOT NULL,
    subjobs INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    attained REAL NOT NULL DEFAULT 0,
    last_mib REAL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS chain_jobs (
    job TEXT PRIMARY KEY,
    chain TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS subjobs (
    job TEXT NOT NULL,
    run INTEGER NOT NULL,
    offer INTEGER,
    profile TEXT NOT NULL,
    memory_slices INTEGER NOT NULL,
    memory_mib REAL NOT NULL,
    window_s REAL NOT NULL,
    granted_at REAL NOT NULL,
    started_at REAL,
    deadline REAL,
    ended_at REAL,
    exit_status INTEGER,
    outcome TEXT,
    PRIMARY KEY (job, run)
);
CREATE TABLE IF NOT EXISTS offers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    node TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    model TEXT NOT NULL,
    profile TEXT NOT NULL,
    start INTEGER NOT NULL,
    opens REAL NOT NULL,
    closes REAL NOT NULL,
    granted TEXT
);
CREATE TABLE IF NOT EXISTS replies (
    offer INTEGER NOT NULL,
    job TEXT NOT NULL,
    interested INTEGER NOT NULL,
    profile TEXT,
    duration REAL NOT NULL,
    bound_mib REAL NOT NULL,
    basis TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decision_spots (
    job TEXT NOT NULL,
    rank INTEGER NOT NULL,
    gpu INTEGER NOT NULL,
    profile TEXT NOT NULL,
    start INTEGER NOT NULL,
    PRIMARY KEY (job, rank)
);
CREATE TABLE IF NOT EXISTS slots (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request TEXT NOT NULL,
    node TEXT NOT NULL,
    gpu INTEGER NOT NULL,
    model TEXT NOT NULL,
    profile TEXT NOT NULL,
    start INTEGER NOT NULL,
    made_at REAL NOT NULL,
    withdrawn_at REAL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    job TEXT,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events(job, kind);
CREATE INDEX IF NOT EXISTS events_time ON events(time);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind);
"""


class StateError(MigBatchError, RuntimeError):
    pass


_DECISION_STATES = {state.value: state for state in DecisionState}  # a dict lookup: DecisionState(text) costs 1 µs


def _decision(row: tuple[Any, ...]) -> Decision:
    job, request, node, gpu, model, profile, start, state, policy = row
    return Decision(job, request, node, gpu, model, profile, start, _DECISION_STATES[state], policy)


@dataclass(frozen=True)
class Decision:
    """One managed job's placement. ``request`` is the job's request as its tag says it (the store keeps
    that text); ``tag`` is the same request parsed, once."""

    job: str
    request: str
    node: str
    gpu: int
    model: str
    profile: str
    start: int
    state: DecisionState
    policy: str

    @property
    def tag(self) -> JobTag:
        """The parsed request (ValueError where the text is not a request); parse_tag memoises each text."""
        return parse_tag(self.request)


@dataclass(frozen=True)
class SlotRecord:
    """A placement decided ahead for the next job of ``request`` that job_submit.lua binds to it."""

    id: int
    request: str
    node: str
    gpu: int
    model: str
    profile: str
    start: int
    made_at: float = 0.0
    withdrawn_at: float | None = None  # out of the published file since then; its spot is freed later


@dataclass(frozen=True)
class ChainRecord:
    job: str
    checkpoint_dir: str
    declared_mib: float
    min_s: float
    max_s: float
    deadline: float | None
    submitted: float
    state: str  # waiting, running, done, failed, cancelled
    subjobs: int
    failures: int
    attained: float  # slice-seconds
    last_mib: float | None


@dataclass(frozen=True)
class SubjobRecord:
    job: str
    run: int
    offer: int | None
    profile: str
    memory_slices: int
    memory_mib: float
    window_s: float
    granted_at: float
    started_at: float | None
    deadline: float | None
    ended_at: float | None
    exit_status: int | None
    outcome: str | None


@dataclass(frozen=True)
class InstanceRecord:
    job: str
    node: str
    gpu: int
    profile: str
    start: int
    gi_id: int
    uuid: str


def _private(path: Path) -> None:
    """Make the store file (and tighten it and its WAL files when they exist) owner-only whatever the umask:
    it holds every job's placement and owner-written request text."""
    for name, flags in ((path, os.O_CREAT), (Path(f"{path}-wal"), 0), (Path(f"{path}-shm"), 0)):
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | flags, 0o600)
            try:
                with contextlib.suppress(PermissionError):  # another user's file: theirs to tighten
                    os.fchmod(fd, 0o600)
            finally:
                os.close(fd)


def _not_ours(application_id: int, version: int, tables: set[str]) -> str:
    """Why an SQLite file is not a mig_batch store ("" when it is): a store carries :data:`APPLICATION_ID`; one
    made before the mark (it gets it at mig-batchd's next open) has a schema version and our decisions and
    events tables."""
    if application_id == APPLICATION_ID or (application_id == 0 and version > 0 and {"decisions", "events"} <= tables):
        return ""
    return (f"no mig_batch schema mark: application_id {application_id}, schema version {version}, {len(tables)} "
            "table(s)")  # fmt: skip


def _refuse_unless_ours(path: Path) -> None:
    """Refuse (:class:`StateError`) an existing, non-empty file at ``path`` that is not a mig_batch store, before
    anything touches it: not its mode, its journal mode nor its tables (another program's database, or a
    text file, named by mistake in ``state:``)."""
    try:
        if path.stat().st_size == 0:
            return  # a new store: an empty file (touched, or left by a crash before the first write)
        db = sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True, timeout=30)
    except FileNotFoundError:
        return
    except (OSError, sqlite3.Error) as exc:
        raise StateError(f"cannot open the mig_batch store {path}: {getattr(exc, 'strerror', None) or exc}; set "
                         "state: in the site config to a file on a writable local disk") from None  # fmt: skip
    try:
        application_id = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.OperationalError as exc:  # locked, unreadable: not a verdict on it
        raise StateError(f"cannot open the mig_batch store {path}: {exc}; set state: in the site config to a file "
                         "on a writable local disk") from None  # fmt: skip
    except sqlite3.DatabaseError as exc:  # not SQLite at all
        raise StateError(f"{path} is not a mig_batch store ({exc}), left as it was; {NOT_A_STORE}") from None
    finally:
        db.close()
    why = _not_ours(application_id, version, tables)
    if why and (tables or version or application_id):  # an SQLite file with nothing in it: a new store
        raise StateError(f"{path} is not a mig_batch store ({why}), left as it was; {NOT_A_STORE}")


IN_MEMORY = ":memory:"


class Store:
    def __init__(self, path: Path | str, create: bool = True):
        """Open the store at ``path``; ``create=False`` (readers such as ``mig-batch status``) opens it read-only
        and refuses to make a new one, so a wrong path is reported instead of answered with an empty store, and
        any other SQLite file it names is refused, left as it was."""
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise StateError(f"no mig_batch store at {self.path}: mig-batchd creates it on the controller host; "
                             "run this there, or set state: in the site config (--config) to its path")  # fmt: skip
        if create:
            _refuse_unless_ours(self.path)
        try:
            if create:
                if str(path) != IN_MEMORY:  # SQLite's name for a store in memory (tests): no file to make
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    _private(self.path)
                self.db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
                self.db.execute("PRAGMA journal_mode=WAL")
            else:
                self.db = sqlite3.connect(f"file:{quote(str(self.path.absolute()))}?mode=ro", uri=True, timeout=30,
                                          isolation_level=None)  # fmt: skip
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA busy_timeout=30000")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            application_id = self.db.execute("PRAGMA application_id").fetchone()[0]
            tables = {row[0] for row in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except (OSError, sqlite3.OperationalError) as exc:  # cannot be opened (or locked): not a verdict on it
            why = getattr(exc, "strerror", None) or str(exc)
            raise StateError(f"cannot open the mig_batch store {self.path}: {why}; set state: in the site config "
                             "to a file on a writable local disk") from None  # fmt: skip
        except sqlite3.DatabaseError as exc:  # not SQLite at all
            raise StateError(f"{self.path} is not a mig_batch store ({exc}); {NOT_A_STORE}") from None
        why = _not_ours(application_id, version, tables)
        if why and (not create or tables):  # a writer found it empty (checked before): its new store
            self.db.close()  # another program's SQLite file: read, never written (an older store: below)
            raise StateError(f"{self.path} is not a mig_batch store ({why}), left as it was; {NOT_A_STORE}")
        if version > SCHEMA_VERSION:
            raise StateError(f"{self.path} has schema {version}; this mig_batch knows up to {SCHEMA_VERSION}")
        if version < SCHEMA_VERSION and not create and version > 0:
            self.db.close()  # a reader must not migrate the store under a mig-batchd of the older version
            raise StateError(f"{self.path} has schema {version}, older than this mig_batch's {SCHEMA_VERSION}: "
                             "restart mig-batchd with this version first (it migrates the store), then run this "
                             "again")  # fmt: skip
        self.backup: Path | None = None  # where the store was kept as it was before a schema migration
        if create and 0 < version < SCHEMA_VERSION:
            self.backup = self._keep_before_migration(version)
        if create or version < SCHEMA_VERSION:  # a writer adds what is missing: an index added since, too
            with self._tx() as db:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                if version < SCHEMA_VERSION:
                    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                if application_id != APPLICATION_ID:  # a new store, or one made before the mark
                    db.execute(f"PRAGMA application_id={APPLICATION_ID}")

    def _keep_before_migration(self, version: int) -> Path:
        """Copy the store, as it is, beside it before migrating it from schema ``version`` (SQLite's online
        backup: a consistent copy whatever its WAL holds), mode 0600: ``<store>.schema<N>-<UTC time>.bak``.
        Rolling back one release puts that file in the store's place (docs/slurm.md, Upgrades). A copy that
        cannot be made stops the migration: the store stays as it was."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        backup = self.path.with_name(f"{self.path.name}.schema{version}-{stamp}.bak")
        n = 1
        while backup.exists() or backup.is_symlink():
            backup = self.path.with_name(f"{self.path.name}.schema{version}-{stamp}.{n}.bak")
            n += 1
        try:
            _private(backup)  # made 0600 before a byte is in it, never through a link
            target = sqlite3.connect(str(backup))
            try:
                self.db.backup(target)
            finally:
                target.close()
        except (OSError, sqlite3.Error) as exc:
            self.db.close()
            raise StateError(f"cannot keep a copy of {self.path} before migrating it from schema {version} to "
                             f"{SCHEMA_VERSION} ({backup}: {getattr(exc, 'strerror', None) or exc}); the store is "
                             "left as it was: free space beside it and start again") from None  # fmt: skip
        logging.getLogger(__name__).warning(
            "migrating %s from schema %d to %d; the store as it was is kept in %s (docs/slurm.md, Upgrades: rolling "
            "back)", self.path, version, SCHEMA_VERSION, backup)  # fmt: skip
        return backup

    @classmethod
    @contextmanager
    def reading(cls, path: Path | str) -> Iterator[Store]:
        """An existing store, open for the length of a ``with`` (the CLI's readers); never creates one."""
        store = cls(path, create=False)
        try:
            yield store
        finally:
            store.close()

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
    @staticmethod
    def _upsert_decision(db: sqlite3.Connection, d: Decision, now: float) -> None:
        db.execute(
            "INSERT INTO decisions VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(job) DO UPDATE SET "
            "request=excluded.request, node=excluded.node, gpu=excluded.gpu, model=excluded.model, "
            "profile=excluded.profile, start=excluded.start, state=excluded.state, policy=excluded.policy, "
            "updated_at=excluded.updated_at",
            (d.job, d.request, d.node, d.gpu, d.model, d.profile, d.start, d.state, d.policy, now, now),
        )

    def record_decision(self, d: Decision, event: str = "decided",
                        spots: tuple[tuple[int, str, int], ...] = ()) -> None:  # fmt: skip
        """Record ``d``; for a multi-instance job also every rank's (gpu, profile, start), in the same
        transaction (all or none). Rank 0 must be the decision's own spot."""
        if spots and spots[0] != (d.gpu, d.profile, d.start):
            raise ValueError(f"job {d.job}: rank 0 {spots[0]} is not the decision's spot")
        now = time.time()
        with self._tx() as db:
            self._upsert_decision(db, d, now)
            db.execute("DELETE FROM decision_spots WHERE job=?", (d.job,))
            if len(spots) > 1:
                db.executemany("INSERT INTO decision_spots VALUES (?,?,?,?,?)",
                               [(d.job, rank, *spot) for rank, spot in enumerate(spots)])  # fmt: skip
            detail: dict[str, Any] = {"node": d.node, "gpu": d.gpu, "profile": d.profile, "start": d.start}
            if len(spots) > 1:
                detail["spots"] = [f"{g}/{p}@{s}" for g, p, s in spots]
            self._event(db, d.job, event, detail)

    def spots(self, job: str) -> list[tuple[int, str, int]]:
        """A multi-instance job's (gpu, profile, start) in rank order; [] for a single-instance job."""
        rows = self.db.execute("SELECT gpu, profile, start FROM decision_spots WHERE job=? ORDER BY rank",
                               (job,)).fetchall()  # fmt: skip
        return [(int(g), str(p), int(s)) for g, p, s in rows]

    def set_state(self, job: str, state: DecisionState, **detail: Any) -> None:
        """Move a decision to ``state`` (checked against the allowed transitions), with an event."""
        with self._tx() as db:
            row = db.execute("SELECT state FROM decisions WHERE job=?", (job,)).fetchone()
            check_decision(row[0] if row else None, state)
            db.execute("UPDATE decisions SET state=?, updated_at=? WHERE job=?", (str(state), time.time(), job))
            self._event(db, job, str(state), detail)

    def set_states(self, jobs: list[str], state: DecisionState) -> None:
        """:meth:`set_state` for many jobs in one transaction (a pass releases hundreds)."""
        if not jobs:
            return
        now = time.time()
        with self._tx() as db:
            for job in jobs:
                row = db.execute("SELECT state FROM decisions WHERE job=?", (job,)).fetchone()
                check_decision(row[0] if row else None, state)
            db.executemany("UPDATE decisions SET state=?, updated_at=? WHERE job=?",
                           [(str(state), now, j) for j in jobs])  # fmt: skip
            db.executemany("INSERT INTO events (time, job, kind, detail) VALUES (?,?,?,?)",
                           [(now, j, str(state), "{}") for j in jobs])  # fmt: skip

    def decision(self, job: str) -> Decision | None:
        row = self.db.execute(f"SELECT {_DECISION_COLS} FROM decisions WHERE job=?", (job,)).fetchone()
        return _decision(row) if row else None

    def decisions(self, states: tuple[str, ...] = ACTIVE) -> list[Decision]:
        marks = ",".join("?" * len(states))
        rows = self.db.execute(
            f"SELECT {_DECISION_COLS} FROM decisions WHERE state IN ({marks}) ORDER BY decided_at",
            [str(s) for s in states],
        ).fetchall()
        return [_decision(r) for r in rows]

    def count_decisions(self, job: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM events WHERE job=? AND kind='decided'", (job,)).fetchone()[0])

    # prompt slots
    def add_slots(self, slots: list[tuple[str, str, int, str, str, int]],
                  made_at: float | None = None) -> list[SlotRecord]:  # fmt: skip
        """Record new slots, each (request, node, gpu, model, profile, start), made at ``made_at`` (the
        controller's clock; None: now), in one transaction; with their ids. An id is never given twice, a lost
        store's included (job_submit.lua remembers the ids it bound): at least the wall time in milliseconds."""
        made, now = [], time.time()
        made_at = now if made_at is None else made_at
        with self._tx() as db:
            row = db.execute("SELECT seq FROM sqlite_sequence WHERE name='slots'").fetchone()
            next_id = max(int(row[0]) + 1 if row else 1, int(now * 1000))
            for k, slot in enumerate(slots):
                db.execute("INSERT INTO slots (id, request, node, gpu, model, profile, start, made_at) VALUES "
                           "(?,?,?,?,?,?,?,?)", (next_id + k, *slot, made_at))  # fmt: skip
                made.append(SlotRecord(next_id + k, *slot, made_at=made_at))
        return made

    def record_bindings(self, bound: list[tuple[Decision, int]]) -> None:
        """The decisions of jobs job_submit.lua bound to slots, each with its slot, which goes: one transaction."""
        now = time.time()
        with self._tx() as db:
            for d, slot in bound:
                self._upsert_decision(db, d, now)
                db.execute("DELETE FROM decision_spots WHERE job=?", (d.job,))
                self._event(db, d.job, "decided", {"node": d.node, "gpu": d.gpu, "profile": d.profile,
                                                   "start": d.start, "slot": slot})  # fmt: skip
            db.executemany("DELETE FROM slots WHERE id=?", [(slot,) for _, slot in bound])

    def slots(self) -> list[SlotRecord]:
        rows = self.db.execute("SELECT id, request, node, gpu, model, profile, start, made_at, withdrawn_at FROM "
                               "slots ORDER BY id").fetchall()  # fmt: skip
        return [SlotRecord(*r) for r in rows]

    def withdraw_slots(self, ids: Collection[int], at: float) -> None:
        with self._tx() as db:
            db.executemany("UPDATE slots SET withdrawn_at=? WHERE id=? AND withdrawn_at IS NULL",
                           [(at, i) for i in ids])  # fmt: skip

    def drop_slots(self, ids: Collection[int]) -> None:
        with self._tx() as db:
            db.executemany("DELETE FROM slots WHERE id=?", [(i,) for i in ids])

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

    def record_instances(self, records: list[InstanceRecord]) -> None:
        """A multi-instance job's instances in one transaction: rank 0 under the job, rank r under ``job#r``."""
        with self._tx() as db:
            for rank, r in enumerate(records):
                key = rank_key(r.job, rank)
                db.execute("INSERT OR REPLACE INTO instances VALUES (?,?,?,?,?,?,?,?)",
                           (key, r.node, r.gpu, r.profile, r.start, r.gi_id, r.uuid, time.time()))  # fmt: skip
            self._event(db, records[0].job, "instance-created", {"node": records[0].node, "uuids": [
                r.uuid for r in records]})  # fmt: skip

    def forget_instance(self, job: str, **detail: Any) -> None:
        # every rank after the first: the keys from "job#" up to the next character, a range over the
        # primary key (a substr() test read every instance, 1 ms a job with 18,000 running)
        prefix = job + RANK_SEPARATOR
        after = job + chr(ord(RANK_SEPARATOR) + 1)
        with self._tx() as db:
            db.execute("DELETE FROM instances WHERE job=? OR (job>=? AND job<?)", (job, prefix, after))
            self._event(db, job, "instance-destroyed", detail)

    # chains (SJA)
    def add_chain(self, c: ChainRecord) -> bool:
        """Register a chain once; False when it is known already."""
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO chains VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (c.job, c.checkpoint_dir, c.declared_mib, c.min_s, c.max_s, c.deadline, c.submitted, c.state,
                 c.subjobs, c.failures, c.attained, c.last_mib, time.time()),
            )  # fmt: skip
            if cur.rowcount:
                db.execute("INSERT OR IGNORE INTO chain_jobs VALUES (?,?)", (c.job, c.job))
                self._event(db, c.job, "chain-registered", {"checkpoint_dir": c.checkpoint_dir})
            return bool(cur.rowcount)

    def link_job(self, job: str, chain: str) -> None:
        """A later Slurm job of ``chain`` (one job per subjob): it runs the chain's next subjobs."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO chain_jobs VALUES (?,?)", (job, chain))
            self._event(db, chain, "chain-job", {"job": job})

    def latest_chain_job(self, chain: str) -> str | None:
        """The job that runs the chain's subjobs now (None: no chain of that name)."""
        row = self.db.execute("SELECT job FROM chain_jobs WHERE chain=? ORDER BY rowid DESC LIMIT 1",
                              (chain,)).fetchone()  # fmt: skip
        return row[0] if row else None

    def chain_jobs(self, chain: str) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT job FROM chain_jobs WHERE chain=? ORDER BY rowid", (chain,))]

    @staticmethod
    def _chain_of(db: sqlite3.Connection, job: str) -> str:
        """The chain a Slurm job runs subjobs of (the chain is named by its first job)."""
        row = db.execute("SELECT chain FROM chain_jobs WHERE job=?", (job,)).fetchone()
        return row[0] if row else job

    def chain(self, job: str) -> ChainRecord | None:
        """The chain of ``job``: its first Slurm job or any later one linked to it."""
        row = self.db.execute(f"SELECT {_CHAIN_COLS} FROM chains WHERE job=?", (self._chain_of(self.db, job),)
                              ).fetchone()  # fmt: skip
        return ChainRecord(*row) if row else None

    def chains(self, states: tuple[str, ...] | None = None) -> list[ChainRecord]:
        if states is None:
            rows = self.db.execute(f"SELECT {_CHAIN_COLS} FROM chains ORDER BY submitted").fetchall()
        else:
            marks = ",".join("?" * len(states))
            rows = self.db.execute(f"SELECT {_CHAIN_COLS} FROM chains WHERE state IN ({marks}) ORDER BY submitted",
                                   states).fetchall()  # fmt: skip
        return [ChainRecord(*r) for r in rows]

    def grant_subjob(self, d: Decision, sub: SubjobRecord) -> None:
        """Record a grant: the decision and the subjob row in one transaction (before Slurm hears of it)."""
        now = time.time()
        with self._tx() as db:
            chain = self._chain_of(db, sub.job)
            self._upsert_decision(db, d, now)
            db.execute("INSERT OR REPLACE INTO subjobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (chain, sub.run, sub.offer, sub.profile, sub.memory_slices, sub.memory_mib, sub.window_s,
                        now, None, None, None, None, None))  # fmt: skip
            db.execute("UPDATE offers SET granted=? WHERE id=?", (d.job, sub.offer))
            db.execute("UPDATE chains SET state='granted', updated_at=? WHERE job=?", (now, chain))
            self._event(db, d.job, "decided", {"node": d.node, "gpu": d.gpu, "profile": d.profile, "start": d.start,
                                               "subjob": sub.run, "window_s": sub.window_s})  # fmt: skip

    def start_subjob(self, job: str, started_at: float) -> SubjobRecord | None:
        """The granted, not yet started subjob of ``job`` started at ``started_at``."""
        now = started_at
        with self._tx() as db:
            job = self._chain_of(db, job)
            sub = self._open_subjob(db, job)
            if sub is None:
                return None
            if sub.started_at is None:
                db.execute("UPDATE subjobs SET started_at=?, deadline=? WHERE job=? AND run=?",
                           (now, now + sub.window_s, job, sub.run))  # fmt: skip
                db.execute("UPDATE chains SET state='running', updated_at=? WHERE job=?", (now, job))
                sub = SubjobRecord(*db.execute(f"SELECT {_SUBJOB_COLS} FROM subjobs WHERE job=? AND run=?",
                                                (job, sub.run)).fetchone())  # fmt: skip
            return sub

    def end_subjob(self, job: str, exit_status: int | None, outcome: str, chain_state: str) -> SubjobRecord | None:
        """Close the chain's open subjob with its outcome; count service, failures and subjobs."""
        now = time.time()
        with self._tx() as db:
            job = self._chain_of(db, job)
            sub = self._open_subjob(db, job)
            ran = (now - sub.started_at) * sub.memory_slices if sub and sub.started_at else 0.0
            if sub is not None:
                db.execute("UPDATE subjobs SET ended_at=?, exit_status=?, outcome=? WHERE job=? AND run=?",
                           (now, exit_status, outcome, job, sub.run))  # fmt: skip
            failed, counts = outcome == "failed", sub is not None and outcome != "not-started"
            # failures in a row: a failure adds one, a subjob that ran its course clears them, and one taken
            # back (not started, requeued by the batch system) leaves them as they were
            kept = outcome in INTERRUPTED
            db.execute(
                "UPDATE chains SET state=?, subjobs=subjobs+?, "
                "failures=CASE WHEN ? THEN failures+1 WHEN ? THEN failures ELSE 0 END, "
                "attained=attained+?, last_mib=COALESCE(?, last_mib), updated_at=? WHERE job=?",
                (chain_state, 1 if counts else 0, failed, kept, ran, sub.memory_mib if sub else None, now, job),
            )
            self._event(db, job, f"subjob-{outcome}", {"run": sub.run if sub else None, "exit_status": exit_status,
                                                       "chain": chain_state})  # fmt: skip
            return sub

    @staticmethod
    def _open_subjob(db: sqlite3.Connection, chain: str) -> SubjobRecord | None:
        row = db.execute(f"SELECT {_SUBJOB_COLS} FROM subjobs WHERE job=? AND ended_at IS NULL "
                         "ORDER BY run DESC LIMIT 1", (chain,)).fetchone()  # fmt: skip
        return SubjobRecord(*row) if row else None

    def open_subjob(self, job: str) -> SubjobRecord | None:
        """The subjob of ``job``'s chain granted or running now (None: none is)."""
        return self._open_subjob(self.db, self._chain_of(self.db, job))

    def subjobs(self, job: str) -> list[SubjobRecord]:
        rows = self.db.execute(f"SELECT {_SUBJOB_COLS} FROM subjobs WHERE job=? ORDER BY run",
                               (self._chain_of(self.db, job),)).fetchall()  # fmt: skip
        return [SubjobRecord(*r) for r in rows]

    def record_round(self, offers: list[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]) -> list[int]:
        """Persist offers (node, gpu, model, profile, start, opens, closes) with their replies
        (job, interested, profile, duration, bound_mib, basis, reason); returns the offer ids."""
        now, ids = time.time(), []
        with self._tx() as db:
            for offer, replies in offers:
                cur = db.execute("INSERT INTO offers (time, node, gpu, model, profile, start, opens, closes) "
                                 "VALUES (?,?,?,?,?,?,?,?)", (now, *offer))  # fmt: skip
                assert cur.lastrowid is not None  # an INSERT's row
                ids.append(cur.lastrowid)
                db.executemany("INSERT INTO replies VALUES (?,?,?,?,?,?,?,?)", [(cur.lastrowid, *r) for r in replies])
        return ids

    def offers(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT id, time, node, gpu, model, profile, start, opens, closes, granted FROM offers "
                               "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()  # fmt: skip
        out = []
        for oid, t, node, gpu, model, profile, start, opens, closes, granted in rows:
            replies = self.db.execute("SELECT job, interested, profile, duration, bound_mib, basis, reason "
                                      "FROM replies WHERE offer=?", (oid,)).fetchall()  # fmt: skip
            out.append({"id": oid, "time": t, "node": node, "gpu": gpu, "model": model, "profile": profile,
                        "start": start, "opens": opens, "closes": closes, "granted": granted,
                        "replies": [dict(zip(("job", "interested", "profile", "duration", "bound_mib", "basis",
                                              "reason"), r, strict=True)) for r in replies]})  # fmt: skip
        return out

    # retention
    def prune(self, before: float, live: Collection[str] | None = None, batch: int = 400,
              budget_s: float = math.inf) -> tuple[dict[str, int], bool]:  # fmt: skip
        """Forget what ended before ``before`` (epoch seconds), so that the store stops growing:
          - chains over and unchanged since, with their jobs and subjobs; also, where ``live`` (the jobs
            the batch system lists now) is given, chains unchanged since none of whose jobs is listed
            (abandoned: their held job was cancelled before a subjob ran);
          - decisions ended or requeued and unchanged since, with their ranks and their job's events, save
            those of a chain kept;
          - the events older than that of jobs with no decision (waiting, unplaceable, ...), and of no job;
          - gaps offered that closed before it and that no kept subjob names, with their replies.
        Each node's newest ``mig-off`` and ``node-problem`` events are kept (``mig-batch status`` and a
        restarted mig-batchd read them back), and an active decision's job keeps every event. The rows of
        at most ``batch`` jobs, chains or offers go per transaction, so that mig-batchd's own writes and the
        readers wait for one of them at most. After the first transaction, none starts past ``budget_s``:
        every call makes progress. Returns the rows deleted per table, and whether nothing is left."""
        gone = {"chains": 0, "decisions": 0, "events": 0, "offers": 0}
        budget = _Budget(budget_s)
        (over, over_args), (decidable, decidable_args) = _marks(CHAIN_OVER), _marks(DECIDABLE)
        self._keep_newest_node_events()
        chains = self._ids(f"SELECT job FROM chains WHERE state IN ({over}) AND updated_at<?", [*over_args, before])
        chains += self._abandoned_chains(before, live)
        for i in range(0, len(chains), batch):
            if not budget.left():
                return gone, False
            part = chains[i : i + batch]
            with self._tx() as db:
                marks = ",".join("?" * len(part))
                db.execute(f"DELETE FROM subjobs WHERE job IN ({marks}) OR job IN "
                           f"(SELECT job FROM chain_jobs WHERE chain IN ({marks}))", part * 2)  # fmt: skip
                db.execute(f"DELETE FROM chain_jobs WHERE chain IN ({marks})", part)
                db.execute(f"DELETE FROM chains WHERE job IN ({marks})", part)
            gone["chains"] += len(part)
            budget.spend()
        going = f"SELECT job FROM chains WHERE state NOT IN ({over})"
        kept = f"job IN ({going}) OR job IN (SELECT job FROM chain_jobs WHERE chain IN ({going}))"
        keep = "id NOT IN (SELECT id FROM temp.prune_keep)"
        ended = f"SELECT job FROM decisions WHERE state IN ({decidable}) AND updated_at<? AND NOT ({kept}) LIMIT ?"
        for db, jobs, marks in self._batches(budget, ended, [*decidable_args, before, *over_args, *over_args, batch]):
            gone["events"] += db.execute(f"DELETE FROM events WHERE job IN ({marks}) AND {keep}", jobs).rowcount
            db.execute(f"DELETE FROM decision_spots WHERE job IN ({marks})", jobs)
            db.execute(f"DELETE FROM decisions WHERE job IN ({marks})", jobs)
            gone["decisions"] += len(jobs)
        undecided = (f"SELECT id FROM events WHERE time<? AND {keep} AND (job IS NULL OR (job NOT IN "
                     f"(SELECT job FROM decisions) AND NOT ({kept}))) LIMIT ?")  # fmt: skip
        for db, ids, marks in self._batches(budget, undecided, [before, *over_args, *over_args, batch]):
            db.execute(f"DELETE FROM events WHERE id IN ({marks})", ids)
            gone["events"] += len(ids)
        closed = ("SELECT id FROM offers WHERE closes<? AND id NOT IN "
                  "(SELECT offer FROM subjobs WHERE offer IS NOT NULL) LIMIT ?")  # fmt: skip
        for db, offers, marks in self._batches(budget, closed, [before, batch]):
            db.execute(f"DELETE FROM replies WHERE offer IN ({marks})", offers)
            db.execute(f"DELETE FROM offers WHERE id IN ({marks})", offers)
            gone["offers"] += len(offers)
        return gone, budget.left()

    def _batches(self, budget: _Budget, select: str,
                 args: list[Any]) -> Iterator[tuple[sqlite3.Connection, list[Any], str]]:  # fmt: skip
        """Each batch of ids ``select`` finds while ``budget`` lasts, with its placeholders, in a transaction of
        its own (rolled back if the caller's work on it fails)."""
        while budget.left() and (ids := self._ids(select, args)):
            with self._tx() as db:
                yield db, ids, ",".join("?" * len(ids))
            budget.spend()

    def _keep_newest_node_events(self) -> None:
        """Note, in a table of this connection, each node's newest event of the kinds read back."""
        self.db.execute("CREATE TEMP TABLE IF NOT EXISTS prune_keep (id INTEGER PRIMARY KEY)")
        self.db.execute("DELETE FROM temp.prune_keep")
        marks, kinds = _marks(READ_BACK)
        self.db.execute(f"INSERT INTO temp.prune_keep SELECT max(id) FROM events WHERE kind IN ({marks}) "
                        "GROUP BY kind, json_extract(detail, '$.node')", kinds)  # fmt: skip

    def _abandoned_chains(self, before: float, live: Collection[str] | None) -> list[str]:
        """Chains not over, unchanged since ``before``, none of whose jobs is in ``live`` (None: not judged)."""
        if live is None:
            return []
        over, over_args = _marks(CHAIN_OVER)
        stale = self._ids(f"SELECT job FROM chains WHERE state NOT IN ({over}) AND updated_at<?", [*over_args, before])
        return [c for c in stale if c not in live and not any(j in live for j in self.chain_jobs(c))]

    def _ids(self, sql: str, args: list[Any]) -> list[Any]:
        return [row[0] for row in self.db.execute(sql, args)]

    # events
    def event(self, job: str | None, kind: str, **detail: Any) -> None:
        with self._tx() as db:
            self._event(db, job, kind, detail)

    def events(self, job: str | None = None, kind: str | Collection[str] | None = None, node: str | None = None,
               since: float | None = None, last: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """Events, oldest first: of ``job``, of ``kind`` (or of any of several kinds), about ``node`` (naming
        it, or of a job decided there), at or after ``since`` (epoch seconds); only the newest ``last`` of
        them when given."""
        sql = "SELECT time, job, kind, detail FROM events WHERE 1=1"
        args: list[Any] = []
        if job is not None:
            sql, args = sql + " AND job=?", [*args, job]
        if kind is not None:
            kinds = [kind] if isinstance(kind, str) else sorted(kind)
            sql, args = sql + f" AND kind IN ({','.join('?' * len(kinds))})", [*args, *kinds]
        if node is not None:
            sql += " AND (json_extract(detail, '$.node')=? OR job IN (SELECT job FROM decisions WHERE node=?))"
            args = [*args, node, node]
        if since is not None:
            sql, args = sql + " AND time>=?", [*args, since]
        if last is not None:
            sql, args = f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT ?)", [*args, last]
            rows = self.db.execute(sql, args).fetchall()[::-1]
        else:
            rows = self.db.execute(sql + " ORDER BY id", args).fetchall()
        return [{"time": t, "job": j, "kind": k, **json.loads(d)} for t, j, k, d in rows]

    def newest_node_events(self, kind: str) -> dict[str, dict[str, Any]]:
        """The newest event of ``kind`` that names each node (``mig-off``, ``node-problem``, ...), by node, in
        one query through the kind's index (``events(kind=, node=, last=1)`` per node reads back through
        every event for a node that has none)."""
        rows = self.db.execute(
            "SELECT detail FROM events WHERE id IN (SELECT max(id) FROM events WHERE kind=? "
            "GROUP BY json_extract(detail, '$.node'))", (kind,))  # fmt: skip
        newest = (json.loads(detail) for (detail,) in rows)
        return {str(d["node"]): d for d in newest if d.get("node") is not None}

    def event_kinds(self) -> list[str]:
        """The kinds of the events recorded, sorted."""
        return [k for (k,) in self.db.execute("SELECT DISTINCT kind FROM events ORDER BY kind")]

    @staticmethod
    def _event(db: sqlite3.Connection, job: str | None, kind: str, detail: dict[str, Any]) -> None:
        db.execute("INSERT INTO events (time, job, kind, detail) VALUES (?,?,?,?)",
                   (time.time(), job, kind, json.dumps(detail)))  # fmt: skip


class _Budget:
    """Seconds for a prune, counted from its first transaction."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.until = seconds, math.inf

    def spend(self) -> None:
        if self.until == math.inf:
            self.until = time.monotonic() + self.seconds

    def left(self) -> bool:
        return time.monotonic() < self.until


def _marks(values: tuple[str, ...]) -> tuple[str, list[str]]:
    """SQL placeholders for ``values`` and the values as text: ``IN ({marks})``."""
    return ",".join("?" * len(values)), [str(v) for v in values]


_DECISION_COLS = "job, request, node, gpu, model, profile, start, state, policy"
_INSTANCE_COLS = "job, node, gpu, profile, start, gi_id, uuid"
_CHAIN_COLS = ("job, checkpoint_dir, declared_mib, min_s, max_s, deadline, submitted, state, subjobs, failures, "
               "attained, last_mib")  # fmt: skip
_SUBJOB_COLS = ("job, run, offer, profile, memory_slices, memory_mib, window_s, granted_at, started_at, deadline, "
                "ended_at, exit_status, outcome")  # fmt: skip
