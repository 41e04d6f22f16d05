"""`/hub/api/gpuslice/classes`: the classes, read and changed in the running hub, on both backends.

A change is made at once, without a restart and without stopping anyone's server: in the
class store the spawners read at every spawn (spawner/class_store.py) and in JupyterHub's
own groups (the hub's database, as its groups API would change it). New members become hub
users (so they may log in where sign-up is closed) and get single-use invite codes for
/hub/join (hub/accounts.py), which the answer carries once, for the teacher to hand out.

* GET: the classes the caller may see, with their rules, members and who has joined:
  admins and a service that may read every user (the portal's own token) all of them, a
  class's teachers their classes, anyone else nothing.
* POST ``{"action": ...}``: ``add-class``, ``change-class`` ``{"name", "rules": {...}}``,
  ``put-class`` (made or replaced whole, with ``members``) and ``remove-class`` ``{"name"}``:
  admins. ``add-members`` / ``remove-members`` ``{"name", "members": [...]}`` and ``invite``
  ``{"name", "members": [...]}`` (a new code replaces one still waiting): admins and the
  class's teachers; ``stop-server`` ``{"name", "user", "server"}``: a member's server, stopped by
  an admin or the class's teacher. 403 with why otherwise, 400 for a class or rule that cannot be.

`gpuslice class ...` asks here with the gpuslice-cli service's token (a file in the data
folder), so the command line and the portal change a running hub the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyterhub import orm
from jupyterhub.apihandlers import APIHandler
from jupyterhub.scopes import Scope as HubScope
from tornado import web

from hub.accounts import has_password, invite_codes, invites_path, passwords_path
from hub.logins import name_problem, normalize_name
from spawner.class_store import ClassStore, Rules, members_of, teachers_of
from spawner.quotas import GroupRulesError

READ_SCOPE = "read:users"
ACT_SCOPE = "delete:servers"  # the portal's reader's token: as for the GPU line (hub/line_api.py)
ADMIN_SCOPE = "admin:groups"  # a service acting as an admin here: gpuslice-cli
USERNAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")
RULE_KEYS = ("max_slice", "budget", "servers_per_user", "max_gpus", "images", "teachers")


@dataclass(frozen=True)
class ClassAction:
    kind: str
    name: str
    rules: Mapping[str, Any]
    members: tuple[str, ...]
    server: str = ""  # stop-server: the member's server (members[0] is the member)


def parse_action(body: Any) -> ClassAction:
    """The change a POST body asks for; ValueError saying what a good one looks like."""
    if not isinstance(body, dict):
        raise ValueError('send a JSON object such as {"action": "add-members", "name": "ml101", "members": ["ann"]}')
    kind = body.get("action")
    known = (
        "add-class",
        "put-class",
        "change-class",
        "remove-class",
        "add-members",
        "remove-members",
        "invite",
        "stop-server",
    )
    if kind not in known:
        raise ValueError(f"unknown action {kind!r}: use {', '.join(known)}")
    name = body.get("name")
    if not isinstance(name, str) or not USERNAME.match(name):
        raise ValueError("name must be a class name: lower-case letters, digits, '.', '_', '@' or '-'")
    rules = body.get("rules") or {}
    if not isinstance(rules, dict) or set(rules) - set(RULE_KEYS):
        raise ValueError(f"rules may set {', '.join(RULE_KEYS)}")
    members = body.get("members") or []
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ValueError("members must be a list of user names")
    for typed in members:  # as the login page keeps names: look-alikes refused
        problem = name_problem(normalize_name(typed)) if typed.strip() else None
        if problem:
            raise ValueError(f"{typed.strip()!r} is not a user name: {problem}")
    names = tuple(dict.fromkeys(normalize_name(m) for m in members if m.strip()))
    if kind == "stop-server":
        user, server = body.get("user"), body.get("server", "")
        if not isinstance(user, str) or not USERNAME.match(user) or not isinstance(server, str):
            raise ValueError('stop-server needs "user" (a member of the class) and "server" ("" for the default)')
        return ClassAction(str(kind), name, {}, (user,), server)
    return ClassAction(str(kind), name, rules, names)


def may_change(caller: str, admin: bool, action: ClassAction, current: Rules | None) -> str | None:
    """Why ``caller`` may not make this change (None: they may). Rosters: admins and the class's teachers."""
    if admin:
        return None
    if action.kind in ("add-class", "put-class", "change-class", "remove-class"):
        return f"{caller} may not {action.kind.replace('-', ' ')}es: only admins can"
    what = "stop the servers of" if action.kind == "stop-server" else "change the roster of"
    if current is None or caller not in teachers_of(current):
        return f"{caller} may not {what} {action.name}: only admins and its teachers can"
    if action.kind == "stop-server" and action.members[0] not in members_of(current):
        return f"{action.members[0]} is not in {action.name}: its teachers may stop only its members' servers"
    return None


def apply(action: ClassAction, current: Rules | None) -> Rules | None:
    """The class's rules after the change (None: removed); ValueError for a change that cannot be."""
    if action.kind == "add-class":
        if current is not None:
            raise ValueError(f"there is already a class {action.name}: change it instead")
        return {**action.rules, "members": list(action.members)}
    if action.kind == "put-class":  # the whole class as given (gpuslice class add): made or replaced
        return {**action.rules, "members": list(action.members)}
    if current is None:
        raise ValueError(f"there is no class {action.name}")
    if action.kind == "remove-class":
        return None
    if action.kind == "change-class":
        return {**current, **action.rules}
    members = members_of(current)
    if action.kind == "add-members":
        return {**current, "members": [*members, *(m for m in action.members if m not in members)]}
    if action.kind == "remove-members":
        return {**current, "members": [m for m in members if m not in action.members]}
    return current  # invite, stop-server: the roster is unchanged


def visible(caller: str, everyone: bool, classes: Sequence[Rules]) -> list[Rules]:
    return [c for c in classes if everyone or caller in teachers_of(c)]


class ClassesHandler(APIHandler):  # type: ignore[misc]
    @property
    def _store(self) -> ClassStore:
        path = self.settings.get("gpuslice_classes_path")
        if not path:
            raise web.HTTPError(404, "this hub keeps no class store (hub/wiring.py LiveClasses)")
        return ClassStore(path)

    @property
    def _data_dir(self) -> Path:
        return Path(self.settings["gpuslice_data_dir"])

    def _caller(self, scope: str) -> tuple[str, bool]:
        """(name, acts as an admin); 403 for no token or one without ``scope``."""
        who = self.current_user
        if who is None:
            raise web.HTTPError(403, "the classes API needs a user's token (the portal sends its reader's)")
        if getattr(who, "kind", "") != "user":  # a service: the portal reads, gpuslice-cli changes
            if self.parsed_scopes.get(ADMIN_SCOPE) is HubScope.ALL:
                return who.name, True
            if scope == READ_SCOPE and self.parsed_scopes.get(READ_SCOPE) is HubScope.ALL:
                return who.name, True
            raise web.HTTPError(403, "this service may not change classes")
        if scope not in self.parsed_scopes:
            raise web.HTTPError(403, f"this token may not {'read' if scope == READ_SCOPE else 'change'} classes")
        return who.name, bool(who.admin)

    def _joined(self, names: Sequence[str]) -> tuple[list[str], list[str]]:
        """Of ``names``: who has a password (joined) and who has an invite code waiting."""
        passwords, invites = passwords_path(self._data_dir), invites_path(self._data_dir)
        joined = [n for n in names if has_password(passwords, n)]
        return joined, [n for n in names if n not in joined and has_password(invites, n)]

    async def get(self) -> None:
        caller, admin = self._caller(READ_SCOPE)
        shown = []
        for rules in visible(caller, admin, self._store.classes()):
            joined, invited = self._joined(members_of(rules))
            shown.append({"rules": rules, "joined": joined, "invited": invited})
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"classes": shown}))

    async def post(self) -> None:
        caller, admin = self._caller(ACT_SCOPE)
        try:
            action = parse_action(self.get_json_body())
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from exc
        refused: list[str] = []

        def edit(current: Rules | None) -> Rules | None:
            why = may_change(caller, admin, action, current)
            if why:
                refused.append(why)
                return current
            return apply(action, current)

        try:
            after = self._store.change(action.name, edit)
        except (ValueError, GroupRulesError) as exc:
            raise web.HTTPError(400, str(exc)) from exc
        if refused:
            raise web.HTTPError(403, refused[0])
        if action.kind == "stop-server":
            await self._stop(action.members[0], action.server)
            self.log.info(
                "gpuslice: %s stopped %s/%s (class %s)", caller, action.members[0], action.server, action.name
            )
            self.finish(json.dumps({"stopped": True}))
            return
        self._sync_group(action.name, after)
        invites: dict[str, str] = {}
        if action.kind in ("add-class", "add-members"):
            invites = invite_codes(self._data_dir, action.members)
        elif action.kind == "invite":
            roster = set(members_of(after or {}))
            invites = invite_codes(self._data_dir, [m for m in action.members if m in roster], renew=True)
        self.log.info("gpuslice: %s %s %s by %s", action.kind, action.name, ",".join(action.members), caller)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"class": after, "invites": invites}))

    async def _stop(self, name: str, server: str) -> None:
        """Stop a member's server with the hub's authority (the caller was checked: the class's teacher)."""
        user = self.find_user(name)
        spawner = user.spawners.get(server) if user is not None else None
        if spawner is None or not (spawner.active or spawner.pending):
            raise web.HTTPError(400, f"{name} has no server {server or '(default)'} running")
        await self.stop_single_user(user, server)

    def _sync_group(self, name: str, rules: Rules | None) -> None:
        """JupyterHub's group of the class to match it: members made hub users; nobody's server stopped."""
        group = orm.Group.find(self.db, name)
        if rules is None:
            if group is not None:
                self.db.delete(group)
                self.db.commit()
            return
        if group is None:
            group = orm.Group(name=name)
            self.db.add(group)
        users = []
        for member in members_of(rules):
            user = orm.User.find(self.db, member)
            if user is None:
                user = self.user_from_username(member).orm_user  # a hub user: may log in once they join
            users.append(user)
        group.users = users
        for teacher in teachers_of(rules):  # a teacher named live may log in too (not a member of the group)
            if orm.User.find(self.db, teacher) is None:
                self.user_from_username(teacher)
        self.db.commit()


CLASSES_HANDLERS = [(r"/api/gpuslice/classes", ClassesHandler)]
