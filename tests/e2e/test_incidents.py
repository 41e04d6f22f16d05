"""Incidents with the real Alertmanager: inhibition by cause, the rotation, escalation, acknowledgement.

Alerts are posted to Alertmanager's API as Prometheus would; a webhook receiver per
person records what reaches them. Escalation waits are seconds here, minutes in use.
"""

import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
import yaml
from playwright.sync_api import sync_playwright

from hub.monitoring import alertmanager_config
from hub.settings import Contact, OnCall
from portal.data.alertmanager import Alertmanager
from portal.data.incident_store import IncidentStore
from portal.gate import start_streamlit
from portal.identity import Identity, sign
from portal.incidents import Escalation, group, timeline
from tests.e2e.alerting import Webhook, wait_for
from tests.e2e.browser import ARGS, CHROMIUM
from tests.e2e.platform import free_port

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts" / "portal"

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


def test_the_portal_opens_one_incident_that_escalates_is_acknowledged_and_resolves(
    alertmanager: str, hooks: dict[str, Webhook], tmp_path: Path
) -> None:
    """The Incidents page's data path (portal/data/alertmanager.py, incident_store.py) on the real Alertmanager."""
    faults = [
        alert("NodeDown", "critical", node="n1"),
        alert("GpuXidError", "critical", node="n1", gpu="0"),  # inhibited by NodeDown
        alert("GpuExporterDown", "critical", node="n1"),  # inhibited by NodeDown
    ]
    requests.post(f"{alertmanager}/api/v2/alerts", json=faults, timeout=5).raise_for_status()
    manager = Alertmanager(alertmanager, requests.Session())
    wait_for(lambda: sum(bool(a.inhibited_by) for a in manager.alerts()) == 2, "the inhibitions to be marked", 20)
    incidents = group(manager.alerts())
    assert [(i.title, sorted(a.name for a in i.alerts)) for i in incidents] == [
        ("NodeDown on node n1", ["GpuExporterDown", "GpuXidError", "NodeDown"])
    ]
    incident = incidents[0]
    store = IncidentStore(tmp_path / "incidents.sqlite")
    store.record(incidents, datetime.now(UTC))

    # Ignored: Alertmanager pages the second line after escalate_after (6 s here); the timeline says so.
    wait_for(lambda: "NodeDown@n1" in received(hooks["carol"]), "the second line to be paged", 30)
    escalation = Escalation(second_line="carol", escalate_after_s=6, owner="dave", owner_after_s=12)
    assert "escalated" in [e.what for e in timeline(incident, manager.silences(), escalation, datetime.now(UTC))]

    silence_id = manager.acknowledge(incident, "root-admin", "rebooting n1", hours=1, now=datetime.now(UTC))
    silences = manager.silences()
    assert [(s.id, s.created_by, s.matchers) for s in silences] == [(silence_id, "root-admin", {"node": "n1"})]
    wait_for(lambda: all(a.silenced_by == (silence_id,) for a in manager.alerts()), "the alerts to be silenced", 20)
    events = timeline(incident, silences, escalation, datetime.now(UTC))
    assert [e.text for e in events if e.what == "acknowledged"] == ["acknowledged by root-admin: rebooting n1"]

    ended = [dict(a, endsAt=datetime.now(UTC).isoformat()) for a in faults]
    requests.post(f"{alertmanager}/api/v2/alerts", json=ended, timeout=5).raise_for_status()
    wait_for(lambda: not manager.alerts(), "Alertmanager to drop the resolved alerts", 20)
    store.record(group(manager.alerts()), datetime.now(UTC))
    store.add_note(incident.id, "root-admin", "PSU swapped; <b>n1</b> back", datetime.now(UTC))
    store.set_summary(incident.id, "root-admin", "n1 lost power; its GPU and exporter alerts followed.")
    [past] = IncidentStore(tmp_path / "incidents.sqlite").incidents()  # a new store: it was kept on disk
    assert past.incident.id == incident.id and past.resolved_at is not None
    assert past.summary_by == "root-admin"
    final = timeline(past.incident, manager.silences(), escalation, datetime.now(UTC), past.resolved_at)
    assert [e.what for e in final][-1] == "resolved"
    assert [n.text for n in store.notes(incident.id)] == ["PSU swapped; <b>n1</b> back"]


def test_the_incidents_page_in_chromium_acknowledges_under_the_admins_name(
    alertmanager: str, hooks: dict[str, Webhook], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page in Debian's Chromium (1280x800) on the real Alertmanager; a screenshot in test-artifacts/portal/."""
    xid = alert("GpuXidError", "critical", node="n1", gpu="0")
    xid["annotations"] = {"summary": "GPU 0 reported Xid 79", "runbook": "docs/runbook.md#gpuxiderror"}
    faults = [alert("NodeDown", "critical", node="n1"), xid, alert("GpuHung", "critical", node="n3", gpu="3")]
    requests.post(f"{alertmanager}/api/v2/alerts", json=faults, timeout=5).raise_for_status()
    posted = time.monotonic()
    manager = Alertmanager(alertmanager, requests.Session())
    wait_for(lambda: any(a.inhibited_by for a in manager.alerts()), "NodeDown to inhibit the Xid alert", 20)
    [hung] = [i for i in group(manager.alerts()) if i.root.name == "GpuHung"]
    manager.acknowledge(hung, "alice", "draining n3", hours=1, now=datetime.now(UTC))
    store = IncidentStore(tmp_path / "data" / "incidents.sqlite")
    store.record(group(manager.alerts()), datetime.now(UTC))
    store.add_note(hung.id, "alice", "<script>alert(1)</script> **not bold**", datetime.now(UTC))
    settings = tmp_path / "settings.yaml"
    oncall = {"second_line": {"name": "carol", "webhook_url": hooks["carol"].url}, "escalate_after": "6s"}
    settings.write_text(yaml.safe_dump({"monitoring": {"oncall": oncall}}))
    for name, value in {
        "GPUSLICE_SETTINGS": str(settings),
        "GPUSLICE_ALERTMANAGER_URL": alertmanager,
        "GPUSLICE_DATA_DIR": str(tmp_path / "data"),
    }.items():
        monkeypatch.setenv(name, value)
    secret, port = b"s" * 32, free_port()
    streamlit = start_streamlit(port, "/services/portal/", secret)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            header = {"X-Gpuslice-Identity": sign(Identity("root-admin", admin=True), secret)}
            page = browser.new_context(viewport={"width": 1280, "height": 800}, extra_http_headers=header).new_page()
            wait_for(lambda: _up(f"http://127.0.0.1:{port}/services/portal/_stcore/health"), "Streamlit", 60)
            time.sleep(max(0.0, 7 - (time.monotonic() - posted)))  # past escalate_after: the timeline shows it
            page.goto(f"http://127.0.0.1:{port}/services/portal/incidents")
            page.wait_for_selector("text=NodeDown on node n1", timeout=60_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(ARTIFACTS / "incidents.png"))
            page.wait_for_selector("text=escalated to the second line (carol)", timeout=10_000)
            body = page.inner_text("body")
            assert "<script>alert(1)</script> **not bold**" in body  # shown as written, not run or rendered
            assert "acknowledged by alice" in body
            assert page.locator("a[href*='runbook#gpuxiderror']").count() == 1
            page.get_by_label("Acknowledge: what you are doing").first.fill("rebooting n1")
            page.get_by_role("button", name="Acknowledge").first.click()
            page.wait_for_selector("text=acknowledged by root-admin", timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "incidents-acknowledged.png"), full_page=True)
            browser.close()
    finally:
        streamlit.terminate()
        streamlit.wait(timeout=10)
    made = {(s.created_by, tuple(s.matchers.items()), s.comment) for s in manager.silences()}
    assert made == {
        ("alice", (("node", "n3"), ("gpu", "3")), "draining n3"),
        ("root-admin", (("node", "n1"),), "rebooting n1"),
    }


def _up(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).ok
    except requests.ConnectionError:
        return False
