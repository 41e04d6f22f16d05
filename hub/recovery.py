"""Bring the ledger back in line with reality before the hub starts.

After a crash (kill -9 of the hub included) the ledger may hold slices of servers
that never finished starting, or that died while the hub was down. The hub's
database says which servers it believes run, and each server's process id says
whether it really does. Anything else is released, and an orphan process (started
but never recorded by the hub) is stopped, so its slice cannot be used twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
from pathlib import Path

from spawner.ledger import Held, Ledger, server_key


def running_servers(hub_db: Path) -> dict[str, int]:
    """user/server -> pid for every server the hub's database records as running."""
    if not hub_db.exists():
        return {}
    db = sqlite3.connect(f"file:{hub_db}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT users.name, spawners.name, spawners.state FROM spawners"
            " JOIN users ON users.id = spawners.user_id WHERE spawners.server_id IS NOT NULL"
        ).fetchall()
    except sqlite3.Error:
        return {}  # a fresh or foreign database: nothing is known to run
    finally:
        db.close()
    running = {}
    for user, name, state in rows:
        pid = int((json.loads(state) if state else {}).get("pid") or 0)
        running[server_key(user, name or "")] = pid
    return running


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reconcile(ledger: Ledger, hub_db: Path) -> list[Held]:
    """Release every hold no live, recorded server owns; stop orphan processes."""
    recorded = running_servers(hub_db)
    live = {key for key, pid in recorded.items() if alive(pid)}
    dropped = ledger.reconcile(live)
    for hold in dropped:
        if hold.pid and hold.key not in recorded and alive(hold.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(hold.pid, signal.SIGTERM)  # servers start in their own session
    return dropped
