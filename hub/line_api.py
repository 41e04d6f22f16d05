"""`/hub/api/gpuslice/line`: the GPU line for the portal, from the hub that runs the waiting spawns.

The line is in the ledger's SQLite file, on the hub's volume on Kubernetes (spawner/line.py); the
portal reads and changes it only here, on both backends (portal/sources/line.py): only the hub's
waiting spawns know their estimated starts, and only the hub may change what they wait for.
Changes are made with the reader's own token (portal/sources/clients.py ``acting_client``).
The caller is that token's user, and the answer is cut to them on the server, by the same rules
the single-machine portal applies to the file (spawner/line_admin.py, spawner/scope.py):

* GET: the line in order (others' requests only for admins and those classes' teachers),
  each waiting spawn's estimated start where this hub runs it, the wait-time percentiles the
  caller may see (``?since=`` seconds since the epoch), and the reservations (class names and
  sizes, no people). A service that may read every user (the portal's own token) gets the
  whole line, as it gets every user's servers: the portal reads one snapshot for all its
  readers and narrows it to each of them (portal/data/access.py), as it does the servers.
* POST ``{"action": "put-first" | "cancel", "user", "server"}``,
  ``{"action": "reserve", "group", "memory_bytes", "start", "end"}`` or
  ``{"action": "drop-reservation", "id"}``: only admins, and a class's teachers for that
  class (``may_manage``, checked again inside the ledger's transaction); 403 with why otherwise.

The classes' rules (who teaches what) are the spawner's (``gpu_group_rules``: the class store, live);
a class's members are the hub's group of that name and the rule's ``members``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from jupyterhub import orm
from jupyterhub.apihandlers import APIHandler
from jupyterhub.scopes import Scope as HubScope
from tornado import web

from hub.notice import NoticeHandler
from spawner import line_admin
from spawner.line import WaitingLineMixin
from spawner.quotas import GroupRules, least_served_groups
from spawner.scope import Scope, scope_for
from spawner.waitline import Manager

# What the token must carry besides its user: reading the line is reading users; changing it
# stops or delays people's spawns, so it needs a token that may stop servers (the portal's does).
READ_SCOPE = "read:users"
ACT_SCOPE = "delete:servers"


@dataclass(frozen=True)
class Move:
    """Put a waiting request first, or take it out of the line."""

    kind: Literal["put-first", "cancel"]
    user: str
    server: str


@dataclass(frozen=True)
class Reserve:
    group: str
    memory_bytes: int
    start: float
    end: float


@dataclass(frozen=True)
class Drop:
    reservation_id: int


Action = Move | Reserve | Drop


def parse_action(body: Any) -> Action:
    """The action a POST body asks for; ValueError saying what a good one looks like."""
    if not isinstance(body, dict):
        raise ValueError('send a JSON object such as {"action": "put-first", "user": "ann", "server": ""}')
    kind = body.get("action")
    if kind in ("put-first", "cancel"):
        return Move(kind, _text(body, "user"), _text(body, "server"))
    if kind == "reserve":
        return Reserve(_text(body, "group"), _whole(body, "memory_bytes"), _number(body, "start"), _number(body, "end"))
    if kind == "drop-reservation":
        return Drop(_whole(body, "id"))
    raise ValueError(f"unknown action {kind!r}: use put-first, cancel, reserve or drop-reservation")


def _text(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, not {value!r}")
    return value


def _whole(body: Mapping[str, Any], key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be a whole number, not {value!r}")
    return value


def _number(body: Mapping[str, Any], key: str) -> float:
    value = body.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{key} must be a number (seconds since the epoch), not {value!r}")
    return float(value)


def viewer_of(
    name: str, admin: bool, rules: Sequence[GroupRules], groups: Mapping[str, Sequence[str]]
) -> tuple[Scope, Manager]:
    """Whom the caller sees in the line, and what they may change in it (the portal's own rules)."""
    return scope_for(name, admin, rules, groups), line_admin.line_manager(name, admin, rules)


class LineHandler(APIHandler):  # type: ignore[misc]
    def _caller(self, scope: str) -> Any:
        """The token's user; 403 for no token, a service's token, or one without ``scope``.

        Reading, a service that may read every user (``read:users`` unfiltered) is let in too.
        """
        user = self.current_user
        if user is None:
            raise web.HTTPError(403, "the GPU line API needs a user's token (the portal sends its reader's)")
        if getattr(user, "kind", "") != "user" and not (scope == READ_SCOPE and self._reads_everyone()):
            raise web.HTTPError(403, "the GPU line API answers users, not services: send the reader's own token")
        if scope not in self.parsed_scopes:
            raise web.HTTPError(403, f"this token may not {'read' if scope == READ_SCOPE else 'change'} the GPU line")
        return user

    def _reads_everyone(self) -> bool:
        return self.parsed_scopes.get(READ_SCOPE) is HubScope.ALL

    def _line(self, user: Any) -> tuple[WaitingLineMixin, Path, Scope, Manager]:
        if getattr(user, "kind", "") != "user":  # a service reading every user: every place in line
            spawner = self._any_spawner()
            return spawner, Path(spawner.gpu_ledger_path), Scope(user.name, everyone=True), Manager(user.name, True)
        spawner = user.spawner
        if not isinstance(spawner, WaitingLineMixin):
            raise web.HTTPError(404, "this hub's spawner keeps no GPU line")
        rules = spawner.gpu_group_rules
        groups = {} if user.admin else {g.name: [u.name for u in g.users] for g in self.db.query(orm.Group)}
        scope, manager = viewer_of(user.name, bool(user.admin), rules, groups)
        return spawner, Path(spawner.gpu_ledger_path), scope, manager

    def _any_spawner(self) -> WaitingLineMixin:
        """A spawner of this hub, for the line's settings (every user's are alike); 404 if none keeps a line."""
        first = self.db.query(orm.User).order_by(orm.User.id).first()
        spawner = self.users[first].spawner if first is not None else None
        if not isinstance(spawner, WaitingLineMixin):
            raise web.HTTPError(404, "this hub's spawner keeps no GPU line")
        return spawner

    def _estimated_start(self, waiting: line_admin.Waiting, now: float) -> float | None:
        """From the request's waiting spawn in this hub (none after a hub restart until it is started again)."""
        if waiting.user not in self.users:  # only the users this hub holds in memory: no database rows made
            return None
        spawner = self.users[waiting.user].spawners.get(waiting.server)
        return spawner.gpu_estimated_start(now) if isinstance(spawner, WaitingLineMixin) else None

    async def get(self) -> None:
        user = self._caller(READ_SCOPE)
        spawner, path, scope, manager = self._line(user)
        holds = await spawner.gpu_holds()  # on Kubernetes the pods: the ledger holds none there
        now = time.time()
        try:
            since = float(self.get_argument("since", str(now - line_admin.WAIT_DAYS * 86400)))
        except ValueError as exc:
            raise web.HTTPError(400, "since must be seconds since the epoch") from exc
        line = [
            replace(w, estimated_start=self._estimated_start(w, now))
            for w in line_admin.waiting_line(path, scope, now, holds, least_served_groups(spawner.gpu_group_rules))
        ]
        body = {
            "line": line_admin.to_json(line),
            "waits": line_admin.to_json(line_admin.wait_times(path, manager, since)),
            "reservations": line_admin.to_json(line_admin.reservations(path, now)),
        }
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    async def post(self) -> None:
        user = self._caller(ACT_SCOPE)
        try:
            action = parse_action(self.get_json_body())
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from exc
        spawner, path, _, manager = self._line(user)
        try:
            answer = await _act(action, spawner, path, manager)
        except PermissionError as exc:
            raise web.HTTPError(403, str(exc)) from exc
        except ValueError as exc:  # a reservation that does not fit, or is not one
            raise web.HTTPError(400, str(exc)) from exc
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(answer))


async def _act(action: Action, spawner: WaitingLineMixin, path: Path, manager: Manager) -> dict[str, Any]:
    if isinstance(action, Move):
        change = line_admin.put_first if action.kind == "put-first" else line_admin.cancel_waiting
        return {"done": change(path, manager, action.user, action.server)}
    if isinstance(action, Drop):
        return {"done": line_admin.drop_reservation(path, manager, action.reservation_id)}
    capacity = await spawner.gpu_capacity_bytes()
    made = line_admin.reserve(path, manager, action.group, action.memory_bytes, action.start, action.end, capacity)
    return {"id": made}


# How long the spawn form's Start waits for the spawn before showing the spawn page (JupyterHub's
# slow_spawn_timeout, 10 s by default): a refusal comes back within it, to the form with its words;
# a start that waits in line shows its place after it, not after ten seconds of a blank page.
SLOW_SPAWN_TIMEOUT_S = 2


def show_the_line_soon(c: Any) -> None:
    """JupyterHub's config ``c``: the spawn page (the place in line) within SLOW_SPAWN_TIMEOUT_S of Start."""
    c.JupyterHub.tornado_settings = {
        **dict(c.JupyterHub.get("tornado_settings", None) or {}),
        "slow_spawn_timeout": SLOW_SPAWN_TIMEOUT_S,
    }


# The hub pages of the GPU line, on every hub (hub/wiring.py configure_hub):
# the reclaim warnings for JupyterLab and the home page, and the line for the portal's Queue.
LINE_HANDLERS = [(r"/gpuslice/notice", NoticeHandler), (r"/api/gpuslice/line", LineHandler)]
