"""The hub's gpuslice APIs as one caller reaches them: the GPU line (hub/line_api.py) over a ledger
file, and the classes (hub/classes_api.py) over a class store.

They answer as the handlers do, through the same functions (spawner/line_admin.py, and
``viewer_of``/``parse_action``/``may_change``/``apply`` from the handlers' modules): the
portal's own token sees every place and class, a reader their scope; changes are checked for
the reader. The handlers themselves run in a real JupyterHub in tests/kube/test_kube_line.py
and tests/e2e (the class flow).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests

from hub.classes_api import apply, may_change, visible
from hub.classes_api import parse_action as parse_class_action
from hub.line_api import Drop, Move, parse_action, viewer_of
from portal.data import hub
from portal.identity import Identity
from spawner import line_admin
from spawner.class_store import ClassStore
from spawner.scope import Scope
from spawner.waitline import Manager

API = "http://hub.invalid/hub/api"
CAPACITY = 32 * 2**30  # the GPUs the hub counts for reservations: two 16 GiB cards


class LineHubDouble(requests.Session):
    """``caller`` None: the portal service's token (reads everyone's places, may change nothing)."""

    def __init__(
        self,
        ledger: Path,
        caller: Identity | None,
        rules: Callable[[], Sequence[Mapping[str, Any]]],
        groups: Callable[[], Mapping[str, Sequence[str]]],
        classes: ClassStore | None = None,
    ) -> None:
        super().__init__()
        self.ledger, self.caller, self.rules, self.groups = ledger, caller, rules, groups
        self.classes = classes
        self.sent: list[tuple[str, str]] = []
        self.stopped: list[tuple[str, str]] = []  # servers a teacher stopped through the classes API

    def _viewer(self) -> tuple[Scope, Manager]:
        if self.caller is None:
            return Scope("portal", everyone=True), Manager("portal", admin=True)
        return viewer_of(self.caller.name, self.caller.admin, self.rules(), self.groups())

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        method, url = str(method), str(url)
        parts = urlsplit(url.removeprefix(API))
        self.sent.append((method, parts.path))
        if parts.path == hub.CLASSES_PATH and self.classes is not None:
            return self._classes(method, kwargs.get("json"))
        assert parts.path == hub.LINE_PATH, url
        scope, manager = self._viewer()
        now = time.time()
        if method == "GET":
            since = float(parse_qs(parts.query).get("since", [now - line_admin.WAIT_DAYS * 86400])[0])
            return _answer(
                200,
                {
                    "line": line_admin.to_json(line_admin.waiting_line(self.ledger, scope, now)),
                    "waits": line_admin.to_json(line_admin.wait_times(self.ledger, manager, since)),
                    "reservations": line_admin.to_json(line_admin.reservations(self.ledger, now)),
                },
            )
        if self.caller is None:
            return _answer(403, {"status": 403, "message": "the GPU line API answers users, not services"})
        try:
            return _answer(200, self._act(parse_action(kwargs.get("json")), manager))
        except PermissionError as exc:
            return _answer(403, {"status": 403, "message": str(exc)})
        except ValueError as exc:
            return _answer(400, {"status": 400, "message": str(exc)})

    def _act(self, action: Any, manager: Manager) -> dict[str, Any]:
        if isinstance(action, Move):
            change = line_admin.put_first if action.kind == "put-first" else line_admin.cancel_waiting
            return {"done": change(self.ledger, manager, action.user, action.server)}
        if isinstance(action, Drop):
            return {"done": line_admin.drop_reservation(self.ledger, manager, action.reservation_id)}
        made = line_admin.reserve(
            self.ledger, manager, action.group, action.memory_bytes, action.start, action.end, CAPACITY
        )
        return {"id": made}

    def _classes(self, method: str, body: Any) -> requests.Response:
        assert self.classes is not None
        caller, admin = ("portal", True) if self.caller is None else (self.caller.name, self.caller.admin)
        if method == "GET":
            shown = [{"rules": r, "joined": [], "invited": []} for r in visible(caller, admin, self.classes.classes())]
            return _answer(200, {"classes": shown})
        if self.caller is None:
            return _answer(403, {"status": 403, "message": "this service may not change classes"})
        try:
            action = parse_class_action(body)
            current = self.classes.get(action.name)
            why = may_change(caller, admin, action, current)
            if why:
                return _answer(403, {"status": 403, "message": why})
            if action.kind == "stop-server":
                self.stopped.append((action.members[0], action.server))
                return _answer(200, {"stopped": True})
            after = self.classes.change(action.name, lambda rules: apply(action, rules))
        except ValueError as exc:
            return _answer(400, {"status": 400, "message": str(exc)})
        made = {m: f"code-{m}" for m in action.members} if action.kind in ("add-class", "add-members", "invite") else {}
        return _answer(200, {"class": after, "invites": made})


def _answer(status: int, body: Any) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps(body).encode()
    return response


def serve_line(
    monkeypatch: Any,
    ledger: Path,
    rules: Callable[[], Sequence[Mapping[str, Any]]],
    groups: Callable[[], Mapping[str, Sequence[str]]],
    classes: ClassStore | None = None,
) -> dict[str, LineHubDouble]:
    """The portal's hub clients (its own and each reader's) answered by the double over ``ledger`` (and the
    class store); each reader's double, by name, to see what it was sent."""
    from portal.sources import clients

    doubles: dict[str, LineHubDouble] = {}

    def acting(identity: Identity) -> hub.HubClient:
        double = doubles.get(identity.name)
        if double is None or double.caller != identity:  # one per reader: it keeps all a page run sent
            double = doubles[identity.name] = LineHubDouble(ledger, identity, rules, groups, classes)
        return hub.HubClient(API, "reader", session=double)

    portal = LineHubDouble(ledger, None, rules, groups, classes)
    monkeypatch.setattr(clients, "hub_client", lambda: hub.HubClient(API, "portal", session=portal))
    monkeypatch.setattr(clients, "acting_client", acting)
    return doubles
