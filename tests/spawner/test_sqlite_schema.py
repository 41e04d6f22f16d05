import sqlite3
from pathlib import Path

import pytest

from spawner.ledger import SCHEMA_STEPS, Ledger
from spawner.sqlite_schema import SchemaError, migrate, version

STEP1 = "CREATE TABLE IF NOT EXISTS t (a INTEGER);"
STEP2 = "ALTER TABLE t ADD COLUMN b TEXT NOT NULL DEFAULT 'x';"


def _db(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def test_a_new_file_takes_every_step(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.sqlite")
    assert migrate(db, (STEP1, STEP2), "s") == 2
    assert version(db) == 2
    db.execute("INSERT INTO t (a) VALUES (1)")
    assert db.execute("SELECT a, b FROM t").fetchall() == [(1, "x")]


def test_a_file_from_before_versioning_keeps_its_rows_and_takes_only_the_new_steps(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.sqlite")
    db.executescript(STEP1 + "INSERT INTO t (a) VALUES (7);")  # written by an unversioned release
    assert version(db) == 0
    migrate(db, (STEP1, STEP2), "s")
    assert db.execute("SELECT a, b FROM t").fetchall() == [(7, "x")]
    migrate(db, (STEP1, STEP2), "s")  # opened again: nothing runs twice (ALTER would fail)
    assert version(db) == 2


def test_a_file_from_a_newer_release_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.sqlite")
    migrate(db, (STEP1, STEP2), "s")
    with pytest.raises(SchemaError, match="newer gpuslice"):
        migrate(db, (STEP1,), "s")
    assert version(db) == 2


def test_a_step_that_fails_leaves_the_file_at_the_step_before(tmp_path: Path) -> None:
    db = _db(tmp_path / "s.sqlite")
    migrate(db, (STEP1,), "s")
    with pytest.raises(sqlite3.Error):
        migrate(db, (STEP1, "CREATE TABLE u (x); ALTER TABLE nowhere ADD COLUMN y;"), "s")
    assert version(db) == 1
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'u'").fetchall() == []


def test_the_ledger_is_versioned(tmp_path: Path) -> None:
    Ledger(tmp_path / "ledger.sqlite")
    assert version(_db(tmp_path / "ledger.sqlite")) == len(SCHEMA_STEPS)
