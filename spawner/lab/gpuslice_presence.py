"""A notebook server's presence reports: whether its owner is there (docs/platform.md#presence).

A jupyter_server extension that every gpuslice notebook server loads (jupyter_server_config.py,
beside it on JUPYTER_CONFIG_PATH, enables it). It runs in the users' environment: only
jupyter_server and tornado are imported, nothing of the platform's.

* Each open JupyterLab page beats (the platform's lab extension, labextensions/@gpuslice/
  reclaim-notice): ``POST /api/gpuslice/presence {"page": ID, "input": true|false}`` every
  ``JUPYTERHUB_ACTIVITY_INTERVAL`` seconds, ``input`` saying whether a key was pressed or the
  pointer used in that page since its last beat, and at once at the first input after a beat
  without any; ``"gone": true`` as the page closes. A page that stops beating is gone after three
  beats missed. The server stamps each beat with its own clock: a page never sends a time.
* jupyter_server's kernel manager knows each kernel's websocket connections and whether it is busy.
* The server posts a report to the hub (``POST $JUPYTERHUB_API_URL/gpuslice/presence/USER/SERVER``
  with its own token) every ``JUPYTERHUB_ACTIVITY_INTERVAL`` seconds, and at once when a page opens
  or input comes after a quiet spell: pages open, kernel connections, a kernel busy, and how many
  seconds ago (on its clock) the last input came and a page last beat. The hub turns those ages
  into instants on its own clock and keeps no instant later than its receipt (hub/presence.py).

The beats are not activity (jupyter_server_config.py leaves them out): input keeps a slice the way
running a cell does only through the reclaimer's reading of these reports.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

# A page that has not beaten for this many beats is gone (the tab closed, the laptop asleep); never
# under 90 s, as browsers slow the timers of background tabs down to one a minute.
PAGE_GONE_BEATS = 3.0
PAGE_GONE_MIN_S = 90.0
PAGES_KEPT = 64  # at most this many pages remembered (a page id is the page's word: bounded)
URGENT_EVERY_S = 1.0  # reports sent at once come at most this often


class Watch:
    """What the server knows of its owner's pages, on its own (monotonic) clock. Pure: times are given."""

    def __init__(self, beat_s: float) -> None:
        self.beat_s = beat_s
        self.gone_after = max(PAGE_GONE_MIN_S, PAGE_GONE_BEATS * beat_s)
        self.beats: dict[str, float] = {}  # page id -> its latest beat
        self.last_input: float | None = None
        self.last_gone: float | None = None  # when a page last said it closed
        self.reported_input: float | None = None  # the latest input the hub has heard of

    def beat(self, page: str, had_input: bool, now: float, gone: bool = False) -> bool:
        """A page's beat (``gone``: its last, sent as it closes); True when the hub should hear of it at
        once: a page opened or the last one closed, or input came after a quiet spell the hub may have
        taken for an absence."""
        if gone:
            was_open = page in self.open_pages(now)
            self.beats.pop(page, None)
            self.last_gone = now if was_open else self.last_gone
            return was_open and not self.open_pages(now)
        opened = page not in self.open_pages(now)
        self.beats[page] = now
        if len(self.beats) > PAGES_KEPT:
            del self.beats[min(self.beats, key=self.beats.__getitem__)]
        if had_input:
            self.last_input = now
        quiet = self.reported_input is None or now - self.reported_input > self.beat_s
        return opened or (had_input and quiet)

    def open_pages(self, now: float) -> dict[str, float]:
        return {page: at for page, at in self.beats.items() if now - at <= self.gone_after}

    def report(self, now: float, connections: int, busy: bool) -> dict[str, Any]:
        """The report to the hub: counts, and ages in seconds on this server's clock (None: never)."""
        self.reported_input = self.last_input
        seen = [*self.beats.values(), *([self.last_gone] if self.last_gone is not None else [])]
        last_beat = max(seen, default=None)
        return {
            "pages": len(self.open_pages(now)),
            "connections": connections,
            "busy": busy,
            "input_s": None if self.last_input is None else round(now - self.last_input, 3),
            "page_s": None if last_beat is None else round(now - last_beat, 3),
        }


def kernels_now(kernel_manager: Any) -> tuple[int, bool]:
    """Websocket connections to the server's kernels, from any client, and whether one runs code."""
    connections, busy = 0, False
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            model = kernel_manager.kernel_model(kernel_id)
        except Exception:  # a kernel that ended between the two calls (jupyter_client raises several kinds)
            continue
        connections += int(model.get("connections") or 0)
        busy = busy or model.get("execution_state") == "busy"
    return connections, busy


class Reporter:
    """Posts the server's reports to the hub, every ``beat_s`` and at once when a beat asks for it."""

    def __init__(self, serverapp: Any, hub: dict[str, str], watch: Watch, tls: dict[str, Any]) -> None:
        from tornado.httpclient import AsyncHTTPClient

        # A client of its own, never the event loop's shared one: tornado makes that once, with the defaults
        # configured when it is first asked for. This extension loads before JupyterHub's, which configures
        # the hub's CA and its client certificate (internal SSL) and then asks for it: taken here, it lacked
        # them, JupyterHub's check of its hub failed, and the server exited before it listened.
        self.serverapp, self.watch = serverapp, watch
        self.client = AsyncHTTPClient(force_instance=True, defaults=tls)
        user, server = quote(hub["user"], safe=""), quote(hub["server"], safe="")
        self.url = f"{hub['api_url'].rstrip('/')}/gpuslice/presence/{user}/{server}"
        self.headers = {"Authorization": f"token {hub['token']}", "Content-Type": "application/json"}
        self.last_sent = 0.0
        self.failed = False

    async def send(self) -> None:
        from tornado.httpclient import HTTPClientError

        now = time.monotonic()
        self.last_sent = now
        connections, busy = kernels_now(self.serverapp.kernel_manager)
        body = json.dumps(self.watch.report(now, connections, busy))
        try:
            await self.client.fetch(self.url, method="POST", headers=self.headers, body=body, request_timeout=20)
        except (HTTPClientError, OSError) as exc:  # the hub restarting: the next report says it all again
            if not self.failed:
                logging.getLogger("gpuslice.presence").warning(
                    "gpuslice: the hub did not take a presence report (%s)", exc
                )
            self.failed = True
        else:
            self.failed = False

    def soon(self) -> None:
        """Send now unless a report went out under a second ago (the periodic one follows anyway)."""
        from tornado.ioloop import IOLoop

        if time.monotonic() - self.last_sent >= URGENT_EVERY_S:
            IOLoop.current().spawn_callback(self.send)


def hub_of(environ: dict[str, str]) -> dict[str, str] | None:
    """Where and as whom to report, from JupyterHub's own variables; None outside JupyterHub."""
    if not environ.get("JUPYTERHUB_API_URL") or not environ.get("JUPYTERHUB_API_TOKEN"):
        return None
    return {
        "api_url": environ["JUPYTERHUB_API_URL"],
        "token": environ["JUPYTERHUB_API_TOKEN"],
        "user": environ.get("JUPYTERHUB_USER", ""),
        "server": environ.get("JUPYTERHUB_SERVER_NAME", ""),
    }


# Where JupyterHub's single-user server finds its TLS files for the hub (internal SSL), by tornado's setting.
HUB_TLS_FILES = {
    "ca_certs": "JUPYTERHUB_SSL_CLIENT_CA",
    "client_key": "JUPYTERHUB_SSL_KEYFILE",
    "client_cert": "JUPYTERHUB_SSL_CERTFILE",
}


def hub_tls(environ: Mapping[str, str]) -> dict[str, Any]:
    """The requests' TLS settings for the hub, as JupyterHub's single-user server makes its own: the hub's CA
    and this server's key and certificate under internal SSL, the system's CAs where none is named."""
    named = {setting: environ[name] for setting, name in HUB_TLS_FILES.items() if environ.get(name)}
    return {"validate_cert": True, **named}


def beat_seconds(environ: dict[str, str]) -> float:
    """The pages' beat and the reports' period: JupyterHub's activity interval (the spawner sets it to a
    sixth of the reclaim warning's lead, so a return during a warning reaches the hub in time)."""
    try:
        return max(1.0, float(environ.get("JUPYTERHUB_ACTIVITY_INTERVAL") or 300))
    except ValueError:
        return 300.0


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpuslice_presence"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_server.base.handlers import APIHandler
    from tornado import web
    from tornado.ioloop import PeriodicCallback

    environ = dict(os.environ)
    watch = Watch(beat_seconds(environ))
    hub = hub_of(environ)
    reporter = Reporter(serverapp, hub, watch, hub_tls(environ)) if hub else None

    class PresenceHandler(APIHandler):
        """A page's beat: ``{"page": ID, "input": BOOL}``; answers how often to beat."""

        @web.authenticated
        def post(self) -> None:
            body = self.get_json_body() or {}
            if not isinstance(body, dict) or not isinstance(body.get("page"), str) or not body["page"]:
                raise web.HTTPError(400, 'send {"page": "an id of the page", "input": true or false}')
            page, had_input, gone = body["page"][:64], body.get("input") is True, body.get("gone") is True
            if watch.beat(page, had_input, time.monotonic(), gone) and reporter:
                reporter.soon()
            self.finish({"beat_s": watch.beat_s})

    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(".*$", [(f"{base.rstrip('/')}/api/gpuslice/presence", PresenceHandler)])
    if reporter is not None:  # the first report at once: a server nobody opened has no page from the start
        serverapp.io_loop.add_callback(reporter.send)
        serverapp.io_loop.add_callback(PeriodicCallback(reporter.send, watch.beat_s * 1000).start)
        serverapp.log.info("gpuslice: presence reports to the hub every %g s", watch.beat_s)
