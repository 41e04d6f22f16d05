"""`gpuslice install`, `uninstall`, `reload`, `start`, `stop`, `status` and `logs`: the platform as a
service of this machine (hub/service.py), from the command line."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from typing import Any

from hub import state
from hub import systemd as systemd_mod
from hub.service_units import Layout
from hub.settings import SettingsError

COMMANDS = ("install", "uninstall", "reload", "start", "stop", "status", "logs")


def add_commands(commands: Any) -> None:
    install = commands.add_parser(
        "install",
        help="install the platform as this machine's service (root; systemd units, started at boot); safe to run again",
    )
    install.add_argument(
        "--admin",
        action="append",
        default=[],
        help="an admin's user name, for the settings file install writes when there is none (default: admin)",
    )
    uninstall = commands.add_parser("uninstall", help="end every notebook server and remove the service (root)")
    uninstall.add_argument(
        "--purge", action="store_true", help="also remove the settings, the data and the account (not the backups)"
    )
    commands.add_parser("reload", help="check the installed settings and apply them; no notebook server stops (root)")
    commands.add_parser("start", help="start the installed platform (root)")
    stop = commands.add_parser("stop", help="stop the installed platform; notebook servers keep running (root)")
    stop.add_argument("--all", action="store_true", help="end every notebook server too, releasing its slice")
    commands.add_parser("status", help="the installed platform's services and running notebook servers")
    logs = commands.add_parser("logs", help="the installed platform's logs (the journal)")
    logs.add_argument(
        "unit", nargs="?", help="hub, exporter, prometheus, alertmanager, node-exporter or backup (default: all)"
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing what comes")
    logs.add_argument("-n", "--lines", type=int, help="the last N lines only")


def run(args: argparse.Namespace, runner: systemd_mod.Runner = systemd_mod.run) -> int:
    from hub import service  # lazy: the platform's imports are heavy
    from hub.platform import PlatformError

    installer = service.Installer(service.layout_here(), systemd_mod.Systemd(runner), runner)
    try:
        if args.command in ("install", "reload", "start", "stop", "uninstall"):
            service.require_systemd(systemd_mod.booted())
        if args.command == "install":
            return _said_passwords(installer.install(args.admin), installer.layout)
        if args.command == "reload":
            return _said_passwords(installer.reload(), installer.layout)
        if args.command == "start":
            installer.start()
        elif args.command == "stop":
            installer.stop(every_server=args.all)
        elif args.command == "uninstall":
            installer.uninstall(purge=args.purge)
        elif args.command == "status":
            return installer.status()
        else:
            command = installer.journal(args.unit, args.follow, args.lines)
            os.execvp(command[0], command)  # the journal straight to the terminal (and its pager's keys)
    except SettingsError as exc:
        print(f"gpuslice {args.command}: {exc}; nothing was changed", file=sys.stderr)
        return 2
    except (
        service.ServiceError,
        PlatformError,
        systemd_mod.SystemdError,
        state.StateError,
        OSError,
        sqlite3.Error,
    ) as exc:
        print(f"gpuslice {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0


def _said_passwords(generated: dict[str, str], layout: Layout) -> int:
    for name, password in generated.items():
        print(f"  admin {name}'s password (shown once): {password}")
    print(
        f"gpuslice runs as a service: gpuslice status, gpuslice logs; settings in {layout.settings} "
        "(gpuslice reload applies a change)."
    )
    return 0
