"""Incidents from alerts, with literal alerts and silences (portal/incidents.py)."""

from datetime import UTC, datetime, timedelta

import pytest

from hub.settings import duration_s
from portal.incidents import Alert, Escalation, Incident, Silence, group, timeline

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


ESCALATION = Escalation(second_line="carol", escalate_after_s=900, owner="dave", owner_after_s=2700)


def test_an_ignored_critical_incident_escalates_to_the_second_line_then_the_owner() -> None:
    incident = group([alert("a", "NodeDown", node="n1"), alert("b", "GpuXidError", minute=1, node="n1", gpu="0")])[0]
    events = timeline(incident, [], ESCALATION, now=T0 + timedelta(hours=1))
    assert [(e.at - T0, e.what, e.text) for e in events] == [
        (timedelta(0), "firing", "NodeDown fired (node n1)"),
        (timedelta(minutes=1), "firing", "GpuXidError fired (node n1, gpu 0)"),
        (timedelta(minutes=15), "escalated", "not acknowledged in time: escalated to the second line (carol)"),
        (timedelta(minutes=45), "escalated", "not acknowledged in time: escalated to the owner (dave)"),
    ]


def test_an_acknowledged_then_resolved_incident_stops_escalating() -> None:
    incident = group([alert("a", "GpuHung", node="n3", gpu="3")])[0]
    ack = Silence("s1", "alice", "looking", T0 + timedelta(minutes=20), {"node": "n3", "gpu": "3"})
    other = Silence("s2", "bob", "", T0, {"node": "n9"})
    earlier = Silence("s0", "carol", "last week's", T0 - timedelta(days=7), {"node": "n3"}, T0 - timedelta(days=6))
    events = timeline(
        incident, [earlier, other, ack], ESCALATION, now=T0 + timedelta(hours=2), resolved_at=T0 + timedelta(minutes=50)
    )
    assert [(e.at - T0, e.what, e.text) for e in events] == [
        (timedelta(0), "firing", "GpuHung fired (node n3, gpu 3)"),
        (timedelta(minutes=15), "escalated", "not acknowledged in time: escalated to the second line (carol)"),
        (timedelta(minutes=20), "acknowledged", "acknowledged by alice: looking"),
        (timedelta(minutes=50), "resolved", "resolved: no alert of this incident fires any more"),
    ]


def test_warnings_never_reach_the_owner_and_nothing_is_due_before_its_time() -> None:
    incident = group([alert("a", "GpuTemperatureHigh", severity="warning", node="n2", gpu="1")])[0]
    late = timeline(incident, [], ESCALATION, now=T0 + timedelta(hours=3))
    assert [e.what for e in late] == ["firing", "escalated"]
    early = timeline(incident, [], ESCALATION, now=T0 + timedelta(minutes=5))
    assert [e.what for e in early] == ["firing"]


def test_durations_read_as_alertmanager_writes_them() -> None:
    assert duration_s("15m") == 900
    assert duration_s("1h30m") == 5400
    assert duration_s("6s") == 6
    with pytest.raises(ValueError, match="15m or 1h30m"):
        duration_s("15 minutes")
