"""The incident recorder: Alertmanager's webhook receiver, always on, writing the incident store.

Alertmanager sends it every alert (a route of its own that takes everything but the
heartbeat, ``incident-recorder``) and every page it sends a person (each on-call receiver
has the recorder as a second webhook), firing and resolved; it writes each notification as
it arrives (portal/data/incident_store.py), with Alertmanager's ``startsAt``/``endsAt`` and
the receiver's name: which tier was told, and when. Every ``--interval`` seconds, and at
once on start (catching up after it was down), it reads Alertmanager's API: the firing
alerts with their inhibitions and silences (Alertmanager notifies neither an inhibited nor
a silenced alert), and the silences, which are the acknowledgements. Once on start it also
reads Prometheus's ``ALERTS`` history (``--prometheus-url``) since it last recorded anything:
an alert that fired and ended while it was down is in neither Alertmanager's API nor any
notification it will send. The Incidents page
reads only the store, so an incident that fires and clears at night is recorded whether
or not anyone has the portal open.

The webhook asks for a bearer token (Alertmanager's ``http_config.authorization`` with
``credentials_file``): nothing is written without it. On one machine the hub runs this as
a managed service (``python -m portal.recorder``); on Kubernetes it is a container of the
portal's pod, beside the store's volume.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hmac
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import requests
from tornado import web

from hub.settings import MONITORING_USER
from portal.data.alertmanager import Alertmanager, PayloadError, notification_from_webhook
from portal.data.incident_store import IncidentStore
from portal.data.prometheus import MetricsUnavailableError, connect, firing_alerts
from portal.incidents import episodes_from_history
from spawner import incident_schema

if TYPE_CHECKING:
    from prometheus_api_client import PrometheusConnect

WEBHOOK_PATH = "/api/alertmanager"
MAX_BODY = 4 * 1024 * 1024  # a notification of a few hundred alerts; Alertmanager caps its own at max_alerts
log = logging.getLogger("gpuslice.recorder")


class Webhook(web.RequestHandler):
    """POST only, with the bearer token; the body is Alertmanager's webhook JSON (version 4)."""

    def initialize(self, store: IncidentStore, token: str) -> None:
        self.store, self.token = store, token

    def post(self) -> None:
        scheme, _, given = self.request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), self.token.encode()):
            raise web.HTTPError(401, "a bearer token is needed (Alertmanager's http_config.authorization)")
        try:
            notification, alerts = notification_from_webhook(json.loads(self.request.body), datetime.now(UTC))
        except (ValueError, PayloadError) as exc:
            raise web.HTTPError(400, str(exc)) from None
        self.store.record_notification(notification, alerts)
        self.set_status(204)

    def write_error(self, status_code: int, **kwargs: object) -> None:
        self.finish({"error": self._reason})


class Health(web.RequestHandler):
    def get(self) -> None:
        self.finish({"status": "ok"})


def make_app(store: IncidentStore, token: str) -> web.Application:
    if not token:
        raise ValueError("the recorder needs a token: never an unauthenticated webhook")
    return web.Application([(WEBHOOK_PATH, Webhook, {"store": store, "token": token}), ("/health", Health)])


def sync_once(store: IncidentStore, manager: Alertmanager) -> int:
    """Alertmanager's alerts and silences into the store; the number of alerts found ended."""
    asked = datetime.now(UTC)
    alerts, silences = manager.alerts(), manager.silences()
    return len(store.sync(alerts, silences, asked))


HISTORY_MAX = timedelta(days=7)  # how far back a catch-up from Prometheus looks at most
HISTORY_POINTS = 10_000  # under Prometheus's 11,000 points a range query may return


def catch_up_from_history(store: IncidentStore, prometheus: PrometheusConnect) -> int:
    """What fired and ended while the recorder was down, from Prometheus's ALERTS series: Alertmanager
    lists no ended alert and sends no end to a receiver that never took the start. The number added."""
    now = datetime.now(UTC)
    since = max(store.last_seen() or now - timedelta(days=1), now - HISTORY_MAX)
    step = max(15, int((now - since).total_seconds() // HISTORY_POINTS) + 1)
    series = firing_alerts(prometheus, since, now, step)
    return len(store.record_history(episodes_from_history(series, step, now)))


async def keep_in_sync(
    store: IncidentStore,
    manager: Alertmanager,
    interval_s: float,
    catch_up: Callable[[], int] | None = None,
) -> None:
    """Read Alertmanager's API at once, then every ``interval_s``; an Alertmanager that does not answer
    is tried again. After the first read, ``catch_up`` (Prometheus's history) once."""
    loop = asyncio.get_running_loop()
    said_down = False
    while True:
        try:
            ended = await loop.run_in_executor(None, sync_once, store, manager)
        except MetricsUnavailableError as exc:
            if not said_down:
                log.warning("gpuslice recorder: %s; trying again every %.0f s", exc, interval_s)
            said_down = True
        else:
            if said_down:
                log.warning("gpuslice recorder: Alertmanager answers again")
            said_down = False
            if ended:
                log.info("gpuslice recorder: %d alert(s) ended without a notification", ended)
            if catch_up is not None:
                try:
                    added = await loop.run_in_executor(None, catch_up)
                except MetricsUnavailableError as exc:
                    log.warning("gpuslice recorder: no catch-up from Prometheus's history: %s", exc)
                else:
                    log.warning("gpuslice recorder: %d alert(s) from Prometheus's history", added)
                catch_up = None
        await asyncio.sleep(interval_s)


def read_secret(path: Path, what: str) -> str:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise SystemExit(f"gpuslice recorder: cannot read {what} {path} ({exc.strerror})") from None
    if not text:
        raise SystemExit(f"gpuslice recorder: {what} {path} is empty")
    return text


async def serve(args: argparse.Namespace) -> None:
    store = IncidentStore(args.data_dir / incident_schema.FILE_NAME)
    token = read_secret(args.token_file, "the webhook token file")
    auth = (args.user, read_secret(args.password_file, "the monitoring password file")) if args.password_file else None
    manager = Alertmanager(args.alertmanager_url, requests.Session(), auth=auth)
    make_app(store, token).listen(args.port, address=args.host, max_body_size=MAX_BODY)
    log.warning(
        "gpuslice recorder: Alertmanager's webhook at http://%s:%d%s, the store %s",
        args.host,
        args.port,
        WEBHOOK_PATH,
        store.path,
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    catch_up = None
    if args.prometheus_url:
        prometheus = connect(args.prometheus_url, timeout_s=30, auth=auth)
        catch_up = functools.partial(catch_up_from_history, store, prometheus)
    syncing = asyncio.create_task(keep_in_sync(store, manager, args.interval, catch_up))
    await stop.wait()
    syncing.cancel()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m portal.recorder", description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, required=True, help="where incidents.sqlite is kept")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 in a pod (a NetworkPolicy admits Alertmanager)")
    p.add_argument("--token-file", type=Path, required=True, help="the bearer token Alertmanager presents")
    p.add_argument("--alertmanager-url", required=True)
    p.add_argument("--password-file", type=Path, help="Alertmanager's and Prometheus's basic-auth password")
    p.add_argument("--prometheus-url", help="what fired and ended while the recorder was down: Prometheus's ALERTS")
    p.add_argument("--user", default=MONITORING_USER, help="the basic-auth user")
    p.add_argument("--interval", type=float, default=15.0, help="seconds between reads of Alertmanager's API")
    return p


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = parser().parse_args(argv)
    started = time.monotonic()
    asyncio.run(serve(args))
    log.warning("gpuslice recorder: stopped after %.0f s", time.monotonic() - started)


if __name__ == "__main__":
    main()
