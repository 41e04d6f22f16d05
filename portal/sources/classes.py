"""The classes: their rules and members, and whom each reader may see because of them."""

from __future__ import annotations

from typing import Any

import streamlit as st

from portal.data import access, hub
from portal.data.access import Scope
from portal.identity import Identity
from portal.sources import clients


def group_rules() -> tuple[dict[str, Any], ...]:
    """The classes' rules (max_slice, budget, teachers, ...), as the spawner reads them."""
    return clients.deployment().group_rules()


@st.cache_data(ttl=30)
def groups() -> dict[str, list[str]]:
    """Each class's members, as the hub's groups have them."""
    return hub.groups(clients.hub_client())


def scope(identity: Identity) -> Scope:
    """Whose names and servers this viewer may see (admins all, teachers their classes)."""
    return access.scope_of(identity, group_rules(), groups())


def visible_groups(identity: Identity) -> dict[str, list[str]]:
    """The viewer's classes (all for admins); members outside the viewer's scope without their names."""
    viewer = scope(identity)
    return {
        name: [m if viewer.sees(m) else access.HIDDEN for m in members]
        for name, members in groups().items()
        if viewer.everyone or identity.name in members or (viewer.teaches and set(members) <= viewer.users)
    }


def my_groups(identity: Identity) -> set[str]:
    return {name for name, members in groups().items() if identity.name in members}
