"""The hub's GPU line API (hub/line_api.py) over a ledger file, as one caller reaches it.

It answers as the handler does, through the same functions (spawner/line_admin.py, and
``viewer_of``/``parse_action`` from the handler's module): the portal's own token sees
every place, a reader their scope; changes are checked for the reader. The handler itself
runs in a real JupyterHub in tests/kube/test_kube_line.py and tests/e2e.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests

from hub.line_api import Drop, Move, parse_action, viewer_of
from portal.data import hub
from portal.identity import Identity
from spawner import line_admin
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
    ) -> None:
        super().__init__()
        self.ledger, self.caller, self.rules, self.groups = ledger, caller, rules, groups
        self.sent: list[tuple[str, str]] = []

    def _viewer(self) -> tuple[Scope, Manager]:
        if self.caller is None:
            return Scope("portal", everyone=True), Manager("portal", admin=True)
        return viewer_of(self.caller.name, self.caller.admin, self.rules(), self.groups())

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        method, url = str(method), str(url)
        parts = urlsplit(url.removeprefix(API))
        assert parts.path == hub.LINE_PATH, url
        self.sent.append((method, parts.path))
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
) -> None:
    """The portal's hub clients (its own and each reader's) answered by the double over ``ledger``."""
    from portal.sources import clients

    monkeypatch.setattr(
        clients, "hub_client", lambda: hub.HubClient(API, "portal", session=LineHubDouble(ledger, None, rules, groups))
    )
    monkeypatch.setattr(
        clients,
        "acting_client",
        lambda identity: hub.HubClient(API, "reader", session=LineHubDouble(ledger, identity, rules, groups)),
    )
