"""The installed platform's units, as text (hub/service_units.py): literal files, as kubespawner's
tests compare make_pod with literal dicts; and systemd's own check of every unit (systemd-analyze)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hub import service_units as units
from hub.monitoring import BINARIES
from hub.settings import from_mapping
from hub.state import beyond_newest

LAYOUT = units.Layout(python=Path("/opt/gpuslice/.venv/bin/python"), code=Path("/opt/gpuslice"))
SETTINGS = from_mapping({"data_dir": "/var/lib/gpuslice", "gpus": {"simulate": "1x16GiB:T4"}}, "test")
INSTALLED = {"prometheus": "/usr/bin/prometheus", "alertmanager": "/usr/bin/prometheus-alertmanager"}


def test_the_hub_unit_stops_the_hub_alone_and_leaves_the_servers_to_their_slice() -> None:
    assert units.hub_unit(LAYOUT, SETTINGS) == (
        "# Written by gpuslice install; gpuslice reload writes it again from the settings.\n"
        "[Unit]\n"
        "Description=gpuslice hub: JupyterHub, its proxy and managed services\n"
        "Documentation=file:///opt/gpuslice/docs/install.md\n"
        "After=network.target\n"
        "PartOf=gpuslice.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        "ExecStart=/opt/gpuslice/.venv/bin/python -m hub.cli up --service --config /etc/gpuslice/gpuslice.yaml\n"
        "WorkingDirectory=/var/lib/gpuslice\n"
        "Environment=PYTHONPATH=/opt/gpuslice\n"
        "KillMode=mixed\n"
        "TimeoutStopSec=60\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "UMask=0077\n"
        "SyslogIdentifier=gpuslice-hub\n"
    )


def test_prometheus_runs_as_the_account_on_files_root_wrote_for_it() -> None:
    assert units.prometheus_unit(LAYOUT, SETTINGS, "/usr/bin/prometheus") == (
        "# Written by gpuslice install; gpuslice reload writes it again from the settings.\n"
        "[Unit]\n"
        "Description=Prometheus for gpuslice on 127.0.0.1:9090, as gpuslice\n"
        "Documentation=file:///opt/gpuslice/docs/install.md\n"
        "PartOf=gpuslice.target\n"
        "\n"
        "[Service]\n"
        "User=gpuslice\n"
        "Group=gpuslice\n"
        "ExecStartPre=+/opt/gpuslice/.venv/bin/python -m hub.service_monitoring --config /etc/gpuslice/gpuslice.yaml"
        " --to /var/lib/gpuslice-monitoring --account gpuslice\n"
        "ExecStart=/usr/bin/prometheus --config.file=/var/lib/gpuslice-monitoring/prometheus.yml"
        " --storage.tsdb.path=/var/lib/gpuslice-monitoring/prometheus-data --web.listen-address=127.0.0.1:9090"
        " --web.config.file=/var/lib/gpuslice-monitoring/web.yml\n"
        "ExecReload=+/opt/gpuslice/.venv/bin/python -m hub.service_monitoring --config /etc/gpuslice/gpuslice.yaml"
        " --to /var/lib/gpuslice-monitoring --account gpuslice\n"
        "ExecReload=/bin/kill -HUP $MAINPID\n"
        "Environment=PYTHONPATH=/opt/gpuslice\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "UMask=0077\n"
        "NoNewPrivileges=yes\n"
        "ProtectSystem=strict\n"
        "ReadWritePaths=/var/lib/gpuslice-monitoring\n"
        "ProtectHome=yes\n"
        "PrivateTmp=yes\n"
    )


def test_the_target_starts_the_services_but_neither_the_servers_slice_nor_the_backup() -> None:
    made = units.units(LAYOUT, SETTINGS, {**INSTALLED, "node_exporter": None})
    assert sorted(made) == [
        "gpuslice-alertmanager.service",
        "gpuslice-backup.service",
        "gpuslice-backup.timer",
        "gpuslice-exporter.service",
        "gpuslice-hub.service",
        "gpuslice-prometheus.service",
        "gpuslice.slice",
        "gpuslice.target",
    ]
    assert made["gpuslice.target"].endswith(
        "Wants=gpuslice-hub.service\n"
        "Wants=gpuslice-exporter.service\n"
        "Wants=gpuslice-prometheus.service\n"
        "Wants=gpuslice-alertmanager.service\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
    # Stopping or restarting the platform reaches no server: nothing ties the slice to it.
    assert "PartOf" not in made["gpuslice.slice"] and "gpuslice.slice" not in made["gpuslice.target"]


def test_without_monitoring_or_its_servers_only_what_runs_is_installed() -> None:
    off = from_mapping({"data_dir": "/var/lib/gpuslice", "monitoring": {"enabled": False}}, "test")
    assert "gpuslice-exporter.service" not in units.units(LAYOUT, off, INSTALLED)
    alone = units.units(LAYOUT, SETTINGS, {"prometheus": "/usr/bin/prometheus", "alertmanager": None})
    assert "gpuslice-exporter.service" in alone and "gpuslice-prometheus.service" not in alone  # both or neither
    node = units.units(LAYOUT, SETTINGS, {**INSTALLED, "node_exporter": "/usr/bin/prometheus-node-exporter"})
    assert "User=gpuslice\n" in node["gpuslice-node-exporter.service"]


def test_the_backup_timer_runs_nightly_and_catches_up_after_a_night_off() -> None:
    made = units.units(LAYOUT, SETTINGS, INSTALLED)
    assert (
        "ExecStart=/opt/gpuslice/.venv/bin/python -m hub.cli backup /var/backups/gpuslice"
        " --config /etc/gpuslice/gpuslice.yaml --keep 14\n"
    ) in made["gpuslice-backup.service"]
    assert "OnCalendar=*-*-* 03:15:00\nRandomizedDelaySec=30min\nPersistent=true\n" in made["gpuslice-backup.timer"]
    assert beyond_newest([f"gpuslice-202611{d:02}T031500Z.tar.gz" for d in range(1, 17)], units.BACKUPS_KEPT) == [
        "gpuslice-20261101T031500Z.tar.gz",
        "gpuslice-20261102T031500Z.tar.gz",
    ]


def test_arguments_reach_the_command_as_written() -> None:
    assert units.exec_line(["/a b/python", "--x=100%", "$HOME", 'say "hi"', ""]) == (
        '"/a b/python" --x=100%% $$HOME "say \\"hi\\"" ""'
    )
    odd = units.Layout(python=Path("/srv/my env/bin/python"), code=Path("/srv/my code"))
    text = units.hub_unit(odd, SETTINGS)
    assert 'ExecStart="/srv/my env/bin/python" -m hub.cli up' in text
    assert 'Environment="PYTHONPATH=/srv/my code"\n' in text


def test_no_secret_is_on_a_command_line_or_in_an_environment() -> None:
    """Every secret is a file the process opens: the units carry paths, never a token or a password."""
    made = units.units(LAYOUT, SETTINGS, {**INSTALLED, "node_exporter": "/usr/bin/prometheus-node-exporter"})
    for name, text in made.items():
        environment = [line for line in text.splitlines() if line.startswith("Environment")]
        assert environment in ([], ["Environment=PYTHONPATH=/opt/gpuslice"]), name
        for word in ("token=", "password=", "TOKEN", "secret"):
            assert word not in text, (name, word)


def test_the_command_runs_the_installed_code() -> None:
    assert units.command_wrapper(LAYOUT) == (
        "#!/bin/sh\n"
        "# Written by gpuslice install: the gpuslice command of the platform installed from /opt/gpuslice.\n"
        'PYTHONPATH=/opt/gpuslice exec /opt/gpuslice/.venv/bin/python -m hub.cli "$@"\n'
    )


def test_the_settings_template_is_valid_settings() -> None:
    text = units.settings_template(LAYOUT, Path("/var/lib/gpuslice"), ["ada", "grace"])
    settings = from_mapping(yaml.safe_load(text), "template")
    assert settings.data_dir == Path("/var/lib/gpuslice") and settings.admin_users == ("ada", "grace")


@pytest.mark.process
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_finds_nothing_wrong_in_any_unit(tmp_path: Path) -> None:
    """systemd's own parser on every unit, with this machine's binaries (it warns on stderr, exit 0)."""
    here = units.Layout(python=Path(sys.executable), code=Path(__file__).parents[2])
    binaries = {name: shutil.which(binary) or "/bin/true" for name, binary in BINARIES.items()}
    for name, text in units.units(here, SETTINGS, binaries).items():
        (tmp_path / name).write_text(text)
    checked = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (checked.returncode, checked.stderr) == (0, "")
