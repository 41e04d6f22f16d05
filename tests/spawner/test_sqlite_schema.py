import sqlite3
from pathlib import Path

import pytest

from spawner.ledger import SCHEMA_STEPS, Ledger
from spawner.sqlite_schema import SchemaError, migrate, statements, version

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


def test_a_process_that_read_the_version_before_another_migrated_takes_no_step_twice(tmp_path: Path) -> None:
    """The hub and the reclaimer open a new ledger at once: one reads version 0, the other takes every
    step before the first gets the write lock. The first must not add the column again."""
    path = tmp_path / "s.sqlite"
    first, other = _db(path), _db(path)

    def the_other_migrates_meanwhile(statement: str) -> None:
        # Called as the first asks for the write lock, after it read version 0: the other gets it first.
        if statement.startswith("BEGIN IMMEDIATE") and version(other) == 0:
            migrate(other, (STEP1, STEP2), "s")

    first.set_trace_callback(the_other_migrates_meanwhile)
    assert migrate(first, (STEP1, STEP2), "s") == 2
    first.set_trace_callback(None)
    assert [c[1] for c in first.execute("PRAGMA table_info(t)")] == ["a", "b"]


def test_a_step_of_several_statements_and_a_trigger_runs_whole() -> None:
    step = """CREATE TABLE t (a INTEGER); CREATE TABLE u (b INTEGER);
    CREATE TRIGGER tu AFTER INSERT ON t BEGIN INSERT INTO u (b) VALUES (new.a); END;
    """
    assert len(statements(step)) == 3
    assert statements(step)[2].endswith("END;")
    db = sqlite3.connect(":memory:", isolation_level=None)
    assert migrate(db, (step,), "s") == 1
    db.execute("INSERT INTO t (a) VALUES (5)")
    assert db.execute("SELECT b FROM u").fetchall() == [(5,)]
