"""The classes as the running hub keeps them: one SQLite file that the hub, its spawners and the CLI share.

A class is its rules as the settings write them (``members``, ``teachers``, ``max_slice``,
``budget``, ...; read by spawner/quotas.py's one model, ``GroupRules``). The spawners read the rules here
at every spawn and every form, so a class added, changed or removed takes effect at once,
without restarting the hub and without stopping anyone's server.

The settings file (or the chart's values) still declares classes: at each start the hub
``seed``s them into the store. A class is taken from the settings when it is new there or
when its definition there changed since it was last taken (the file's edit wins); changes
made live (the portal, ``gpuslice class ...``) to a class whose definition in the file did not
change stand across restarts. A class the file no longer names, taken from it before, goes.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spawner.quotas import DEFAULT_GROUP, GroupRules, GroupRulesError, read_group, read_groups
from spawner.sqlite_schema import SchemaError, migrate

Rules = dict[str, Any]  # one class's rules in settings spelling, with its "name"

# The store's schema, step by step (spawner/sqlite_schema.py): a later release adds steps.
SCHEMA_STEPS = (
    """CREATE TABLE IF NOT EXISTS class (
    name TEXT PRIMARY KEY,
    rules TEXT NOT NULL,
    seeded TEXT  -- the digest of the settings' definition it was last taken from; NULL: made live
);""",
)


class ClassStoreError(RuntimeError):
    """The store could not be read or written (a read-only volume, a locked file)."""


def digest(rules: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(rules, sort_keys=True, default=str).encode()).hexdigest()


def as_rules(group: GroupRules) -> Rules:
    """A class's rules in settings spelling with its name, as the store and the classes API keep them."""
    return {"name": group.name, **group.model_dump(mode="json", exclude_defaults=True, exclude={"name"})}


def checked(name: str, rules: Mapping[str, Any]) -> Rules:
    """``rules`` read as GroupRules (spawner/quotas.py), with the name; GroupRulesError says what is wrong."""
    if not name or not isinstance(name, str):
        raise GroupRulesError("a class needs a name")
    if name == DEFAULT_GROUP:
        raise GroupRulesError(f"{DEFAULT_GROUP!r} names the rules of users in no class: change them in the settings")
    return as_rules(read_group(name, {k: v for k, v in rules.items() if k != "name"}))


_MADE: set[Path] = set()  # the stores whose schema this process has made: reads need no write lock


class ClassStore:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).absolute()
        if self.path not in _MADE:
            with self._connect() as db:
                migrate(db, SCHEMA_STEPS, str(self.path))
            _MADE.add(self.path)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        except sqlite3.Error as exc:
            raise ClassStoreError(f"the class store {self.path} cannot be opened ({exc})") from exc
        try:
            yield db
        except (sqlite3.Error, SchemaError) as exc:
            raise ClassStoreError(f"the class store {self.path}: {exc}") from exc
        finally:
            db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One writer at a time: read, decide and write in one transaction."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def classes(self) -> tuple[Rules, ...]:
        """Every class's rules, by name."""
        with self._connect() as db:
            rows = db.execute("SELECT name, rules FROM class ORDER BY name").fetchall()
        return tuple({"name": name, **json.loads(rules)} for name, rules in rows)

    def groups(self) -> tuple[GroupRules, ...]:
        """Every class's rules as the spawners apply them."""
        return read_groups(list(self.classes()))

    def get(self, name: str) -> Rules | None:
        return next((c for c in self.classes() if c["name"] == name), None)

    def change(self, name: str, edit: Callable[[Rules | None], Rules | None]) -> Rules | None:
        """Apply ``edit`` to the class (None: there is none) in one transaction; it returns the new rules
        (None: remove the class). Checked before anything is written; returns what was written."""
        with self._write() as db:
            row = db.execute("SELECT rules FROM class WHERE name = ?", (name,)).fetchone()
            before = {"name": name, **json.loads(row[0])} if row else None
            after = edit(dict(before) if before else None)
            if after is None:
                db.execute("DELETE FROM class WHERE name = ?", (name,))
                return None
            made = checked(name, after)
            stored = json.dumps({k: v for k, v in made.items() if k != "name"})
            db.execute(
                "INSERT INTO class (name, rules) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET rules = excluded.rules",
                (name, stored),
            )
            return made

    def seed(self, declared: Iterable[GroupRules | Mapping[str, Any]]) -> None:
        """Take the settings' classes (see the module's doc): new ones and those whose definition changed.
        The ``default`` rules are no class: they stay in the settings."""
        read = [c if isinstance(c, GroupRules) else read_group(str(c["name"]), c) for c in declared]
        wanted = {c.name: as_rules(c) for c in read if c.name != DEFAULT_GROUP}
        with self._write() as db:
            known = {name: seeded for name, seeded in db.execute("SELECT name, seeded FROM class").fetchall()}
            for name, rules in wanted.items():
                mark = digest(rules)
                if known.get(name, "") == mark:
                    continue  # unchanged in the file: the live edits stand
                stored = json.dumps({k: v for k, v in rules.items() if k != "name"})
                db.execute(
                    "INSERT INTO class (name, rules, seeded) VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE"
                    " SET rules = excluded.rules, seeded = excluded.seeded",
                    (name, stored, mark),
                )
            for name, seeded in known.items():
                if seeded is not None and name not in wanted:
                    db.execute("DELETE FROM class WHERE name = ?", (name,))


def members_of(rules: Mapping[str, Any]) -> list[str]:
    return [str(m) for m in rules.get("members") or ()]


def teachers_of(rules: Mapping[str, Any]) -> list[str]:
    return [str(t) for t in rules.get("teachers") or ()]
