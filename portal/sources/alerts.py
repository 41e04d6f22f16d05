"""Alertmanager and the incident store: the Alerts page's rows, incidents, acknowledging, notes."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

import streamlit as st

from portal.data.alertmanager import Alertmanager, AlertRow
from portal.data.incident_store import IncidentStore, Note, Recorded
from portal.data.prometheus import MetricsUnavailableError
from portal.identity import Identity
from portal.incidents import Incident, Silence
from portal.sources import clients
from portal.sources.metrics import monitoring_auth
from spawner import environ, incident_schema


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
    path = clients.deployment().data_dir() / incident_schema.FILE_NAME
    try:
        return IncidentStore(path)
    except (OSError, sqlite3.Error) as exc:  # a read-only volume: say where, not a traceback
        raise MetricsUnavailableError(
            f"the incident store {path} cannot be written ({exc}); give the portal a writable {environ.DATA_DIR.name}"
        ) from exc


def _admin(identity: Identity, what: str) -> None:
    if not identity.admin:
        raise PermissionError(f"{identity.name} may not {what}: alerts and incidents are for admins")


def incidents(identity: Identity) -> tuple[list[Recorded], list[Silence]]:
    """The incidents the recorder kept (portal/recorder.py writes them as Alertmanager sends them), with
    the silences it read: the page asks Alertmanager nothing."""
    _admin(identity, "read incidents")
    store = incident_store()
    return store.incidents(), store.silences()


def acknowledge(identity: Identity, incident: Incident, comment: str, hours: float) -> str:
    """A silence in Alertmanager under the admin's name; the store takes Alertmanager's silences at once."""
    _admin(identity, "acknowledge incidents")
    manager = alertmanager_client()
    made = manager.acknowledge(incident, identity.name, comment, hours, datetime.now(UTC))
    incident_store().record_silences(manager.silences())
    return made


def add_incident_note(identity: Identity, incident_id: str, text: str) -> None:
    _admin(identity, "write incident notes")
    incident_store().add_note(incident_id, identity.name, text, datetime.now(UTC))


def incident_notes(identity: Identity, incident_id: str) -> list[Note]:
    _admin(identity, "read incident notes")
    return incident_store().notes(incident_id)


def set_incident_summary(identity: Identity, incident_id: str, text: str) -> None:
    _admin(identity, "write incident summaries")
    incident_store().set_summary(incident_id, identity.name, text)
