"""Incidents from alerts, with literal alerts and silences (portal/incidents.py)."""

from datetime import UTC, datetime, timedelta

import pytest

from hub.settings import duration_s
from portal.incidents import (
    Alert,
    Incident,
    Notification,
    Silence,
    episodes_from_history,
    fingerprint,
    group,
    timeline,
)

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)


def alert(
    fp: str, name: str, severity: str = "critical", minute: int = 0, inhibited_by: tuple[str, ...] = (), **labels: str
) -> Alert:
    return Alert(
        fp,
        {"alertname": name, "severity": severity, **labels},
        T0 + timedelta(minutes=minute),
        inhibited_by=inhibited_by,
    )


def names(incidents: list[Incident]) -> list[list[str]]:
    return [[f"{a.name}@{a.where}" for a in i.alerts] for i in incidents]


def test_inhibited_alerts_join_the_alert_that_explains_them() -> None:
    alerts = [
        alert("a", "GpuExporterDown", node="n4"),
        alert("b", "GpuEccDoubleBitErrors", minute=1, inhibited_by=("a",), node="n9", gpu="2"),
        alert("c", "PrometheusDown"),
    ]
    incidents = group(alerts)
    assert names(incidents) == [
        ["GpuExporterDown@node n4", "GpuEccDoubleBitErrors@node n9, gpu 2"],
        ["PrometheusDown@"],
    ]
    assert incidents[0].root.name == "GpuExporterDown"
    assert incidents[0].title == "GpuExporterDown on node n4"


def test_a_node_alert_takes_in_its_cards_and_separate_cards_stay_apart() -> None:
    alerts = [
        alert("x1", "GpuXidError", minute=2, node="n1", gpu="0"),
        alert("x2", "GpuTemperatureHigh", severity="warning", minute=3, node="n2", gpu="1"),
        alert("x3", "GpuXidError", minute=1, node="n2", gpu="1"),
        alert("x4", "GpuHung", minute=1, node="n2", gpu="3"),
        alert("x5", "NodeDown", minute=4, node="n1"),
        alert("w", "Watchdog", severity="none"),
    ]
    incidents = group(alerts)
    assert names(incidents) == [
        ["GpuXidError@node n2, gpu 1", "GpuTemperatureHigh@node n2, gpu 1"],
        ["GpuHung@node n2, gpu 3"],
        ["GpuXidError@node n1, gpu 0", "NodeDown@node n1"],
    ]
    # The root is the most severe, earliest uninhibited alert; acknowledging silences its place.
    assert incidents[0].root.fingerprint == "x3"
    assert incidents[0].silence_matchers() == {"node": "n2", "gpu": "1"}
    assert incidents[2].root.name == "GpuXidError"  # NodeDown came later and inhibits nothing here
    assert incidents[2].silence_matchers() == {"node": "n1", "gpu": "0"}
    assert group([alert("p", "PrometheusDown")])[0].silence_matchers() == {"alertname": "PrometheusDown"}


def test_an_incident_id_changes_when_the_cause_fires_again() -> None:
    first = group([alert("a", "NodeDown", node="n1")])[0]
    again = group([alert("a", "NodeDown", minute=90, node="n1")])[0]
    assert first.id == f"a-{int(T0.timestamp())}"
    assert first.id != again.id


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def test_the_timeline_is_what_alertmanager_sent_each_tier_and_when() -> None:
    node, xid = alert("a", "NodeDown", node="n1"), alert("b", "GpuXidError", minute=1, node="n1", gpu="0")
    incident = group([node, xid])[0]
    notes = [
        Notification("incident-recorder", minutes(0), firing=(node.key,)),  # the recorder's own route: no page
        Notification("first-line-alice", minutes(0.1), firing=(node.key,)),
        Notification("first-line-alice", minutes(1.1), firing=(node.key, xid.key)),  # only the new alert is news
        Notification("second-line", minutes(15), firing=(node.key, xid.key)),
        Notification("second-line", minutes(75), firing=(node.key, xid.key)),  # a repeat: already told
        Notification("owner", minutes(45), firing=(node.key, xid.key)),
    ]
    assert [(e.at - T0, e.what, e.text) for e in timeline(incident, notes, [])] == [
        (timedelta(0), "firing", "NodeDown fired (node n1)"),
        (timedelta(seconds=6), "notified", "Alertmanager notified first-line-alice of NodeDown"),
        (timedelta(minutes=1), "firing", "GpuXidError fired (node n1, gpu 0)"),
        (timedelta(seconds=66), "notified", "Alertmanager notified first-line-alice of GpuXidError"),
        (
            timedelta(minutes=15),
            "escalated",
            "not acknowledged in time: Alertmanager notified the second line (second-line) of NodeDown, GpuXidError",
        ),
        (
            timedelta(minutes=45),
            "escalated",
            "not acknowledged in time: Alertmanager notified the owner (owner) of NodeDown, GpuXidError",
        ),
    ]


def test_nothing_is_said_that_alertmanager_did_not_send() -> None:
    """No notification recorded (the tier's wait not over, or acknowledged in time): no escalation shown."""
    incident = group([alert("a", "GpuHung", node="n3", gpu="3")])[0]
    assert [e.what for e in timeline(incident, [], [])] == ["firing"]


def test_an_acknowledged_then_resolved_incident_ends_at_alertmanagers_endsat() -> None:
    hung = alert("a", "GpuHung", node="n3", gpu="3")
    ended = Alert(hung.fingerprint, hung.labels, hung.started, ended=minutes(50))
    incident = group([ended])[0]
    ack = Silence("s1", "alice", "looking", minutes(20), {"node": "n3", "gpu": "3"})
    other = Silence("s2", "bob", "", T0, {"node": "n9"})
    earlier = Silence("s0", "carol", "last week's", T0 - timedelta(days=7), {"node": "n3"}, T0 - timedelta(days=6))
    later = Silence("s3", "carol", "next time", minutes(90), {"node": "n3"})
    notes = [Notification("first-line-alice", minutes(0), firing=(hung.key,))]
    assert [(e.at - T0, e.what, e.text) for e in timeline(incident, notes, [earlier, other, ack, later])] == [
        (timedelta(0), "firing", "GpuHung fired (node n3, gpu 3)"),
        (timedelta(0), "notified", "Alertmanager notified first-line-alice of GpuHung"),
        (timedelta(minutes=20), "acknowledged", "acknowledged by alice: looking"),
        (timedelta(minutes=50), "resolved", "resolved: no alert of this incident fires any more"),
    ]


def test_an_end_the_recorder_only_saw_says_so() -> None:
    hung = alert("a", "GpuHung", node="n3", gpu="3")
    seen_gone = Alert(hung.fingerprint, hung.labels, hung.started, ended=minutes(30), end_exact=False)
    [event] = [e for e in timeline(group([seen_gone])[0], [], []) if e.what == "resolved"]
    assert "seen gone from Alertmanager" in event.text


def test_the_same_place_firing_again_later_is_another_incident() -> None:
    labels = {"alertname": "GpuXidError", "severity": "critical", "node": "n1", "gpu": "0"}
    first, again = Alert("a", labels, T0, ended=minutes(5)), Alert("a", labels, minutes(90))
    temperature = alert("t", "GpuTemperatureHigh", severity="warning", minute=2, node="n1", gpu="0")
    temperature = Alert(temperature.fingerprint, temperature.labels, temperature.started, ended=minutes(10))
    incidents = group([first, again, temperature])
    assert names(incidents) == [  # the open one first
        ["GpuXidError@node n1, gpu 0"],
        ["GpuXidError@node n1, gpu 0", "GpuTemperatureHigh@node n1, gpu 0"],
    ]
    assert incidents[0].id == f"a-{int(minutes(90).timestamp())}" and incidents[0].resolved_at is None
    assert incidents[1].id == f"a-{int(T0.timestamp())}" and incidents[1].resolved_at == minutes(10)


def test_durations_read_as_alertmanager_writes_them() -> None:
    assert duration_s("15m") == 900
    assert duration_s("1h30m") == 5400
    assert duration_s("6s") == 6
    with pytest.raises(ValueError, match="15m or 1h30m"):
        duration_s("15 minutes")


def test_fingerprints_are_alertmanagers() -> None:
    """The values the real Alertmanager gave these label sets (tests/e2e/test_incidents.py checks more)."""
    assert fingerprint({"alertname": "NodeDown", "node": "n1", "severity": "critical"}) == "467bfbf98847ef0b"
    labels = {"alertname": "GpuXidError", "gpu": "0", "node": "n1", "severity": "critical"}
    assert fingerprint(labels) == "048f1ce26d77ce62"


def test_prometheus_history_gives_the_episodes_that_ended_while_the_recorder_was_down() -> None:
    t0 = T0.timestamp()
    hung = {"__name__": "ALERTS", "alertname": "GpuHung", "alertstate": "firing", "node": "n3", "gpu": "3"}
    series = [
        (hung, [t0 + 60 * i for i in range(10)] + [t0 + 60 * i for i in range(30, 33)]),  # two episodes
        ({**hung, "alertname": "Watchdog"}, [t0 + 60 * i for i in range(40)]),
        ({**hung, "gpu": "1"}, [t0 + 60 * i for i in range(35, 40)]),  # still firing at the end: the API has it
    ]
    found = episodes_from_history(series, 60, until=minutes(39.5))
    assert [(a.name, a.labels["gpu"], a.started, a.ended, a.end_exact) for a in found] == [
        ("GpuHung", "3", T0, minutes(10), False),
        ("GpuHung", "3", minutes(30), minutes(33), False),
    ]
    assert found[0].fingerprint == fingerprint({"alertname": "GpuHung", "node": "n3", "gpu": "3"})
