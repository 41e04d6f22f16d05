"""Alertmanager and the incident store: the Alerts page's rows, incidents, acknowledging, notes."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

import streamlit as st

from hub.settings import duration_s
from portal.data.alertmanager import Alertmanager, AlertRow
from portal.data.incident_store import IncidentStore, Note, Recorded
from portal.data.prometheus import MetricsUnavailableError
from portal.identity import Identity
from portal.incidents import Escalation, Incident, Silence, group
from portal.sources import clients
from portal.sources.metrics import monitoring_auth
from spawner import environ


def alertmanager_url() -> str:
    return clients.deployment().alertmanager_url()


@st.cache_data(ttl=10)
def _active_alerts() -> list[AlertRow]:
    return alertmanager_client().rows()


def active_alerts(identity: Identity) -> list[AlertRow]:
    """The platform's alerts: for admins, who act on them (a student can do nothing about an incident)."""
    _admin(identity, "read the platform's alerts")
    return _active_alerts()


def alertmanager_client() -> Alertmanager:
    """Alertmanager with the platform's monitoring credentials: acknowledgements are made with them."""
    return Alertmanager(alertmanager_url(), auth=monitoring_auth())


@st.cache_resource
def incident_store() -> IncidentStore:
    path = clients.deployment().data_dir() / "incidents.sqlite"
    try:
        return IncidentStore(path)
    except (OSError, sqlite3.Error) as exc:  # a read-only volume: say where, not a traceback
        raise MetricsUnavailableError(
            f"the incident store {path} cannot be written ({exc}); give the portal a writable {environ.DATA_DIR.name}"
        ) from exc


def escalation() -> Escalation:
    """The on-call tiers' waits (monitoring.oncall), for the timeline's "escalated" entries."""
    oncall = clients.deployment().oncall()
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
