"""The incidents the portal has seen, with admins' notes and summaries, in one SQLite file.

Alertmanager forgets an alert once it is resolved; the store keeps each incident's alerts,
when it opened and ended, and what admins wrote about it, so the Incidents page can show
past incidents and their post-incident summaries after a restart.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from portal.incidents import Alert, Incident
from spawner.sqlite_schema import migrate

MAX_TEXT = 5000  # characters in a note or summary: a few paragraphs, not a log dump

SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    severity TEXT NOT NULL,
    opened_at REAL NOT NULL,
    resolved_at REAL,
    alerts TEXT NOT NULL,
    summary TEXT NOT NULL DEFAULT '',
    summary_by TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS incident_notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id TEXT NOT NULL REFERENCES incidents(id),
    author TEXT NOT NULL,
    at REAL NOT NULL,
    text TEXT NOT NULL
);
"""
SCHEMA_STEPS = (SCHEMA,)  # a change to the tables is a new step (spawner/sqlite_schema.py)


@dataclass(frozen=True)
class Note:
    author: str
    at: datetime
    text: str


@dataclass(frozen=True)
class Recorded:
    """An incident as stored: its alerts (rebuilt), when it ended, and the summary."""

    incident: Incident
    resolved_at: datetime | None
    summary: str
    summary_by: str


def _alert_json(alert: Alert) -> dict[str, object]:
    return {
        "fingerprint": alert.fingerprint,
        "labels": alert.labels,
        "started": alert.started.timestamp(),
        "summary": alert.summary,
        "runbook": alert.runbook,
        "inhibited_by": list(alert.inhibited_by),
    }


def _alert(raw: dict[str, Any]) -> Alert:
    return Alert(
        fingerprint=str(raw["fingerprint"]),
        labels=dict(raw["labels"]),
        started=datetime.fromtimestamp(float(raw["started"]), UTC),
        summary=str(raw.get("summary", "")),
        runbook=str(raw.get("runbook", "")),
        inhibited_by=tuple(raw.get("inhibited_by") or ()),
    )


def _text(text: str, what: str) -> str:
    text = text.strip()
    if not text:
        raise ValueError(f"the {what} is empty: write what happened or what you did")
    if len(text) > MAX_TEXT:
        raise ValueError(f"the {what} has {len(text)} characters; keep it under {MAX_TEXT} (link to longer logs)")
    return text


class IncidentStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=10)
        try:
            migrate(db, SCHEMA_STEPS, f"the incident store {path}")
        finally:
            db.close()

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=10)
        try:
            with db:  # one transaction: committed, or rolled back on error
                yield db
        finally:
            db.close()

    def record(self, firing: Iterable[Incident], now: datetime) -> None:
        """Store the incidents firing now; those open in the store but no longer firing have ended now."""
        current = list(firing)
        with self._db() as db:
            for incident in current:
                db.execute(
                    "INSERT INTO incidents (id, title, severity, opened_at, alerts) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT(id) DO UPDATE SET alerts = excluded.alerts, severity = excluded.severity, "
                    "resolved_at = NULL",
                    (
                        incident.id,
                        incident.title,
                        incident.severity,
                        incident.started.timestamp(),
                        json.dumps([_alert_json(a) for a in incident.alerts]),
                    ),
                )
            ids = [i.id for i in current]
            marks = ",".join("?" * len(ids))
            db.execute(
                f"UPDATE incidents SET resolved_at = ? WHERE resolved_at IS NULL AND id NOT IN ({marks})",
                (now.timestamp(), *ids),
            )

    def incidents(self, limit: int = 50) -> list[Recorded]:
        """Open incidents first, then the most recent ended ones."""
        with self._db() as db:
            rows = db.execute(
                "SELECT alerts, resolved_at, summary, summary_by FROM incidents "
                "ORDER BY resolved_at IS NOT NULL, opened_at DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            Recorded(
                Incident(tuple(_alert(a) for a in json.loads(alerts))),
                datetime.fromtimestamp(ended, UTC) if ended is not None else None,
                summary,
                summary_by,
            )
            for alerts, ended, summary, summary_by in rows
        ]

    def _known(self, db: sqlite3.Connection, incident_id: str) -> None:
        if not db.execute("SELECT 1 FROM incidents WHERE id = ?", (incident_id,)).fetchone():
            raise ValueError(f"no incident {incident_id!r}: reload the page, it may have been replaced")

    def add_note(self, incident_id: str, author: str, text: str, now: datetime) -> None:
        text = _text(text, "note")
        with self._db() as db:
            self._known(db, incident_id)
            db.execute(
                "INSERT INTO incident_notes (incident_id, author, at, text) VALUES (?, ?, ?, ?)",
                (incident_id, author, now.timestamp(), text),
            )

    def notes(self, incident_id: str) -> list[Note]:
        with self._db() as db:
            rows = db.execute(
                "SELECT author, at, text FROM incident_notes WHERE incident_id = ? ORDER BY at, id", (incident_id,)
            ).fetchall()
        return [Note(author, datetime.fromtimestamp(at, UTC), text) for author, at, text in rows]

    def set_summary(self, incident_id: str, author: str, text: str) -> None:
        text = _text(text, "summary")
        with self._db() as db:
            self._known(db, incident_id)
            db.execute("UPDATE incidents SET summary = ?, summary_by = ? WHERE id = ?", (text, author, incident_id))
