"""Prometheus and Alertmanager for the single-machine platform.

Pure builders return the two configs as dicts; ``binaries`` says which Debian-packaged
servers are installed. The rule files beside this module are the one source of truth
for recording and alert rules (the Helm chart renders the same files).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt

from hub.settings import MONITORING_USER

RULES_DIR = Path(__file__).parent
RULE_FILES = (RULES_DIR / "recording.yml", RULES_DIR / "alerts.yml")
BINARIES = {
    "prometheus": "prometheus",
    "alertmanager": "prometheus-alertmanager",
    "node_exporter": "prometheus-node-exporter",
}


@dataclass(frozen=True)
class Ports:
    hub: int
    exporter: int
    prometheus: int
    alertmanager: int
    node_exporter: int


def binaries() -> dict[str, str | None]:
    """Where each server's binary is, or None when its Debian package is missing."""
    return {name: shutil.which(binary) for name, binary in BINARIES.items()}


def web_config(password: str) -> dict[str, Any]:
    """Prometheus's and Alertmanager's --web.config.file: basic auth, one user, a bcrypt hash."""
    return {"basic_auth_users": {MONITORING_USER: bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()}}


def prometheus_config(
    ports: Ports,
    hub_token_file: Path,
    *,
    node_exporter: bool,
    interval: str = "15s",
    password_file: Path | None = None,
) -> dict[str, Any]:
    """Scrape jobs and the Alertmanager to send to; ``password_file``: both ask for basic auth."""
    auth = {"basic_auth": {"username": MONITORING_USER, "password_file": str(password_file)}} if password_file else {}

    def job(name: str, port: int, **extra: Any) -> dict[str, Any]:
        return {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}], **extra}

    jobs = [
        job(
            "jupyterhub",
            ports.hub,
            metrics_path="/hub/metrics",
            authorization={"type": "Bearer", "credentials_file": str(hub_token_file)},
        ),
        job("gpu-exporter", ports.exporter),
        job("prometheus", ports.prometheus, **auth),
        job("alertmanager", ports.alertmanager, **auth),
    ]
    if node_exporter:
        jobs.append(job("node", ports.node_exporter))
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in RULE_FILES],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}], **auth}]},
        "scrape_configs": jobs,
    }


def alertmanager_config(webhook_url: str | None) -> dict[str, Any]:
    """Route by severity: critical and warning to the webhook (resolved too), info kept in Alertmanager."""

    def receiver(name: str) -> dict[str, Any]:
        if not webhook_url:
            return {"name": name}
        return {"name": name, "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}

    return {
        "route": {
            "receiver": "default",
            "group_by": ["alertname", "severity"],
            "group_wait": "10s",
            "group_interval": "1m",
            "repeat_interval": "4h",
            "routes": [
                {"matchers": ['severity="critical"'], "receiver": "critical", "group_wait": "0s"},
                {"matchers": ['severity="warning"'], "receiver": "warning"},
            ],
        },
        "receivers": [receiver("default"), receiver("critical"), receiver("warning")],
        "inhibit_rules": [
            {
                "source_matchers": ['alertname="JupyterHubDown"'],
                "target_matchers": ['alertname="SpawnFailureRateHigh"'],
            }
        ],
    }
