"""Where the portal runs: one machine or the Helm chart. The one place that knows the difference.

Everything the two deployments do differently for the portal is a method of ``Deployment``:
where the GPUs and what holds them are read (this machine's GPUs and the ledger, or the
Kubernetes API), where a server's history is kept, how the note of who stops a server is
left, and which of the settings (gpuslice.yaml, or the chart's values) name Prometheus,
Alertmanager and the markets; under KAI Scheduler, where a class's KAI queue is read. The rest
of the portal talks to the hub's REST APIs, the same on both (``portal/data/hub.py``): the GPU
line and the classes are read and changed only there (the classes live in the running hub: not
in either file).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from hub.kube_values import KubeValues, load_kube_values
from hub.settings import Settings, market_url
from hub.settings import from_environment as settings_from_environment
from hub.settings import models_root as settings_models_root
from market.store import MarketError
from portal.data import access, cluster
from portal.data.access import Scope
from portal.data.prometheus import MetricsUnavailableError
from spawner import environ
from spawner.inventory import Inventory
from spawner.ledger import Held, ServerEvent
from spawner.sharing.kai import ClassQueue, Kai


class Deployment(Protocol):
    """What the portal reads and writes differently on one machine and on Kubernetes."""

    def data_dir(self) -> Path: ...

    def inventory(self) -> tuple[Inventory, list[Held]]: ...

    def server_events(self) -> dict[str, ServerEvent]: ...

    def server_history(self, scope: Scope, user: str, server: str) -> list[ServerEvent]: ...

    def note_stop(self, scope: Scope, user: str, server: str) -> None: ...

    def prometheus_url(self) -> str: ...

    def alertmanager_url(self) -> str: ...

    def market_url(self) -> str: ...

    def proposals_per_hour(self) -> int: ...

    def models_root(self) -> Path: ...

    def class_queue(self, group: str) -> ClassQueue | None: ...


class OneMachine:
    """``gpuslice up``: the settings file, this machine's GPUs and the ledger in the data folder."""

    def __init__(self, settings: Settings, env: environ.Environment | None = None) -> None:
        self.settings, self.env = settings, env or environ.read()

    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def _ledger(self) -> Path:
        return self.data_dir() / "ledger.sqlite"

    def inventory(self) -> tuple[Inventory, list[Held]]:
        return cluster.local_inventory(self._ledger, self.settings.simulate)

    def server_events(self) -> dict[str, ServerEvent]:
        return cluster.latest_events(self._ledger)

    def server_history(self, scope: Scope, user: str, server: str) -> list[ServerEvent]:
        return cluster.server_history(self._ledger, scope, user, server)

    def note_stop(self, scope: Scope, user: str, server: str) -> None:
        cluster.note_stop(self._ledger, scope, user, server)

    def _monitoring_on(self) -> None:
        if not self.settings.monitoring.enabled:
            raise MetricsUnavailableError("monitoring is off in the settings (monitoring.enabled)")

    def prometheus_url(self) -> str:
        self._monitoring_on()
        return self.env.get(environ.PROMETHEUS_URL) or f"http://127.0.0.1:{self.settings.monitoring.prometheus_port}"

    def alertmanager_url(self) -> str:
        self._monitoring_on()
        port = self.settings.monitoring.alertmanager_port
        return self.env.get(environ.ALERTMANAGER_URL) or f"http://127.0.0.1:{port}"

    def market_url(self) -> str:
        return market_url(self.settings)  # the settings have what `gpuslice up` handed down

    def proposals_per_hour(self) -> int:
        return self.settings.market.proposals_per_hour

    def models_root(self) -> Path:
        return settings_models_root(self.settings)

    def class_queue(self, group: str) -> ClassQueue | None:
        """Classes have no KAI queue on one machine (gpuslice's own line is the only one)."""
        return None


class Kubernetes:
    """The Helm chart: its values (a ConfigMap), nodes and pods from the Kubernetes API."""

    def __init__(
        self, values: KubeValues, client: cluster.KubeClient | None, env: environ.Environment | None = None
    ) -> None:
        self.values, self._client, self.env = values, client, env or environ.read()
        self.namespace = self.env.pod_namespace

    @property
    def client(self) -> cluster.KubeClient:
        if self._client is None:  # made on first use: reading the values needs no cluster
            self._client = cluster.KubeClient.in_cluster()
        return self._client

    def data_dir(self) -> Path:
        """The portal's own folder (the chart mounts one for the incident store), not the hub's volume."""
        return settings_from_environment(self.env).data_dir

    def inventory(self) -> tuple[Inventory, list[Held]]:
        # The backend as the hub's spawner has it, from the same values: its settings (gpushare's memory
        # unit, DRA's slices and driver, ...) decide how the pods' holds are read.
        return cluster.kube_inventory(self.client, self.namespace, self.values.sharing_backend())

    def server_events(self) -> dict[str, ServerEvent]:
        return cluster.kube_server_events(self.client, self.namespace)

    def server_history(self, scope: Scope, user: str, server: str) -> list[ServerEvent]:
        """Kubernetes keeps a pod's events, not a history after it is gone: the latest one."""
        access.require(scope, user, "server history")
        latest = self.server_events().get(f"{user}/{server}")
        return [latest] if latest else []

    def note_stop(self, scope: Scope, user: str, server: str) -> None:
        cluster.note_kube_stop(self.client, self.namespace, scope, user, server, datetime.now(UTC))

    def prometheus_url(self) -> str:
        return _chart_url(self.values.prometheus_url, "monitoring.prometheusUrl", "Prometheus")

    def alertmanager_url(self) -> str:
        return _chart_url(self.values.alertmanager_url, "monitoring.alertmanagerUrl", "Alertmanager")

    def market_url(self) -> str:
        url = self.values.market_url(self.env)
        if url.startswith("sqlite"):  # on the hub's volume, which only the hub's pod mounts
            raise MarketError(
                "on Kubernetes the portal reaches the markets only in a database server: the chart's "
                "markets.existingSecret is empty, so they live in SQLite on the hub's volume. Ask an admin to set it."
            )
        return url

    def proposals_per_hour(self) -> int:
        return self.values.proposals_per_hour

    def models_root(self) -> Path:
        return settings_models_root(settings_from_environment(self.env))

    def class_queue(self, group: str) -> ClassQueue | None:
        """The class's KAI queue where KAI queues and places the GPU pods (``gpuSharing.backend: kai``), else None."""
        backend = self.values.sharing_backend()
        if not isinstance(backend, Kai):
            return None
        return cluster.kai_queue(self.client, self.namespace, backend, group)


def _chart_url(url: str, key: str, what: str) -> str:
    if not url:
        raise MetricsUnavailableError(f"the chart names no {what} ({key} is empty); ask an admin to set it")
    return url


def from_environment() -> Deployment:
    """The deployment the gate's environment names (``environ.BACKEND`` "kubernetes" in the chart)."""
    env = environ.read()
    if env.on_kubernetes:
        return Kubernetes(load_kube_values(), None, env)
    return OneMachine(settings_from_environment(env), env)
