"""mig-batchd keeps a copy of the store before any schema migration (SQLite's backup API): the copy is the
store as it was, WAL included, private (0600), and rolling back one release is putting it in the store's
place. A copy that cannot be made stops the migration."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

from mig_batch.state import SCHEMA_VERSION, Store


def older_store(path: Path, rows: int = 3, pad: int = 0) -> sqlite3.Connection:
    """A store of schema 2 (made before chain_jobs and decision_spots) holding ``rows`` events, written after
    the last checkpoint: while the connection returned stays open they are in the WAL only, as a running
    mig-batchd leaves them."""
    Store(path).close()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("DROP TABLE chain_jobs")
    db.execute("DROP TABLE decision_spots")
    db.execute("PRAGMA user_version=2")
    db.execute("PRAGMA application_id=0")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for n in range(rows):
        db.execute("INSERT INTO events (time, job, kind, detail) VALUES (?, ?, 'decided', ?)",
                   (1000.0 + n, str(n), json.dumps({"pad": "x" * pad})))  # fmt: skip
    return db


def table_names(path: Path) -> set[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        db.close()


def schema_of(path: Path) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def events_of(path: Path) -> list[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [row[0] for row in db.execute("SELECT job FROM events ORDER BY time")]
    finally:
        db.close()


def test_a_migration_keeps_the_store_as_it_was_beside_it(tmp_path):
    path = tmp_path / "state.db"
    writer = older_store(path, rows=3)
    assert Path(f"{path}-wal").stat().st_size > 0  # the rows are in the WAL only
    store = Store(path)
    backup = store.backup
    store.close()
    writer.close()
    assert backup is not None and backup.parent == tmp_path
    assert backup.name.startswith("state.db.schema2-") and backup.name.endswith(".bak")
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert schema_of(backup) == 2 and schema_of(path) == SCHEMA_VERSION
    assert "decision_spots" not in table_names(backup) and "decision_spots" in table_names(path)
    assert events_of(backup) == ["0", "1", "2"]  # the WAL's rows too: a consistent copy

    # the store of the same version opened again: nothing to migrate, no second copy
    again = Store(path)
    assert again.backup is None
    again.close()
    assert sorted(p.name for p in tmp_path.glob("*.bak")) == [backup.name]

    # rolling back one release: the copy in the store's place (mig-batchd stopped, -wal/-shm removed)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(backup, path)
    assert schema_of(path) == 2 and events_of(path) == ["0", "1", "2"]


def test_a_new_store_and_a_current_one_get_no_copy(tmp_path):
    store = Store(tmp_path / "state.db")
    assert store.backup is None
    store.close()
    assert list(tmp_path.glob("*.bak")) == []


def test_a_copy_that_cannot_be_made_stops_the_migration(tmp_path):
    """The copy fails for want of room (a file size limit below the store's size): the store stays at its
    schema, and the message says why and what to do."""
    path = tmp_path / "state.db"
    older_store(path, rows=40, pad=4000).close()  # ~160 kB of events
    size = path.stat().st_size
    assert size > 100_000
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
        "from mig_batch.state import Store, StateError\n"
        "try:\n"
        f"    Store({str(path)!r})\n"
        "except StateError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(3)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert out.returncode == 3, out.stdout + out.stderr
    assert "cannot keep a copy of" in out.stdout and "left as it was" in out.stdout and "free space" in out.stdout
    assert schema_of(path) == 2 and len(events_of(path)) == 40
