"""Run inside the machine of tests/e2e/test_service.py (``python -m tests.e2e.service_inside ...``):
what a person does in a browser (log in, start a server) and what the test checks, read where
the installed platform keeps it, printed as JSON for the test on the host.

- ``wait``: until the hub answers /hub/health.
- ``spawn USER SIZE``: USER logs in and starts a server with a slice of SIZE, until it is ready.
- ``without-hub``: the ledger's holds and the servers' scopes, when no hub runs.
- ``facts``: the users, classes and servers the hub serves (its API, as the admin), each
  server's process, its systemd scope and that scope's memory limit, the ledger's holds, the
  markets' image statuses, the incidents with their notes, and each store's schema version.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from tests.e2e.platform import PASSWORD, Session

BASE = "http://127.0.0.1:8000"
DATA = Path("/var/lib/gpuslice")


def wait(timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{BASE}/hub/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the hub did not answer at {BASE} in {timeout_s} s")


def login(user: str) -> Session:
    session = Session(BASE)
    session.get(f"{BASE}/hub/login", timeout=60)
    answer = session.post(
        f"{BASE}/hub/login",
        data={"username": user, "password": PASSWORD, "_xsrf": session.xsrf()},
        allow_redirects=False,
        timeout=60,
    )
    if answer.status_code != 302:
        raise SystemExit(f"{user} cannot log in: {answer.status_code} {answer.text[:300]}")
    return session


def spawn(user: str, size: str) -> None:
    session = login(user)
    started = session.api("POST", f"/users/{user}/server", json={"gpu_memory": size})
    if started.status_code not in (201, 202):
        raise SystemExit(f"{user}'s server was refused: {started.status_code} {started.text[:300]}")
    session.wait_ready(user, timeout_s=300)


def scope_of(pid: int) -> str:
    """The cgroup of a process that holds its memory limit: the memory controller's (cgroup v1), else v2's."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    memory = [path for _, controllers, path in lines if "memory" in controllers.split(",")]
    return (memory or [path for _, controllers, path in lines if controllers == ""] or [""])[0]


def memory_limit(cgroup: str) -> int:
    v1 = Path(f"/sys/fs/cgroup/memory{cgroup}/memory.limit_in_bytes")
    return int(v1.read_text() if v1.exists() else Path(f"/sys/fs/cgroup{cgroup}/memory.max").read_text())


def versions() -> dict[str, int]:
    found = {}
    for name in ("ledger", "incidents", "classes"):
        path = DATA / f"{name}.sqlite"
        if path.exists():
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                found[name] = int(db.execute("PRAGMA user_version").fetchone()[0])
    return found


def facts() -> dict[str, Any]:
    from market.store import Store
    from portal.data.incident_store import IncidentStore
    from spawner.ledger import Ledger

    seen = {"versions": versions()}  # before anything here opens a store (opening one migrates it)
    admin = login("admin")
    users = admin.api("GET", "/users").json()
    seen["users"] = sorted(u["name"] for u in users)
    seen["groups"] = {g["name"]: sorted(g["users"]) for g in admin.api("GET", "/groups").json()}
    seen["ready"] = sorted(u["name"] for u in users if u["servers"].get("", {}).get("ready"))
    servers = {}
    for hold in Ledger(DATA / "ledger.sqlite").holdings():
        alive = hold.pid is not None and Path(f"/proc/{hold.pid}").exists()
        scope = scope_of(hold.pid) if alive and hold.pid else ""
        servers[hold.user] = {
            "pid": hold.pid,
            "alive": alive,
            "gpu_memory": hold.memory_bytes,
            "scope": scope,
            "memory_limit": memory_limit(scope) if scope else 0,
        }
    seen["servers"] = servers
    seen["scopes"] = scopes()
    store = Store(f"sqlite:///{DATA / 'market.sqlite'}")
    seen["images"] = {image.slug: image.status for image in store.images()}
    store.engine.dispose()
    incidents = IncidentStore(DATA / "incidents.sqlite")
    seen["incidents"] = {
        r.incident.title: [n.text for n in incidents.notes(r.incident.id)] for r in incidents.incidents()
    }
    return seen


def scopes() -> list[str]:
    running = subprocess.run(
        ["systemctl", "list-units", "--type=scope", "--state=running", "--plain", "--no-legend", "gpuslice-*"],
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(line.split()[0] for line in running.stdout.splitlines() if line.strip())


def without_hub() -> dict[str, Any]:
    """What is left when no hub runs: the ledger's holds and the servers' scopes."""
    from spawner.ledger import Ledger

    return {"holds": [h.key for h in Ledger(DATA / "ledger.sqlite").holdings()], "scopes": scopes()}


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "wait":
        wait()
    elif command == "spawn":
        spawn(*args)
    elif command == "facts":
        print(json.dumps(facts(), sort_keys=True))
    elif command == "without-hub":
        print(json.dumps(without_hub(), sort_keys=True))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
