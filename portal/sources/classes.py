"""The classes: their rules and members as the running hub keeps them, and whom each reader may see.

Read from the hub's classes API (hub/classes_api.py) on both backends: one snapshot with the
portal's own token, shared by every reader. A teacher's page reads the classes they teach with
their own token (the hub decides which), and changes them with it (the hub checks who may).
Under KAI Scheduler a class's queue is read from the cluster, for those same readers only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import streamlit as st

from portal.data import access, hub
from portal.data.access import Scope
from portal.data.hub import ClassInfo
from portal.identity import Identity
from portal.sources import clients
from portal.sources.snapshot import Snapshot
from spawner.quotas import GroupRules, read_groups
from spawner.sharing.kai import ClassQueue, QueuedPod

CLASSES_S = 1.0  # how old the classes may be: a class added elsewhere shows within a second
GROUPS_S = 5.0  # the hub's groups (a chart's classes keep their members there)
QUEUE_S = 2.0  # a class's KAI queue: what KAI counts in it changes as its controllers catch up


@st.cache_resource
def _classes_source() -> Snapshot[list[ClassInfo]]:
    client = clients.hub_client()  # here, in the page's thread: the snapshot's own thread calls no Streamlit
    return Snapshot(lambda: hub.classes(client), CLASSES_S)


def _all_classes() -> list[ClassInfo]:
    return _classes_source().get()


def group_rules() -> tuple[GroupRules, ...]:
    """The classes' rules (max_slice, budget, teachers, members, ...), as the spawners read them now."""
    return read_groups([c.rules for c in _all_classes()])


@st.cache_resource
def _groups_source() -> Snapshot[dict[str, list[str]]]:
    client = clients.hub_client()
    return Snapshot(lambda: hub.groups(client), GROUPS_S)


def _hub_groups() -> dict[str, list[str]]:
    return _groups_source().get()


def groups() -> dict[str, list[str]]:
    """Each class's members: its roster, and the hub's group of its name (a chart's class keeps them there)."""
    found = {name: list(users) for name, users in _hub_groups().items()}
    for info in _all_classes():
        members = found.setdefault(info.name, [])
        members += [m for m in info.members if m not in members]
    return found


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


def teaches(identity: Identity) -> bool:
    """Whether the reader teaches a class (or is an admin): the Teaching page is for them."""
    return identity.admin or any(identity.name in c.teachers for c in _all_classes())


@st.cache_data(ttl=2.0, show_spinner=False)
def taught(identity: Identity) -> list[ClassInfo]:
    """The classes the reader may manage, as the hub tells them with the reader's own token (a page's
    reruns within two seconds ask once)."""
    return hub.classes(clients.acting_client(identity))


@st.cache_data(ttl=QUEUE_S, show_spinner=False)
def _class_queue(name: str) -> ClassQueue | None:
    return clients.deployment().class_queue(name)


def class_queue(identity: Identity, name: str) -> ClassQueue | None:
    """Class ``name``'s KAI queue (None: KAI does not queue this platform's pods), for the classes the hub
    says the reader may manage (their own as a teacher, all as an admin); waiting people outside the reader's
    scope unnamed."""
    if name not in {c.name for c in taught(identity)}:
        raise PermissionError(
            f"{identity.name} may not read class {name}'s KAI queue: only its teachers and admins can"
        )
    found = _class_queue(name)
    if found is None:
        return None
    viewer = scope(identity)
    waiting = tuple(w if viewer.sees(w.user) else QueuedPod(access.HIDDEN, "", "", w.reason) for w in found.waiting)
    return replace(found, waiting=waiting)


def _act(identity: Identity, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return hub.class_action(clients.acting_client(identity), body)
    finally:
        taught.clear()
        _classes_source().refresh()
        _groups_source().refresh()


def add_class(identity: Identity, name: str, rules: dict[str, Any], members: list[str]) -> dict[str, str]:
    """A new class (admins); the new members' invite codes, shown once."""
    answer = _act(identity, {"action": "add-class", "name": name, "rules": rules, "members": members})
    return dict(answer.get("invites") or {})


def change_class(identity: Identity, name: str, rules: dict[str, Any]) -> None:
    _act(identity, {"action": "change-class", "name": name, "rules": rules})


def remove_class(identity: Identity, name: str) -> None:
    _act(identity, {"action": "remove-class", "name": name})


def add_members(identity: Identity, name: str, members: list[str]) -> dict[str, str]:
    """Students into a class (admins, its teachers); their invite codes, shown once."""
    return dict(_act(identity, {"action": "add-members", "name": name, "members": members}).get("invites") or {})


def remove_members(identity: Identity, name: str, members: list[str]) -> None:
    _act(identity, {"action": "remove-members", "name": name, "members": members})


def invite_again(identity: Identity, name: str, members: list[str]) -> dict[str, str]:
    """New codes for members who have not joined (the old ones stop working)."""
    return dict(_act(identity, {"action": "invite", "name": name, "members": members}).get("invites") or {})


def stop_member_server(identity: Identity, name: str, user: str, server: str) -> None:
    """A class member's server, stopped by its teacher with the hub's authority (the hub checks)."""
    _act(identity, {"action": "stop-server", "name": name, "user": user, "server": server})
