"""The cluster: this machine's GPUs and ledger, or Kubernetes nodes and pods; each server's events."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from portal.data import access
from portal.data.access import Scope
from portal.data.errors import SourceUnavailableError, why
from spawner import environ, sharing
from spawner.gpus import machine
from spawner.inventory import GROUP_ANNOTATION, SERVERNAME, USERNAME, Inventory, build_local
from spawner.ledger import Held, Ledger, ServerEvent, server_key
from spawner.sharing import kai
from spawner.stop_events import (
    STOP_REQUESTED,
    STOPPED,
    parse_time,
    pod_event,
    stopped_servers,
    timestamp,
)


def local_inventory(ledger_path: Path, simulate: str) -> tuple[Inventory, list[Held]]:
    holds = Ledger(ledger_path).holdings() if ledger_path.exists() else []
    return build_local(machine(simulate).gpus, [(h.gpu_index, h.allocation()) for h in holds]), holds


def latest_events(ledger_path: Path) -> dict[str, ServerEvent]:
    """Each server's latest event, everyone's: narrow it to a viewer with ``access.events``."""
    if not ledger_path.exists():
        return {}
    return Ledger(ledger_path).latest_events()


def server_history(ledger_path: Path, scope: Scope, user: str, server: str) -> list[ServerEvent]:
    """One server's events, oldest first; PermissionError for a server outside the viewer's scope."""
    access.require(scope, user, "server history")
    return Ledger(ledger_path).history(server_key(user, server)) if ledger_path.exists() else []


log = logging.getLogger(__name__)


def note_stop(ledger_path: Path, scope: Scope, user: str, server: str) -> None:
    """Write who asks to stop a server, so its "stopped" event can name them."""
    access.require(scope, user, "server")
    if ledger_path.exists():
        Ledger(ledger_path).record(server_key(user, server), "stopping", 90, f"{scope.viewer} in the portal")


class KubeClient:
    """The Kubernetes API over HTTP with the pod's service account (reads, and notes of who stopped what)."""

    def __init__(self, api_url: str, token: str, ca_file: str | bool = True, timeout_s: float = 5) -> None:
        self.api_url, self.timeout_s = api_url.rstrip("/"), timeout_s
        self.session = requests.Session()
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.verify = ca_file

    @classmethod
    def in_cluster(cls) -> KubeClient:
        url = environ.read().kube_api_url()
        if url is None:
            raise RuntimeError("not in a Kubernetes pod: KUBERNETES_SERVICE_HOST is not set")
        account = Path("/var/run/secrets/kubernetes.io/serviceaccount")
        return cls(url, (account / "token").read_text(), str(account / "ca.crt"))

    def items(self, path: str) -> list[dict[str, Any]]:
        try:
            response = self.session.get(f"{self.api_url}{path}", timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise SourceUnavailableError(f"The Kubernetes API did not answer ({why(exc)})") from exc
        if response.status_code >= 500:
            raise SourceUnavailableError(f"The Kubernetes API answered HTTP {response.status_code}")
        response.raise_for_status()
        return list(response.json().get("items") or [])

    def get(self, path: str) -> dict[str, Any] | None:
        """One object (None: there is none)."""
        try:
            response = self.session.get(f"{self.api_url}{path}", timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise SourceUnavailableError(f"The Kubernetes API did not answer ({why(exc)})") from exc
        if response.status_code == 404:
            return None
        if response.status_code >= 500:
            raise SourceUnavailableError(f"The Kubernetes API answered HTTP {response.status_code}")
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    def create(self, path: str, body: dict[str, Any]) -> None:
        try:
            response = self.session.post(f"{self.api_url}{path}", json=body, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise SourceUnavailableError(f"The Kubernetes API did not answer ({why(exc)})") from exc
        response.raise_for_status()


def note_kube_stop(client: KubeClient, namespace: str, scope: Scope, user: str, server: str, now: datetime) -> None:
    """Write who asks to stop a server as an Event on its pod, so the spawner can name them when it stops it."""
    access.require(scope, user, "server")
    for pod in client.items(f"/api/v1/namespaces/{namespace}/pods?labelSelector=component%3Dsingleuser-server"):
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get(USERNAME) == user and annotations.get(SERVERNAME, "") == server:
            note = pod_event(pod, STOP_REQUESTED, f"{scope.viewer} in the portal", "gpuslice-portal", now)
            try:
                client.create(f"/api/v1/namespaces/{namespace}/events", note)
            except requests.HTTPError as exc:  # the note is for people reading Servers: never block the stop
                log.warning(
                    "could not note who stops %s/%s (%s): the chart grants the portal events create", user, server, exc
                )


def kube_inventory(client: KubeClient, namespace: str, reader: sharing.SharingBackend) -> tuple[Inventory, list[Held]]:
    """Nodes and the namespace's pods as the core's inventory, as ``reader`` (the sharing backend) reads
    them; holds from the pods' annotations."""
    pods = client.items(f"/api/v1/namespaces/{namespace}/pods")
    objects = {
        read.key: client.items(read.path) for read in reader.reads
    }  # DRA's slices and claims, KAI's reservations
    inventory = sharing.build_kube(client.items("/api/v1/nodes"), pods, reader, objects=objects)
    groups = {
        str(p["metadata"].get("name")): (p["metadata"].get("annotations") or {}).get(GROUP_ANNOTATION) for p in pods
    }
    holds = [
        Held(server_key(a.user, a.server), gpu.index, a.user, a.server, a.memory_bytes, a.whole, groups.get(a.owner))
        for gpu, a in inventory.allocations()
    ]
    return inventory, holds


def kube_server_events(client: KubeClient, namespace: str) -> dict[str, ServerEvent]:
    """Why each notebook pod waits or failed, from its status and latest event (everyone's: narrow with
    ``access.events``)."""
    pods = client.items(f"/api/v1/namespaces/{namespace}/pods?labelSelector=component%3Dsingleuser-server")
    events = client.items(f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.kind%3DPod")
    return server_events_from_pods(pods, events)


def server_events_from_pods(pods: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, ServerEvent]:
    """Pure: a pending pod's latest event says why it waits; a failed pod's reason says why it failed;
    a server stopped since its pod was made says who stopped it (the spawner's ``GpusliceStopped`` event)."""
    latest: dict[str, dict[str, Any]] = {}
    for item in events:
        if item.get("reason") in (STOP_REQUESTED, STOPPED):
            continue  # notes about stopping (read below), not why a pod waits
        name = item.get("involvedObject", {}).get("name", "")
        if name not in latest or timestamp(item) >= timestamp(latest[name]):
            latest[name] = item
    found: dict[str, ServerEvent] = {}
    pod_made: dict[str, float] = {}
    for pod in pods:
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        annotations = meta.get("annotations") or {}
        user = annotations.get(USERNAME) or (meta.get("labels") or {}).get(USERNAME)
        if not user:
            continue
        key = server_key(user, annotations.get(SERVERNAME, ""))
        pod_made[key] = parse_time(meta.get("creationTimestamp"))
        event: dict[str, Any] | None = latest.get(meta.get("name", ""))
        created = timestamp(event) if event else pod_made[key]
        if status.get("phase") == "Failed":
            why = status.get("message") or (event or {}).get("message") or "the pod failed"
            found[key] = ServerEvent(key, "died", 100, f"{status.get('reason') or 'Failed'}: {why}", created)
        elif status.get("phase") == "Pending" and event is not None:
            progress = 20 if event.get("reason") == "FailedScheduling" else 50
            found[key] = ServerEvent(key, "placed", progress, f"{event.get('reason')}: {event.get('message')}", created)
    for key, stopped in stopped_servers(events).items():
        if stopped.created > pod_made.get(key, -1.0):  # not a stop from before the pod there now
            found[key] = stopped
    return found


def kai_queue(client: KubeClient, namespace: str, backend: kai.Kai, group: str) -> kai.ClassQueue:
    """The KAI queue of class ``group`` (KAI's Queue object, only that one), and its pods in ``namespace``."""
    name = backend.queue(group)
    selector = quote(f"{kai.QUEUE_LABEL}={name}", safe="")
    try:
        queue = client.get(f"{kai.QUEUES_PATH}/{quote(name, safe='')}")
        pods = client.items(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
    except requests.HTTPError as exc:
        if exc.response is None or exc.response.status_code not in (401, 403):
            raise
        raise PermissionError(
            f"The Kubernetes API refused the portal KAI's queue {name} (HTTP {exc.response.status_code}): its "
            "ServiceAccount needs get on queues.scheduling.run.ai, which helm/gpuslice grants when "
            "gpuSharing.backend is kai. Tell an admin."
        ) from exc
    return kai.read_queue(name, queue, pods)
