"""The first poll after a hub restart: a server answers, exits, or stays silent (real processes, real HTTP)."""

import asyncio
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from spawner.ledger import Held, Ledger, ServerProcess
from spawner.local import LocalGpuSpawner
from spawner.processes import identify
from tests.e2e.platform import free_port

pytestmark = pytest.mark.process  # starts processes: not in the fast tier


class LoadedSpawner(LocalGpuSpawner):
    """A spawner as the hub loads it from its database after a restart: a pid and a URL, nothing started."""

    server = None  # JupyterHub's property reads the database; the test sets the URL

    @property
    def _key(self) -> str:
        return "ann/"


def _loaded(tmp_path: Path, pid: int, port: int) -> LoadedSpawner:
    spawner = LoadedSpawner(gpu_ledger_path=str(tmp_path / "ledger.sqlite"), http_timeout=3)
    spawner.server = SimpleNamespace(url=f"http://127.0.0.1:{port}/user/ann/")
    spawner.pid = pid
    Ledger(spawner.gpu_ledger_path).record("ann/", "started", 50, "server process started")
    return spawner


def _reaped(process: subprocess.Popen[bytes]) -> None:
    # The hub that started it is gone; someone else reaps it, so poll sees it end.
    threading.Thread(target=process.wait, daemon=True).start()


def test_a_server_that_answers_is_running(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], stderr=subprocess.DEVNULL
    )
    _reaped(server)
    try:
        spawner = _loaded(tmp_path, server.pid, port)
        assert asyncio.run(spawner.poll()) is None  # its 404 is an answer, as JupyterHub counts it
    finally:
        server.kill()


def test_a_server_that_exits_before_answering_is_reported_at_once(tmp_path: Path) -> None:
    port = free_port()
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    _reaped(silent)
    spawner = _loaded(tmp_path, silent.pid, port)
    assert asyncio.run(asyncio.wait_for(spawner.poll(), timeout=10)) == 0  # not after http_timeout
    assert Ledger(spawner.gpu_ledger_path).history("ann/")[-1].kind == "died"


def test_a_server_that_never_answers_is_given_up_after_http_timeout(tmp_path: Path) -> None:
    # A socket that listens but never accepts: connections hang as with a stopped server.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        _reaped(hung)
        try:
            spawner = _loaded(tmp_path, hung.pid, port)
            assert asyncio.run(asyncio.wait_for(spawner.poll(), timeout=20)) is not None
            assert spawner._stop_reason() == (
                "failed",
                100,
                "gave up: the server did not answer within 3 s after the hub restarted",
            )
            # Only the first poll after the restart waits; later ones are JupyterHub's usual check.
            assert asyncio.run(asyncio.wait_for(spawner.poll(), timeout=2)) is None
        finally:
            hung.send_signal(signal.SIGKILL)


def test_a_server_this_hub_started_is_not_checked_again(tmp_path: Path) -> None:
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _reaped(hung)
    try:
        spawner = _loaded(tmp_path, hung.pid, free_port())
        spawner._gpu_restart.started()  # what start() does
        assert asyncio.run(asyncio.wait_for(spawner.poll(), timeout=2)) is None
    finally:
        hung.send_signal(signal.SIGKILL)


def test_a_server_whose_start_the_hub_never_recorded_is_adopted_from_the_ledger(tmp_path: Path) -> None:
    """The hub was killed after the process started and before start() returned: its database has
    no pid and a port chosen before the server's. The ledger has both, and the slice."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)], stderr=subprocess.DEVNULL
    )
    _reaped(server)
    try:
        spawner = _loaded(tmp_path, 0, free_port())
        spawner.server.base_url = "/user/ann/"
        ledger = Ledger(spawner.gpu_ledger_path)
        ledger.restore([Held("ann/", 1, "ann", "", 2**30)])
        found = identify(server.pid)
        assert found is not None
        ledger.add_process(ServerProcess("ann/", found.pid, found.started, f"http://127.0.0.1:{port}"))
        assert asyncio.run(asyncio.wait_for(spawner.poll(), timeout=20)) is None  # adopted, and it answers
        assert spawner.pid == server.pid
        assert asyncio.run(spawner.get_url()) == f"http://127.0.0.1:{port}/user/ann/"  # JupyterHub corrects its URL
        assert spawner._gpu_holds == [Held("ann/", 1, "ann", "", 2**30, pid=server.pid)]
    finally:
        server.kill()


def test_without_a_record_a_server_the_hub_never_recorded_is_not_running(tmp_path: Path) -> None:
    spawner = _loaded(tmp_path, 0, free_port())
    assert asyncio.run(asyncio.wait_for(spawner.poll(), timeout=5)) == 0
