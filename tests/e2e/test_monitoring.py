"""Real Prometheus and Alertmanager, started by `gpuslice up`, scraping a real exporter and hub."""

import json
import shutil
from typing import Any

import pytest
import requests
from prometheus_api_client import PrometheusConnect

from tests.e2e.alerting import Webhook, wait_for
from tests.e2e.platform import Platform, free_port

GiB = 2**30


@pytest.mark.waits
def test_metrics_reach_prometheus_and_an_alert_reaches_the_webhook(make_platform: Any) -> None:
    webhook = Webhook()
    ports = {k: free_port() for k in ("exporter_port", "prometheus_port", "alertmanager_port", "node_exporter_port")}
    platform: Platform = make_platform(monitoring={"scrape_interval": "1s", "webhook_url": webhook.url, **ports})
    platform.start()
    bob = platform.login("bob")
    assert bob.api("POST", "/users/bob/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    bob.wait_ready("bob")

    prometheus = PrometheusConnect(
        url=f"http://127.0.0.1:{ports['prometheus_port']}", disable_ssl=True, auth=platform.monitoring_auth()
    )

    def targets_up() -> bool:
        up = prometheus.custom_query("up")
        return len(up) >= 4 and all(r["value"][1] == "1" for r in up)

    wait_for(targets_up, "every scrape target to be up", 60)  # Prometheus scrapes itself and Alertmanager with auth
    _monitoring_asks_for_credentials(platform, ports["prometheus_port"], ports["alertmanager_port"])
    if shutil.which("prometheus-node-exporter"):  # it asks for the password too, and Prometheus gives it
        assert [r["value"][1] for r in prometheus.custom_query('up{job="node"}')] == ["1"]
    util = prometheus.custom_query("DCGM_FI_DEV_GPU_UTIL")
    assert sorted(r["metric"]["gpu"] for r in util) == ["0", "1"]

    # The hub's allocation reaches Prometheus, and the recording rules sum it.
    def allocated() -> bool:
        result = prometheus.custom_query("gpuslice:gpu_memory_allocated_bytes:sum")
        return bool(result) and float(result[0]["value"][1]) == 4 * GiB  # 0 until the hub's first scrape

    wait_for(allocated, "the recording rule to sum bob's slice", 90)
    capacity = prometheus.custom_query("gpuslice:gpu_memory_capacity_bytes:sum")
    assert float(capacity[0]["value"][1]) == 32 * GiB
    process = prometheus.custom_query('gpuslice_process_gpu_memory_bytes{user="bob"}')
    assert len(process) == 1 and 0 < float(process[0]["value"][1]) <= 4 * GiB

    # Inject an Xid on GPU 1: the alert goes pending, then firing, then reaches the webhook.
    (platform.data_dir / "monitoring" / "faults.json").write_text(json.dumps([{"gpu": 1, "xid": 79}]))

    def alert_state() -> str:
        alerts = prometheus.custom_query('ALERTS{alertname="GpuXidError"}')
        return alerts[0]["metric"]["alertstate"] if alerts else ""

    wait_for(lambda: alert_state() == "pending", "GpuXidError to be pending", 30)
    wait_for(lambda: alert_state() == "firing", "GpuXidError to fire", 100)
    alert = wait_for(
        lambda: [a for a in webhook.received if a["labels"]["alertname"] == "GpuXidError"], "the webhook", 60
    )[0]
    assert alert["status"] == "firing"
    assert alert["labels"]["gpu"] == "1" and alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"] == "GPU 1 on localhost reported Xid 79"
    # Incidents are per node: the alert and the exporter's target name the same node (inhibitions use it).
    assert alert["labels"]["node"] == "localhost"
    assert [r["metric"]["node"] for r in prometheus.custom_query('up{job="gpu-exporter"}')] == ["localhost"]
    assert not [a for a in webhook.received if a["labels"]["alertname"] == "Watchdog"]  # the heartbeat goes elsewhere
    am = requests.get(
        f"http://127.0.0.1:{ports['alertmanager_port']}/api/v2/alerts", auth=platform.monitoring_auth(), timeout=10
    ).json()
    assert any(a["labels"]["alertname"] == "GpuXidError" for a in am)
    webhook.server.shutdown()


def _monitoring_asks_for_credentials(platform: Platform, prometheus_port: int, alertmanager_port: int) -> None:
    """Without the password (in 0600 files only the platform's account reads) a local user gets 401:
    no series, no alerts, no silence (issue 13)."""
    query = f"http://127.0.0.1:{prometheus_port}/api/v1/query"
    silences = f"http://127.0.0.1:{alertmanager_port}/api/v2/silences"
    silence = {
        "matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
        "startsAt": "2020-01-01T00:00:00Z",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "a student",
        "comment": "hide everything",
    }
    for auth in (None, ("gpuslice", "a-guess"), ("admin", platform.monitoring_auth()[1])):
        assert requests.get(query, params={"query": "up"}, auth=auth, timeout=10).status_code == 401
        assert (
            requests.get(f"http://127.0.0.1:{alertmanager_port}/api/v2/alerts", auth=auth, timeout=10).status_code
            == 401
        )
        assert requests.post(silences, json=silence, auth=auth, timeout=10).status_code == 401
    assert requests.get(silences, auth=platform.monitoring_auth(), timeout=10).json() == []  # none was made
    for name in ("web-password", "web.yml"):
        assert (platform.data_dir / "monitoring" / name).stat().st_mode & 0o777 == 0o600
