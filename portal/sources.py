"""Where the portal's data comes from (from the environment the gate passes), cached."""

from __future__ import annotations

import math
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import streamlit as st

from hub.kube_values import KubeValues, load_kube_values
from hub.settings import MONITORING_USER, Settings, duration_s, from_environment, market_url
from hub.settings import models_root as settings_models_root
from market.store import MarketError, Store, market_store
from portal.data import access, cluster, hub, prometheus
from portal.data.access import Scope
from portal.data.alertmanager import Alertmanager, AlertRow
from portal.data.errors import SourceUnavailableError
from portal.data.hub import HubClient, ServerRow
from portal.data.incident_store import IncidentStore, Note, Recorded
from portal.identity import Identity
from portal.incidents import Escalation, Incident, Silence, group
from spawner import environ, line_admin, usage
from spawner.inventory import Inventory
from spawner.ledger import Held, ServerEvent
from spawner.line_admin import Waiting
from spawner.quotas import GroupRules
from spawner.waitline import Manager, Reservation, WaitStats

if TYPE_CHECKING:
    from prometheus_api_client import PrometheusConnect

    from spawner.anomaly import Finding  # scikit-learn is optional: imported when the models run


@st.cache_resource
def settings() -> Settings:
    """The settings `gpuslice up` named, with the data folder and markets it handed down (hub/settings.py)."""
    return from_environment()


def _env() -> environ.Environment:
    return environ.read()


def _hub_api_url() -> str:
    return _env().get(environ.HUB_API_URL)


@st.cache_resource
def kube_values() -> KubeValues:
    """The chart's values, read as the hub reads them (hub/kube_values.py)."""
    return load_kube_values()


@st.cache_resource
def hub_client() -> HubClient:
    """The portal service's own token: it reads users, servers and groups, and nothing more."""
    return HubClient(_hub_api_url(), _env().get(environ.HUB_API_TOKEN))


def acting_client(identity: Identity) -> HubClient:
    """The reader's own authority (their OAuth token from the gate): for starting and stopping servers."""
    return HubClient(_hub_api_url(), identity.hub_token)


def _monitoring_on() -> None:
    if not settings().monitoring.enabled:
        raise prometheus.MetricsUnavailableError("monitoring is off in the settings (monitoring.enabled)")


def prometheus_url() -> str:
    if _kubernetes():
        return _chart_url(kube_values().prometheus_url, "monitoring.prometheusUrl", "Prometheus")
    _monitoring_on()
    return _env().get(environ.PROMETHEUS_URL) or f"http://127.0.0.1:{settings().monitoring.prometheus_port}"


def monitoring_auth() -> tuple[str, str] | None:
    """Prometheus's and Alertmanager's basic auth, from the 0600 file gpuslice up made (None: none asked)."""
    path = _env().get(environ.MONITORING_PASSWORD_FILE)
    return (MONITORING_USER, Path(path).read_text().strip()) if path else None


def _prometheus(timeout_s: float = 5) -> PrometheusConnect:
    """The platform's Prometheus with the monitoring password; a page's query gives up after 5 s, a report's later."""
    return prometheus.connect(prometheus_url(), timeout_s=timeout_s, auth=monitoring_auth())


def alertmanager_url() -> str:
    if _kubernetes():
        return _chart_url(kube_values().alertmanager_url, "monitoring.alertmanagerUrl", "Alertmanager")
    _monitoring_on()
    return _env().get(environ.ALERTMANAGER_URL) or f"http://127.0.0.1:{settings().monitoring.alertmanager_port}"


def _chart_url(url: str, key: str, what: str) -> str:
    if not url:
        raise prometheus.MetricsUnavailableError(f"the chart names no {what} ({key} is empty); ask an admin to set it")
    return url


def scope(identity: Identity) -> Scope:
    """Whose names and servers this viewer may see (admins all, teachers their classes)."""
    return access.scope_of(identity, group_rules(), groups())


# How old the hub's and the ledger's state may be on a live page. One snapshot is shared by
# every viewer (the data layer narrows it to each viewer's scope), so the hub is asked at
# most ~1/LIVE_S times a second however many pages are open.
LIVE_S = 0.2
# How often live parts of a page re-read: with LIVE_S, a change at the hub shows within
# REFRESH_S + LIVE_S plus one round trip (`python -m bench.jobs_lag` measures it).
REFRESH_S = 0.5


@st.cache_data(ttl=LIVE_S, show_spinner=False)
def _hub_users() -> list[dict[str, Any]]:
    return hub.every_user(hub_client())


def servers(identity: Identity) -> list[ServerRow]:
    return hub.servers_in_scope(_hub_users(), scope(identity))


def group_rules() -> tuple[GroupRules, ...]:
    """The classes' rules (max_slice, budget, ...), as the spawner reads them: the chart's or the settings'."""
    return kube_values().groups if _kubernetes() else settings().groups


@st.cache_data(ttl=30)
def groups() -> dict[str, list[str]]:
    return hub.groups(hub_client())


def _ledger_path() -> Path:
    return settings().data_dir / "ledger.sqlite"


def _kubernetes() -> bool:
    """In the Helm chart the portal reads the Kubernetes API instead of a local ledger."""
    return _env().on_kubernetes


@st.cache_resource
def kube_client() -> cluster.KubeClient:
    return cluster.KubeClient.in_cluster()


def _namespace() -> str:
    return _env().pod_namespace


@st.cache_data(ttl=LIVE_S, show_spinner=False)
def _all_inventory() -> tuple[Inventory, list[Held]]:
    if _kubernetes():
        return cluster.kube_inventory(
            kube_client(),
            _namespace(),
            _env().get(environ.SHARING_BACKEND),
            gpushare_memory_unit=_env().get(environ.GPUSHARE_MEMORY_UNIT),
        )
    return cluster.local_inventory(_ledger_path(), settings().simulate)


def inventory(identity: Identity) -> tuple[Inventory, list[Held]]:
    """GPUs and holds; the holds of people outside the viewer's scope without their names."""
    found, held = _all_inventory()
    viewer = scope(identity)
    return access.inventory(found, viewer), access.holds(held, viewer)


@st.cache_data(ttl=LIVE_S, show_spinner=False)
def _all_server_events() -> dict[str, ServerEvent]:
    if _kubernetes():
        return cluster.kube_server_events(kube_client(), _namespace())
    return cluster.latest_events(_ledger_path())


def server_events(identity: Identity) -> dict[str, ServerEvent]:
    return access.events(_all_server_events(), scope(identity))


@st.cache_data(ttl=5)
def waiting_line(identity: Identity) -> list[Waiting]:
    """The GPU line, the places the viewer may see (on Kubernetes as the hub gives them: it holds the line)."""
    if _kubernetes():
        return _hub_line(identity, _wait_since()).line
    line = line_admin.waiting_line(_ledger_path(), scope(identity), time.time())
    return _with_hub_estimates(identity, line) if line else line


def _with_hub_estimates(identity: Identity, line: list[Waiting]) -> list[Waiting]:
    """On one machine the ledger says who waits; the hub, which runs the waiting spawns, says when each may start.

    A hub that does not answer leaves the starts unknown: the line itself is still shown.
    """
    try:
        told = _hub_line(identity, _wait_since()).line
    except SourceUnavailableError:
        return line
    return line_admin.with_estimates(line, told)


WAIT_DAYS = line_admin.WAIT_DAYS  # how many days of wait times the Overview shows


def _wait_since() -> float:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today - timedelta(days=WAIT_DAYS - 1)).timestamp()


@st.cache_data(ttl=30, show_spinner=False)
def wait_times(identity: Identity) -> list[WaitStats]:
    """Wait-time percentiles per class and per day in the GPU line, of the waits the viewer may see."""
    if _kubernetes():
        return _hub_line(identity, _wait_since()).waits
    return line_admin.wait_times(_ledger_path(), line_manager(identity), _wait_since())


@st.cache_data(ttl=5, show_spinner=False)
def _hub_line(identity: Identity, since: float) -> hub.LineState:
    """On Kubernetes: the line, the waits and the reservations in one answer from the hub, with the reader's token."""
    return hub.line_state(acting_client(identity), since)


def line_manager(identity: Identity) -> Manager:
    """What the viewer may do to the GPU line: admins anything, a class's teachers their class's requests."""
    return line_admin.line_manager(identity.name, identity.admin, group_rules())


def _forget_line() -> None:
    waiting_line.clear()
    _hub_line.clear()


def put_first(identity: Identity, user: str, server: str) -> bool:
    if _kubernetes():
        done = bool(_hub_act(identity, {"action": "put-first", "user": user, "server": server}).get("done"))
    else:
        done = line_admin.put_first(_ledger_path(), line_manager(identity), user, server)
    _forget_line()
    return done


def cancel_waiting(identity: Identity, user: str, server: str) -> bool:
    if _kubernetes():
        done = bool(_hub_act(identity, {"action": "cancel", "user": user, "server": server}).get("done"))
    else:
        done = line_admin.cancel_waiting(_ledger_path(), line_manager(identity), user, server)
    _forget_line()
    return done


def reservations(identity: Identity) -> list[Reservation]:
    if _kubernetes():
        return _hub_line(identity, _wait_since()).reservations
    return line_admin.reservations(_ledger_path(), time.time())


def reserve(identity: Identity, group: str, size: int, start: float, end: float) -> int:
    """Keep GPU memory for a class for a window; never more, with the others, than the GPUs hold."""
    if _kubernetes():  # the hub counts the cluster's GPUs itself
        body = {"action": "reserve", "group": group, "memory_bytes": size, "start": start, "end": end}
        made = int(_hub_act(identity, body)["id"])
    else:
        capacity = sum(g.memory_bytes for g in _all_inventory()[0].gpus() if g.healthy)
        made = line_admin.reserve(_ledger_path(), line_manager(identity), group, size, start, end, capacity)
    _forget_line()
    return made


def drop_reservation(identity: Identity, reservation_id: int) -> bool:
    if _kubernetes():
        done = bool(_hub_act(identity, {"action": "drop-reservation", "id": reservation_id}).get("done"))
    else:
        done = line_admin.drop_reservation(_ledger_path(), line_manager(identity), reservation_id)
    _forget_line()
    return done


def _hub_act(identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
    """A change to the line on Kubernetes: the hub checks who may (PermissionError with its words if not)."""
    return hub.line_action(acting_client(identity), body)


def server_history(identity: Identity, user: str, server: str) -> list[ServerEvent]:
    if _kubernetes():  # Kubernetes keeps a pod's events, not a history after it is gone: show the latest
        access.require(scope(identity), user, "server history")
        latest = server_events(identity).get(f"{user}/{server}")
        return [latest] if latest else []
    return cluster.server_history(_ledger_path(), scope(identity), user, server)


def stop_server(identity: Identity, user: str, server: str) -> None:
    """Stop a server (admins any, users their own), noting who asked where the ledger is."""
    hub.check_may_stop(identity, user)
    # Before the stop: the spawner reads the note when it stops the server.
    if _kubernetes():
        cluster.note_kube_stop(kube_client(), _namespace(), scope(identity), user, server, datetime.now(UTC))
    else:
        cluster.note_stop(_ledger_path(), scope(identity), user, server)
    hub.stop_server(acting_client(identity), identity, user, server)  # the reader's own authority
    forget_servers()


def forget_servers() -> None:
    """After a start or stop from the portal: the next read asks the hub, not the cache."""
    _hub_users.clear()
    _all_server_events.clear()


@st.cache_data(ttl=10)
def gpu_readings() -> dict[tuple[str, str], prometheus.GpuReading]:
    return prometheus.gpu_readings(_prometheus())


@st.cache_data(ttl=10)
def summary() -> dict[str, float]:
    return prometheus.summary(_prometheus())


@st.cache_data(ttl=30)
def trend(expr: str, hours: float) -> list[tuple[datetime, float]]:
    return prometheus.trend(_prometheus(), expr, hours)


@st.cache_data(ttl=10)
def active_alerts() -> list[AlertRow]:
    return alertmanager_client().rows()


def alertmanager_client() -> Alertmanager:
    """Alertmanager with the platform's monitoring credentials: acknowledgements are made with them."""
    return Alertmanager(alertmanager_url(), auth=monitoring_auth())


@st.cache_resource
def incident_store() -> IncidentStore:
    path = settings().data_dir / "incidents.sqlite"
    try:
        return IncidentStore(path)
    except (OSError, sqlite3.Error) as exc:  # a read-only volume: say where, not a traceback
        raise prometheus.MetricsUnavailableError(
            f"the incident store {path} cannot be written ({exc}); give the portal a writable {environ.DATA_DIR.name}"
        ) from exc


def escalation() -> Escalation:
    """The on-call tiers' waits (monitoring.oncall), for the timeline's "escalated" entries."""
    oncall = kube_values().oncall if _kubernetes() else settings().monitoring.oncall
    return Escalation(
        second_line=oncall.second_line.name if oncall.second_line else "",
        escalate_after_s=duration_s(oncall.escalate_after),
        owner=oncall.owner.name if oncall.owner else "",
        owner_after_s=duration_s(oncall.owner_after),
    )


def _admin(identity: Identity, what: str) -> None:
    if not identity.admin:
        raise PermissionError(f"{identity.name} may not {what}: incidents are for admins")


def incidents(identity: Identity) -> tuple[list[Recorded], list[Silence]]:
    """The incidents firing now (recorded as seen) and past ones from the store, with Alertmanager's silences."""
    _admin(identity, "read incidents")
    manager = alertmanager_client()
    store = incident_store()
    store.record(group(manager.alerts()), datetime.now(UTC))
    return store.incidents(), manager.silences()


def acknowledge(identity: Identity, incident: Incident, comment: str, hours: float) -> str:
    _admin(identity, "acknowledge incidents")
    return alertmanager_client().acknowledge(incident, identity.name, comment, hours, datetime.now(UTC))


def add_incident_note(identity: Identity, incident_id: str, text: str) -> None:
    _admin(identity, "write incident notes")
    incident_store().add_note(incident_id, identity.name, text, datetime.now(UTC))


def incident_notes(identity: Identity, incident_id: str) -> list[Note]:
    _admin(identity, "read incident notes")
    return incident_store().notes(incident_id)


def set_incident_summary(identity: Identity, incident_id: str, text: str) -> None:
    _admin(identity, "write incident summaries")
    incident_store().set_summary(incident_id, identity.name, text)


ANOMALY_STEP_S = 60
ANOMALY_DAYS = 3  # the models learn from the first two, and look for the unusual in all three
CARD_QUERIES = {
    "utilization": "DCGM_FI_DEV_GPU_UTIL",
    "temperature": "DCGM_FI_DEV_GPU_TEMP",
    "memory": "sum by (Hostname, gpu) (gpuslice_process_gpu_memory_bytes)",
    "errors": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",  # correctable (single-bit) ECC errors, a counter
    "held": "sum by (node, gpu) (gpuslice_gpu_memory_allocated_bytes)",  # the slices servers hold
}


@st.cache_data(ttl=300)
def card_history() -> tuple[datetime, dict[str, dict[tuple[str, str], list[float | None]]]]:
    """Each card's utilization, temperature, servers' GPU memory, correctable errors and held slices.

    A sample a minute for three days.
    """
    end = datetime.now(UTC)
    start = end - timedelta(days=ANOMALY_DAYS)
    prom = _prometheus(timeout_s=30)
    return start, {
        name: prometheus.card_series(prom, q, start, end, ANOMALY_STEP_S) for name, q in CARD_QUERIES.items()
    }


def _anomaly_models() -> ModuleType:
    try:
        from spawner import anomaly  # scikit-learn: the .[anomaly] extra, which a small install may leave out
    except ImportError as exc:
        raise prometheus.MetricsUnavailableError(
            f"the anomaly models need scikit-learn ({exc.name} is missing): pip install 'gpuslice[anomaly]'"
        ) from exc
    return anomaly


def platform_load() -> dict[tuple[str, str], list[float | None]]:
    """Per card, the other held cards' mean utilization: the load the collapse model compares it with."""
    _, history = card_history()
    means = _anomaly_models().others_mean(history["utilization"], history["held"])
    return {card: [None if math.isnan(v) else float(v) for v in values] for card, values in means.items()}


def anomalies(identity: Identity) -> list[tuple[tuple[str, str], Finding, datetime]]:
    """What the per-card models find (spawner/anomaly.py): (card, finding, when), newest first; admins only."""
    _admin(identity, "read the anomaly findings")
    anomaly = _anomaly_models()
    start, history = card_history()
    train = slice(0, (ANOMALY_DAYS - 1) * 86400 // ANOMALY_STEP_S)
    platform = anomaly.others_mean(history["utilization"], history["held"])
    found = []
    for card, util in history["utilization"].items():
        temp = history["temperature"].get(card)
        if temp:
            found += [(card, f) for f in anomaly.hot_for_load(util, temp, train)]
        if card in history["held"]:
            held = history["held"][card]
            found += [(card, f) for f in anomaly.utilization_collapsed(util, held, platform[card], train)]
    for card, memory in history["memory"].items():
        found += [(card, f) for f in anomaly.memory_growing(memory)]
    for card, errors in history["errors"].items():
        found += [(card, f) for f in anomaly.correctable_errors_rising(errors, train)]
    when = [(card, f, start + timedelta(seconds=f.found * ANOMALY_STEP_S)) for card, f in found]
    return sorted(when, key=lambda x: x[2], reverse=True)


USAGE_STEP_S = 900  # a sample per 15 minutes: 8 weeks stay under Prometheus' 11,000 points per query


@st.cache_data(ttl=600)
def _usage_rows(weeks: int) -> list[usage.UsageRow]:
    end = datetime.now(UTC)
    prom = _prometheus(timeout_s=30)
    samples = prometheus.usage_samples(prom, end - timedelta(weeks=weeks), end, USAGE_STEP_S)
    return usage.usage(samples, USAGE_STEP_S, usage.group_members(group_rules()))


def usage_rows(identity: Identity, weeks: int) -> list[usage.UsageRow]:
    """GPU-hours per user and week: admins everyone's, teachers their classes', everyone else their own."""
    seen = scope(identity)
    return [r for r in _usage_rows(weeks) if seen.sees(r.user)]


@st.cache_data(ttl=30)
def utilization_heatmap(hours: float, per_node: bool = False) -> dict[str, list[tuple[datetime, float]]]:
    """Every card over time; past 64 cards one row per node (its mean), to stay readable."""
    metric = (
        'label_replace(avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL), "gpu", "all", "", "")'
        if per_node
        else "DCGM_FI_DEV_GPU_UTIL"
    )
    return prometheus.per_gpu_trend(_prometheus(), metric, hours)


@st.cache_data(ttl=30)
def spawn_success() -> float | None:
    return prometheus.spawn_success_ratio(_prometheus())


@st.cache_resource
def market() -> Store:
    if _kubernetes():
        url = kube_values().market_url(_env())
        if url.startswith("sqlite"):  # on the hub's volume, which only the hub's pod mounts
            raise MarketError(
                "on Kubernetes the portal reaches the markets only in a database server: the chart's "
                "markets.existingSecret is empty, so they live in SQLite on the hub's volume. Ask an admin to set it."
            )
        return market_store(url)
    return market_store(market_url(settings()))


def proposals_per_hour() -> int:
    return kube_values().proposals_per_hour if _kubernetes() else settings().market.proposals_per_hour


def models_root() -> Path:
    return settings_models_root(settings())


def image_usage() -> dict[str, int]:
    return hub.image_usage(_hub_users())


def visible_groups(identity: Identity) -> dict[str, list[str]]:
    """The viewer's classes (all for admins); members outside the viewer's scope without their names."""
    viewer = scope(identity)
    return {
        name: [m if viewer.sees(m) else access.HIDDEN for m in members]
        for name, members in groups().items()
        if viewer.everyone or identity.name in members or (viewer.teaches and set(members) <= viewer.users)
    }


def server_counts() -> dict[str, int]:
    return hub.server_counts(_hub_users())


def my_groups(identity: Identity) -> set[str]:
    return {name for name, members in groups().items() if identity.name in members}
