"""Incidents with the real Alertmanager: inhibition by cause, the rotation, escalation, acknowledgement,
and the incident recorder (portal/recorder.py) keeping all of it as Alertmanager sends it.

Alerts are posted to Alertmanager's API as Prometheus would; a webhook receiver per
person records what reaches them. Escalation waits are seconds here, minutes in use.
"""

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
import yaml
from playwright.sync_api import sync_playwright

from hub.monitoring import RECORDER_PATH, Recorder, alertmanager_config
from hub.settings import Contact, OnCall
from portal.data.alertmanager import Alertmanager
from portal.data.incident_store import IncidentStore, Recorded
from portal.gate import start_streamlit
from portal.identity import Identity, sign
from portal.incidents import group, timeline
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


@dataclass
class Stack:
    """The real Alertmanager and the incident recorder (portal/recorder.py) it sends to."""

    url: str
    store_path: Path
    recorder_port: int
    token: str
    start_recorder: Callable[..., subprocess.Popen[bytes]]
    recorder: subprocess.Popen[bytes] | None = None

    @property
    def store(self) -> IncidentStore:
        return IncidentStore(self.store_path)

    def stop_recorder(self) -> None:
        if self.recorder is not None:
            self.recorder.terminate()
            self.recorder.wait(timeout=10)
            self.recorder = None

    def restart_recorder(self, *extra: str) -> None:
        self.stop_recorder()
        self.recorder = self.start_recorder(*extra)


@pytest.fixture
def stack(tmp_path: Path, hooks: dict[str, Webhook]) -> Iterator[Stack]:
    oncall = OnCall(
        rotation=tuple(Contact(name=n, webhook_url=hooks[n].url) for n in ("alice", "bob")),
        rotation_start=datetime.now(UTC).date(),  # alice's turn today, bob's next week
        second_line=Contact(name="carol", webhook_url=hooks["carol"].url),
        owner=Contact(name="dave", webhook_url=hooks["dave"].url),
        first_page_after="2s",  # the inhibitor sees the causes posted with their effects
        escalate_after="6s",
        owner_after="12s",
        group_interval="2s",
        business_days="monday:sunday",
        business_hours=hours_that_exclude_now(),
        deadman_url=hooks["deadman"].url,
    )
    port, recorder_port = free_port(), free_port()
    token = tmp_path / "recorder-token"
    token.write_text("a-token-only-alertmanager-and-the-recorder-read")
    token.chmod(0o600)
    recorder = Recorder(f"http://127.0.0.1:{recorder_port}{RECORDER_PATH}", credentials_file=token)
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(alertmanager_config(None, oncall, recorder=recorder)))
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
    recorder_log = (tmp_path / "recorder.log").open("a")

    def start_recorder(*extra: str) -> subprocess.Popen[bytes]:
        started = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "portal.recorder",
                f"--data-dir={tmp_path / 'portal-data'}",
                f"--port={recorder_port}",
                f"--token-file={token}",
                f"--alertmanager-url={url}",
                "--interval=1",
                *extra,
            ],
            stdout=recorder_log,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: _up(f"http://127.0.0.1:{recorder_port}/health"), "the recorder to listen", 30)
        return started

    running = Stack(
        url, tmp_path / "portal-data" / "incidents.sqlite", recorder_port, token.read_text(), start_recorder
    )
    try:
        wait_for(lambda: _up(f"{url}/-/ready"), "Alertmanager to start", 30)
        running.recorder = start_recorder()
        yield running
    finally:
        running.stop_recorder()
        process.terminate()
        process.wait(timeout=10)
        log.close()
        recorder_log.close()


def alert(name: str, severity: str, starts: datetime | None = None, **labels: str) -> dict[str, object]:
    now = starts or datetime.now(UTC)
    return {
        "labels": {"alertname": name, "severity": severity, **labels},
        "annotations": {"summary": f"{name} test"},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }


def now_ms() -> datetime:
    """Now, in Alertmanager's precision (its API keeps milliseconds)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def ended(raw: dict[str, object], at: datetime) -> dict[str, object]:
    """The same alert as Prometheus sends it once it resolved: endsAt is the moment it ended."""
    return {**raw, "endsAt": at.isoformat()}


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


@pytest.mark.waits
def test_an_incident_is_paged_inhibited_acknowledged_and_escalated(stack: Stack, hooks: dict[str, Webhook]) -> None:
    alertmanager = stack.url
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


def recorded(stack: Stack, title: str) -> Recorded | None:
    return next((r for r in stack.store.incidents() if r.incident.title == title), None)


@pytest.mark.waits
def test_an_incident_nobody_looks_at_is_recorded_with_alertmanagers_times(
    stack: Stack, hooks: dict[str, Webhook]
) -> None:
    """The recorder writes what Alertmanager sends, as it sends it: nobody opens the portal."""
    t0 = now_ms() - timedelta(seconds=1)
    node = alert("NodeDown", "critical", t0, node="n1")
    xid = alert("GpuXidError", "critical", t0 + timedelta(milliseconds=300), node="n1", gpu="0")  # inhibited
    requests.post(f"{stack.url}/api/v2/alerts", json=[node, xid], timeout=5).raise_for_status()
    wait_for(lambda: "NodeDown@n1" in received(hooks["dave"]), "the owner to be paged after 12 s", 40)

    # The inhibited alert ends first: Alertmanager never notifies it, the recorder sees it leave the API.
    xid_end = now_ms()
    requests.post(f"{stack.url}/api/v2/alerts", json=[ended(xid, xid_end)], timeout=5).raise_for_status()
    wait_for(
        lambda: (r := recorded(stack, "NodeDown on node n1")) and any(a.ended for a in r.incident.alerts),
        "the recorder to see the Xid alert gone",
        20,
    )
    node_end = now_ms()
    requests.post(f"{stack.url}/api/v2/alerts", json=[ended(node, node_end)], timeout=5).raise_for_status()
    kept = wait_for(  # (the API read may see it gone first; Alertmanager's resolved notification then corrects it)
        lambda: (r := recorded(stack, "NodeDown on node n1")) and r.resolved_at and r.incident.end_exact and r,
        "the resolved notification",
        30,
    )
    incident = kept.incident
    assert incident.started == t0  # Alertmanager's startsAt, to the microsecond
    assert incident.resolved_at == node_end and incident.end_exact  # its endsAt, not when someone looked
    [gone] = [a for a in incident.alerts if a.name == "GpuXidError"]
    # Its end: the moment the recorder saw it leave the API, or, when Alertmanager still held it in
    # the group when NodeDown ended, the endsAt of the resolved notification that carried both.
    assert gone.inhibited_by and gone.ended is not None
    assert gone.ended == xid_end if gone.end_exact else xid_end <= gone.ended <= node_end
    events = timeline(incident, kept.notifications, stack.store.silences())
    assert [(e.what, e.text.split(" of ")[0]) for e in events] == [
        ("firing", "NodeDown fired (node n1)"),
        ("firing", "GpuXidError fired (node n1, gpu 0)"),  # both before the first page went out
        ("notified", "Alertmanager notified first-line-alice"),
        ("escalated", "not acknowledged in time: Alertmanager notified the second line (second-line)"),
        ("escalated", "not acknowledged in time: Alertmanager notified the owner (owner)"),
        ("resolved", "resolved: no alert"),
    ]
    notified: dict[str, datetime] = {}
    for note in sorted(kept.notifications, key=lambda n: n.at):
        notified.setdefault(note.receiver, note.at)
    paged = {name: hooks[name].received_at[0] for name in ("alice", "carol", "dave")}
    # The tiers' times are Alertmanager's sends: within a second of each person's webhook receiving it.
    for tier, person in (("first-line-alice", "alice"), ("second-line", "carol"), ("owner", "dave")):
        assert abs((notified[tier] - paged[person]).total_seconds()) < 1, (tier, notified, paged)
    assert 5 < (paged["carol"] - paged["alice"]).total_seconds() < 12  # escalate_after 6 s
    assert 11 < (paged["dave"] - paged["alice"]).total_seconds() < 18  # owner_after 12 s


def test_what_fires_while_the_recorder_is_down_is_caught_up(stack: Stack, hooks: dict[str, Webhook]) -> None:
    """Down for a while: on start the recorder reads what fires from Alertmanager's API, and
    Alertmanager, which kept failing to reach it, sends it the rest (the end, with its endsAt).

    An alert that fires *and* ends while the recorder is down never reaches it through
    Alertmanager (which sends no end to a receiver that never took the start, and lists no
    ended alert): Prometheus's ALERTS history fills that in (test_the_recorder_catches_up_from_prometheus)."""
    assert (
        requests.post(  # and nobody without the token writes to it
            f"http://127.0.0.1:{stack.recorder_port}{RECORDER_PATH}", json={"version": "4", "alerts": []}, timeout=5
        ).status_code
        == 401
    )
    stack.stop_recorder()
    t0 = now_ms()
    hung = alert("GpuHung", "critical", t0, node="n3", gpu="3")
    hot = alert("GpuTemperatureHigh", "warning", t0, node="n5", gpu="1")  # after hours: no page, still kept
    requests.post(f"{stack.url}/api/v2/alerts", json=[hung, hot], timeout=5).raise_for_status()
    wait_for(lambda: "GpuHung@n3" in received(hooks["alice"]), "alice to be paged while the recorder is down", 20)
    stack.restart_recorder()
    kept = wait_for(lambda: recorded(stack, "GpuHung on node n3, gpu 3"), "the recorder to catch up", 30)
    assert kept.incident.started == t0 and kept.resolved_at is None
    warm = wait_for(lambda: recorded(stack, "GpuTemperatureHigh on node n5, gpu 1"), "the muted warning", 20)
    assert warm.incident.started == t0 and warm.resolved_at is None
    hung_end = now_ms()
    requests.post(f"{stack.url}/api/v2/alerts", json=[ended(hung, hung_end)], timeout=5).raise_for_status()
    kept = wait_for(
        lambda: (r := recorded(stack, "GpuHung on node n3, gpu 3")) and r.resolved_at and r.incident.end_exact and r,
        "Alertmanager's end of the hung GPU",
        40,
    )
    assert kept.resolved_at == hung_end
    assert "first-line-alice" in {n.receiver for n in kept.notifications}


def test_what_fired_and_ended_while_the_recorder_was_down_comes_from_prometheus(stack: Stack, tmp_path: Path) -> None:
    """Prometheus's ALERTS series (backfilled here as a real Prometheus would have written them) give
    the episodes Alertmanager can no longer tell: the recorder reads them once, when it starts."""
    stack.stop_recorder()
    end = int(datetime.now(UTC).timestamp()) // 15 * 15
    labels = 'alertname="GpuXidError",alertstate="firing",gpu="2",node="n7",severity="critical"'
    samples = [f"ALERTS{{{labels}}} 1 {end - 1800 + 15 * i}" for i in range(40)]  # 10 minutes, 20 minutes ago
    (tmp_path / "alerts.om").write_text("\n".join(["# TYPE ALERTS gauge", *samples, "# EOF", ""]))
    blocks = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "alerts.om"), str(tmp_path / "tsdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert blocks.returncode == 0, blocks.stdout + blocks.stderr
    (tmp_path / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    port = free_port()
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _up(f"http://127.0.0.1:{port}/-/ready"), "Prometheus", 60)
        stack.restart_recorder(f"--prometheus-url=http://127.0.0.1:{port}")
        kept = wait_for(lambda: recorded(stack, "GpuXidError on node n7, gpu 2"), "the catch-up from history", 30)
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
    [alert] = kept.incident.alerts
    started, stopped = end - 1800, end - 1800 + 585  # the first and last firing samples
    assert started <= alert.started.timestamp() <= started + 15 and not alert.end_exact  # within the query's step
    # A backfilled series has no staleness marker (a rule evaluation writes one when an alert stops),
    # so Prometheus returns its last sample for up to 5 more minutes here: the end is that late at most.
    assert kept.resolved_at is not None and stopped < kept.resolved_at.timestamp() <= stopped + 300 + 30
    assert "Prometheus's history" in alert.summary


def resolved(hook: Webhook) -> set[str]:
    return {
        f"{a['labels']['alertname']}@{a['labels'].get('node', '')}" for a in hook.received if a["status"] == "resolved"
    }


def test_the_incidents_page_in_chromium_acknowledges_under_the_admins_name(
    stack: Stack, hooks: dict[str, Webhook], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page in Debian's Chromium (1280x800) on the recorder's store; a screenshot in test-artifacts/portal/."""
    alertmanager = stack.url
    xid = alert("GpuXidError", "critical", node="n1", gpu="0")
    xid["annotations"] = {"summary": "GPU 0 reported Xid 79", "runbook": "docs/runbook.md#gpuxiderror"}
    faults = [alert("NodeDown", "critical", node="n1"), xid, alert("GpuHung", "critical", node="n3", gpu="3")]
    requests.post(f"{alertmanager}/api/v2/alerts", json=faults, timeout=5).raise_for_status()
    manager = Alertmanager(alertmanager, requests.Session())
    wait_for(lambda: any(a.inhibited_by for a in manager.alerts()), "NodeDown to inhibit the Xid alert", 20)
    [hung] = [i for i in group(manager.alerts()) if i.root.name == "GpuHung"]
    manager.acknowledge(hung, "alice", "draining n3", hours=1, now=datetime.now(UTC))
    wait_for(lambda: any(r.incident.title == "GpuHung on node n3, gpu 3" for r in stack.store.incidents()), "hung", 20)
    stack.store.add_note(hung.id, "alice", "<script>alert(1)</script> **not bold**", datetime.now(UTC))
    wait_for(lambda: "NodeDown@n1" in received(hooks["carol"]), "the second line", 30)
    for name, value in {
        "GPUSLICE_ALERTMANAGER_URL": alertmanager,
        "GPUSLICE_DATA_DIR": str(stack.store_path.parent),
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
            page.goto(f"http://127.0.0.1:{port}/services/portal/incidents")
            page.wait_for_selector("text=NodeDown on node n1", timeout=60_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=str(ARTIFACTS / "incidents.png"))
            page.wait_for_selector("text=Alertmanager notified the second line", timeout=60_000)
            body = page.inner_text("body")
            assert "<script>alert(1)</script> **not bold**" in body  # shown as written, not run or rendered
            assert "acknowledged by alice" in body
            assert page.locator("a[href*='runbook#gpuxiderror']").count() == 1
            page.get_by_label("Acknowledge: what you are doing").first.fill("rebooting n1")
            page.get_by_role("button", name="Acknowledge").first.click()
            page.wait_for_selector("text=acknowledged by root-admin", timeout=120_000)  # at once, from the API
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
