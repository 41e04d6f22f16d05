"""systemd: each notebook server in a transient scope unit of its own (where systemd is PID 1).

As jupyterhub-systemdspawner does with its transient services, but a scope: ``systemd-run
--scope`` makes the unit, puts its own process in it and then runs the server in place, so
the pid the hub records is the server's and JupyterHub's local spawner keeps polling and
stopping it by pid. The unit carries the limits (spawner/cgroups.py ``systemd_properties``)
and lives in ``gpuslice.slice``, outside the hub's own unit: a restart of the hub's service
leaves it running. systemd removes a scope when its last process ends; ``stop`` ends one
that outlived its server.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SLICE = "gpuslice.slice"


def booted(run: Path = Path("/run/systemd/system")) -> bool:
    """Whether systemd is the init system (sd_booted(3)'s test) and systemd-run is installed."""
    return run.is_dir() and shutil.which("systemd-run") is not None


def scope_command(unit: str, properties: list[str], command: list[str]) -> list[str]:
    """``command`` run in a new scope ``unit`` with ``properties`` (pure)."""
    return [
        "systemd-run",
        "--scope",
        "--quiet",
        "--collect",  # forgotten once it ends, even after a failure: the next start reuses nothing
        f"--unit={unit}",
        f"--slice={SLICE}",
        *(f"--property={p}" for p in properties),
        "--",
        *command,
    ]


def units() -> set[str]:
    """The servers' scopes systemd runs now (names without ``.scope``)."""
    listed = subprocess.run(
        ["systemctl", "list-units", "--type=scope", "--plain", "--no-legend", "--all", "gpuslice-*"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {line.split()[0].removesuffix(".scope") for line in listed.stdout.splitlines() if line.strip()}


def stop(unit: str) -> None:
    """End every process of the server's scope (systemd sends SIGTERM, then SIGKILL)."""
    subprocess.run(["systemctl", "stop", f"{unit}.scope"], capture_output=True, check=False)
