"""The local lifecycle's ledger use: one Ledger per spawner, and polls that only read."""

import asyncio
import logging
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spawner.ledger import Ledger, LedgerError
from spawner.lifecycle import LedgerGpuMixin


class _RunningServer:
    """JupyterHub's Spawner.poll for a server that is up."""

    async def poll(self) -> int | None:
        return None


class Spawner(LedgerGpuMixin, _RunningServer):
    def __init__(self, ledger: Path, **options: Any) -> None:
        super().__init__(gpu_simulate="2x16GiB:T4", gpu_ledger_path=str(ledger))
        self.user = SimpleNamespace(name="ann", groups=[], admin=False)
        self.name = ""
        self.user_options = options
        self.log = logging.getLogger("test")
        self._gpu_restart.started()  # this hub started it


def _started(tmp_path: Path) -> Spawner:
    spawner = Spawner(tmp_path / "ledger.sqlite", gpu_memory="4GiB")
    _, spawner._gpu_holds = spawner.allocate()
    return spawner


def test_a_spawner_keeps_one_ledger(tmp_path: Path) -> None:
    spawner = _started(tmp_path)
    assert spawner._ledger is spawner._ledger


def test_a_poll_reads_the_ledger_without_taking_the_write_lock(tmp_path: Path) -> None:
    spawner = _started(tmp_path)
    spawner._gpu_ledger = Ledger(spawner.gpu_ledger_path, timeout_s=0.2)  # a write would wait 0.2 s, then fail
    other = sqlite3.connect(spawner.gpu_ledger_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another hub thread writing: holds the write lock
    try:
        assert asyncio.run(spawner.poll()) is None
        with pytest.raises(LedgerError):  # the control: a write does wait for the lock
            spawner._ledger.set_pid("ann/", 1)
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_poll_puts_back_a_lost_slice(tmp_path: Path) -> None:
    spawner = _started(tmp_path)
    Ledger(spawner.gpu_ledger_path).release("ann/")
    assert asyncio.run(spawner.poll()) is None
    assert [(h.key, h.memory_bytes) for h in Ledger(spawner.gpu_ledger_path).holdings()] == [("ann/", 4 * 2**30)]
