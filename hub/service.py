"""The platform as a service of this machine: `gpuslice install`, `uninstall`, `reload`, `upgrade`
(installed), `start`, `stop`, `status` and `logs`.

The units are built by hub/service_units.py (pure text) and handed to systemd by hub/systemd.py
(given its runner). Install is safe to run again: it writes only what differs, restarts only
what changed, and migrates any store an older release left (hub/state.py), the hub stopped
meanwhile; the notebook servers keep running through all of it, in their scopes under
gpuslice.slice, and the next hub adopts them (hub/recovery.py). Only `stop --all` and
`uninstall` end them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hub import monitoring, recovery, state
from hub import service_units as units_mod
from hub.platform import PROXY, REPO, admin_passwords, monitoring_secrets
from hub.service_units import Layout
from hub.settings import Settings, load, market_url
from hub.systemd import Runner, Systemd, ensure_account, journal_command, remove_account
from spawner import confinement
from spawner.ledger import Ledger

Say = Callable[[str], None]
WRITTEN_BY = "# Written by gpuslice install"  # the first line of every file install writes
# Debian's own units for the same servers, and the port each listens on by default.
DEBIAN_UNITS = {
    "prometheus.service": ("prometheus_port", 9090),
    "prometheus-alertmanager.service": ("alertmanager_port", 9093),
    "prometheus-node-exporter.service": ("node_exporter_port", 9100),
}


class ServiceError(RuntimeError):
    """The service cannot be installed or changed as asked; the message says what to do."""


def layout_here() -> Layout:
    """The installed paths, running this interpreter and this source folder."""
    return Layout(python=Path(sys.executable), code=REPO)


def installed(layout: Layout) -> bool:
    return (layout.units_dir / units_mod.HUB).exists()


def installed_here(settings_file: Path, layout: Layout | None = None) -> bool:
    """Whether ``settings_file`` is the installed platform's (its commands then act on the service)."""
    layout = layout or layout_here()
    return installed(layout) and settings_file.absolute() == layout.settings


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ServiceError(f"gpuslice {what} changes this machine's services: run it as root (sudo gpuslice {what})")


def require_systemd(booted: bool) -> None:
    if not booted:
        raise ServiceError(
            "systemd is not this machine's init (PID 1), so gpuslice cannot run as its service here; "
            "run it in the foreground with gpuslice up (or under your own process supervisor)"
        )


def read_settings(layout: Layout) -> Settings:
    """The installed settings, checked; SettingsError (the file and the key) or ServiceError otherwise."""
    settings = load(layout.settings)
    if not settings.data_dir.is_absolute():
        raise ServiceError(
            f"{layout.settings}: data_dir is {settings.data_dir}, a relative path; the service needs an "
            "absolute one, for example /var/lib/gpuslice"
        )
    return settings


def installed_data_dir(layout: Layout) -> Path | None:
    """The data folder the installed hub unit runs on (its WorkingDirectory), None before an install."""
    try:
        text = (layout.units_dir / units_mod.HUB).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("WorkingDirectory="):
            return Path(line.removeprefix("WorkingDirectory="))
    return None


def check_reload(layout: Layout, settings: Settings) -> None:
    """What reload refuses beyond the settings model: moving the data folder under running servers."""
    before = installed_data_dir(layout)
    if before is not None and before != settings.data_dir:
        raise ServiceError(
            f"{layout.settings}: data_dir changed from {before} to {settings.data_dir}; the running servers and "
            f"their slices are recorded in {before}. Put it back, or move the data with gpuslice stop --all, "
            "gpuslice backup and gpuslice restore (docs/install.md)"
        )


def write_changed(folder: Path, files: Mapping[str, str], mode: int = 0o644) -> list[str]:
    """Write each file whose content differs; return their names (none: nothing to do)."""
    changed = []
    for name, text in files.items():
        path = folder / name
        try:
            if path.read_text() == text:
                continue
        except OSError:
            pass
        temporary = path.with_name(f".{name}.new")
        temporary.write_text(text)
        temporary.chmod(mode)
        temporary.replace(path)
        changed.append(name)
    return changed


def ours(path: Path) -> bool:
    """Whether install wrote ``path`` (its first lines say so; a script's after its #! line)."""
    try:
        with path.open() as f:
            return any(f.readline().startswith(WRITTEN_BY) for _ in range(2))
    except (OSError, UnicodeDecodeError):
        return False


def installed_units(layout: Layout) -> list[str]:
    """The unit files install wrote that are there now."""
    return sorted(p.name for p in layout.units_dir.glob("gpuslice*") if p.is_file() and ours(p))


def members(names: Iterable[str]) -> list[str]:
    """The services gpuslice.target starts (not the slice, the backup, the timer or the target)."""
    apart = {units_mod.TARGET, units_mod.SLICE, units_mod.BACKUP, units_mod.BACKUP_TIMER}
    return [n for n in names if n.endswith(".service") and n not in apart]


def debian_conflicts(settings: Settings, enabled: Callable[[str], bool]) -> list[str]:
    """Debian's own Prometheus units that would take the ports the platform's use (pure, given ``enabled``)."""
    ports = settings.monitoring
    return [unit for unit, (key, port) in DEBIAN_UNITS.items() if getattr(ports, key) == port and enabled(unit)]


@dataclass
class Installer:
    """Install, reload, upgrade, start, stop and uninstall, through ``systemd`` and ``runner``."""

    layout: Layout
    systemd: Systemd
    runner: Runner
    say: Say = print

    def install(self, admins: list[str], *, upgrading: bool = False) -> dict[str, str]:
        """Everything in place and running; returns the admins' passwords made now (to print once).
        ``upgrading``: the code changed (gpuslice upgrade): every service restarts on it."""
        layout = self.layout
        require_root("upgrade" if upgrading else "install")
        if not PROXY.exists():
            raise ServiceError(f"configurable-http-proxy is not at {PROXY}: run scripts/setup in {REPO} first")
        self._settings_file(admins)
        settings = read_settings(layout)
        if ensure_account(self.runner, layout.account):
            self.say(f"gpuslice: made the system account {layout.account} (Prometheus and Alertmanager run as it)")
        data_dir = settings.data_dir
        for folder in (data_dir, layout.backups):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            folder.chmod(0o700)
        self._migrate(settings, stop_hub_first=upgrading)
        generated = admin_passwords(settings, data_dir, service=False)
        self._monitoring_files(settings)
        changed = self._write_units(settings)
        self._give_way(settings)
        self.systemd.enable([units_mod.TARGET, units_mod.BACKUP_TIMER])
        running = [u for u in members(installed_units(layout)) if self.systemd.active(u)]
        again = running if upgrading else [u for u in changed if u in running]
        if again:
            self.say(f"gpuslice: restarting {', '.join(again)} (notebook servers keep running)")
            self.systemd.restart(again)
        self.systemd.start([units_mod.TARGET, units_mod.BACKUP_TIMER])
        return generated

    def _settings_file(self, admins: list[str]) -> None:
        path = self.layout.settings
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if path.exists():
            return
        text = units_mod.settings_template(self.layout, Path("/var/lib/gpuslice"), admins or ["admin"])
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        self.say(f"gpuslice: wrote the settings {path} (edit it, then gpuslice reload)")

    def _migrate(self, settings: Settings, stop_hub_first: bool) -> None:
        """Every store brought to this release (a backup first), with the hub stopped while it happens."""
        data_dir = settings.data_dir
        if not (data_dir / "jupyterhub.sqlite").exists():
            return
        url = market_url(settings)
        stale = [s for s in state.store_statuses(data_dir, url) if not s.current]
        if (stale or stop_hub_first) and self.systemd.active(units_mod.HUB):
            self.say("gpuslice: stopping the hub while the stores change (notebook servers keep running)")
            self.systemd.stop([units_mod.HUB])
        state.upgrade(data_dir, self.layout.settings, url, say=self.say)

    def _monitoring_files(self, settings: Settings) -> None:
        """The monitoring secrets made before any unit reads them (the exporter's password), and the
        monitoring account's files written."""
        from hub import service_monitoring

        if not settings.monitoring.enabled:
            return
        monitoring_secrets(settings, settings.data_dir, {})
        found = monitoring.binaries()
        if found["prometheus"] and found["alertmanager"]:
            service_monitoring.publish(settings, self.layout.monitoring_dir, self.layout.account)

    def _write_units(self, settings: Settings) -> list[str]:
        """The unit files and the command written where they differ; units no longer wanted stopped and
        removed; systemd told. Returns the names of the units written."""
        layout = self.layout
        wanted = units_mod.units(layout, settings, monitoring.binaries())
        gone = [name for name in installed_units(layout) if name not in wanted]
        if gone:
            self.systemd.stop(gone)
            for name in gone:
                (layout.units_dir / name).unlink()
            self.say(f"gpuslice: removed {', '.join(gone)} (no longer in the settings)")
        changed = write_changed(layout.units_dir, wanted)
        layout.command.parent.mkdir(parents=True, exist_ok=True)
        write_changed(layout.command.parent, {layout.command.name: units_mod.command_wrapper(layout)}, mode=0o755)
        if changed or gone:
            self.systemd.daemon_reload()
        if changed:
            self.say(f"gpuslice: wrote {', '.join(changed)} in {layout.units_dir}")
        return changed

    def _give_way(self, settings: Settings) -> None:
        """Debian's own Prometheus units stopped where they would take the platform's ports."""
        conflicting = debian_conflicts(settings, self.systemd.enabled)
        if conflicting:
            self.systemd.disable(conflicting, now=True)
            self.say(
                f"gpuslice: stopped and disabled {', '.join(conflicting)}: the platform runs its own on the same "
                f"ports (change monitoring's ports, then systemctl enable --now {' '.join(conflicting)})"
            )

    def reload(self) -> dict[str, str]:
        """The settings checked, then applied: units written again, the services restarted, no server stopped."""
        layout = self.layout
        require_root("reload")
        if not installed(layout):
            raise ServiceError("gpuslice is not installed here: gpuslice install (as root) installs it")
        settings = read_settings(layout)
        check_reload(layout, settings)
        self._check_monitoring(settings)
        generated = admin_passwords(settings, settings.data_dir, service=False)
        self._monitoring_files(settings)
        self._write_units(settings)
        again = [u for u in members(installed_units(layout)) if self.systemd.active(u)]
        self.say(f"gpuslice: restarting {', '.join(again)} with {layout.settings} (notebook servers keep running)")
        self.systemd.restart(again)
        self.systemd.start([units_mod.TARGET])
        return generated

    def _check_monitoring(self, settings: Settings) -> None:
        """The Alertmanager config built before anything changes (an on-call webhook file missing, ...)."""
        if settings.monitoring.enabled:
            options = settings.monitoring
            recorder = monitoring.Recorder("http://127.0.0.1", credentials_file=Path("/dev/null"))
            monitoring.alertmanager_config(options.webhook_url, options.oncall, recorder=recorder)

    def start(self) -> None:
        require_root("start")
        self.systemd.start([units_mod.TARGET])

    def stop(self, every_server: bool) -> None:
        """The platform's services stopped; with ``every_server``, every notebook server ended too."""
        require_root("stop")
        self.systemd.stop([units_mod.TARGET, *members(installed_units(self.layout))])
        if not every_server:
            self.say("gpuslice: stopped; notebook servers keep running (gpuslice stop --all ends them)")
            return
        data_dir = read_settings(self.layout).data_dir
        ledger, confined = Ledger(data_dir / "ledger.sqlite"), confinement.for_machine(data_dir)
        released = recovery.stop_servers(ledger, say=self.say, confinement=confined)
        self.say(f"gpuslice: stopped, and every notebook server ended ({len(released)} slices released)")

    def uninstall(self, purge: bool) -> None:
        layout = self.layout
        require_root("uninstall")
        names = installed_units(layout)
        settings = read_settings(layout) if layout.settings.exists() else None
        if names:
            self.stop(every_server=settings is not None)
            self.systemd.disable([n for n in (units_mod.TARGET, units_mod.BACKUP_TIMER) if n in names], now=True)
            for name in names:
                (layout.units_dir / name).unlink()
            self.systemd.daemon_reload()
        if ours(layout.command):
            layout.command.unlink()
        self.say(f"gpuslice: uninstalled ({len(names)} units removed)")
        kept = [layout.settings.parent, layout.monitoring_dir, *([settings.data_dir] if settings else [])]
        if not purge:
            self.say(
                f"gpuslice: kept {', '.join(map(str, kept))} and {layout.backups} (--purge removes all but the backups)"
            )
            return
        for folder in kept:
            shutil.rmtree(folder, ignore_errors=True)
        remove_account(self.runner, layout.account)
        self.say(
            f"gpuslice: removed {', '.join(map(str, kept))} and the account {layout.account}; "
            f"the backups in {layout.backups} are kept"
        )

    def status(self) -> int:
        """Each installed service's state and the servers running; 0 when every service runs."""
        layout = self.layout
        names = installed_units(layout)
        if not names:
            self.say("gpuslice is not installed here (gpuslice install, as root)")
            return 4
        states = [self.systemd.state(n) for n in members(names)]
        for unit in states:
            since = f" since {unit.since}" if unit.since else ""
            self.say(f"{unit.name:34} {unit.active} ({unit.sub}){since}")
        timer = self.systemd.state(units_mod.BACKUP_TIMER)
        self.say(f"{units_mod.BACKUP_TIMER:34} {timer.active} ({timer.sub}); backups in {layout.backups}")
        settings = read_settings(layout)
        prefix = f"gpuslice-{confinement.platform_id(settings.data_dir)}-*"
        self.say(f"notebook servers: {len(self.systemd.scopes(prefix))} running, each in a scope of {units_mod.SLICE}")
        self.say(f"settings: {layout.settings}; data: {settings.data_dir}; open http://127.0.0.1:{settings.port}/")
        return 0 if all(unit.up for unit in states) else 3

    def journal(self, unit: str | None, follow: bool, lines: int | None) -> list[str]:
        """The journalctl command for one service (its short name: hub, prometheus ...) or all of them."""
        names = installed_units(self.layout)
        if unit is None:
            return journal_command(names, follow, lines)
        full = unit if unit.startswith("gpuslice") else f"gpuslice-{unit}"
        matches = [n for n in names if n in (full, f"{full}.service", f"{full}.timer")]
        if not matches:
            short = ", ".join(n.removeprefix("gpuslice-").removesuffix(".service") for n in members(names))
            raise ServiceError(f"no installed unit {unit!r}: one of {short}, backup, or none for all")
        return journal_command(matches, follow, lines)
