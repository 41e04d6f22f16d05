"""Where `gpuslice top` reads the platform: the hub's APIs, with a token that may read them.

* ``/hub/metrics``: each card's capacity and the slices held on it (gpuslice's allocation
  gauges, hub/metrics.py);
* ``/hub/api/users?state=active``: each server's last activity (its idle time);
* ``/hub/api/gpuslice/line``: the GPU line in order, with expected starts;
* Alertmanager's ``/api/v2/alerts``, where its address and password are given: what fires.

A source that does not answer is said in the snapshot's ``problems``, never a crash: top is
opened when something is wrong.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from hub.top import Card, Firing, Slice, Snapshot, Waiting

TIMEOUT_S = 10


@dataclass(frozen=True)
class Source:
    hub_url: str  # http://127.0.0.1:8000 (the proxy) or the hub's own address
    token: str
    alertmanager_url: str = ""
    alertmanager_auth: tuple[str, str] | None = None


def cards_from_metrics(text: str, idle: Mapping[tuple[str, str], float | None]) -> tuple[Card, ...]:
    """Cards and their slices from /hub/metrics' exposition text (pure)."""
    capacity: dict[tuple[str, str], tuple[str, int, bool]] = {}
    held: dict[tuple[str, str], list[Slice]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "gpuslice_gpu_memory_capacity_bytes":
                key = (labels["node"], labels["gpu"])
                capacity[key] = (labels.get("model", ""), int(sample.value), labels.get("simulated") == "true")
            elif sample.name == "gpuslice_gpu_memory_allocated_bytes" and sample.value > 0:
                user, server = labels["user"], labels.get("server", "")
                held[(labels["node"], labels["gpu"])].append(
                    Slice(user, server, int(sample.value), idle.get((user, server)))
                )
    return tuple(
        Card(node, gpu, model, size, simulated, tuple(sorted(held[(node, gpu)], key=lambda s: (s.user, s.server))))
        for (node, gpu), (model, size, simulated) in sorted(capacity.items())
    )


def idle_times(users: list[dict[str, Any]], now: float) -> dict[tuple[str, str], float | None]:
    """(user, server) -> seconds since its last activity, from the hub's user models (pure)."""
    found: dict[tuple[str, str], float | None] = {}
    for user in users:
        for name, server in (user.get("servers") or {}).items():
            last = server.get("last_activity")
            found[(user["name"], name)] = None if not last else max(0.0, now - _epoch(last))
    return found


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def line_from_json(body: dict[str, Any], now: float) -> tuple[Waiting, ...]:
    return tuple(
        Waiting(
            user=str(w["user"]),
            server=str(w.get("server") or ""),
            position=int(w["position"]),
            ask=str(w.get("asked") or ""),
            waited_s=max(0.0, now - float(w.get("since") or now)),
            expected=_clock(w.get("estimated_start")),
        )
        for w in body.get("line") or []
    )


def _clock(epoch: Any) -> str:
    return "" if not epoch else time.strftime("%H:%M", time.localtime(float(epoch)))


def firing_from_json(alerts: list[dict[str, Any]]) -> tuple[Firing, ...]:
    found = []
    for alert in alerts:
        labels = alert.get("labels") or {}
        if labels.get("alertname") == "Watchdog" or (alert.get("status") or {}).get("state") != "active":
            continue
        where = ", ".join(f"{k} {labels[k]}" for k in ("node", "gpu") if labels.get(k))
        found.append(
            Firing(
                labels.get("alertname", "?"),
                labels.get("severity", ""),
                where,
                (alert.get("annotations") or {}).get("summary", ""),
            )
        )
    return tuple(sorted(found, key=lambda a: (a.severity != "critical", a.name, a.where)))


def read(source: Source, session: requests.Session | None = None) -> Snapshot:
    """One snapshot of the platform; each source that fails is named in ``problems``."""
    http = session or requests.Session()
    headers = {"Authorization": f"token {source.token}"}
    problems: list[str] = []
    now = time.time()

    def get(url: str, what: str, **kwargs: Any) -> Any:
        try:
            response = http.get(url, timeout=TIMEOUT_S, **kwargs)
        except requests.RequestException as exc:
            problems.append(f"{what}: {type(exc).__name__} ({url})")
            return None
        if response.status_code != 200:
            problems.append(f"{what}: HTTP {response.status_code} from {url}")
            return None
        return response

    users = get(f"{source.hub_url}/hub/api/users?state=active", "servers", headers=headers)
    idle = idle_times(users.json() if users is not None else [], now)
    metrics = get(f"{source.hub_url}/hub/metrics", "cards", headers=headers)
    cards = cards_from_metrics(metrics.text, idle) if metrics is not None else ()
    line_answer = get(f"{source.hub_url}/hub/api/gpuslice/line", "the GPU line", headers=headers)
    line = line_from_json(line_answer.json(), now) if line_answer is not None else ()
    alerts: tuple[Firing, ...] = ()
    if source.alertmanager_url:
        answer = get(f"{source.alertmanager_url}/api/v2/alerts", "alerts", auth=source.alertmanager_auth)
        alerts = firing_from_json(answer.json()) if answer is not None else ()
    return Snapshot(cards, line, alerts, tuple(problems), now)
