"""The platform installed as a service on a machine with systemd as PID 1 (a podman container,
tests/e2e/machine.py), as an admin lives with it: the previous release's state installed over,
two students' servers, a hub restart, a new class reloaded, an upgrade, `gpuslice top`, a backup,
an uninstall, then the backup restored and installed on a fresh machine, and that machine rebooted.

After each step the two servers still run, the same processes in the same scopes under
gpuslice.slice with their memory limits, holding the same slices, served ready by the hub; and
every user, class, market entry and incident of the previous release is still there.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from spawner.incident_schema import SCHEMA_STEPS as INCIDENT_STEPS
from spawner.ledger import SCHEMA_STEPS as LEDGER_STEPS
from tests.e2e.machine import EXCHANGE, Machine
from tests.e2e.platform import PASSWORD
from tests.kube import images

PREVIOUS = Path(__file__).parents[1] / "fixtures" / "previous_state" / "state-83b91fc.tar.gz"
SETTINGS = "/etc/gpuslice/gpuslice.yaml"
GiB = 1 << 30
# The previous release's settings (tests/fixtures/previous_state/make.sh) on the installed paths.
INSTALLED = {
    "data_dir": "/var/lib/gpuslice",
    "admin_users": ["admin"],
    "isolation": "none",
    "gpus": {"simulate": "1x16GiB:T4"},
    "limits": {"memory": "1GiB"},
    "groups": {"ml101": {"members": ["amy", "ben"], "teachers": ["tess"], "max_slice": "4GiB", "budget": "8GiB"}},
}


def a_machine_can_boot() -> None:
    """Skip where podman cannot boot a systemd machine; under CI=true, fail (CI has what it needs)."""
    missing = images.missing_tools()
    reason = f"missing {', '.join(missing)}: scripts/setup installs them as root" if missing else ""
    reason = reason or ("podman runs a systemd machine as root only" if os.geteuid() != 0 else "")
    if reason and os.environ.get("CI") == "true":
        pytest.fail(reason + "; CI=true, so it must run")
    if reason:
        pytest.skip(reason)


def facts(machine: Machine) -> dict[str, Any]:
    return dict(json.loads(machine.python("-m", "tests.e2e.service_inside", "facts", timeout=300).stdout))


def hub_up(machine: Machine) -> None:
    machine.python("-m", "tests.e2e.service_inside", "wait", timeout=300)


def gpuslice(machine: Machine, *args: str, check: bool = True) -> str:
    """The installed command, as an admin types it."""
    done = machine.run("gpuslice", *args, check=check, timeout=600)
    return done.stdout + done.stderr


def write_settings(exchange: Path, machine: Machine, settings: dict[str, Any]) -> None:
    (exchange / "gpuslice.yaml").write_text(yaml.safe_dump(settings))
    machine.run("install", "-D", "-m", "600", f"{EXCHANGE}/gpuslice.yaml", SETTINGS)


def the_previous_release_is_there(seen: dict[str, Any]) -> None:
    """What the previous release's people left (tests/fixtures/previous_state/make.sh)."""
    assert {"admin", "amy"} <= set(seen["users"])
    assert {"amy", "ben"} <= set(seen["groups"]["ml101"])
    assert "deprecated" in seen["images"].values()  # an admin's change to the market
    assert seen["incidents"] == {"GpuXidError on node localhost, gpu 0": ["card reseated"]}
    # Migrated by the install to this release's schemas.
    assert seen["versions"] == {**seen["versions"], "incidents": len(INCIDENT_STEPS), "ledger": len(LEDGER_STEPS)}


def the_servers_run_on(before: dict[str, Any], now: dict[str, Any]) -> None:
    """The same server processes, in the same scopes with their limits, holding the same slices, ready."""
    assert now["servers"] == before["servers"]
    for user in ("amy", "ben"):
        server = now["servers"][user]
        assert server["alive"] and server["gpu_memory"] == 4 * GiB, (user, server)
        assert server["scope"].startswith("/gpuslice.slice/gpuslice-") and server["memory_limit"] == GiB, server
    assert now["ready"] == ["amy", "ben"]
    assert len(now["scopes"]) == 2


def test_the_installed_platform_keeps_its_servers_and_its_state(tmp_path: Path) -> None:
    timings: dict[str, float] = {}
    began = time.monotonic()

    def step(name: str) -> None:
        nonlocal began
        timings[name] = time.monotonic() - began
        began = time.monotonic()

    a_machine_can_boot()
    image = images.build("machine")
    step("image")
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    (exchange / "password").write_text(PASSWORD + "\n")
    with tarfile.open(PREVIOUS) as tar:
        tar.extractall(exchange / "previous", filter="data")
    first = Machine(image, exchange)
    try:
        first.start()
        step("boot")
        # A machine that ran the previous release: its data folder, and its settings on the installed paths.
        first.run("cp", "-a", f"{EXCHANGE}/previous/data", "/var/lib/gpuslice")
        write_settings(exchange, first, INSTALLED)
        installed = first.python("-m", "hub.cli", "install").stdout
        assert "migrating incident store" in installed and "migrating ledger" in installed, installed
        assert "stopped and disabled prometheus.service, prometheus-alertmanager.service" in installed, installed
        hub_up(first)
        step("install over the previous release")
        units = first.run("sh", "-c", "sha256sum /etc/systemd/system/gpuslice* /usr/local/bin/gpuslice").stdout
        again = gpuslice(first, "install")
        assert "restarting" not in again and "wrote" not in again, again
        assert first.run("sh", "-c", "sha256sum /etc/systemd/system/gpuslice* /usr/local/bin/gpuslice").stdout == units
        step("install again")
        seen = facts(first)
        the_previous_release_is_there(seen)

        gpuslice(first, "user", "set-password", "ben", "--password-file", f"{EXCHANGE}/password")
        for user in ("amy", "ben"):
            first.python("-m", "tests.e2e.service_inside", "spawn", user, "4GiB", timeout=400)
        running = facts(first)
        the_servers_run_on(running, running)
        step("two servers")

        first.run("systemctl", "restart", "gpuslice-hub.service")
        hub_up(first)
        the_servers_run_on(running, facts(first))
        step("hub restarted")

        broken = {**INSTALLED, "groups": {"ml102": {"members": ["carl"], "max_slice": "4 GiB please"}}}
        hub_pid = first.run("systemctl", "show", "--property=MainPID", "gpuslice-hub.service").stdout
        write_settings(exchange, first, broken)
        refused = first.run("gpuslice", "reload", check=False)
        assert refused.returncode == 2 and "max_slice" in refused.stderr and "nothing was changed" in refused.stderr
        assert first.run("systemctl", "show", "--property=MainPID", "gpuslice-hub.service").stdout == hub_pid
        with_class = {
            **INSTALLED,
            "groups": {**INSTALLED["groups"], "ml102": {"members": ["carl"], "max_slice": "4GiB"}},
        }
        write_settings(exchange, first, with_class)
        assert "notebook servers keep running" in gpuslice(first, "reload")
        hub_up(first)
        reloaded = facts(first)
        the_servers_run_on(running, reloaded)
        assert reloaded["groups"]["ml102"] == ["carl"]
        step("reload with a new class")

        upgraded = gpuslice(first, "upgrade")
        assert "every store is current" in upgraded and "the service runs this release" in upgraded, upgraded
        hub_up(first)
        after = facts(first)
        the_servers_run_on(running, after)
        the_previous_release_is_there(after)
        step("upgrade")

        top = gpuslice(first, "top", "--once")
        assert "8 GiB of 16 GiB held by 2 servers" in top and "amy" in top and "ben" in top, top
        status = gpuslice(first, "status")
        assert "notebook servers: 2 running" in status, status
        listed = [line.split(None, 1) for line in first.run("ps", "-eo", "user=,args=").stdout.splitlines()]
        monitoring = sorted((args.split()[0], user) for user, args in listed if args.startswith("/usr/bin/prometheus"))
        assert monitoring == [("/usr/bin/prometheus", "gpuslice"), ("/usr/bin/prometheus-alertmanager", "gpuslice")]
        assert first.run("stat", "-c", "%a %U", "/var/lib/gpuslice").stdout.split() == ["700", "root"]

        gpuslice(first, "backup", f"{EXCHANGE}/backup.tar.gz")
        archive = exchange / "backup.tar.gz"
        assert stat.S_IMODE(archive.stat().st_mode) == 0o600 and archive.stat().st_uid == 0
        step("top, status, backup")

        assert "kept /etc/gpuslice" in gpuslice(first, "uninstall")
        left = json.loads(first.python("-m", "tests.e2e.service_inside", "without-hub").stdout)
        assert left == {"holds": [], "scopes": []}
        assert not any(alive(first, server["pid"]) for server in running["servers"].values())
        assert first.run("test", "-f", "/var/lib/gpuslice/jupyterhub.sqlite", check=False).returncode == 0
        step("uninstall")
    finally:
        first.remove()

    fresh = Machine(image, exchange)
    try:
        fresh.start()
        fresh.python("-m", "hub.cli", "restore", f"{EXCHANGE}/backup.tar.gz", "--config", SETTINGS)
        fresh.python("-m", "hub.cli", "install")
        hub_up(fresh)
        restored = facts(fresh)
        the_previous_release_is_there(restored)
        assert restored["groups"]["ml102"] == ["carl"] and restored["servers"] == {}
        step("restore and install on a fresh machine")
        fresh.reboot()
        hub_up(fresh)  # enabled at boot
        rebooted = facts(fresh)
        assert {k: rebooted[k] for k in ("users", "groups", "images", "incidents")} == {
            k: restored[k] for k in ("users", "groups", "images", "incidents")
        }
        step("reboot")
    finally:
        fresh.remove()
    print("\n" + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items()), file=sys.stderr)


def alive(machine: Machine, pid: int) -> bool:
    return machine.run("test", "-d", f"/proc/{pid}", check=False).returncode == 0
