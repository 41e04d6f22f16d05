"""The portal's auth gate: a JupyterHub service in front of Streamlit.

It logs people in through the hub (HubOAuth), then proxies HTTP and the websocket to
Streamlit, which listens on loopback only, adding the signed identity header
(portal.identity). Started by the hub as a managed service (`python -m portal.gate`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import httpclient, web, websocket

from portal.identity import HEADER, Identity, sign
from spawner import environ, secretenv
from spawner.lifetime import die_with_parent
from spawner.ports import free_port

# Requests to Streamlit in flight at once. Tornado's client allows 10 by default and fails what
# waits in its queue longer than 20 s; two browsers loading the portal together already open 12
# (6 each), and a class opening it at 9:00 many more, so the gate must not be the bottleneck.
UPSTREAM_REQUESTS = 256
BUNDLE_MAX_AGE_S = 365 * 24 * 3600
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length", HEADER.lower()}


def streamlit_front_end() -> Path:
    """Streamlit's built front end (index.html, and static/ with the hashed bundles), found without
    importing Streamlit: the gate does not run it."""
    spec = importlib.util.find_spec("streamlit")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("Streamlit is not installed: run scripts/setup")
    return Path(spec.submodule_search_locations[0]) / "static"


def identity_of(user: dict[str, Any], hub_token: str = "") -> Identity:
    return Identity(str(user["name"]), bool(user.get("admin")), tuple(sorted(user.get("groups") or ())), hub_token)


class Upstream:
    def __init__(self, port: int, secret: bytes) -> None:
        self.port, self.secret = port, secret
        self._client: httpclient.AsyncHTTPClient | None = None

    @property
    def client(self) -> httpclient.AsyncHTTPClient:
        """The gate's own client for Streamlit (made in the running loop, on first use)."""
        if self._client is None:
            self._client = httpclient.AsyncHTTPClient(force_instance=True, max_clients=UPSTREAM_REQUESTS)
        return self._client

    def url(self, uri: str, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{uri}"

    def headers(self, incoming: Any, user: dict[str, Any] | None, hub_token: str = "") -> dict[str, str]:
        """The browser's headers for Streamlit, with the signed identity and the user's hub token.

        The token is the one the hub issued to this user at the portal's OAuth login (its
        scopes: oauth_client_allowed_scopes, within the user's own permissions).
        """
        headers = {k: v for k, v in incoming.get_all() if k.lower() not in HOP_BY_HOP}
        if user is not None:
            headers[HEADER] = sign(identity_of(user, hub_token), self.secret)
        return headers


class ProxyHandler(HubOAuthenticated, web.RequestHandler):  # type: ignore[misc]
    def initialize(self, upstream: Upstream) -> None:
        self.upstream = upstream

    def check_xsrf_cookie(self) -> None:
        pass  # Streamlit's own XSRF protection checks the requests it serves

    @web.authenticated
    async def get(self, path: str = "") -> None:
        await self._forward()

    @web.authenticated
    async def post(self, path: str = "") -> None:
        await self._forward()

    async def _forward(self) -> None:
        request = httpclient.HTTPRequest(
            self.upstream.url(self.request.uri or "/"),
            method=self.request.method or "GET",
            headers=self.upstream.headers(self.request.headers, self.current_user, self.hub_auth.get_token(self) or ""),
            body=self.request.body if self.request.method == "POST" else None,
            follow_redirects=False,
            request_timeout=60,
        )
        try:
            response = await self.upstream.client.fetch(request, raise_error=False)
        except (OSError, httpclient.HTTPClientError) as exc:  # not answering, or not started yet
            raise web.HTTPError(502, f"the portal's Streamlit did not answer ({exc}); reload in a moment") from exc
        self.set_status(response.code)
        for name, value in response.headers.get_all():
            lower = name.lower()
            if lower == "set-cookie":
                self.add_header(name, value)
            elif lower not in HOP_BY_HOP | {"content-encoding", "server", "date"}:
                self.set_header(name, value)  # replaces Tornado's default Content-Type
        if response.body:
            self.write(response.body)


class ScriptHandler(HubOAuthenticated, web.StaticFileHandler):  # type: ignore[misc]
    """Streamlit's own bundles (``static/js``, ``static/css``, ``static/media``), served by the gate.

    A page's first load asks for about a hundred script chunks. Streamlit's process also runs
    every open page's script, and beside one admin page with live parts those chunks waited
    4-19 s each there (docs/load.md). The gate only relays, so it answers them at once. They
    are the framework's files, the same for everyone, and their names carry their hash: the
    browser keeps them for a year, as Streamlit itself tells it to. Logged-in users only, as
    every other path of the portal.
    """

    def check_xsrf_cookie(self) -> None:
        # Only reads of files that are the same for everyone: nothing to forge. (The browser fetches
        # module scripts in "cors" mode, which JupyterHub would otherwise want an XSRF token for,
        # and a <script> tag cannot send one.)
        pass

    @web.authenticated  # before get and head: a login through the hub, as for every other path
    def prepare(self) -> None:
        pass

    def set_extra_headers(self, path: str) -> None:
        self.set_header("Cache-Control", f"public, immutable, max-age={BUNDLE_MAX_AGE_S}")


class HealthHandler(web.RequestHandler):
    """Streamlit's health check, open: it says nothing about anyone."""

    def initialize(self, upstream: Upstream) -> None:
        self.upstream = upstream

    async def get(self) -> None:
        try:
            response = await self.upstream.client.fetch(
                self.upstream.url(self.request.uri or "/"), raise_error=False, request_timeout=5
            )
        except (OSError, httpclient.HTTPClientError):
            self.set_status(503)
            self.write("starting")
            return
        self.set_status(response.code)
        self.write(response.body or b"")


class StreamHandler(HubOAuthenticated, websocket.WebSocketHandler):  # type: ignore[misc]
    def initialize(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.peer: websocket.WebSocketClientConnection | None = None

    async def get(self, *args: Any, **kwargs: Any) -> None:
        if self.current_user is None:
            raise web.HTTPError(403, "log in through JupyterHub first")
        await super().get(*args, **kwargs)

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return subprotocols[0] if subprotocols else None

    async def open(self, *args: Any) -> None:
        headers = self.upstream.headers(self.request.headers, self.current_user, self.hub_auth.get_token(self) or "")
        headers.pop("Origin", None)
        for key in [k for k in headers if k.lower().startswith("sec-websocket")]:
            if key.lower() != "sec-websocket-protocol":
                headers.pop(key)
        request = httpclient.HTTPRequest(self.upstream.url(self.request.uri or "/", "ws"), headers=headers)
        protocols = self.request.headers.get("Sec-WebSocket-Protocol")
        self.peer = await websocket.websocket_connect(
            request,
            on_message_callback=self._from_upstream,
            subprotocols=[p.strip() for p in protocols.split(",")] if protocols else None,
        )

    def _from_upstream(self, message: str | bytes | None) -> None:
        if message is None:
            self.close()
        else:
            self.write_message(message, binary=isinstance(message, bytes))

    async def on_message(self, message: str | bytes) -> None:
        if self.peer is not None:
            await self.peer.write_message(message, binary=isinstance(message, bytes))

    def on_close(self) -> None:
        if self.peer is not None:
            self.peer.close()


def make_app(prefix: str, upstream: Upstream, cookie_secret: bytes) -> web.Application:
    bundles = streamlit_front_end() / "static"
    routes = [
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        (url_path_join(prefix, "static/(.*)"), ScriptHandler, {"path": str(bundles)}),
        (url_path_join(prefix, "_stcore/health"), HealthHandler, {"upstream": upstream}),
        (url_path_join(prefix, "_stcore/stream"), StreamHandler, {"upstream": upstream}),
        (url_path_join(prefix, "(.*)"), ProxyHandler, {"upstream": upstream}),
    ]
    # Compressed: the gate's client takes Streamlit's answers uncompressed, and a first page's
    # scripts are 2.7 MB raw, about a quarter of that gzipped, for a class on one network.
    return web.Application(routes, cookie_secret=cookie_secret, xsrf_cookies=False, compress_response=True)


def start_streamlit(port: int, prefix: str, secret: bytes) -> subprocess.Popen[bytes]:
    app = Path(__file__).with_name("app.py")
    # The key and the hub token in a 0600 file, not in Streamlit's /proc/PID/environ.
    env = secretenv.child_env({**os.environ, environ.PORTAL_SECRET.name: secret.hex()})
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(app),
            "--server.address=127.0.0.1",
            f"--server.port={port}",
            f"--server.baseUrlPath={prefix.strip('/')}",
            "--server.headless=true",
            "--browser.gatherUsageStats=false",
            "--server.fileWatcherType=none",
            "--client.toolbarMode=minimal",
            # Not a full garbage collection after every run: with the live parts of the pages
            # (twice a second each) it was over half of the portal's CPU with one admin's Servers
            # page open (docs/load.md). Python's own collector still runs as objects pile up.
            "--runner.postScriptGC=false",
        ],
        env=env,
        preexec_fn=partial(die_with_parent, os.getpid()),  # a killed gate does not leave Streamlit behind
    )


def main() -> None:
    env = environ.read()
    prefix = env.get(environ.SERVICE_PREFIX)
    listen = urlsplit(env.get(environ.SERVICE_URL))
    host, port = listen.hostname or "127.0.0.1", listen.port or 8502
    streamlit_port = env.streamlit_port or free_port()
    secret = secrets.token_bytes(32)  # lives only in this process and its Streamlit child
    child = start_streamlit(streamlit_port, prefix, secret)
    app = make_app(prefix, Upstream(streamlit_port, secret), secrets.token_bytes(32))
    try:
        asyncio.run(_serve(app, host, port))
    finally:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()


async def _serve(app: web.Application, host: str, port: int) -> None:
    # Loopback on one machine; the pod's address in Kubernetes (JUPYTERHUB_SERVICE_URL says which).
    app.listen(port, address=host)  # binds to the running loop
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # The hub stops services with SIGTERM: return so that main() stops Streamlit too.
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


if __name__ == "__main__":
    main()
