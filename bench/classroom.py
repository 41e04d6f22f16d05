"""`gpuslice bench class --users N`: a class pressing Start at 9:00, gpuslice vs plain JupyterHub.

N users log in over HTTP at the same moment, each starts a server (gpuslice: a GPU slice
on simulated GPUs), runs one cell in a kernel of it, and stops it. The same is done
against plain JupyterHub with its local process spawner. Printed: time to ready (p50,
p95, max), time to the cell's result, failures by cause, hub CPU seconds and peak
memory, over-commit (cards holding more than their memory; must be 0) and leaked
allocations after the stops (must be 0), and gpuslice / plain ratios.

With ``--portal-sessions M``, M people keep opening the portal's pages in headless
Chromium while gpuslice's class spawns (bench/portal.py); their page times, idle and
during the class, are printed too, and each page's first paint per role: from three
sessions on, the students are one class, whose teacher and one of whose students are two
of the sessions (the others admins). The gpuslice hub runs as shipped, with its portal and
idle culler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psutil
import requests
from tornado import httpclient, websocket

from bench.portal import PortalLoad
from bench.spawn import Hub, hubs
from hub.accounts import passwords_path, set_password
from spawner.ledger import Ledger

SLICE = "512MiB"  # 50 of them fit on the two simulated 16 GiB cards with room to spare
PASSWORD = "bench-password"  # every bench user's (plain JupyterHub's dummy authenticator takes any)
TEACHER = "bench-teacher"
READY_WITHIN_S = 600  # a server not ready this long after Start is a failure
RECONNECT_S = 3.0  # a browser's EventSource waits about this long before it opens a broken stream again


class KernelConnectionClosedError(RuntimeError):
    """The kernel's websocket closed before the cell's reply."""


@dataclass
class Outcome:
    ready_s: float | None = None
    cell_s: float | None = None
    failure: str = ""
    retried: bool = False


@dataclass
class Sampler:
    """Samples the hub process's CPU time and memory while the class runs."""

    pid: int
    peak_rss: int = 0
    cpu_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Sampler:
        self._process = psutil.Process(self.pid)
        self._cpu0 = sum(self._process.cpu_times()[:2])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_rss = max(self.peak_rss, self._process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_s = sum(self._process.cpu_times()[:2]) - self._cpu0


def _login(base: str, user: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{base}/hub/login", timeout=60)
    xsrf = _xsrf(session)
    response = session.post(
        f"{base}/hub/login",
        data={"username": user, "password": PASSWORD, "_xsrf": xsrf},
        allow_redirects=False,
        timeout=60,
    )
    if response.status_code != 302:
        raise RuntimeError(f"login: HTTP {response.status_code}")
    session.get(f"{base}/hub/home", timeout=60)  # the signed-in page sets the user's own XSRF cookie
    session.headers["X-XSRFToken"] = _xsrf(session)
    return session


def _xsrf(session: requests.Session) -> str:
    """The hub's XSRF cookie (a user's server sets its own under /user/)."""
    cookies = [c for c in session.cookies if c.name == "_xsrf" and not (c.path or "/").startswith("/user")]
    return str(cookies[-1].value) if cookies else ""


def _run_cell(base: str, user: str, token: str) -> bool:
    """Start a kernel in the user's server and run `1 + 1`; like a person, try a new kernel once.

    Returns whether it took the second try (reported, so retries cannot hide).
    """
    try:
        _run_cell_once(base, user, token)
        return False
    except (KernelConnectionClosedError, httpclient.HTTPClientError):
        _run_cell_once(base, user, token)
        return True


def _run_cell_once(base: str, user: str, token: str) -> None:
    headers = {"Authorization": f"token {token}"}
    kernel = requests.post(f"{base}/user/{user}/api/kernels", json={}, headers=headers, timeout=120)
    if kernel.status_code != 201:
        raise RuntimeError(f"kernel start: HTTP {kernel.status_code}: {kernel.text[:200]!r}")
    url = f"{base.replace('http', 'ws', 1)}/user/{user}/api/kernels/{kernel.json()['id']}/channels"
    asyncio.run(_execute(url, headers))


async def _execute(url: str, headers: dict[str, str]) -> None:
    connection = await websocket.websocket_connect(httpclient.HTTPRequest(url, headers=headers, request_timeout=120))
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "username": "bench",
        "session": uuid.uuid4().hex,
        "msg_type": "execute_request",
        "version": "5.3",
        "date": "",
    }
    content = {"code": "1 + 1", "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    await connection.write_message(
        json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"})
    )
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(connection.read_message(), timeout=120)
            if raw is None:
                raise KernelConnectionClosedError("kernel websocket closed")
            message = json.loads(raw)
            if message.get("msg_type") == "execute_reply" and message["parent_header"].get("msg_id") == msg_id:
                if message["content"]["status"] != "ok":
                    raise RuntimeError(f"cell failed: {message['content']}")
                return
        raise RuntimeError("no execute_reply in 120 s")
    finally:
        connection.close()


def _student(hub: Hub, base: str, user: str, options: dict[str, Any], start: threading.Event) -> Outcome:
    outcome = Outcome()
    step = "login"
    try:
        session = _login(base, user)
        made = session.post(f"{base}/hub/api/users/{user}/tokens", json={"note": "bench"}, timeout=60)
        if made.status_code != 201:
            raise RuntimeError(f"token: HTTP {made.status_code}: {made.text[:120]}")
        token = made.json()["token"]
        start.wait()
        step = "spawn"
        began = time.perf_counter()
        response = session.post(f"{base}/hub/api/users/{user}/server", json=options, timeout=300)
        if response.status_code not in (201, 202):
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:120]}")
        step = "ready"
        _follow_progress(session, base, user, began)
        outcome.ready_s = time.perf_counter() - began
        step = "cell"
        outcome.retried = _run_cell(base, user, token)
        outcome.cell_s = time.perf_counter() - began
    except Exception as exc:  # every failure is counted by cause, none stops the class
        outcome.failure = f"{step}: {type(exc).__name__}: {str(exc)[:300]}"
    return outcome


def _follow_progress(session: requests.Session, base: str, user: str, began: float) -> None:
    """Wait for the server as the hub's spawn page does: an event stream of its progress (JupyterHub's
    ``/server/progress``) until an event says ready or failed, opened again when it breaks or stays silent (a
    browser's EventSource reconnects by itself). (Polling the user's model four times a second, as this benchmark
    once did, is 240 requests a second from a class of 60, which no class's browsers send.)"""
    while time.perf_counter() - began < READY_WITHIN_S:
        try:
            if _ready_by_stream(session, f"{base}/hub/api/users/{user}/server/progress", began):
                return
        except (requests.ConnectionError, requests.Timeout):
            pass  # as EventSource does: open it again (the hub answers at once if the server is ready)
        time.sleep(RECONNECT_S)
    raise RuntimeError(f"server not ready in {READY_WITHIN_S} s")


def _ready_by_stream(session: requests.Session, url: str, began: float) -> bool:
    """One progress stream: True once it says ready, False when it ends or runs past the wait; raises if failed."""
    # The hub writes a keepalive every 8 s: a minute of silence is a stream to open again.
    with session.get(url, stream=True, timeout=(60, 60)) as response:
        if response.status_code != 200:
            raise RuntimeError(f"progress: HTTP {response.status_code}: {response.text[:120]}")
        for line in response.iter_lines(decode_unicode=True):
            if time.perf_counter() - began > READY_WITHIN_S:
                return False
            if not line or not line.startswith("data:"):
                continue
            event = json.loads(line.removeprefix("data:"))
            if event.get("ready"):
                return True
            if event.get("failed"):
                raise RuntimeError(f"spawn failed: {str(event.get('message', ''))[:240]}")
    return False


def _stop_all(hub: Hub, users: list[str]) -> None:
    for user in users:
        hub.api("DELETE", f"/users/{user}/server")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if all(not hub.api("GET", f"/users/{u}")[1]["servers"] for u in users):
            return
        time.sleep(0.5)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_class(hub: Hub, users: int, options: dict[str, Any], over_commit: Callable[[], int]) -> dict[str, Any]:
    base = hub.url.removesuffix("/hub/api")
    names = [f"{hub.kind}-s{i:03d}" for i in range(users)]
    start = threading.Event()
    with Sampler(hub.proc.pid) as sampler, ThreadPoolExecutor(max_workers=users) as pool:
        futures = [pool.submit(_student, hub, base, name, options, start) for name in names]
        time.sleep(1.0)  # everyone logged in and waiting
        start.set()
        outcomes = [f.result() for f in futures]
        overcommitted = over_commit()
    _stop_all(hub, names)
    ready = [o.ready_s for o in outcomes if o.ready_s is not None]
    cells = [o.cell_s for o in outcomes if o.cell_s is not None]
    return {
        "users": users,
        "ready_s": {"p50": statistics.median(ready), "p95": _percentile(ready, 0.95), "max": max(ready)}
        if ready
        else None,
        "cell_s": {"p50": statistics.median(cells), "p95": _percentile(cells, 0.95)} if cells else None,
        "failures": dict(Counter(o.failure.split(":")[0] for o in outcomes if o.failure)),
        "failure_examples": sorted({o.failure for o in outcomes if o.failure})[:5],
        "cells_that_needed_a_second_kernel": sum(o.retried for o in outcomes),
        "hub_cpu_s": round(sampler.cpu_s, 2),
        "hub_peak_rss_mib": round(sampler.peak_rss / 2**20, 1),
        "over_commit": overcommitted,
    }


def run(users: int, portal_sessions: int = 0, browsers_apart: bool = False, idle_rounds: int = 2) -> dict[str, Any]:
    """With three portal sessions or more, gpuslice's students are one class: the first session is its
    teacher, the second one of its students, the others admins (each role's first paints apart).
    ``browsers_apart``: the sessions' browsers in a cgroup of their own; ``idle_rounds``: how often each
    session opens every page before the class starts (bench/portal.py)."""
    students = [f"gpuslice-s{i:03d}" for i in range(users)]
    roles = {f"watcher-{i:02d}": "admin" for i in range(portal_sessions)}
    groups = None
    if portal_sessions >= 3:
        admins = [f"watcher-{i:02d}" for i in range(portal_sessions - 2)]
        roles = {TEACHER: "teacher", students[0]: "student", **dict.fromkeys(admins, "admin")}
        groups = {"bench": {"members": students, "teachers": [TEACHER], "max_slice": SLICE}}
    admins = [name for name, role in roles.items() if role == "admin"]
    with hubs(admins=admins, groups=groups) as (plain, ours):
        baseline = run_class(plain, users, {}, lambda: 0)
        # Admins, the class's members and teachers log in with a password gpuslice gave them (hub/accounts.py).
        for name in {*roles, *(students if groups else ())}:
            set_password(passwords_path(ours.data), name, PASSWORD)
        base = ours.url.removesuffix("/hub/api")
        load = PortalLoad(base, list(roles), roles, idle_rounds, browsers_apart) if roles else None
        with load or contextlib.nullcontext():
            result = run_class(ours, users, {"gpu_memory": SLICE}, ours.over_committed_cards)
        leaked = len(Ledger(ours.data / "ledger.sqlite").holdings())
    result["leaked_allocations"] = leaked
    ratio = None
    if result["ready_s"] and baseline["ready_s"]:
        ratio = {k: result["ready_s"][k] / baseline["ready_s"][k] for k in ("p50", "p95", "max")}
    report = {"gpuslice": result, "plain_jupyterhub": baseline, "ready_ratio": ratio, "slice": SLICE}
    if load is not None:
        report["portal"] = load.summary()  # the class above ran with these sessions refreshing the portal
    return report
