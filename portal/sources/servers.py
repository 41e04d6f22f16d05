"""Notebook servers: the hub's view of them, their events and history, the GPUs they hold; stopping one."""

from __future__ import annotations

from typing import Any

import streamlit as st

from portal.data import access, hub
from portal.data.hub import ServerRow
from portal.identity import Identity
from portal.sources import classes, clients
from portal.sources.clients import LIVE_S
from portal.sources.snapshot import Snapshot
from spawner.inventory import Inventory
from spawner.ledger import Held, ServerEvent


@st.cache_resource
def _users_source() -> Snapshot[list[dict[str, Any]]]:
    client = clients.hub_client()  # here, in the page's thread: the snapshot's own thread calls no Streamlit
    return Snapshot(lambda: hub.every_user(client), LIVE_S)


def _hub_users() -> list[dict[str, Any]]:
    """Every user with their servers, as the hub had them a moment ago: a page never waits for a busy hub."""
    return _users_source().get()


def servers(identity: Identity) -> list[ServerRow]:
    return hub.servers_in_scope(_hub_users(), classes.scope(identity))


@st.cache_resource
def _inventory_source() -> Snapshot[tuple[Inventory, list[Held]]]:
    deployment = clients.deployment()
    return Snapshot(deployment.inventory, LIVE_S)


def _all_inventory() -> tuple[Inventory, list[Held]]:
    return _inventory_source().get()


def inventory(identity: Identity) -> tuple[Inventory, list[Held]]:
    """GPUs and holds; the holds of people outside the viewer's scope without their names."""
    found, held = _all_inventory()
    viewer = classes.scope(identity)
    return access.inventory(found, viewer), access.holds(held, viewer)


@st.cache_resource
def _events_source() -> Snapshot[dict[str, ServerEvent]]:
    deployment = clients.deployment()
    return Snapshot(deployment.server_events, LIVE_S)


def _all_server_events() -> dict[str, ServerEvent]:
    return _events_source().get()


def server_events(identity: Identity) -> dict[str, ServerEvent]:
    return access.events(_all_server_events(), classes.scope(identity))


def server_history(identity: Identity, user: str, server: str) -> list[ServerEvent]:
    return clients.deployment().server_history(classes.scope(identity), user, server)


def stop_server(identity: Identity, user: str, server: str) -> None:
    """Stop a server: admins any, users their own, a class's teachers their students' (the hub checks again),
    noting who asked."""
    class_name = _taught_class_of(identity, user)
    if not identity.admin and identity.name != user and class_name is None:
        raise PermissionError(
            f"{identity.name} may not stop {user}'s server: only admins, {user}'s teachers and {user} can"
        )
    # Before the stop: the spawner reads the note when it stops the server.
    clients.deployment().note_stop(classes.scope(identity), user, server)
    if identity.admin or identity.name == user:
        hub.stop_server(clients.acting_client(identity), identity, user, server)  # the reader's own authority
    else:  # a teacher: the hub's classes API stops it once it has checked they teach the student's class
        classes.stop_member_server(identity, str(class_name), user, server)
    forget_servers()


def _taught_class_of(identity: Identity, user: str) -> str | None:
    """A class the reader teaches that ``user`` is in (None: none)."""
    return next(
        (
            rules.name
            for rules in classes.group_rules()
            if identity.name in rules.teachers and user in classes.groups().get(rules.name, [])
        ),
        None,
    )


def forget_servers() -> None:
    """After a start or stop from the portal: read the hub again now, so the page shows the change."""
    _users_source().refresh()
    _events_source().refresh()


def server_counts() -> dict[str, int]:
    return hub.server_counts(_hub_users())


def image_usage() -> dict[str, int]:
    return hub.image_usage(_hub_users())
