"""`gpuslice backup`, `restore` and `upgrade`: the platform's state (hub/state.py) from the command line."""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hub import settings as settings_mod
from hub import state

COMMANDS = ("backup", "restore", "upgrade")


def add_commands(commands: Any) -> None:
    """The three subcommands, on ``gpuslice``'s subparsers."""
    backup = commands.add_parser(
        "backup", help="copy the platform's state (users, classes, markets, line, incidents, secrets) to one file"
    )
    backup.add_argument(
        "file", type=Path, help="the archive to write (tar.gz, mode 0600), or a folder: a new dated archive in it"
    )
    backup.add_argument(
        "--keep", type=int, help="with a folder: keep only the newest N dated archives there (the backup timer's)"
    )
    backup.add_argument(
        "--config", type=Path, help="settings file (default ./gpuslice.yaml where it exists, else the installed one)"
    )
    backup.add_argument("--homes", action="store_true", help="also the users' home folders (can be large)")
    restore = commands.add_parser("restore", help="put a backup's state onto this machine (a fresh data folder)")
    restore.add_argument("file", type=Path, help="an archive made by gpuslice backup")
    restore.add_argument(
        "--config",
        type=Path,
        default=settings_mod.DEFAULT_CONFIG,
        help="where to write the backup's settings file (default ./gpuslice.yaml)",
    )
    restore.add_argument(
        "--force", action="store_true", help="restore over an existing data folder and settings (moved aside)"
    )
    upgrade = commands.add_parser(
        "upgrade",
        help="bring every store to this release (JupyterHub's database, markets, ledger, incidents), backed up first; "
        "installed, the service then runs this release (notebook servers keep running)",
    )
    upgrade.add_argument(
        "--config", type=Path, help="settings file (default ./gpuslice.yaml where it exists, else the installed one)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.command == "backup":
            return _backup(args)
        if args.command == "restore":
            return _restore(args)
        return _upgrade(args)
    except (state.StateError, settings_mod.SettingsError, OSError, sqlite3.Error) as exc:
        print(f"gpuslice {args.command}: {exc}", file=sys.stderr)
        return 2


def _settings(config: Path | None) -> tuple[settings_mod.Settings, Path | None]:
    path = settings_mod.config_path(config)
    return settings_mod.load(path), path


def hub_users(data_dir: Path) -> list[str]:
    with sqlite3.connect(f"file:{data_dir / 'jupyterhub.sqlite'}?mode=ro", uri=True) as db:
        return [row[0] for row in db.execute("SELECT name FROM users ORDER BY name")]


def home_of(settings: settings_mod.Settings, user: str) -> Path:
    """Where ``user``'s home is under the platform's isolation (spawner/local.py decides the same)."""
    from spawner.local import SYSTEM_PREFIX

    if settings.isolation == "unix-users":
        try:
            return Path(pwd.getpwnam(SYSTEM_PREFIX + user.lower()).pw_dir)
        except KeyError:
            return Path("/nonexistent")
    return settings.data_dir.absolute() / "homes" / user


def _backup(args: argparse.Namespace) -> int:
    settings, path = _settings(args.config)
    data_dir = settings.data_dir.absolute()
    homes = {user: home_of(settings, user) for user in hub_users(data_dir)} if args.homes else None
    folder = args.file if args.file.is_dir() else None
    if args.keep is not None and (folder is None or args.keep < 1):
        raise state.StateError("--keep N takes a folder to back up into, and N of at least 1")
    out = folder / state.dated_name(datetime.now(UTC)) if folder else args.file
    counts = state.backup(data_dir, path, out, homes, _installed_alertmanager_data(path))
    if os.geteuid() == 0:
        os.chown(out, 0, 0)
    what = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
    print(f"gpuslice backup: {out} ({what}); readable by its owner only. Restore: gpuslice restore {out}")
    if folder and args.keep:
        for old in state.beyond_newest([p.name for p in folder.iterdir()], args.keep):
            (folder / old).unlink()
            print(f"gpuslice backup: removed {folder / old} (older than the newest {args.keep})")
    return 0


def _installed_alertmanager_data(settings_file: Path | None) -> Path | None:
    """The installed platform's Alertmanager keeps its silences in the monitoring account's folder."""
    from hub import service  # lazy: the platform's imports are heavy

    if settings_file is None or not service.installed_here(settings_file):
        return None
    return service.layout_here().monitoring_dir / "alertmanager-data"


def _restore(args: argparse.Namespace) -> int:
    text = state.archived_settings(args.file)
    state.read_manifest(args.file)  # refuse a damaged or foreign file before writing anything
    if text is not None:
        if args.config.exists() and not args.force:
            raise state.StateError(f"{args.config} exists: name another --config, or add --force")
        args.config.parent.mkdir(parents=True, exist_ok=True)
        args.config.write_text(text)
        settings = settings_mod.load(args.config)
    else:
        settings = settings_mod.Settings()
    data_dir = settings.data_dir.absolute()
    manifest, homes = state.restore(args.file, data_dir, force=args.force)
    restored_homes = manifest.get("homes") or []
    assert isinstance(restored_homes, list)
    for user in restored_homes:
        _give_home(settings, str(user), homes / str(user))
    shutil.rmtree(homes.parent, ignore_errors=True)
    print(
        f"gpuslice restore: the state of {manifest.get('created')} (gpuslice {manifest.get('gpuslice')}) is in "
        f"{data_dir}, settings in {args.config if text is not None else '(defaults)'}"
        + (f", {len(restored_homes)} homes" if restored_homes else "")
        + "."
    )
    state.upgrade(data_dir, args.config if text is not None else None, settings_mod.market_url(settings))
    from hub import service  # lazy: the platform's imports are heavy

    if service.installed_here(args.config):
        print("Start it: gpuslice install (as root; the service it was, or a new one)")
    else:
        print(f"Start it: gpuslice up --config {args.config}" if text is not None else "Start it: gpuslice up")
    return 0


def _give_home(settings: settings_mod.Settings, user: str, unpacked: Path) -> None:
    """A restored home back to its user: under unix-users their account is made again (new uid) and owns it."""
    from spawner.local import SYSTEM_PREFIX, ensure_system_user

    if settings.isolation == "unix-users":
        account = SYSTEM_PREFIX + user.lower()
        ensure_system_user(account)
        target = Path(pwd.getpwnam(account).pw_dir)
        shutil.copytree(unpacked, target, symlinks=True, dirs_exist_ok=True)
        entry = pwd.getpwnam(account)
        for path in [target, *target.rglob("*")]:
            os.lchown(path, entry.pw_uid, entry.pw_gid)
        target.chmod(0o700)
    else:
        target = settings.data_dir.absolute() / "homes" / user
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(unpacked, target, symlinks=True, dirs_exist_ok=True)


def _upgrade(args: argparse.Namespace) -> int:
    from hub import service  # lazy: the platform's imports are heavy

    settings, path = _settings(args.config)
    if path is not None and service.installed_here(path):
        # The installed platform: its hub stopped while the stores change, every service started again
        # on this code; the notebook servers keep running and the new hub adopts them.
        from hub import systemd

        installer = service.Installer(service.layout_here(), systemd.Systemd(), systemd.run)
        installer.install([], upgrading=True)
        print("gpuslice upgrade: the service runs this release (gpuslice status)")
        return 0
    state.upgrade(settings.data_dir.absolute(), path, settings_mod.market_url(settings))
    return 0
