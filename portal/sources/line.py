"""The GPU line, read and changed through the hub's line API on both backends (hub/line_api.py).

The hub holds the line (its waiting spawns know their estimated starts); the portal reads one
snapshot of it with its own token, shared by every reader and narrowed to each one's scope
like the servers, and changes it with the reader's own token: the hub decides who may.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import streamlit as st

from portal.data import hub
from portal.identity import Identity
from portal.sources import classes, clients
from portal.sources.clients import LIVE_S
from portal.sources.snapshot import Snapshot
from spawner import line_admin
from spawner.line_admin import Waiting
from spawner.waitline import Manager, Reservation, WaitStats

WAIT_DAYS = line_admin.WAIT_DAYS  # how many days of wait times the Overview shows


@st.cache_resource
def _line_source() -> Snapshot[hub.LineState]:
    """Everyone's places and the reservations, as the hub has them (no wait times: those are read per reader)."""
    client = clients.hub_client()  # here, in the page's thread: the snapshot's own thread calls no Streamlit
    return Snapshot(lambda: hub.line_state(client, since=time.time()), LIVE_S)


def _snapshot() -> hub.LineState:
    return _line_source().get()


def waiting_line(identity: Identity) -> list[Waiting]:
    """The GPU line in order, the places the viewer may see."""
    viewer = classes.scope(identity)
    return [w for w in _snapshot().line if viewer.sees(w.user)]


def reservations(identity: Identity) -> list[Reservation]:
    """The reservations not yet over (class names and sizes: anyone may see them)."""
    return _snapshot().reservations


def _wait_since() -> float:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (today - timedelta(days=WAIT_DAYS - 1)).timestamp()


@st.cache_data(ttl=30, show_spinner=False)
def wait_times(identity: Identity) -> list[WaitStats]:
    """Wait-time percentiles per class and per day, of the waits the viewer may see (the hub narrows them)."""
    return hub.line_state(clients.acting_client(identity), _wait_since()).waits


def line_manager(identity: Identity) -> Manager:
    """What the viewer may do to the GPU line: admins anything, a class's teachers their class's requests."""
    return line_admin.line_manager(identity.name, identity.admin, classes.group_rules())


def _act(identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
    """A change to the line, with the reader's authority: the hub checks who may (PermissionError, its words)."""
    try:
        return hub.line_action(clients.acting_client(identity), body)
    finally:
        _line_source().refresh()


def put_first(identity: Identity, user: str, server: str) -> bool:
    return bool(_act(identity, {"action": "put-first", "user": user, "server": server}).get("done"))


def cancel_waiting(identity: Identity, user: str, server: str) -> bool:
    return bool(_act(identity, {"action": "cancel", "user": user, "server": server}).get("done"))


def reserve(identity: Identity, group: str, size: int, start: float, end: float) -> int:
    """Keep GPU memory for a class for a window; never more, with the others, than the GPUs hold (the hub counts)."""
    body = {"action": "reserve", "group": group, "memory_bytes": size, "start": start, "end": end}
    return int(_act(identity, body)["id"])


def drop_reservation(identity: Identity, reservation_id: int) -> bool:
    return bool(_act(identity, {"action": "drop-reservation", "id": reservation_id}).get("done"))
