"""What the incident recorder kept, in one SQLite file: alerts, notifications, silences, notes, summaries.

The recorder (portal/recorder.py) writes every notification Alertmanager sends it as it
arrives, and what Alertmanager's API says (inhibitions, silences, alerts no notification
carries) every few seconds; the Incidents page only reads this file (and writes admins'
notes and summaries). Alertmanager forgets an alert once it is resolved; this file keeps it.
SQLite in WAL mode: the recorder writes while the portal reads.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from portal.incidents import Alert, Incident, Notification, Silence, from_micros, group, micros
from spawner.incident_schema import SCHEMA_STEPS
from spawner.sqlite_schema import migrate

MAX_TEXT = 5000  # characters in a note or summary: a few paragraphs, not a log dump
RECENT_ALERTS = 5000  # alert episodes read to build the incident list: weeks of a busy platform


@dataclass(frozen=True)
class Note:
    author: str
    at: datetime
    text: str


@dataclass(frozen=True)
class Recorded:
    """An incident as recorded: its alerts, the notifications that carried them, and the summary."""

    incident: Incident
    notifications: tuple[Notification, ...]
    summary: str
    summary_by: str

    @property
    def resolved_at(self) -> datetime | None:
        return self.incident.resolved_at


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _alert_row(row: sqlite3.Row | tuple[Any, ...]) -> Alert:
    fingerprint, started, labels, summary, runbook, inhibited, silenced, ended, exact = row
    return Alert(
        fingerprint=fingerprint,
        labels=json.loads(labels),
        started=from_micros(started),
        summary=summary,
        runbook=runbook,
        inhibited_by=tuple(json.loads(inhibited)),
        silenced_by=tuple(json.loads(silenced)),
        ended=_ts(ended),
        end_exact=bool(exact),
    )


def _keys(raw: str) -> tuple[tuple[str, int], ...]:
    return tuple((str(f), int(s)) for f, s in json.loads(raw))


def _text(text: str, what: str) -> str:
    text = text.strip()
    if not text:
        raise ValueError(f"the {what} is empty: write what happened or what you did")
    if len(text) > MAX_TEXT:
        raise ValueError(f"the {what} has {len(text)} characters; keep it under {MAX_TEXT} (link to longer logs)")
    return text


ALERT_COLUMNS = "fingerprint, started, labels, summary, runbook, inhibited_by, silenced_by, ended, end_exact"


class IncidentStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, timeout=10)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # the recorder writes while the portal reads
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

    # What the recorder writes.

    def record_notification(self, notification: Notification, alerts: Sequence[Alert]) -> None:
        """A webhook call as it arrived: its alerts (a resolved one with Alertmanager's endsAt) and the call."""
        with self._db() as db:
            for alert in alerts:
                _upsert(db, alert, notification.at.timestamp(), from_webhook=True)
            db.execute(
                "INSERT INTO notifications (receiver, at, firing, resolved) VALUES (?, ?, ?, ?)",
                (
                    notification.receiver,
                    notification.at.timestamp(),
                    json.dumps(notification.firing),
                    json.dumps(notification.resolved),
                ),
            )

    def sync(self, firing: Sequence[Alert], silences: Sequence[Silence], asked_at: datetime) -> list[Alert]:
        """What Alertmanager's API listed when asked at ``asked_at``: the alerts firing (with their
        inhibitions and silences) and every silence. An alert open here that the API no longer lists,
        and that nothing has shown firing since, ended without Alertmanager telling us when (it sends
        no notification for a silenced, inhibited or muted alert): it ended at ``asked_at`` at the
        latest. Returns the alerts so ended."""
        now = asked_at.timestamp()
        listed = {a.key for a in firing}
        with self._db() as db:
            for alert in firing:
                _upsert(db, alert, now, from_webhook=False)
            gone = [
                a
                for a in map(_alert_row, db.execute(f"SELECT {ALERT_COLUMNS} FROM alerts WHERE ended IS NULL"))
                if a.key not in listed
            ]
            ended = []
            for alert in gone:
                (last_seen,) = db.execute(
                    "SELECT last_seen FROM alerts WHERE fingerprint = ? AND started = ?", alert.key
                ).fetchone()
                if last_seen < now:  # a notification newer than the question would know better
                    db.execute(
                        "UPDATE alerts SET ended = ?, end_exact = 0 WHERE fingerprint = ? AND started = ?",
                        (now, *alert.key),
                    )
                    ended.append(alert)
            _record_silences(db, silences)
        return ended

    def record_history(self, episodes: Sequence[Alert]) -> list[Alert]:
        """Episodes read back from Prometheus's history after the recorder was down: those the store
        does not hold yet (no alert with the same labels overlapping them), kept with their ends marked
        as not Alertmanager's. Returns the ones added."""
        known = self.alerts()
        added = []
        with self._db() as db:
            for episode in episodes:
                if any(_same_alert(episode, a) and episode.overlaps(a) for a in known):
                    continue
                assert episode.ended is not None
                db.execute(
                    "INSERT OR IGNORE INTO alerts (fingerprint, started, labels, summary, ended, end_exact, last_seen) "
                    "VALUES (?, ?, ?, ?, ?, 0, ?)",
                    (
                        episode.fingerprint,
                        micros(episode.started),
                        json.dumps(episode.labels, sort_keys=True),
                        episode.summary,
                        episode.ended.timestamp(),
                        episode.ended.timestamp(),
                    ),
                )
                added.append(episode)
        return added

    def last_seen(self) -> datetime | None:
        """The latest moment anything was recorded: where a catch-up starts."""
        with self._db() as db:
            (seen,) = db.execute("SELECT MAX(last_seen) FROM alerts").fetchone()
        return _ts(seen)

    def record_silences(self, silences: Sequence[Silence]) -> None:
        """Silences as Alertmanager lists them (an acknowledgement just made shows at once)."""
        with self._db() as db:
            _record_silences(db, silences)

    # What the Incidents page reads.

    def alerts(self, limit: int = RECENT_ALERTS) -> list[Alert]:
        """Every open alert and the most recent ended ones."""
        with self._db() as db:
            rows = db.execute(
                f"SELECT {ALERT_COLUMNS} FROM alerts ORDER BY ended IS NOT NULL, started DESC LIMIT ?", (limit,)
            ).fetchall()
        return [_alert_row(r) for r in rows]

    def notifications(self, since: datetime) -> list[Notification]:
        with self._db() as db:
            rows = db.execute(
                "SELECT receiver, at, firing, resolved FROM notifications WHERE at >= ? ORDER BY at, id",
                (since.timestamp(),),
            ).fetchall()
        return [Notification(r, datetime.fromtimestamp(at, UTC), _keys(f), _keys(x)) for r, at, f, x in rows]

    def silences(self) -> list[Silence]:
        with self._db() as db:
            rows = db.execute(
                "SELECT id, created_by, comment, starts, ends, matchers, state FROM silences ORDER BY starts"
            ).fetchall()
        return [
            Silence(i, by, comment, datetime.fromtimestamp(starts, UTC), json.loads(m), _ts(ends), state)
            for i, by, comment, starts, ends, m, state in rows
        ]

    def incidents(self, limit: int = 50) -> list[Recorded]:
        """Open incidents first, then the most recent ended ones, each with its notifications and summary."""
        found = group(self.alerts())
        found = [i for i in found if i.resolved_at is None] + sorted(
            (i for i in found if i.resolved_at is not None), key=lambda i: i.started, reverse=True
        )
        found = found[:limit]
        if not found:
            return []
        notes = self.notifications(min(i.started for i in found))
        with self._db() as db:
            summaries = dict(
                (
                    (i, (s, by))
                    for i, s, by in db.execute("SELECT incident_id, summary, summary_by FROM incident_summaries")
                )
            )
        out = []
        for incident in found:
            keys = {a.key for a in incident.alerts}
            mine = tuple(n for n in notes if keys.intersection(n.firing) or keys.intersection(n.resolved))
            summary, by = summaries.get(incident.id, ("", ""))
            out.append(Recorded(incident, mine, summary, by))
        return out

    # What admins write.

    def _known(self, incident_id: str) -> None:
        if incident_id not in {i.id for i in group(self.alerts())}:
            raise ValueError(f"no incident {incident_id!r}: reload the page, it may have been replaced")

    def add_note(self, incident_id: str, author: str, text: str, now: datetime) -> None:
        text = _text(text, "note")
        self._known(incident_id)
        with self._db() as db:
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
        self._known(incident_id)
        with self._db() as db:
            db.execute(
                "INSERT INTO incident_summaries (incident_id, summary, summary_by) VALUES (?, ?, ?) "
                "ON CONFLICT(incident_id) DO UPDATE SET summary = excluded.summary, summary_by = excluded.summary_by",
                (incident_id, text, author),
            )


def _upsert(db: sqlite3.Connection, alert: Alert, seen: float, *, from_webhook: bool) -> None:
    """Insert or update one episode. A webhook's resolved alert ends it at Alertmanager's endsAt
    (exact, even over an earlier guess); an API listing updates inhibitions and silences only."""
    exact_end = alert.ended.timestamp() if alert.ended is not None else None
    db.execute(
        "INSERT INTO alerts (fingerprint, started, labels, summary, runbook, inhibited_by, silenced_by, ended, "
        "end_exact, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?) "
        "ON CONFLICT(fingerprint, started) DO UPDATE SET labels = excluded.labels, summary = excluded.summary, "
        "runbook = excluded.runbook, last_seen = MAX(last_seen, excluded.last_seen)",
        (
            alert.fingerprint,
            micros(alert.started),
            json.dumps(alert.labels, sort_keys=True),
            alert.summary,
            alert.runbook,
            json.dumps(list(alert.inhibited_by)),
            json.dumps(list(alert.silenced_by)),
            exact_end,
            seen,
        ),
    )
    key = alert.key
    if from_webhook and exact_end is not None:
        db.execute(
            "UPDATE alerts SET ended = ?, end_exact = 1 WHERE fingerprint = ? AND started = ?", (exact_end, *key)
        )
    elif from_webhook:  # firing again after a guess at its end (a poll raced the notification): open
        db.execute("UPDATE alerts SET ended = NULL WHERE fingerprint = ? AND started = ? AND end_exact = 0", key)
    else:
        db.execute(
            "UPDATE alerts SET inhibited_by = ?, silenced_by = ? WHERE fingerprint = ? AND started = ?",
            (json.dumps(list(alert.inhibited_by)), json.dumps(list(alert.silenced_by)), *key),
        )


def _same_alert(history: Alert, kept: Alert) -> bool:
    """Prometheus's ALERTS series lack the external labels Prometheus adds when it sends an alert."""
    return all(kept.labels.get(k) == v for k, v in history.labels.items())


def _record_silences(db: sqlite3.Connection, silences: Sequence[Silence]) -> None:
    for silence in silences:
        db.execute(
            "INSERT INTO silences (id, created_by, comment, starts, ends, matchers, state) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET ends = excluded.ends, "
            "state = excluded.state, comment = excluded.comment",
            (
                silence.id,
                silence.created_by,
                silence.comment,
                silence.starts.timestamp(),
                silence.ends.timestamp() if silence.ends else None,
                json.dumps(silence.matchers),
                silence.state,
            ),
        )
