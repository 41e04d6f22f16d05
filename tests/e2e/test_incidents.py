"""Incidents with the real Alertmanager: inhibition by cause, the rotation, escalation, acknowledgement.

Alerts are posted to Alertmanager's API as Prometheus would; a webhook receiver per
person records what reaches them. Escalation waits are seconds here, minutes in use.
"""

import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
import yaml

from hub.monitoring import alertmanager_config
from hub.settings import Contact, OnCall
from tests.e2e.alerting import Webhook, wait_for
from tests.e2e.platform import free_port

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(not BINARY, reason="Alertmanager is missing: apt-get install prometheus-alertmanager")
PEOPLE = ("alice", "bob", "carol", "dave", "deadman")


def hours_that_exclude_now() -> str:
    """Business hours that do not contain this moment, so that warnings must wait."""
    hour = datetime.now(UTC).hour
    first = hour + 2 if hour < 20 else hour - 5
    return f"{first:02d}:00-{first + 1:02d}:00"


@pytest.fixture
def hooks() -> dict[str, Webhook]:
    return {name: Webhook() for name in PEOPLE}


@pytest.fixture
def alertmanager(tmp_path: Path, hooks: dict[str, Webhook]) -> Iterator[str]:
    oncall = OnCall(
        rotation=tuple(Contact(name=n, webhook_url=hooks[n].url) for n in ("alice", "bob")),
        rotation_start=datetime.now(UTC).date(),  # alice's turn today, bob's next week
        second_line=Contact(name="carol", webhook_url=hooks["carol"].url),
        owner=Contact(name="dave", webhook_url=hooks["dave"].url),
        escalate_after="6s",
        owner_after="12s",
        group_interval="2s",
        business_days="monday:sunday",
        business_hours=hours_that_exclude_now(),
        deadman_url=hooks["deadman"].url,
    )
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(alertmanager_config(None, oncall)))
    port = free_port()
    log = (tmp_path / "alertmanager.log").open("w")
    process = subprocess.Popen(
        [
            str(BINARY),
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # one instance: no gossip port to collide with others
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return requests.get(f"{url}/-/ready", timeout=2).ok
        except requests.ConnectionError:
            return False

    try:
        wait_for(ready, "Alertmanager to start", 30)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def alert(name: str, severity: str, **labels: str) -> dict[str, object]:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, "severity": severity, **labels},
        "annotations": {"summary": f"{name} test"},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }


def received(hook: Webhook) -> set[str]:
    return {f"{a['labels']['alertname']}@{a['labels'].get('node', '')}" for a in hook.received}


def acknowledge(url: str, by: str, **matchers: str) -> None:
    """What an admin's acknowledgement is in Alertmanager: a silence under their name."""
    now = datetime.now(UTC)
    silence = {
        "matchers": [{"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in matchers.items()],
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(hours=1)).isoformat(),
        "createdBy": by,
        "comment": "acknowledged: looking at it",
    }
    requests.post(f"{url}/api/v2/silences", json=silence, timeout=5).raise_for_status()


def test_an_incident_is_paged_inhibited_acknowledged_and_escalated(
    alertmanager: str, hooks: dict[str, Webhook]
) -> None:
    alerts = [
        alert("NodeDown", "critical", node="n1"),  # explains the two below: one incident
        alert("GpuXidError", "critical", node="n1", gpu="0"),
        alert("GpuExporterDown", "critical", node="n1"),
        alert("GpuExporterDown", "critical", node="n4"),  # explains the missing-data alert below
        alert("GpuEccDoubleBitErrors", "critical", node="n4", gpu="2"),
        alert("GpuXidError", "critical", node="n2", gpu="1"),  # its own incident
        alert("GpuHung", "critical", node="n3", gpu="3"),  # acknowledged by alice in time
        alert("GpuTemperatureHigh", "warning", node="n2", gpu="1"),  # after hours: waits
        alert("Watchdog", "none"),  # the heartbeat
    ]
    requests.post(f"{alertmanager}/api/v2/alerts", json=alerts, timeout=5).raise_for_status()
    first_line = {"NodeDown@n1", "GpuExporterDown@n4", "GpuXidError@n2", "GpuHung@n3"}
    wait_for(lambda: received(hooks["alice"]) >= first_line, "alice (first line this week) to be paged", 20)
    acknowledge(alertmanager, "alice", alertname="GpuHung", node="n3")

    unacknowledged = first_line - {"GpuHung@n3"}
    wait_for(lambda: received(hooks["carol"]) >= unacknowledged, "the second line after 6 s", 30)
    wait_for(lambda: received(hooks["dave"]) >= unacknowledged, "the owner after 12 s", 40)

    assert received(hooks["alice"]) == first_line  # nothing inhibited, nothing after hours
    assert received(hooks["carol"]) == unacknowledged  # the acknowledged incident did not escalate
    assert received(hooks["dave"]) == unacknowledged
    assert received(hooks["bob"]) == set()  # not his turn
    assert received(hooks["deadman"]) == {"Watchdog@"}
    silences = requests.get(f"{alertmanager}/api/v2/silences", timeout=5).json()
    assert [s["createdBy"] for s in silences] == ["alice"]
    inhibited = {
        f"{a['labels']['alertname']}@{a['labels']['node']}"
        for a in requests.get(f"{alertmanager}/api/v2/alerts", timeout=5).json()
        if a["status"]["inhibitedBy"]
    }
    assert inhibited == {"GpuXidError@n1", "GpuExporterDown@n1", "GpuEccDoubleBitErrors@n4"}

    # The node comes back: Prometheus sends NodeDown ended; the on-call person hears it is resolved.
    back = alert("NodeDown", "critical", node="n1")
    back["endsAt"] = datetime.now(UTC).isoformat()
    requests.post(f"{alertmanager}/api/v2/alerts", json=[back], timeout=5).raise_for_status()

    def resolved() -> bool:
        return any(
            a["labels"]["alertname"] == "NodeDown" and a["status"] == "resolved" for a in hooks["alice"].received
        )

    wait_for(resolved, "alice to hear that NodeDown is resolved", 30)
