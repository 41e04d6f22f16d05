"""Active alerts from Alertmanager's API (v2)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import requests

from portal.data.errors import why
from portal.data.prometheus import MetricsUnavailableError


@dataclass(frozen=True)
class AlertRow:
    name: str
    severity: str
    summary: str
    description: str
    runbook: str
    started: datetime | None
    state: str


def active_alerts(
    url: str, session: requests.Session | None = None, timeout_s: float = 5, auth: tuple[str, str] | None = None
) -> list[AlertRow]:
    try:
        response = (session or requests.Session()).get(f"{url.rstrip('/')}/api/v2/alerts", timeout=timeout_s, auth=auth)
        response.raise_for_status()
        raw = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise MetricsUnavailableError(f"Alertmanager did not answer ({why(exc)})") from exc
    rows = []
    for alert in raw:
        labels, annotations = alert.get("labels", {}), alert.get("annotations", {})
        if labels.get("alertname") == "Watchdog":  # the always-firing heartbeat of the alerting pipeline
            continue
        started = alert.get("startsAt")
        rows.append(
            AlertRow(
                name=labels.get("alertname", "?"),
                severity=labels.get("severity", "none"),
                summary=annotations.get("summary", ""),
                description=annotations.get("description", ""),
                runbook=annotations.get("runbook", ""),
                started=datetime.fromisoformat(started.replace("Z", "+00:00")) if started else None,
                state=(alert.get("status") or {}).get("state", "active"),
            )
        )
    order = {"critical": 0, "warning": 1, "info": 2}
    return sorted(rows, key=lambda a: (order.get(a.severity, 3), a.name))
