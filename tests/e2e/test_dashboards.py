"""Dashboards and metric names against real Prometheus, started once by `gpuslice up`.

Every panel query of NVIDIA's dcgm-exporter dashboard and of gpuslice's own returns data,
with the template variables substituted as Grafana does; every metric name used in the
rules, the portal, the chart, the dashboards and the docs is one that Prometheus really
scraped (from the exporter, the hub, node-exporter or itself) or records.
"""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.e2e.platform import Platform, free_port
from tests.e2e.promql import (
    LABEL_VALUES,
    grafana_variables,
    names_in_promql,
    names_in_prose,
    panel_queries,
    substitute,
    variable_query,
)
from tests.shared import shared_file

REPO = Path(__file__).parents[2]
OUR_DASHBOARD = REPO / "helm" / "gpuslice" / "files" / "grafana-dashboard.json"
RULE_FILES = [
    *sorted((REPO / "hub" / "monitoring").glob("*.yml")),
    *sorted((REPO / "helm/gpuslice/files").glob("*.yml")),
]


# Served on Kubernetes by kube-state-metrics (its internal/store/cronjob.go), which one machine does not
# run: RenewalOverdue's Kubernetes branch reads them, tested by promtool (tests/hub/monitoring/alerts_*test.yml).
KUBE_STATE_METRICS = {
    "kube_cronjob_created",
    "kube_cronjob_next_schedule_time",
    "kube_cronjob_status_last_schedule_time",
    "kube_cronjob_status_last_successful_time",
}


class Prometheus:
    def __init__(self, port: int, auth: tuple[str, str]) -> None:
        self.api, self.auth = f"http://127.0.0.1:{port}/api/v1", auth

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = requests.get(f"{self.api}/query", params={"query": expr}, auth=self.auth, timeout=10).json()
        assert answer["status"] == "success", f"{expr}: {answer}"
        return list(answer["data"]["result"])

    def label_values(self, match: str, label: str) -> list[str]:
        answer = requests.get(
            f"{self.api}/label/{label}/values", params={"match[]": match}, auth=self.auth, timeout=10
        ).json()
        return sorted(answer["data"])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """One platform for the module: bob holds a 4 GiB slice, one spawn was refused, GPU 1 has an Xid."""
    ports = {k: free_port() for k in ("exporter_port", "prometheus_port", "alertmanager_port", "node_exporter_port")}
    platform = Platform(tmp_path_factory.mktemp("dashboards"), {"monitoring": {"scrape_interval": "1s", **ports}})
    platform.start()
    try:
        bob = platform.login("bob")
        assert bob.api("POST", "/users/bob/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
        bob.wait_ready("bob")
        refused = platform.login("carol").api("POST", "/users/carol/server", json={"gpu_memory": "64GiB"})
        assert refused.status_code >= 400, refused.text
        (platform.data_dir / "monitoring" / "faults.json").write_text(json.dumps([{"gpu": 1, "xid": 79}]))
        yield Prometheus(ports["prometheus_port"], platform.monitoring_auth())
    finally:
        platform.stop()


def empty_panels(prom: Prometheus, dashboard: dict[str, Any]) -> list[str]:
    values = grafana_variables(dashboard, prom.label_values)
    return [
        f"{title}: {substitute(expr, values)}"
        for title, expr in panel_queries(dashboard)
        if not prom.query(substitute(expr, values))
    ]


def wait_until_every_panel_has_data(prom: Prometheus, dashboard: dict[str, Any]) -> list[str]:
    """The panels still empty after a minute (the recording rules run every 30s)."""
    deadline = time.monotonic() + 75
    while (empty := empty_panels(prom, dashboard)) and time.monotonic() < deadline:
        time.sleep(1)
    return empty


def test_every_panel_of_nvidias_dcgm_dashboard_shows_data(prometheus: Prometheus) -> None:
    dashboard = json.loads(shared_file("vendor/dcgm-exporter/dcgm-exporter-dashboard.json").read_text())
    assert len(panel_queries(dashboard)) == 8
    assert wait_until_every_panel_has_data(prometheus, dashboard) == []


def test_every_panel_of_gpuslices_dashboard_shows_data(prometheus: Prometheus) -> None:
    dashboard = json.loads(OUR_DASHBOARD.read_text())
    assert wait_until_every_panel_has_data(prometheus, dashboard) == []
    # The alerts panel shows the real one (another alert may fill the panel first: the rules run every 30 s).
    deadline = time.monotonic() + 90
    while not (firing := {a["metric"]["alertname"] for a in prometheus.query("ALERTS")}) >= {"GpuXidError"}:
        assert time.monotonic() < deadline, f"GpuXidError never fired; ALERTS has {sorted(firing)}"
        time.sleep(1)


def used_metric_names() -> dict[str, set[str]]:
    """Metric name -> where it is used."""
    used: dict[str, set[str]] = {}

    def add(names: set[str], where: Path | str) -> None:
        for name in names:
            used.setdefault(name, set()).add(str(where).replace(f"{REPO}/", ""))

    for rules in RULE_FILES:
        for group in yaml.safe_load(rules.read_text())["groups"]:
            for rule in group["rules"]:
                add(names_in_promql(rule["expr"]), rules)
    vendored = shared_file("vendor/dcgm-exporter/dcgm-exporter-dashboard.json")
    for path in (vendored, OUR_DASHBOARD):
        dashboard = json.loads(path.read_text())
        add({n for _, expr in panel_queries(dashboard) for n in names_in_promql(expr)}, path.name)
        for variable in dashboard["templating"]["list"]:
            if match := LABEL_VALUES.match(variable_query(variable)):
                add(names_in_promql(match["match"]), path.name)
    for source in (REPO / "portal").rglob("*.py"):
        strings = [n.value for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.Constant)]
        add({name for s in strings if isinstance(s, str) for name in names_in_prose(s)}, source)
    prose = [*(REPO / "helm" / "gpuslice").rglob("*.yaml"), *(REPO / "docs").glob("*.md"), REPO / "README.md"]
    for path in prose:
        add(names_in_prose(path.read_text()), path)
    return used


def test_every_metric_name_used_anywhere_is_really_served(prometheus: Prometheus) -> None:
    used = used_metric_names()
    assert {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpuslice_spawn_refused_total", "node_filesystem_avail_bytes"} <= set(used)
    assert set(used) >= KUBE_STATE_METRICS  # the list names only what is used

    def unserved() -> dict[str, set[str]]:
        served = set(prometheus.label_values('{__name__=~".+"}', "__name__")) | KUBE_STATE_METRICS
        return {name: where for name, where in used.items() if name not in served}

    deadline = time.monotonic() + 45  # recording rules appear at their first evaluation (every 30s)
    while (missing := unserved()) and time.monotonic() < deadline:
        time.sleep(1)
    assert missing == {}, "used but not served (name: where)"
