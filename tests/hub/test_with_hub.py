"""hub.with_hub: a managed service ends when the hub that started it is killed."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.platform import process_alive

pytestmark = pytest.mark.process  # starts processes: not in the fast tier

# A stand-in for the hub: starts the service (with its own pid for {hub_pid}), says the
# service's pid, then waits to be killed.
_HUB = """
import os, subprocess, sys, time

p = subprocess.Popen([a.replace("{hub_pid}", str(os.getpid())) for a in sys.argv[1:]])
print(p.pid, flush=True)
time.sleep(300)
"""
_SERVICE = ["http.server", "--bind", "127.0.0.1", "0"]


def _start_under_hub(service: list[str]) -> tuple[subprocess.Popen[str], int]:
    hub = subprocess.Popen([sys.executable, "-c", _HUB, *service], stdout=subprocess.PIPE, text=True)
    assert hub.stdout is not None
    pid = int(hub.stdout.readline())
    # The service shares the hub's stdout: its banner says that it runs the module.
    assert "Serving HTTP" in hub.stdout.readline()
    return hub, pid


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not process_alive(pid)


@pytest.mark.parametrize(
    ("launcher", "ends_with_hub"),
    [(["-m", "hub.with_hub", "--hub-pid={hub_pid}"], True), (["-m"], False)],
    ids=["with_hub", "plain (what a killed hub leaves behind)"],
)
def test_a_service_ends_when_its_hub_is_killed(launcher: list[str], ends_with_hub: bool) -> None:
    hub, service = _start_under_hub([sys.executable, "-u", *launcher, *_SERVICE])
    try:
        hub.send_signal(signal.SIGKILL)
        hub.wait(timeout=10)
        assert _gone_within(service, 10) is ends_with_hub
    finally:
        hub.kill()
        if process_alive(service):
            subprocess.run(["kill", "-9", str(service)], check=False)


def test_a_service_whose_hub_died_before_it_started_ends_at_once() -> None:
    # This test's process is the parent, so any other --hub-pid means the hub is gone.
    late = subprocess.Popen([sys.executable, "-m", "hub.with_hub", f"--hub-pid={os.getpid() + 1}", *_SERVICE])
    try:
        assert late.wait(timeout=20) == -signal.SIGTERM
    finally:
        late.kill()


def test_a_service_needs_a_module() -> None:
    run = subprocess.run([sys.executable, "-m", "hub.with_hub", "--hub-pid=1"], capture_output=True, text=True)
    assert run.returncode != 0 and "usage: python -m hub.with_hub" in run.stderr


def test_a_service_started_with_sigint_ignored_still_stops_at_the_hubs_sigint() -> None:
    """`gpuslice up &` from a script starts everything with SIGINT ignored; JupyterHub stops a
    managed service with SIGINT and waits 30 s before SIGTERM: Ctrl-C took 32 s."""
    service = subprocess.Popen(
        [sys.executable, "-u", "-m", "hub.with_hub", f"--hub-pid={os.getpid()}", *_SERVICE],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert service.stdout is not None and "Serving HTTP" in service.stdout.readline()
        service.send_signal(signal.SIGINT)
        assert _gone_within(service.pid, 5)
    finally:
        service.kill()
        service.wait()
