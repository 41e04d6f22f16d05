"""systemd and the machine's accounts, for the installed platform: the one module that runs
systemctl, journalctl, useradd and userdel. It takes its runner (a function that runs a command
and returns its result), so a test hands it one that records and answers."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """The machine's runner: the command's exit status and output, never an exception for a failure."""
    return subprocess.run(list(command), capture_output=True, text=True, check=False, timeout=600)


class SystemdError(RuntimeError):
    """systemctl (or useradd) refused; the message has its own words."""


def booted(run_dir: Path = Path("/run/systemd/system")) -> bool:
    """Whether systemd is this machine's init (sd_booted(3)'s test)."""
    return run_dir.is_dir()


def parse_show(text: str) -> dict[str, str]:
    """``systemctl show`` output (``Key=value`` lines) as a mapping."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@dataclass(frozen=True)
class UnitState:
    name: str
    active: str  # active, inactive, failed, activating, ...
    sub: str  # running, dead, exited, waiting ...
    since: str  # when it entered its active state ('' when never)
    main_pid: int

    @property
    def up(self) -> bool:
        return self.active == "active"


class Systemd:
    """systemctl, through ``runner``."""

    def __init__(self, runner: Runner = run) -> None:
        self.runner = runner

    def _systemctl(self, *args: str) -> str:
        done = self.runner(["systemctl", *args])
        if done.returncode != 0:
            raise SystemdError(f"systemctl {' '.join(args)} failed: {(done.stderr or done.stdout).strip()[-1000:]}")
        return done.stdout

    def daemon_reload(self) -> None:
        self._systemctl("daemon-reload")

    def enable(self, units: Iterable[str]) -> None:
        self._systemctl("enable", "--quiet", *units)

    def disable(self, units: Iterable[str], now: bool = False) -> None:
        self._systemctl("disable", "--quiet", *(["--now"] if now else []), *units)

    def start(self, units: Iterable[str]) -> None:
        self._systemctl("start", *units)

    def stop(self, units: Iterable[str]) -> None:
        self._systemctl("stop", *units)

    def restart(self, units: Iterable[str]) -> None:
        self._systemctl("restart", *units)

    def reload(self, unit: str) -> None:
        self._systemctl("reload", unit)

    def state(self, unit: str) -> UnitState:
        shown = parse_show(
            self._systemctl("show", unit, "--property=ActiveState,SubState,ActiveEnterTimestamp,MainPID")
        )
        return UnitState(
            unit,
            shown.get("ActiveState", ""),
            shown.get("SubState", ""),
            shown.get("ActiveEnterTimestamp", ""),
            int(shown.get("MainPID") or 0),
        )

    def enabled(self, unit: str) -> bool:
        return self.runner(["systemctl", "is-enabled", "--quiet", unit]).returncode == 0

    def active(self, unit: str) -> bool:
        return self.runner(["systemctl", "is-active", "--quiet", unit]).returncode == 0

    def scopes(self, pattern: str) -> list[str]:
        """The running scopes whose names match ``pattern`` (the servers')."""
        listed = self._systemctl("list-units", "--type=scope", "--state=running", "--plain", "--no-legend", pattern)
        return [line.split()[0] for line in listed.splitlines() if line.strip()]


def account_exists(runner: Runner, name: str) -> bool:
    return runner(["getent", "passwd", name]).returncode == 0


def ensure_account(runner: Runner, name: str) -> bool:
    """A system account (and its group) that cannot log in; True when made now."""
    if account_exists(runner, name):
        return False
    command = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
    done = runner([*command, "--shell", "/usr/sbin/nologin", "--comment", "gpuslice monitoring", name])
    if done.returncode != 0:
        raise SystemdError(f"useradd {name} failed: {done.stderr.strip()}")
    return True


def remove_account(runner: Runner, name: str) -> bool:
    """The account gone (its group with it); True when it existed."""
    if not account_exists(runner, name):
        return False
    done = runner(["userdel", name])
    if done.returncode != 0:
        raise SystemdError(f"userdel {name} failed: {done.stderr.strip()}")
    return True


def journal_command(units: Sequence[str], follow: bool, lines: int | None) -> list[str]:
    """journalctl for these units (pure): the last ``lines`` lines, or following."""
    command = ["journalctl", "--no-pager", *(f"--unit={u}" for u in units)]
    if lines is not None:
        command.append(f"--lines={lines}")
    if follow:
        command.append("--follow")
    return command
