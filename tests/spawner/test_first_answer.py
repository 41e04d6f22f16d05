"""start() waits for the server's first answer itself, so the progress stream shows "server answering".

Real processes on loopback: a server that answers, one that exits first. JupyterHub's part
(the hub's own wait, the progress handler) is in tests/e2e/test_spawn_page.py.
"""

import asyncio
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spawner.ledger import Ledger
from spawner.lifecycle import LedgerGpuMixin
from spawner.ports import free_port

pytestmark = pytest.mark.process  # starts processes: not in the fast tier

SERVES_API = "import http.server as h; h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"


class _ProcessSpawner:
    """What the mixin uses of JupyterHub's LocalProcessSpawner: start a process, poll it."""

    http_timeout = 30
    start_timeout = 300
    process: subprocess.Popen[bytes] | None = None
    code = ""

    def run_pre_spawn_hook(self) -> None:
        return None

    def clear_state(self) -> None:
        return None

    async def start(self) -> tuple[str, int]:
        port = free_port()
        self.process = subprocess.Popen([sys.executable, "-c", self.code.format(port=port)], cwd=self.root)  # type: ignore[attr-defined]
        self.pid = self.process.pid
        return "127.0.0.1", port

    async def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()


class Spawner(LedgerGpuMixin, _ProcessSpawner):
    def __init__(self, root: Path, code: str) -> None:
        super().__init__(gpu_simulate="2x16GiB:T4", gpu_ledger_path=str(root / "ledger.sqlite"))
        (root / "api").mkdir()  # what the stand-in server answers at /api
        self.root, self.code = root, code
        self.user = SimpleNamespace(name="ann", groups=[], admin=False)
        self.name = ""
        self.user_options = {"gpu_memory": "4GiB"}
        self.server = SimpleNamespace(ip="", port=0, base_url="/")
        self.log = logging.getLogger("test")


async def _start_and_read_progress(spawner: Spawner) -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []

    async def read() -> None:
        async for event in spawner.progress():
            events.append(event)

    started = asyncio.ensure_future(spawner.start())
    await asyncio.sleep(0)  # allocate() has made the stage list: read it as the spawn page would
    reader = asyncio.ensure_future(read())
    try:
        result = await started
    except Exception as exc:
        result = exc
    # JupyterHub's progress handler stops reading the moment the spawn ends; what it has read
    # by then is what the user sees.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    reader.cancel()
    return result, events


def test_a_server_that_answers_shows_the_answering_stage_before_the_spawn_ends(tmp_path: Path) -> None:
    spawner = Spawner(tmp_path, SERVES_API)
    try:
        result, events = asyncio.run(_start_and_read_progress(spawner))
        assert isinstance(result, tuple), result
        assert [e["progress"] for e in events][-2:] == [70, 90], events
        assert events[-1]["message"].startswith("server answering ("), events
    finally:
        assert spawner.process is not None
        spawner.process.kill()


def test_a_server_that_exits_before_answering_fails_the_start_and_frees_the_slice(tmp_path: Path) -> None:
    spawner = Spawner(tmp_path, "import sys; sys.exit(3)")
    result, _ = asyncio.run(_start_and_read_progress(spawner))
    assert isinstance(result, RuntimeError)
    assert "exited with status 3 before it answered" in str(result)
    ledger = Ledger(spawner.gpu_ledger_path)
    assert ledger.holdings() == []
    last = ledger.history("ann/")[-1]
    assert last.kind == "failed" and "exited with status 3" in last.message, last


def test_a_server_that_stays_silent_fails_after_http_timeout(tmp_path: Path) -> None:
    spawner = Spawner(tmp_path, "import time; time.sleep(60)")
    spawner.http_timeout = timeout = 1
    try:
        result, _ = asyncio.run(_start_and_read_progress(spawner))
        assert isinstance(result, TimeoutError) and f"did not answer within {timeout} s" in str(result)
        assert Ledger(spawner.gpu_ledger_path).holdings() == []
    finally:
        assert spawner.process is not None
        spawner.process.kill()


def test_with_turns_a_second_server_waits_until_the_first_answers_and_is_told_its_place(tmp_path: Path) -> None:
    """One start at a time: the second server's process does not exist until the first one answered."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = Spawner(tmp_path / "a", SERVES_API), Spawner(tmp_path / "b", SERVES_API)
    second.user = SimpleNamespace(name="bob", groups=[], admin=False)
    for spawner in (first, second):
        spawner.gpu_ledger_path = str(tmp_path / "ledger.sqlite")
        spawner.gpu_concurrent_starts = 1

    async def scenario() -> tuple[Any, Any]:
        one = asyncio.ensure_future(first.start())
        await asyncio.sleep(0)
        result, events = await _start_and_read_progress(second)
        assert one.done(), "the second server started before the first one answered"
        return await one, (result, events)

    try:
        _, (result, events) = asyncio.run(scenario())
        assert isinstance(result, tuple), result
        waits = [e["message"] for e in events if e["progress"] == 55]
        assert waits == ["Waiting for a turn to start: yours is next. This machine starts 1 server at a time."]
        assert [e["progress"] for e in events][-2:] == [70, 90]
        kinds = [e.kind for e in Ledger(tmp_path / "ledger.sqlite").history("bob/")]
        assert kinds == ["requested", "placed", "waiting", "started"], kinds
    finally:
        for spawner in (first, second):
            if spawner.process is not None:
                spawner.process.kill()


def test_with_turns_jupyterhub_waits_the_turn_on_top_of_start_timeout(tmp_path: Path) -> None:
    spawner = Spawner(tmp_path, SERVES_API)
    spawner.run_pre_spawn_hook()
    assert spawner.start_timeout == 300
    spawner.gpu_concurrent_starts = 4
    spawner.run_pre_spawn_hook()
    assert spawner.start_timeout == 300 + spawner.gpu_start_turn_max_wait
