"""Notebook servers and groups from JupyterHub's REST API (the portal's service token)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests

from portal.data.access import Scope
from portal.data.errors import SourceUnavailableError, why
from portal.identity import Identity
from spawner import line_admin
from spawner.line_admin import Waiting
from spawner.waitline import Reservation, WaitStats


@dataclass(frozen=True)
class ServerRow:
    user: str
    name: str
    state: str  # running, starting, stopping, stopped
    gpu_memory: str
    gpus: int
    image: str
    started: datetime | None
    last_activity: datetime | None
    url: str = ""


class HubClient:
    # A hub busy with a class starting at once can take several seconds to list fifty users.
    def __init__(
        self, api_url: str, token: str, session: requests.Session | None = None, timeout_s: float = 15
    ) -> None:
        self.api_url, self.timeout_s = api_url.rstrip("/"), timeout_s
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"token {token}"

    def get(self, path: str) -> Any:
        response = self._send("GET", path)
        response.raise_for_status()
        return response.json()

    def get_every_page(self, path: str) -> list[Any]:
        """GET a list the hub pages (``/users``, ``/groups``), following every page.

        Without the pagination header JupyterHub answers only its first page (200 items by
        default) and says nothing of the rest, so a big class would silently lose names.
        """
        items: list[Any] = []
        offset = 0
        while True:
            response = self._send("GET", _with_query(path, offset=offset), headers={"Accept": PAGINATED})
            response.raise_for_status()
            body = response.json()
            if isinstance(body, list):  # a hub older than pagination answers the whole list
                return body
            items.extend(body.get("items") or [])
            following = (body.get("_pagination") or {}).get("next")
            if not following or not body.get("items"):
                return items
            offset = int(following["offset"])

    def get_response(self, path: str) -> requests.Response:
        """GET; the response is returned whatever its status (callers read the hub's message)."""
        return self._send("GET", path)

    def post(self, path: str, body: dict[str, Any]) -> requests.Response:
        """POST JSON; the response is returned whatever its status (callers read the hub's message)."""
        return self._send("POST", path, json=body)

    def delete(self, path: str) -> int:
        response = self._send("DELETE", path)
        response.raise_for_status()
        return response.status_code

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            response = self.session.request(method, f"{self.api_url}{path}", timeout=self.timeout_s, **kwargs)
        except requests.RequestException as exc:
            raise SourceUnavailableError(f"JupyterHub did not answer ({why(exc)})") from exc
        if response.status_code in (502, 503, 504):
            raise SourceUnavailableError(f"JupyterHub answered HTTP {response.status_code}")
        return response


PAGINATED = "application/jupyterhub-pagination+json"


def _with_query(path: str, **params: int) -> str:
    extra = "&".join(f"{key}={value}" for key, value in params.items())
    return f"{path}{'&' if '?' in path else '?'}{extra}"


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _state(server: dict[str, Any]) -> str:
    if server.get("pending") == "spawn":
        return "starting"
    if server.get("pending") == "stop":
        return "stopping"
    return "running" if server.get("ready") else "stopped"


def rows_of(user: dict[str, Any]) -> list[ServerRow]:
    rows = []
    for name, server in (user.get("servers") or {}).items():
        options = server.get("user_options") or {}
        rows.append(
            ServerRow(
                user=str(user["name"]),
                name=str(name),
                state=_state(server),
                gpu_memory=str(options.get("gpu_memory", "0")),
                gpus=int(options.get("gpus", 0) or 0),
                image=str(options.get("image", "default")),
                started=_time(server.get("started")),
                last_activity=_time(server.get("last_activity")),
                url=str(server.get("url", "")),
            )
        )
    return rows


def every_user(client: HubClient) -> list[dict[str, Any]]:
    """Every user with their servers, stopped ones included: one snapshot that all viewers share."""
    return client.get_every_page("/users?include_stopped_servers=1")


def servers_in_scope(users: list[dict[str, Any]], scope: Scope) -> list[ServerRow]:
    """Admins see every server; a teacher their classes' too; everyone else only their own (checked here)."""
    return [row for user in users if scope.sees(str(user["name"])) for row in rows_of(user)]


def check_may_stop(identity: Identity, user: str) -> None:
    if not identity.admin and identity.name != user:
        raise PermissionError(f"{identity.name} may not stop {user}'s server: only admins can stop other people's")


def stop_server(client: HubClient, identity: Identity, user: str, server: str) -> None:
    """Stop a server: admins any, users their own; raises PermissionError otherwise."""
    check_may_stop(identity, user)
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    client.delete(path)


def groups(client: HubClient) -> dict[str, list[str]]:
    return {str(g["name"]): [str(u) for u in g.get("users") or []] for g in client.get_every_page("/groups")}


def image_usage(users: list[dict[str, Any]]) -> dict[str, int]:
    """How many servers run (or are starting) each image, over every user: counts only."""
    counts: dict[str, int] = {}
    for user in users:
        for row in rows_of(user):
            if row.state in ("running", "starting"):
                counts[row.image] = counts.get(row.image, 0) + 1
    return counts


def server_counts(users: list[dict[str, Any]]) -> dict[str, int]:
    """The cluster's servers running and starting and the users with one: counts only, no names."""
    rows = [row for user in users for row in rows_of(user)]
    active = {row.user for row in rows if row.state in ("running", "starting")}
    return {
        "running": sum(row.state == "running" for row in rows),
        "starting": sum(row.state == "starting" for row in rows),
        "users": len(active),
    }


# The GPU line on Kubernetes: the hub holds it and answers with the reader's own token (hub/line_api.py).
LINE_PATH = "/gpuslice/line"


@dataclass(frozen=True)
class LineState:
    line: list[Waiting]
    waits: list[WaitStats]
    reservations: list[Reservation]


def line_state(client: HubClient, since: float) -> LineState:
    """The line as the hub lets this client's user see it, with wait times since ``since``."""
    response = client.get_response(f"{LINE_PATH}?since={since:.0f}")
    if response.status_code != 200:
        raise SourceUnavailableError(f"The GPU line: {_refusal(response)}")
    try:
        body = response.json()
        return LineState(
            line_admin.from_json(Waiting, body["line"]),
            line_admin.from_json(WaitStats, body["waits"]),
            line_admin.from_json(Reservation, body["reservations"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceUnavailableError(f"The GPU line: the hub's answer is not one this portal reads ({exc})") from exc


def line_action(client: HubClient, body: dict[str, Any]) -> dict[str, Any]:
    """Ask the hub to change the line; PermissionError (the hub refused, why) or ValueError (bad request)."""
    response = client.post(LINE_PATH, body)
    if response.status_code == 403:
        raise PermissionError(f"The hub refused: {_message(response)}")
    if response.status_code == 400:
        raise ValueError(_message(response))
    if response.status_code != 200:
        raise SourceUnavailableError(f"The GPU line: {_refusal(response)}")
    answer = response.json()
    if not isinstance(answer, dict):
        raise SourceUnavailableError(f"The GPU line: the hub answered {answer!r}, not an object")
    return answer


def _message(response: requests.Response) -> str:
    """JupyterHub's own words for an error (its API answers {"status", "message"})."""
    try:
        body = response.json()
    except ValueError:
        return response.reason or "no reason given"
    return str(body.get("message") or response.reason) if isinstance(body, dict) else str(body)


def _refusal(response: requests.Response) -> str:
    if response.status_code == 404:
        return "the hub serves no GPU line API (/hub/api/gpuslice/line): it needs hub/wiring.py's configure_hub"
    if response.status_code in (401, 403):
        return f"HTTP {response.status_code}, {_message(response)}"
    return f"the hub answered HTTP {response.status_code}: {_message(response)}"


# The classes, as the running hub keeps them (hub/classes_api.py): read with the portal's token (all of
# them) or a reader's (the classes they teach), changed with the reader's (the hub checks who may).
CLASSES_PATH = "/gpuslice/classes"


@dataclass(frozen=True)
class ClassInfo:
    rules: dict[str, Any]  # {"name", "members", "teachers", "max_slice", "budget", ...}
    joined: tuple[str, ...]  # members who chose their password
    invited: tuple[str, ...]  # members with an invite code waiting

    @property
    def name(self) -> str:
        return str(self.rules["name"])

    @property
    def members(self) -> list[str]:
        return [str(m) for m in self.rules.get("members") or ()]

    @property
    def teachers(self) -> list[str]:
        return [str(t) for t in self.rules.get("teachers") or ()]


def classes(client: HubClient) -> list[ClassInfo]:
    response = client.get_response(CLASSES_PATH)
    if response.status_code == 404:
        raise SourceUnavailableError("The classes: the hub serves no classes API (/hub/api/gpuslice/classes)")
    if response.status_code != 200:
        raise SourceUnavailableError(f"The classes: {_refusal(response)}")
    try:
        return [
            ClassInfo(dict(c["rules"]), tuple(c.get("joined") or ()), tuple(c.get("invited") or ()))
            for c in response.json()["classes"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceUnavailableError(f"The classes: the hub's answer is not one this portal reads ({exc})") from exc


def class_action(client: HubClient, body: dict[str, Any]) -> dict[str, Any]:
    """Ask the hub to change a class; PermissionError (the hub refused, why) or ValueError (it cannot be)."""
    response = client.post(CLASSES_PATH, body)
    if response.status_code == 403:
        raise PermissionError(f"The hub refused: {_message(response)}")
    if response.status_code == 400:
        raise ValueError(_message(response))
    if response.status_code != 200:
        raise SourceUnavailableError(f"The classes: {_refusal(response)}")
    answer = response.json()
    if not isinstance(answer, dict):
        raise SourceUnavailableError(f"The classes: the hub answered {answer!r}, not an object")
    return answer
