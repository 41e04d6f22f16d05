"""`gpuslice top`: the command line of the terminal view (hub/top.py, hub/top_app.py, hub/top_source.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hub import settings as settings_mod
from hub.top import SORTS, text, to_json
from hub.top_source import Source, read
from spawner import environ

TOP_SERVICE = "gpuslice-top"  # the single machine's read-only service: its token in DATA/gpuslice-top-hub-token


def add_command(commands: Any) -> None:
    top = commands.add_parser(
        "top", help="cards, slices, owners, idle time, the GPU line and alerts, refreshing (q quits)"
    )
    top.add_argument(
        "--config", type=Path, help="settings file (default ./gpuslice.yaml where it exists, else the installed one)"
    )
    top.add_argument("--url", help="the hub, as http://HOST:PORT (default: this machine's, from the settings)")
    top.add_argument(
        "--token-file",
        type=Path,
        help=f"a file holding an admin's API token (default: ${environ.HUB_API_TOKEN.name}, else, as root on "
        "the hub's machine, the platform's own read-only token)",
    )
    top.add_argument("--once", action="store_true", help="print the view once, as text, and exit")
    top.add_argument("--json", action="store_true", help="print the view once, as JSON, and exit")
    top.add_argument("--sort", choices=SORTS, default="card", help="order of the slices (default card)")
    top.add_argument("--filter", default="", help="only slices whose user, server, card or model contains this")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")


def source(args: argparse.Namespace) -> Source:
    """Where and how to read: the hub's URL, a token, and Alertmanager where the settings say."""
    settings = settings_mod.load(settings_mod.config_path(args.config))
    data_dir = settings.data_dir.absolute()
    url = (args.url or f"http://127.0.0.1:{settings.port}").rstrip("/")
    token = ""
    if args.token_file:
        token = args.token_file.read_text().strip()
    token = token or environ.read().get(environ.HUB_API_TOKEN)
    own = data_dir / f"{TOP_SERVICE}-hub-token"
    if not token and own.exists():
        token = own.read_text().strip()
    if not token:
        raise SystemExit(
            f"gpuslice top: no token: give --token-file (an admin's token from {url}/hub/token), set "
            f"{environ.HUB_API_TOKEN.name}, or run it as root on the hub's machine"
        )
    alertmanager, auth = "", None
    password = data_dir / "monitoring" / "web-password"
    if settings.monitoring.enabled and password.exists():
        alertmanager = f"http://127.0.0.1:{settings.monitoring.alertmanager_port}"
        auth = (settings_mod.MONITORING_USER, password.read_text().strip())
    return Source(url, token, alertmanager, auth)


def run(args: argparse.Namespace) -> int:
    where = source(args)
    if args.once or args.json:
        snapshot = read(where)
        print(to_json(snapshot) if args.json else text(snapshot, args.sort, args.filter))
        return 1 if snapshot.problems and not snapshot.cards else 0
    if not sys.stdout.isatty():
        raise SystemExit("gpuslice top: not a terminal; use --once or --json in scripts")
    from hub.top_app import TopApp  # Textual: only for the interactive view

    app = TopApp(lambda: read(where), args.interval)
    app.sort, app.filter_text = args.sort, args.filter
    app.run()
    return 0
