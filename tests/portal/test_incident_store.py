"""The incident store as the recorder writes it and the page reads it (portal/data/incident_store.py).

The webhook bodies are Alertmanager's (version 4, as its documentation and its notify/webhook
package write them); tests/e2e/test_incident_recorder.py feeds the real Alertmanager's.
"""

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from portal.data.alertmanager import PayloadError, alert_from_api, notification_from_webhook
from portal.data.incident_store import IncidentStore
from portal.incidents import Alert, Silence, micros

T0 = datetime(2026, 11, 24, 2, 14, 5, 123000, tzinfo=UTC)  # at night, to the millisecond as Alertmanager writes it


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def stamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def webhook(receiver: str, *alerts: dict[str, Any]) -> dict[str, Any]:
    firing = any(a["status"] == "firing" for a in alerts)
    return {
        "version": "4",
        "groupKey": '{}/{alertname!="Watchdog"}:{node="n1"}',
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": receiver,
        "groupLabels": {"node": "n1"},
        "commonLabels": {"node": "n1"},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9093",
        "alerts": list(alerts),
    }


def xid(status: str = "firing", ends: datetime | None = None, fingerprint: str = "4f3a") -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": "GpuXidError", "severity": "critical", "node": "n1", "gpu": "0"},
        "annotations": {"summary": "GPU 0 on n1 reported Xid 79", "runbook": "docs/runbook.md#gpuxiderror"},
        "startsAt": stamp(T0),
        "endsAt": stamp(ends) if ends else "0001-01-01T00:00:00Z",
        "generatorURL": "http://127.0.0.1:9090/graph",
        "fingerprint": fingerprint,
    }


def record(store: IncidentStore, body: dict[str, Any], when: datetime) -> None:
    store.record_notification(*notification_from_webhook(body, when))


def test_an_incident_at_night_is_kept_with_alertmanagers_own_times(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "incidents.sqlite")
    record(store, webhook("incident-recorder", xid()), at(0.1))
    record(store, webhook("first-line-alice", xid()), at(0.1))
    record(store, webhook("second-line", xid()), at(15.1))
    [open_one] = store.incidents()
    assert open_one.resolved_at is None
    record(store, webhook("incident-recorder", xid("resolved", at(40))), at(41))
    record(store, webhook("first-line-alice", xid("resolved", at(40))), at(41))
    reopened = IncidentStore(tmp_path / "incidents.sqlite")  # a restart: all of it on disk
    [kept] = reopened.incidents()
    assert kept.incident.started == T0  # startsAt to the microsecond
    assert kept.resolved_at == at(40) and kept.incident.end_exact  # endsAt, not when anyone looked
    assert [(n.receiver, n.at) for n in kept.notifications] == [
        ("incident-recorder", at(0.1)),
        ("first-line-alice", at(0.1)),
        ("second-line", at(15.1)),
        ("incident-recorder", at(41)),
        ("first-line-alice", at(41)),
    ]


def test_an_alert_alertmanager_never_ends_is_ended_when_the_api_no_longer_lists_it(tmp_path: Path) -> None:
    """A silenced (acknowledged) alert gets no resolved notification: its end is when it left the API."""
    store = IncidentStore(tmp_path / "incidents.sqlite")
    silenced = notification_from_webhook(webhook("incident-recorder", xid()), at(0))[1][0]
    silence = Silence("s1", "alice", "draining n1", at(5), {"node": "n1", "gpu": "0"}, at(65))
    store.sync([silenced], [silence], at(6))
    assert store.sync([], [silence], at(30)) == [silenced]
    [kept] = store.incidents()
    assert kept.resolved_at == at(30) and not kept.incident.end_exact
    assert [s.created_by for s in store.silences()] == ["alice"]
    # Alertmanager's own end, when it comes after all, wins over the guess.
    record(store, webhook("incident-recorder", xid("resolved", at(27))), at(31))
    [kept] = store.incidents()
    assert kept.resolved_at == at(27) and kept.incident.end_exact


def test_the_api_and_the_webhook_name_one_episode_whatever_their_precision(tmp_path: Path) -> None:
    """The API writes startsAt to the millisecond, the webhook with every digit: one alert, not two."""
    store = IncidentStore(tmp_path / "incidents.sqlite")
    record(store, webhook("incident-recorder", dict(xid(), startsAt="2026-11-24T02:14:05.123456789Z")), at(0))
    listed = alert_from_api({**xid(), "startsAt": "2026-11-24T02:14:05.123Z", "status": {"state": "active"}})
    store.sync([listed], [], at(0.5))
    [kept] = store.incidents()
    assert len(kept.incident.alerts) == 1 and kept.incident.started == T0


def test_a_listing_older_than_a_notification_does_not_end_the_alert(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "incidents.sqlite")
    record(store, webhook("incident-recorder", xid()), at(1))  # arrived while the API was being read
    assert store.sync([], [], asked_at=at(0.5)) == []
    assert store.incidents()[0].resolved_at is None


def test_inhibitions_come_from_the_api_and_join_the_incident(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "incidents.sqlite")
    node = Alert("n", {"alertname": "NodeDown", "severity": "critical", "node": "n2"}, at(0))
    hidden = Alert("g", {"alertname": "GpuHung", "severity": "critical", "node": "n9"}, at(1), inhibited_by=("n",))
    store.sync([node, hidden], [], at(2))
    [incident] = [r.incident for r in store.incidents()]
    assert incident.title == "NodeDown on node n2" and len(incident.alerts) == 2


def test_the_same_alert_firing_twice_is_two_incidents(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "incidents.sqlite")
    record(store, webhook("incident-recorder", xid("resolved", at(10))), at(11))
    later = dict(xid(), startsAt=stamp(at(120)))
    record(store, webhook("incident-recorder", later), at(120))
    assert [(r.incident.started, r.resolved_at) for r in store.incidents()] == [(at(120), None), (T0, at(10))]


def test_notes_and_summaries_belong_to_an_incident_that_exists(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "incidents.sqlite")
    record(store, webhook("incident-recorder", xid()), at(0))
    [kept] = store.incidents()
    store.add_note(kept.incident.id, "root", "<b>reset</b> the card", at(3))
    store.set_summary(kept.incident.id, "root", "Xid 79: the card fell off the bus.")
    assert [n.text for n in store.notes(kept.incident.id)] == ["<b>reset</b> the card"]
    assert store.incidents()[0].summary_by == "root"
    with pytest.raises(ValueError, match="no incident 'nope'"):
        store.add_note("nope", "root", "x", at(4))
    with pytest.raises(ValueError, match="empty"):
        store.set_summary(kept.incident.id, "root", "  ")


@pytest.mark.parametrize(
    "body",
    [
        {"alerts": []},  # no version
        {"version": "3", "alerts": []},
        {"version": "4", "alerts": [{"labels": {}}]},  # no startsAt
        {"version": "4", "alerts": [{"startsAt": "yesterday", "labels": {}}]},
        ["not", "a", "notification"],
    ],
)
def test_a_body_that_is_not_alertmanagers_is_refused(body: Any) -> None:
    with pytest.raises(PayloadError):
        notification_from_webhook(body, T0)


def test_the_first_versions_incidents_and_summaries_are_kept(tmp_path: Path) -> None:
    """Earlier versions kept one row per incident the portal saw; an upgrade imports them once."""
    path = tmp_path / "incidents.sqlite"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE incidents (id TEXT PRIMARY KEY, title TEXT NOT NULL, severity TEXT NOT NULL, "
        "opened_at REAL NOT NULL, resolved_at REAL, alerts TEXT NOT NULL, summary TEXT NOT NULL DEFAULT '', "
        "summary_by TEXT NOT NULL DEFAULT '');"
        "CREATE TABLE incident_notes (id INTEGER PRIMARY KEY AUTOINCREMENT, incident_id TEXT NOT NULL, "
        "author TEXT NOT NULL, at REAL NOT NULL, text TEXT NOT NULL);"
    )
    old = {"fingerprint": "a", "labels": {"alertname": "NodeDown", "severity": "critical", "node": "n1"}}
    started = 1795000000.0
    old_id = f"a-{int(started)}"
    db.execute(
        "INSERT INTO incidents VALUES (?, 'NodeDown on node n1', 'critical', ?, ?, ?, 'PSU', 'root')",
        (old_id, started, started + 600, json.dumps([{**old, "started": started, "summary": "down"}])),
    )
    db.execute(
        "INSERT INTO incident_notes (incident_id, author, at, text) VALUES (?, 'root', ?, 'swapped')", (old_id, started)
    )
    db.commit()
    db.close()
    store = IncidentStore(path)
    [kept] = store.incidents()
    assert kept.incident.id == old_id and micros(kept.incident.started) == started * 1_000_000
    assert (kept.summary, kept.summary_by) == ("PSU", "root")
    assert [n.text for n in store.notes(old_id)] == ["swapped"]
    assert not kept.incident.end_exact  # the old store knew only when the portal saw it end
    IncidentStore(path)  # a second start imports nothing twice
    assert len(IncidentStore(path).incidents()) == 1


def test_history_adds_only_what_the_store_missed(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "incidents.sqlite")
    record(store, webhook("incident-recorder", xid("resolved", at(10))), at(11))
    labels = {"alertname": "GpuXidError", "severity": "critical", "node": "n1", "gpu": "0"}
    same = Alert("x", labels, at(1), ended=at(9), end_exact=False)  # the same episode, seen by Prometheus
    missed = Alert("y", {**labels, "gpu": "1"}, at(60), ended=at(70), end_exact=False)
    assert store.record_history([same, missed]) == [missed]
    assert len(store.incidents()) == 2 and store.record_history([missed]) == []
    assert store.last_seen() == at(70)
