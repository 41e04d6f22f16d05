"""`POST /hub/api/gpuslice/presence/USER/SERVER`: a notebook server's report of whether its owner is there.

Each notebook server sends one every ``JUPYTERHUB_ACTIVITY_INTERVAL`` seconds and at once when a
page opens or input comes after a quiet spell (spawner/lab/gpuslice_presence.py): JupyterLab pages
open, kernel websocket connections, whether a kernel runs code, and how many seconds ago, by the
server's clock, the last keyboard or pointer input came and a page last beat. The hub stamps the
report with its own clock when it arrives and turns the ages into instants before that moment
(``presence_from``): nothing in a report can be dated later than its receipt. The result is kept in
the ledger (``Ledger.record_presence``), where the gpu-reclaimer reads it; on Kubernetes the ledger
is on the hub's volume and the reclaimer runs beside the hub, so the same reports serve both backends.

Who may send one: a token with ``users:activity`` and ``access:servers`` for that server (the server's
own token, as for JupyterHub's activity API; its owner's other tokens; admins). A report is its
owner's word; what it can gain is bounded in docs/security.md (presence).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from jupyterhub.apihandlers import APIHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from spawner.ledger import LedgerError, server_key
from spawner.line import WaitingLineMixin
from spawner.waitline import Presence

MOST_PAGES = 1000  # no server has more pages or connections than this: a larger number is nonsense


@dataclass(frozen=True)
class Report:
    """A server's report as sent: counts, and ages in seconds on its clock (None: never)."""

    pages: int
    connections: int
    busy: bool
    input_s: float | None
    page_s: float | None


def read_report(body: Any) -> Report:
    """The report in ``body`` (JSON), or ValueError saying what a good one looks like."""
    example = '{"pages": 1, "connections": 1, "busy": false, "input_s": 12.5, "page_s": 3.0}'
    if not isinstance(body, dict):
        raise ValueError(f"send a JSON object such as {example}")
    counts = []
    for name in ("pages", "connections"):
        value = body.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MOST_PAGES:
            raise ValueError(f"{name} must be a whole number from 0 to {MOST_PAGES}, as in {example}")
        counts.append(value)
    if not isinstance(body.get("busy", False), bool):
        raise ValueError(f"busy must be true or false, as in {example}")
    ages = []
    for name in ("input_s", "page_s"):
        value = body.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
        ):
            raise ValueError(f"{name} must be seconds ago (a number) or null, as in {example}")
        ages.append(None if value is None else float(value))
    return Report(counts[0], counts[1], bool(body.get("busy", False)), ages[0], ages[1])


def presence_from(report: Report, received: float) -> Presence:
    """The report on the hub's clock: each age counted back from ``received``, and never ahead of it
    (a negative age, or any claim of the future, is taken as now)."""

    def instant(age: float | None) -> float | None:
        return None if age is None else received - max(0.0, age)

    return Presence(
        received, report.pages, report.connections, report.busy, instant(report.input_s), instant(report.page_s)
    )


class PresenceHandler(APIHandler):  # type: ignore[misc]
    @needs_scope("users:activity", "access:servers")  # type: ignore[untyped-decorator]
    def post(self, user_name: str, server_name: str) -> None:
        user = self.find_user(user_name)
        spawner = user.spawners.get(server_name) if user is not None else None
        if spawner is None or not spawner.active:
            raise web.HTTPError(404, f"{user_name} has no server {server_name!r} running")
        try:
            report = read_report(json.loads(self.request.body or b"null"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise web.HTTPError(400, str(exc)) from None
        if isinstance(spawner, WaitingLineMixin):
            try:
                spawner._ledger.record_presence(server_key(user_name, server_name), presence_from(report, time.time()))
            except LedgerError as exc:
                raise web.HTTPError(
                    503, f"the report could not be kept: {exc}; the server sends the next one"
                ) from None
        self.set_status(204)
        self.finish()


PRESENCE_HANDLERS = [(r"/api/gpuslice/presence/([^/]+)/([^/]*)", PresenceHandler)]
