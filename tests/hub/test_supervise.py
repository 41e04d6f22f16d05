"""The monitoring supervisor of `gpuslice up`, with real child processes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub.supervise import Child, Supervisor, command_of, restart_delay, stop_leftover

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]
CRASHER = [sys.executable, "-c", "raise SystemExit(3)"]


def wait_until(check: object, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_the_delay_doubles_with_quick_failures_and_is_capped() -> None:
    assert [restart_delay(n) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]


@pytest.mark.process
def test_a_killed_child_is_started_again_and_its_pid_file_follows(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor([Child("prometheus", SLEEPER, tmp_path, dict(os.environ))], say=said.append)
    supervisor.start_all()
    child = supervisor.children[0]
    first = child.proc
    assert first is not None and int(child.pid_file.read_text()) == first.pid
    try:
        first.kill()
        first.wait()
        supervisor.tick()  # notices the exit; a first quick failure waits 1 s
        assert child.proc is first and "prometheus exited with code -9" in said[0] and "in 1 s" in said[0]
        wait_until(lambda: (supervisor.tick(), child.proc is not first)[1], timeout_s=5)
        assert child.proc is not None and child.proc.poll() is None and child.restarts == 1
        assert int(child.pid_file.read_text()) == child.proc.pid
    finally:
        supervisor.terminate_all()
        supervisor.wait_all()
    assert not child.pid_file.exists()


@pytest.mark.process
def test_a_crash_loop_backs_off_instead_of_spinning(tmp_path: Path) -> None:
    now = [0.0]
    said: list[str] = []
    supervisor = Supervisor([Child("alertmanager", CRASHER, tmp_path, {})], say=said.append, clock=lambda: now[0])
    supervisor.start_all()
    child = supervisor.children[0]
    for _ in range(200):  # 20 s of ticks
        assert child.proc is not None
        child.proc.wait()
        supervisor.tick()
        now[0] += 0.1
    # Quick failures wait 1, 2, 4, 8 s: five starts in 20 s, not two hundred; the next waits 16 s.
    assert child.restarts == 4, said
    assert "in 16 s" in said[-1]


@pytest.mark.process
def test_no_restart_while_the_platform_stops(tmp_path: Path) -> None:
    supervisor = Supervisor([Child("exporter", SLEEPER, tmp_path, dict(os.environ))], say=lambda _: None)
    supervisor.start_all()
    supervisor.terminate_all()
    supervisor.wait_all()
    supervisor.tick()
    assert supervisor.children[0].restarts == 0


@pytest.mark.process
def test_a_leftover_of_a_killed_platform_is_stopped_but_a_stranger_is_not(tmp_path: Path) -> None:
    child = Child("prometheus", SLEEPER, tmp_path, dict(os.environ))
    leftover = subprocess.Popen(SLEEPER)
    child.pid_file.write_text(str(leftover.pid))
    wait_until(lambda: command_of(leftover.pid) == SLEEPER)  # exec'd
    assert stop_leftover(child)
    assert leftover.wait(timeout=10) == -signal.SIGTERM

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(301)"])
    try:
        wait_until(lambda: command_of(stranger.pid) is not None)
        child.pid_file.write_text(str(stranger.pid))  # a recycled PID: not ours
        assert not stop_leftover(child)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
    child.pid_file.write_text("not a pid")
    assert not stop_leftover(child)
