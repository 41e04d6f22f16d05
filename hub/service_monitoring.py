"""What the installed platform's Prometheus, Alertmanager and node-exporter read, written for them.

They run as the ``gpuslice`` system account (hub/service_units.py), which may not enter the
platform's data folder (0700 root: the hub's database, passwords, tokens). So before each start
and reload, their units run this as root (``ExecStartPre=+``): it makes the monitoring secrets
where `gpuslice up` keeps them (the data folder's ``monitoring/``, once), then writes into the
account's own folder, owned by the account and 0600, the Prometheus and Alertmanager configs
(built from the settings as `gpuslice up` builds them, naming files in that folder), the rules,
the web config, and copies of the three secrets they present or check: the monitoring password,
Prometheus's hub token and the incident recorder's webhook token.

``python -m hub.service_monitoring --config FILE --to FOLDER``
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml

from hub import monitoring
from hub.exporter import default_hostname
from hub.platform import hub_token, monitoring_folder, monitoring_ports, monitoring_secrets
from hub.settings import Settings, SettingsError, load

DATA_FOLDERS = ("prometheus-data", "alertmanager-data")


def files(settings: Settings, data_dir: Path, to: Path, node_exporter: bool, hostname: str) -> dict[str, str]:
    """Each file the account's servers read, by its path in ``to``: configs built for ``to``, secrets
    copied from the data folder (which `monitoring_secrets` has made)."""
    source, options = monitoring_folder(data_dir), settings.monitoring
    ports = monitoring_ports(settings)
    rules = tuple(to / "rules" / path.name for path in monitoring.RULE_FILES)
    prometheus = monitoring.prometheus_config(
        ports,
        to / "hub-token",
        node_exporter=node_exporter,
        interval=options.scrape_interval,
        node=hostname,
        password_file=to / "web-password",
        rule_files=rules,
    )
    recorder_url = monitoring.local_recorder(source, options.recorder_port).url
    alertmanager = monitoring.alertmanager_config(
        options.webhook_url,
        options.oncall,
        datetime.now(UTC).date(),
        recorder=monitoring.Recorder(recorder_url, credentials_file=to / "recorder-token"),
    )
    made = {
        "prometheus.yml": yaml.safe_dump(prometheus, sort_keys=False),
        "alertmanager.yml": yaml.safe_dump(alertmanager, sort_keys=False),
        "web.yml": (source / "web.yml").read_text(),
        "web-password": (source / "web-password").read_text(),
        "hub-token": hub_token(data_dir).read_text(),
        "recorder-token": monitoring.recorder_token_path(source).read_text(),
    }
    made |= {f"rules/{path.name}": path.read_text() for path in monitoring.RULE_FILES}
    return made


def write_owned(folder: Path, made: dict[str, str], uid: int, gid: int) -> None:
    """Each file in ``folder``, the account's own and 0600, replaced whole (a server reloading mid-write
    reads the old file or the new one); the servers' data folders the account's too."""
    for relative, text in made.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chown(path.parent, uid, gid)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chown(temporary, uid, gid)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    for name in DATA_FOLDERS:
        (folder / name).mkdir(exist_ok=True, mode=0o700)
        os.chown(folder / name, uid, gid)


def restored_silences(data_dir: Path, folder: Path, uid: int, gid: int) -> list[str]:
    """Alertmanager's silences and notification log from a restored backup (where `gpuslice up` keeps
    them, in the data folder) handed to the account's Alertmanager, once: when it has none yet."""
    source, target = monitoring_folder(data_dir) / "alertmanager-data", folder / "alertmanager-data"
    if not source.is_dir() or any(target.iterdir()):
        return []
    copied = []
    for path in sorted(p for p in source.iterdir() if p.is_file()):
        shutil.copy2(path, target / path.name)
        os.chown(target / path.name, uid, gid)
        copied.append(path.name)
    return copied


def publish(settings: Settings, to: Path, account: str) -> None:
    """Make the secrets (once) and write the account's files into ``to`` (its folder, made here)."""
    data_dir = settings.data_dir.absolute()
    monitoring_secrets(settings, data_dir, {})
    hub_token(data_dir)
    # The root copy, which the renewals service renews daily (hub/renewals.py); its reload then
    # reloads the Alertmanager unit, whose ExecReload writes the account's copy again.
    monitoring.write_alertmanager_config(settings.monitoring, monitoring_folder(data_dir))
    entry = pwd.getpwnam(account)
    to.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chown(to, entry.pw_uid, entry.pw_gid)
    to.chmod(0o700)
    found = monitoring.binaries()
    made = files(settings, data_dir, to, bool(found["node_exporter"]), default_hostname())
    write_owned(to, made, entry.pw_uid, entry.pw_gid)
    restored_silences(data_dir, to, entry.pw_uid, entry.pw_gid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hub.service_monitoring", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the installed settings file")
    parser.add_argument("--to", type=Path, required=True, help="the monitoring account's folder")
    parser.add_argument("--account", default="gpuslice", help="the account the monitoring servers run as")
    args = parser.parse_args(argv)
    try:
        publish(load(args.config), args.to, args.account)
    except (SettingsError, OSError, KeyError) as exc:
        print(f"gpuslice: the monitoring files cannot be written: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
