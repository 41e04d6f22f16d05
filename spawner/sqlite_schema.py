"""Versioned schemas for gpuslice's own SQLite stores (the ledger, the incident store, ...).

Each store lists its schema as steps; a file's ``PRAGMA user_version`` says how many it has
taken. Opening a store runs the steps it has not taken, each in a transaction of its own, so
a file made by an earlier release is brought forward in place (``gpuslice upgrade`` opens
every store once). Step 1 must be idempotent (``CREATE ... IF NOT EXISTS``): files written
before the stores were versioned say 0 and already hold it. A file newer than this code (a
downgrade) is refused with a message, never written.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence


class SchemaError(RuntimeError):
    """A store's file cannot be used by this version of gpuslice; the message says what to do."""


def version(db: sqlite3.Connection) -> int:
    row = db.execute("PRAGMA user_version").fetchone()
    return int(row[0]) if row else 0


def migrate(db: sqlite3.Connection, steps: Sequence[str], what: str) -> int:
    """Run the steps ``db`` has not taken; return the version it is at now.

    ``what`` names the store in errors (its path, for instance).
    """
    have = version(db)
    if have > len(steps):
        raise SchemaError(
            f"{what} was written by a newer gpuslice (schema {have}, this one knows {len(steps)}): "
            "run that version, or restore a backup made by this one (gpuslice restore)"
        )
    if db.in_transaction:
        db.commit()  # as executescript did: what the caller began is its own, not the migration's
    for number in range(have + 1, len(steps) + 1):
        # The hub and its services open the same new file at once: each step is taken under the
        # write lock, and only if no other process took it while this one waited for the lock (a
        # reclaimer and a hub both adding a column once failed one of them: duplicate column name).
        db.execute("BEGIN IMMEDIATE")
        try:
            if version(db) < number:
                for statement in statements(steps[number - 1]):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")
            db.execute("COMMIT")
        except sqlite3.Error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    return len(steps)


def statements(script: str) -> list[str]:
    """A step's SQL as single statements (a trigger's body, with its own semicolons, stays whole)."""
    found, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\n;"):
                found.append(pending.strip())
            pending = ""
    if pending.strip(" \t\n;"):
        raise SchemaError(f"an incomplete SQL statement in a schema step: {pending.strip()[:80]!r}")
    return found
