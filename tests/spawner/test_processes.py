"""spawner.processes: a process named by pid and start time, stopped with everything it started."""

import os
import subprocess
import sys

import pytest

from spawner.processes import Proc, identify, running, stop_tree, stop_trees
from tests.e2e.platform import process_alive

pytestmark = pytest.mark.process  # starts processes: not in the fast tier

# A stand-in server: starts a "kernel" in a session of its own (as jupyter_client does), says
# the kernel's pid, and lives on. With IGNORE it also ignores SIGTERM (a server stuck in shutdown).
_SERVER = """
import os, signal, subprocess, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(kernel.pid, flush=True)
time.sleep(120)
"""


def _server(mode: str = "plain") -> tuple[subprocess.Popen[str], int]:
    server = subprocess.Popen([sys.executable, "-c", _SERVER, mode], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def test_identify_and_running() -> None:
    me = identify(os.getpid())
    assert me is not None and running(me)
    assert identify(999_999_999) is None
    assert not running(Proc(os.getpid(), me.started - 1))  # the pid, but a later process


def test_a_server_and_the_kernel_it_started_in_another_session_are_stopped() -> None:
    server, kernel = _server()
    try:
        proc = identify(server.pid)
        assert proc is not None
        ended = stop_tree(proc, grace_s=10)
        assert {p.pid for p in ended} == {server.pid, kernel}
        assert not process_alive(server.pid) and not process_alive(kernel)
    finally:
        server.kill()
        server.wait()
        if process_alive(kernel):
            os.kill(kernel, 9)


def test_one_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    stubborn, kernel = _server("ignore")
    plain, other_kernel = _server()
    try:
        procs = [identify(stubborn.pid), identify(plain.pid)]
        assert None not in procs
        stop_trees([p for p in procs if p is not None], grace_s=1)
        assert not any(process_alive(pid) for pid in (stubborn.pid, kernel, plain.pid, other_kernel))
    finally:
        for server in (stubborn, plain):
            server.kill()
            server.wait()


def test_a_pid_that_now_names_another_process_is_left_alone() -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        found = identify(stranger.pid)
        assert found is not None
        assert stop_tree(Proc(stranger.pid, found.started - 100)) == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
