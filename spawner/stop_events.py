"""Who stopped a notebook pod, kept as Kubernetes Events (pure: builds and reads their JSON).

On one machine the ledger keeps each server's history. On Kubernetes a stopped server's
pod is deleted with everything on it, so the note survives as core/v1 Events in the
namespace (the API server keeps them for an hour by default): the portal writes who asked
(``GpusliceStopRequested``) before it asks the hub to stop a server, and the hub's spawner
writes the outcome (``GpusliceStopped``) as it stops the pod. Both carry the pod's
``hub.jupyter.org/username`` and ``servername`` annotations, so the portal can say who
stopped a server whose pod is gone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from spawner.inventory import SERVERNAME, USERNAME
from spawner.ledger import STOP_NOTE_S, ServerEvent, server_key

STOP_REQUESTED = "GpusliceStopRequested"
STOPPED = "GpusliceStopped"


def pod_event(pod: Mapping[str, Any], reason: str, message: str, component: str, now: datetime) -> dict[str, Any]:
    """A core/v1 Event about ``pod``, as the API server accepts it from a client (no eventTime: the legacy form)."""
    meta = pod["metadata"]
    annotations = meta.get("annotations") or {}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
            "namespace": meta["namespace"],
            "annotations": {k: annotations[k] for k in (USERNAME, SERVERNAME) if k in annotations},
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message,
        "type": "Normal",
        "source": {"component": component},
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
    }


def timestamp(event: Mapping[str, Any]) -> float:
    """When an event last happened (seconds since the epoch; 0 when it says nothing)."""
    return parse_time(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp"))


def parse_time(text: str | None) -> float:
    """A Kubernetes RFC 3339 time in seconds since the epoch (0 for none)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else 0.0


def _key(event: Mapping[str, Any]) -> str | None:
    annotations = (event.get("metadata") or {}).get("annotations") or {}
    user = annotations.get(USERNAME)
    return server_key(user, annotations.get(SERVERNAME, "")) if user else None


def stop_request(events: Iterable[Mapping[str, Any]], pod_name: str, now: float) -> ServerEvent | None:
    """The latest note of who asked to stop ``pod_name``, as the ledger's "stopping" event, if recent."""
    asked = [
        e
        for e in events
        if e.get("reason") == STOP_REQUESTED and (e.get("involvedObject") or {}).get("name") == pod_name
    ]
    if not asked:
        return None
    latest = max(asked, key=timestamp)
    if now - timestamp(latest) >= STOP_NOTE_S:
        return None
    return ServerEvent(_key(latest) or "", "stopping", 90, str(latest.get("message", "")), timestamp(latest))


def stopped_servers(events: Iterable[Mapping[str, Any]]) -> dict[str, ServerEvent]:
    """Each server's latest "stopped" note, by server key (the spawner's ``GpusliceStopped`` events)."""
    found: dict[str, ServerEvent] = {}
    for event in events:
        key = _key(event)
        if event.get("reason") != STOPPED or key is None:
            continue
        when = timestamp(event)
        if key not in found or when >= found[key].created:
            found[key] = ServerEvent(key, "stopped", 100, str(event.get("message", "")), when)
    return found
