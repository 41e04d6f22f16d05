"""Install, reload, stop and uninstall (hub/service.py): what they write and what they ask of systemd,
on a machine whose systemctl and account tools are a small model of the real ones (``Machine``).
The real ones, in a container with systemd as PID 1: tests/e2e/test_service.py."""

import os
import pwd
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from hub import monitoring, service, service_units
from hub.service import Installer, ServiceError, debian_conflicts
from hub.settings import SettingsError, from_mapping
from hub.systemd import Systemd, journal_command

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="install writes as root (chown to the monitoring account)")


class Machine:
    """systemctl, getent and useradd as this machine would answer them; every command kept in order."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.active: set[str] = set()
        self.enabled: set[str] = set()
        self.accounts = {"root", "nobody"}

    def __call__(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        command = list(command)
        self.calls.append(command)
        tool, verb, rest = command[0], (command[1:2] or [""])[0], command[2:]
        units = [a for a in rest if not a.startswith("-")]
        ok = 0
        if tool == "systemctl":
            if verb in ("start", "restart"):
                self.active |= set(units)
            elif verb == "stop":
                self.active -= set(units)
            elif verb == "enable":
                self.enabled |= set(units)
            elif verb == "disable":
                self.enabled -= set(units)
                self.active -= set(units) if "--now" in rest else set()
            elif verb == "is-active":
                ok = 0 if units[0] in self.active else 3
            elif verb == "is-enabled":
                ok = 0 if units[0] in self.enabled else 1
        elif tool == "getent":
            ok = 0 if rest[0] in self.accounts else 2
        elif tool == "useradd":
            self.accounts.add(command[-1])
        return subprocess.CompletedProcess(command, ok, "", "")

    def said(self, verb: str) -> list[list[str]]:
        return [c[2:] for c in self.calls if c[:2] == ["systemctl", verb]]


@pytest.fixture
def place(tmp_path: Path) -> tuple[Installer, Machine, list[str]]:
    layout = service_units.Layout(
        python=Path("/usr/bin/python3"),
        code=Path("/opt/gpuslice"),
        settings=tmp_path / "etc" / "gpuslice.yaml",
        monitoring_dir=tmp_path / "monitoring",
        backups=tmp_path / "backups",
        units_dir=tmp_path / "units",
        command=tmp_path / "bin" / "gpuslice",
        account="nobody",
    )
    layout.units_dir.mkdir()
    layout.settings.parent.mkdir()
    write_settings(layout, {"data_dir": str(tmp_path / "data"), "admin_users": ["ada"], "isolation": "none"})
    machine, said = Machine(), []
    return Installer(layout, Systemd(machine), machine, said.append), machine, said


def write_settings(layout: service_units.Layout, settings: dict[str, object]) -> None:
    layout.settings.write_text(yaml.safe_dump(settings))


def unit_files(layout: service_units.Layout) -> dict[str, tuple[str, int]]:
    return {p.name: (p.read_text(), p.stat().st_mtime_ns) for p in layout.units_dir.iterdir()}


def test_installing_twice_gives_the_same_machine(place: tuple[Installer, Machine, list[str]]) -> None:
    installer, machine, _ = place
    first = installer.install([])
    assert list(first) == ["ada"]  # the admin's password, made once and printed by the command
    assert machine.active >= {"gpuslice.target", "gpuslice-backup.timer"}
    assert {"gpuslice.target", "gpuslice-backup.timer"} <= machine.enabled
    files, account_calls = unit_files(installer.layout), len([c for c in machine.calls if c[0] == "useradd"])
    machine.calls.clear()
    machine.active |= set(service.members(files))  # what the target started runs now

    assert installer.install([]) == {}  # no second password
    assert unit_files(installer.layout) == files  # not one file written again
    assert machine.said("daemon-reload") == [] and machine.said("restart") == []
    assert [c for c in machine.calls if c[0] == "useradd"] == [] and account_calls == 0  # nobody exists already


def test_restored_silences_reach_the_monitoring_accounts_alertmanager_once(
    place: tuple[Installer, Machine, list[str]],
) -> None:
    installer, _, _ = place
    if not all(monitoring.binaries()[name] for name in ("prometheus", "alertmanager")):
        pytest.skip("Prometheus and Alertmanager are not installed (scripts/setup installs them)")
    data = Path(yaml.safe_load(installer.layout.settings.read_text())["data_dir"])
    restored = data / "monitoring" / "alertmanager-data"  # where a restored backup puts them
    restored.mkdir(parents=True)
    (restored / "silences").write_bytes(b"kept")
    installer.install([])
    given = installer.layout.monitoring_dir / "alertmanager-data" / "silences"
    assert given.read_bytes() == b"kept" and given.stat().st_uid == pwd.getpwnam("nobody").pw_uid
    given.write_bytes(b"newer")  # Alertmanager's own since then: never overwritten
    installer.install([])
    assert given.read_bytes() == b"newer"


def test_a_changed_unit_restarts_that_service_alone(place: tuple[Installer, Machine, list[str]]) -> None:
    installer, machine, _ = place
    installer.install([])
    machine.active |= set(service.members(unit_files(installer.layout)))
    settings = yaml.safe_load(installer.layout.settings.read_text())
    write_settings(installer.layout, {**settings, "monitoring": {"exporter_port": 9401}})
    machine.calls.clear()
    installer.install([])
    assert machine.said("daemon-reload") == [[]]
    assert machine.said("restart") == [["gpuslice-exporter.service"]]


def test_reload_refuses_bad_settings_before_touching_anything(place: tuple[Installer, Machine, list[str]]) -> None:
    installer, machine, _ = place
    installer.install([])
    files = unit_files(installer.layout)
    machine.calls.clear()
    installer.layout.settings.write_text("groups:\n  ml101: {max_slice: 4 GiB please}\n")
    with pytest.raises(SettingsError, match="max_slice"):
        installer.reload()
    write_settings(installer.layout, {"data_dir": "/somewhere/else", "admin_users": ["ada"]})
    with pytest.raises(ServiceError, match=r"data_dir changed from .* the running servers"):
        installer.reload()
    write_settings(installer.layout, {"data_dir": "relative/data"})
    with pytest.raises(ServiceError, match="absolute"):
        installer.reload()
    assert machine.calls == [] and unit_files(installer.layout) == files


def test_reload_applies_a_new_class_by_restarting_the_hub_never_the_servers(
    place: tuple[Installer, Machine, list[str]],
) -> None:
    installer, machine, said = place
    installer.install([])
    machine.active |= set(service.members(unit_files(installer.layout)))
    settings = yaml.safe_load(installer.layout.settings.read_text())
    write_settings(installer.layout, {**settings, "groups": {"ml102": {"members": ["carl"], "max_slice": "4GiB"}}})
    machine.calls.clear()
    installer.reload()
    restarted = {unit for call in machine.said("restart") for unit in call}
    assert "gpuslice-hub.service" in restarted
    touched = [unit for call in machine.calls for unit in call if unit == "gpuslice.slice" or unit.endswith(".scope")]
    assert touched == []
    assert "notebook servers keep running" in said[-1]


def test_stop_leaves_the_servers_and_says_how_to_end_them(place: tuple[Installer, Machine, list[str]]) -> None:
    installer, machine, said = place
    installer.install([])
    machine.calls.clear()
    installer.stop(every_server=False)
    assert machine.said("stop")[0][0] == "gpuslice.target"
    assert said[-1] == "gpuslice: stopped; notebook servers keep running (gpuslice stop --all ends them)"


def test_uninstall_keeps_the_data_unless_purged_and_the_backups_always(
    place: tuple[Installer, Machine, list[str]],
) -> None:
    installer, machine, _ = place
    installer.install([])
    layout = installer.layout
    data = Path(yaml.safe_load(layout.settings.read_text())["data_dir"])
    installer.uninstall(purge=False)
    assert list(layout.units_dir.iterdir()) == [] and not layout.command.exists()
    assert data.is_dir() and layout.settings.exists() and layout.backups.is_dir()
    assert ["--quiet", "--now", "gpuslice.target", "gpuslice-backup.timer"] in machine.said("disable")
    installer.install([])
    installer.uninstall(purge=True)
    assert not data.exists() and not layout.settings.exists() and layout.backups.is_dir()
    assert ["userdel", "nobody"] in machine.calls


def test_debian_units_give_way_only_on_the_ports_the_platform_takes() -> None:
    settings = from_mapping({"monitoring": {"alertmanager_port": 19093}}, "test")
    enabled = {"prometheus.service", "prometheus-alertmanager.service"}.__contains__
    assert debian_conflicts(settings, enabled) == ["prometheus.service"]


def test_logs_name_the_installed_units(place: tuple[Installer, Machine, list[str]]) -> None:
    installer, _, _ = place
    installer.install([])
    assert installer.journal("hub", follow=True, lines=None) == [
        "journalctl",
        "--no-pager",
        "--unit=gpuslice-hub.service",
        "--follow",
    ]
    assert installer.journal("backup", follow=False, lines=20)[2:] == [
        "--unit=gpuslice-backup.service",
        "--unit=gpuslice-backup.timer",
        "--lines=20",
    ]
    with pytest.raises(
        ServiceError,
        match="no installed unit 'portal': one of alertmanager, exporter, hub, node-exporter, prometheus, backup",
    ):
        installer.journal("portal", follow=False, lines=None)
    assert journal_command([], follow=False, lines=None) == ["journalctl", "--no-pager"]
