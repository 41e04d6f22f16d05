"""A fault at night, nobody on the portal: `gpuslice up` with the real Prometheus and Alertmanager
records the incident by itself (the hub's incident-recorder service), with its firing, each
notification, the escalations and the resolution as Alertmanager sent them."""

import json
from datetime import datetime
from typing import Any

import pytest
import requests
import yaml

from portal.data.alertmanager import alert_from_api
from portal.data.incident_store import IncidentStore
from portal.incidents import timeline
from spawner.card_health import CardLedger
from tests.e2e.alerting import Webhook, wait_for
from tests.e2e.platform import Platform, free_port

PORTS = ("exporter_port", "prometheus_port", "alertmanager_port", "node_exporter_port")


@pytest.mark.waits
def test_a_fault_at_night_becomes_an_incident_with_alertmanagers_times(make_platform: Any) -> None:
    hooks = {name: Webhook() for name in ("alice", "carol", "dave")}
    ports = {k: free_port() for k in PORTS}
    oncall = {
        "rotation": [{"name": "alice", "webhook_url": hooks["alice"].url}],
        "second_line": {"name": "carol", "webhook_url": hooks["carol"].url},
        "owner": {"name": "dave", "webhook_url": hooks["dave"].url},
        "first_page_after": "5s",
        "escalate_after": "20s",
        "owner_after": "40s",
        "group_interval": "5s",
    }
    platform: Platform = make_platform(monitoring={"scrape_interval": "1s", "oncall": oncall, **ports})
    platform.start()
    store = IncidentStore(platform.data_dir / "incidents.sqlite")
    alertmanager = f"http://127.0.0.1:{ports['alertmanager_port']}"

    # The gpu-patrol service checks each free card as the hub starts, then every 6 hours. A fault
    # written before that first round ends would also fail the card's patrol (GpuPatrolFailed, which
    # keeps the incident open until an admin clears the card); this night's fault comes hours later.
    cards = CardLedger(platform.data_dir / "ledger.sqlite")

    def first_round() -> list[Any]:
        health = cards.health()
        return health if len(health) == 2 else []  # the platform simulates two cards

    checked = wait_for(first_round, "the patrol's first round", 60)
    assert all(card.healthy for card in checked), checked
    # 03:12, a card reports Xid 79; nobody has the portal open.
    (platform.data_dir / "monitoring" / "faults.json").write_text(json.dumps([{"gpu": 1, "xid": 79}]))

    def firing_in_alertmanager() -> list[dict[str, Any]]:
        alerts = requests.get(f"{alertmanager}/api/v2/alerts", auth=platform.monitoring_auth(), timeout=10).json()
        return [a for a in alerts if a["labels"]["alertname"] == "GpuXidError"]

    [raw] = wait_for(firing_in_alertmanager, "GpuXidError to reach Alertmanager", 150)
    started_in_alertmanager = alert_from_api(raw).started
    wait_for(lambda: hooks["dave"].received, "the owner to be paged after 40 s", 90)

    # The card is reset: the exporter reports Xid 0, the alert resolves.
    (platform.data_dir / "monitoring" / "faults.json").write_text("[]")

    def ended() -> Any:
        return next((r for r in store.incidents() if r.resolved_at and r.incident.end_exact), None)

    kept = wait_for(ended, "the recorder to keep the resolved incident", 120)
    incident = kept.incident
    assert incident.title.startswith("GpuXidError on node ") and incident.title.endswith(", gpu 1")
    assert incident.started == started_in_alertmanager  # Alertmanager's own startsAt
    wait_for(lambda: [a for a in hooks["alice"].received if a["status"] == "resolved"], "alice told it resolved", 60)
    resolved = [a for a in hooks["alice"].received if a["status"] == "resolved"]
    assert incident.resolved_at == datetime.fromisoformat(resolved[0]["endsAt"].replace("Z", "+00:00"))
    events = timeline(incident, kept.notifications, store.silences())
    assert [e.what for e in events] == ["firing", "notified", "escalated", "escalated", "resolved"]
    told: dict[str, datetime] = {}
    for note in sorted(kept.notifications, key=lambda n: n.at):
        if note.firing:
            told.setdefault(note.receiver, note.at)
    assert [e.at for e in events[1:4]] == [told["first-line-alice"], told["second-line"], told["owner"]]
    for receiver, person in (("first-line-alice", "alice"), ("second-line", "carol"), ("owner", "dave")):
        assert abs((told[receiver] - hooks[person].received_at[0]).total_seconds()) < 2, (receiver, told)
    assert 18 < (told["second-line"] - told["first-line-alice"]).total_seconds() < 30
    assert 38 < (told["owner"] - told["first-line-alice"]).total_seconds() < 50
    # The renewals service renewed the Alertmanager config at its start, and Prometheus has seen it.
    prometheus = f"http://127.0.0.1:{ports['prometheus_port']}/api/v1/query"

    def renewal() -> list[dict[str, Any]]:
        query = {"query": 'gpuslice_renewal_last_success_timestamp_seconds{task="alertmanager-config"}'}
        answer = requests.get(prometheus, params=query, auth=platform.monitoring_auth(), timeout=10).json()
        return list(answer["data"]["result"])

    [renewed] = wait_for(renewal, "the renewal's metric in Prometheus", 60)
    assert abs(float(renewed["value"][1]) - incident.started.timestamp()) < 600
    # Nobody can write to the recorder without its token.
    port = yaml.safe_load(platform.config.read_text())["monitoring"]["recorder_port"]
    recorder = f"http://127.0.0.1:{port}/api/alertmanager"
    assert requests.post(recorder, json={"version": "4", "alerts": []}, timeout=5).status_code == 401
    for hook in hooks.values():
        hook.server.shutdown()
