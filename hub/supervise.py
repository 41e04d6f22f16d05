"""Keep the monitoring processes of `gpuslice up` running, as systemd would.

A child that exits while the platform runs (Prometheus killed by the OOM killer, an
Alertmanager crash) is started again after a delay that doubles with each quick
failure (1 s, 2 s, 4 s ... up to a minute) and resets once it has run for a minute, so
a crash loop does not spin. Each child's PID is kept in ``<name>.pid`` beside its log;
a child left behind by a `gpuslice up` that was itself killed is stopped before a new
one starts, so two Prometheus never write the same data folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

STEADY_S = 60.0  # a child that ran this long had started fine: its next failure restarts at once
MAX_DELAY_S = 60.0


def restart_delay(quick_failures: int) -> float:
    """Seconds to wait before starting a child again after its n-th quick failure in a row."""
    return 0.0 if quick_failures <= 0 else min(MAX_DELAY_S, 2.0 ** (quick_failures - 1))


@dataclass
class Child:
    name: str
    command: list[str]
    folder: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_failures: int = 0
    restart_at: float | None = None
    restarts: int = 0

    @property
    def pid_file(self) -> Path:
        return self.folder / f"{self.name}.pid"

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name}.log"


@dataclass
class Supervisor:
    children: list[Child] = field(default_factory=list)
    say: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    stopping: bool = False

    def start_all(self) -> None:
        for child in self.children:
            stop_leftover(child)
            self._start(child)

    def tick(self) -> None:
        """Notice children that exited and start them again when their delay is over."""
        if self.stopping:
            return
        now = self.clock()
        for child in self.children:
            assert child.proc is not None
            if child.restart_at is None:
                code = child.proc.poll()
                if code is None:
                    continue
                ran_s = now - child.started_at
                child.quick_failures = 0 if ran_s >= STEADY_S else child.quick_failures + 1
                delay = restart_delay(child.quick_failures)
                child.restart_at = now + delay
                self.say(
                    f"gpuslice: {child.name} exited with code {code} after {ran_s:.0f} s; "
                    f"starting it again in {delay:.0f} s (its log: {child.log})"
                )
            if now >= child.restart_at:
                child.restart_at = None
                child.restarts += 1
                self._start(child)

    def terminate_all(self) -> None:
        self.stopping = True
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()

    def wait_all(self, timeout_s: float = 30) -> None:
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
            child.pid_file.unlink(missing_ok=True)

    def _start(self, child: Child) -> None:
        with child.log.open("ab") as log:
            child.proc = subprocess.Popen(child.command, cwd=child.folder, env=child.env, stdout=log, stderr=log)
        child.started_at = self.clock()
        child.pid_file.write_text(str(child.proc.pid))


def stop_leftover(child: Child, wait_s: float = 10) -> bool:
    """Stop the process named in the child's PID file if it still runs the same command."""
    try:
        pid = int(child.pid_file.read_text())
    except (OSError, ValueError):
        return False
    if command_of(pid) != child.command:
        return False  # gone, or the PID now belongs to something else
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while command_of(pid) == child.command and time.monotonic() < deadline:
        time.sleep(0.1)
    if command_of(pid) == child.command:
        os.kill(pid, signal.SIGKILL)
    return True


def command_of(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").decode(errors="replace").split("\0") if raw else None
