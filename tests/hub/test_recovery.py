import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hub.recovery import alive, reconcile, running_servers
from spawner.ledger import Held, Ledger

GiB = 2**30


def hub_db(path: Path, servers: list[tuple[str, str, int | None, bool]]) -> Path:
    """A database with JupyterHub's users/spawners tables (the columns recovery reads)."""
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
        "CREATE TABLE spawners (id INTEGER PRIMARY KEY, user_id INTEGER, server_id INTEGER, state TEXT, name TEXT);"
    )
    for i, (user, name, pid, running) in enumerate(servers, start=1):
        db.execute("INSERT INTO users VALUES (?, ?)", (i, user))
        state = json.dumps({"pid": pid}) if pid else None
        db.execute("INSERT INTO spawners VALUES (?, ?, ?, ?, ?)", (i, i, i if running else None, state, name))
    db.commit()
    db.close()
    return path


def test_running_servers_reads_the_hub_database(tmp_path: Path) -> None:
    path = hub_db(tmp_path / "hub.sqlite", [("a", "", 11, True), ("b", "gpu", 12, True), ("c", "", None, False)])
    assert running_servers(path) == {"a/": 11, "b/gpu": 12}
    assert running_servers(tmp_path / "missing.sqlite") == {}


@pytest.mark.process
def test_reconcile_keeps_live_recorded_servers_and_stops_orphans(tmp_path: Path) -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        ledger = Ledger(tmp_path / "ledger.sqlite")
        ledger.restore(
            [
                Held("live/", 0, "live", "", GiB, pid=live.pid),
                Held("dead/", 0, "dead", "", GiB, pid=999_999_999),  # recorded, but its process is gone
                Held("orphan/", 1, "orphan", "", GiB, pid=orphan.pid),  # started, never recorded by the hub
                Held("pending/", 1, "pending", "", GiB),  # hub died before the process started
            ]
        )
        path = hub_db(tmp_path / "hub.sqlite", [("live", "", live.pid, True), ("dead", "", 999_999_999, True)])
        dropped = reconcile(ledger, path)
        assert sorted(h.key for h in dropped) == ["dead/", "orphan/", "pending/"]
        assert [h.key for h in ledger.holdings()] == ["live/"]
        assert orphan.wait(timeout=10) != 0  # terminated
        assert live.poll() is None
    finally:
        for p in (live, orphan):
            p.kill()
            p.wait()


def test_alive() -> None:
    assert alive(os.getpid())
    assert not alive(0) and not alive(999_999_999)
