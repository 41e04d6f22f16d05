"""The installed platform's systemd units, as text, from plain values (pure: no I/O).

As kubespawner's ``make_pod`` builds a pod, each function here builds one unit file from the
installed paths (``Layout``), the settings and the monitoring binaries found; hub/service.py
writes them and tells systemd (through hub/systemd.py). The split:

- ``gpuslice-hub.service`` (root): ``gpuslice up --service``, which runs JupyterHub with its
  proxy and managed services (portal gate, culler, reclaimer, incident recorder, renewals) as
  its children. Root, because it starts each server as its user, in a scope of its own. Only
  the main process is told to stop (``KillMode=mixed``): JupyterHub stops its children and
  leaves every server running in ``gpuslice.slice``; the next start adopts them.
- ``gpuslice.slice``: the servers' scopes (spawner/systemd_units.py puts each there). No unit
  is ``PartOf`` it, and it is no part of ``gpuslice.target``: stopping the platform stops no server.
- ``gpuslice-exporter.service`` (root): the GPU exporter, which reads the ledger and names the
  owner of every process on a card.
- ``gpuslice-prometheus.service``, ``gpuslice-alertmanager.service``,
  ``gpuslice-node-exporter.service`` (the ``gpuslice`` system account), when installed: each
  restarts alone, is accounted apart from the hub, and cannot read the platform's data. Before
  each start and reload, root writes what they read into their own folder (hub/service_monitoring.py).
- ``gpuslice-backup.service`` and ``.timer`` (root): the state backed up daily.
- ``gpuslice.target``: all of the above but the slice and the backup, started at boot.

No secret is on a command line or in an environment: every one is a 0600 file, named by path.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hub.settings import INSTALLED_CONFIG, Settings

TARGET = "gpuslice.target"
HUB = "gpuslice-hub.service"
SLICE = "gpuslice.slice"  # the name spawner/systemd_units.py gives the servers' scopes
EXPORTER = "gpuslice-exporter.service"
PROMETHEUS = "gpuslice-prometheus.service"
ALERTMANAGER = "gpuslice-alertmanager.service"
NODE_EXPORTER = "gpuslice-node-exporter.service"
BACKUP = "gpuslice-backup.service"
BACKUP_TIMER = "gpuslice-backup.timer"
BACKUPS_KEPT = 14  # daily archives kept by the timer's backups (two weeks)


@dataclass(frozen=True)
class Layout:
    """Where the installed platform lives. ``python`` and ``code``: the interpreter and the source
    folder install ran from (the units run that code); the rest: the machine's fixed places."""

    python: Path
    code: Path
    settings: Path = INSTALLED_CONFIG
    monitoring_dir: Path = Path("/var/lib/gpuslice-monitoring")  # the monitoring account's folder
    backups: Path = Path("/var/backups/gpuslice")
    units_dir: Path = Path("/etc/systemd/system")
    command: Path = Path("/usr/local/bin/gpuslice")
    account: str = "gpuslice"

    def docs(self) -> str:
        return f"file://{self.code / 'docs' / 'install.md'}"


def exec_line(args: Sequence[str | Path]) -> str:
    """A command for ExecStart= and its kin: each argument quoted where systemd would split it,
    and ``%`` and ``$`` escaped so that systemd hands them over as written."""

    def quoted(arg: str) -> str:
        arg = arg.replace("%", "%%").replace("$", "$$")
        if arg and not any(c in arg for c in " \t\"'\\;"):
            return arg
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return " ".join(quoted(str(a)) for a in args)


def unit_file(sections: Mapping[str, Sequence[tuple[str, str]]]) -> str:
    """An INI-style unit file: sections in order, each a list of (key, value) (keys may repeat)."""
    blocks = []
    for section, entries in sections.items():
        blocks.append(f"[{section}]\n" + "".join(f"{key}={value}\n" for key, value in entries))
    return "# Written by gpuslice install; gpuslice reload writes it again from the settings.\n" + "\n".join(blocks)


def gpuslice_command(layout: Layout, *args: str | Path) -> list[str | Path]:
    return [layout.python, "-m", "hub.cli", *args]


def _runs_code(layout: Layout) -> list[tuple[str, str]]:
    # The code the installer ran from, whether or not it is installed into the environment.
    return [("Environment", exec_line([f"PYTHONPATH={layout.code}"]))]


def hub_unit(layout: Layout, settings: Settings) -> str:
    return unit_file(
        {
            "Unit": [
                ("Description", "gpuslice hub: JupyterHub, its proxy and managed services"),
                ("Documentation", layout.docs()),
                ("After", "network.target"),
                ("PartOf", TARGET),
            ],
            "Service": [
                ("Type", "simple"),
                ("ExecStart", exec_line(gpuslice_command(layout, "up", "--service", "--config", layout.settings))),
                ("WorkingDirectory", str(settings.data_dir)),
                *_runs_code(layout),
                # Only `gpuslice up` is told to stop: it stops JupyterHub, which stops its proxy and
                # services; what is left in this unit is then killed. Servers are in gpuslice.slice.
                ("KillMode", "mixed"),
                ("TimeoutStopSec", "60"),
                ("Restart", "on-failure"),
                ("RestartSec", "5"),
                ("UMask", "0077"),
                ("SyslogIdentifier", "gpuslice-hub"),
            ],
        }
    )


def slice_unit(layout: Layout) -> str:
    return unit_file(
        {
            "Unit": [
                ("Description", "gpuslice notebook servers, each in a scope of its own with its limits"),
                ("Documentation", layout.docs()),
            ],
            "Slice": [],
        }
    )


def exporter_unit(layout: Layout, settings: Settings) -> str:
    data, port = settings.data_dir, settings.monitoring.exporter_port
    command = gpuslice_command(
        layout,
        "exporter",
        "--port",
        str(port),
        "--simulate",
        settings.simulate,
        "--ledger",
        data / "ledger.sqlite",
        "--faults",
        data / "monitoring" / "faults.json",
        "--password-file",
        data / "monitoring" / "web-password",
    )
    return unit_file(
        {
            "Unit": [
                ("Description", f"gpuslice GPU exporter on 127.0.0.1:{port}"),
                ("Documentation", layout.docs()),
                ("PartOf", TARGET),
            ],
            "Service": [
                ("ExecStart", exec_line(command)),
                *_runs_code(layout),
                ("Restart", "on-failure"),
                ("RestartSec", "5"),
                ("UMask", "0077"),
                ("SyslogIdentifier", "gpuslice-exporter"),
            ],
        }
    )


def _as_account(layout: Layout, name: str, port: int, command: Sequence[str | Path]) -> str:
    """A monitoring server run as the platform's account, its files written for it by root first."""
    folder = layout.monitoring_dir
    write_files = exec_line(
        [
            layout.python,
            "-m",
            "hub.service_monitoring",
            "--config",
            layout.settings,
            "--to",
            folder,
            "--account",
            layout.account,
        ]
    )
    return unit_file(
        {
            "Unit": [
                ("Description", f"{name} for gpuslice on 127.0.0.1:{port}, as {layout.account}"),
                ("Documentation", layout.docs()),
                ("PartOf", TARGET),
            ],
            "Service": [
                ("User", layout.account),
                ("Group", layout.account),
                # "+": as root, to copy what the account may read out of the platform's data folder.
                ("ExecStartPre", f"+{write_files}"),
                ("ExecStart", exec_line(command)),
                ("ExecReload", f"+{write_files}"),
                ("ExecReload", "/bin/kill -HUP $MAINPID"),
                *_runs_code(layout),
                ("Restart", "on-failure"),
                ("RestartSec", "5"),
                ("UMask", "0077"),
                ("NoNewPrivileges", "yes"),
                ("ProtectSystem", "strict"),
                ("ReadWritePaths", str(folder)),
                ("ProtectHome", "yes"),
                ("PrivateTmp", "yes"),
            ],
        }
    )


def prometheus_unit(layout: Layout, settings: Settings, binary: str) -> str:
    folder, port = layout.monitoring_dir, settings.monitoring.prometheus_port
    command = [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.config.file={folder / 'web.yml'}",
    ]
    return _as_account(layout, "Prometheus", port, command)


def alertmanager_unit(layout: Layout, settings: Settings, binary: str) -> str:
    folder, port = layout.monitoring_dir, settings.monitoring.alertmanager_port
    command = [
        binary,
        f"--config.file={folder / 'alertmanager.yml'}",
        f"--storage.path={folder / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.config.file={folder / 'web.yml'}",
        "--cluster.listen-address=",
    ]
    return _as_account(layout, "Alertmanager", port, command)


def node_exporter_unit(layout: Layout, settings: Settings, binary: str) -> str:
    port = settings.monitoring.node_exporter_port
    command = [
        binary,
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.config.file={layout.monitoring_dir / 'web.yml'}",
    ]
    return _as_account(layout, "node-exporter", port, command)


def backup_unit(layout: Layout) -> str:
    command = gpuslice_command(layout, "backup", layout.backups, "--config", layout.settings)
    return unit_file(
        {
            "Unit": [
                ("Description", f"gpuslice: the platform's state backed up into {layout.backups}"),
                ("Documentation", layout.docs()),
            ],
            "Service": [
                ("Type", "oneshot"),
                ("ExecStart", exec_line([*command, "--keep", str(BACKUPS_KEPT)])),
                *_runs_code(layout),
                ("UMask", "0077"),
                ("Nice", "10"),
                ("IOSchedulingClass", "idle"),
            ],
        }
    )


def backup_timer(layout: Layout) -> str:
    return unit_file(
        {
            "Unit": [
                ("Description", "gpuslice: a backup of the platform's state every night"),
                ("Documentation", layout.docs()),
            ],
            "Timer": [
                ("OnCalendar", "*-*-* 03:15:00"),
                ("RandomizedDelaySec", "30min"),
                ("Persistent", "true"),  # a machine that was off at 03:15 backs up when it starts
            ],
            "Install": [("WantedBy", "timers.target")],
        }
    )


def target_unit(layout: Layout, members: Sequence[str]) -> str:
    return unit_file(
        {
            "Unit": [
                ("Description", "gpuslice: the GPU notebook platform (the hub and its monitoring)"),
                ("Documentation", layout.docs()),
                *(("Wants", member) for member in members),
            ],
            "Install": [("WantedBy", "multi-user.target")],
        }
    )


def units(layout: Layout, settings: Settings, binaries: Mapping[str, str | None]) -> dict[str, str]:
    """Every unit file of the installed platform, by name, for these settings and the monitoring
    servers installed (``binaries``: hub/monitoring.py ``binaries()``)."""
    made = {HUB: hub_unit(layout, settings)}
    if settings.monitoring.enabled:
        made[EXPORTER] = exporter_unit(layout, settings)
        if binaries.get("prometheus") and binaries.get("alertmanager"):  # as `gpuslice up`: both or neither
            made[PROMETHEUS] = prometheus_unit(layout, settings, str(binaries["prometheus"]))
            made[ALERTMANAGER] = alertmanager_unit(layout, settings, str(binaries["alertmanager"]))
            if binaries.get("node_exporter"):
                made[NODE_EXPORTER] = node_exporter_unit(layout, settings, str(binaries["node_exporter"]))
    members = list(made)
    made[TARGET] = target_unit(layout, members)
    made[SLICE] = slice_unit(layout)
    made[BACKUP] = backup_unit(layout)
    made[BACKUP_TIMER] = backup_timer(layout)
    return made


def command_wrapper(layout: Layout) -> str:
    """/usr/local/bin/gpuslice: the command of the installed platform, running the code its units run."""
    return (
        "#!/bin/sh\n"
        f"# Written by gpuslice install: the gpuslice command of the platform installed from {layout.code}.\n"
        f'PYTHONPATH={shlex.quote(str(layout.code))} exec {shlex.quote(str(layout.python))} -m hub.cli "$@"\n'
    )


SETTINGS_TEMPLATE = """\
# gpuslice settings, written by `gpuslice install` (docs/install.md). Every key is optional:
# examples/gpuslice.yaml shows them all, hub/settings.py describes each. After a change,
# `gpuslice reload` checks this file and applies it; no notebook server stops.

# People open http://127.0.0.1:PORT/ (put a TLS reverse proxy in front for other machines).
port: 8000

# The hub's database, the ledger, the markets, passwords and invites: back it up (docs/install.md).
data_dir: {data_dir}

# Who may see and stop every server; each gets a password at install (printed once).
admin_users:
{admins}
# unix-users (the default as root): each user's notebooks run as an account of their own.
isolation: unix-users

# Classes: `gpuslice class add NAME roster.csv --config {settings}` writes them here.
# groups:
#   ml101: {{members: [alice, bob], max_slice: 4GiB, budget: 40GiB}}
"""


def settings_template(layout: Layout, data_dir: Path, admins: Sequence[str]) -> str:
    listed = "".join(f"  - {name}\n" for name in admins)
    return SETTINGS_TEMPLATE.format(data_dir=data_dir, admins=listed, settings=layout.settings)
