"""Drive a real `gpuslice up` (JupyterHub, configurable-http-proxy, jupyterlab) on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import psutil
import requests
import yaml

from hub.accounts import has_password, passwords_path, set_password, write_private
from spawner.confinement import for_machine
from spawner.ledger import Ledger
from spawner.ports import free_port
from spawner.processes import Proc, running, stop_trees

GPUSLICE = str(Path(sys.executable).with_name("gpuslice"))
PASSWORD = "a-long-password"  # every test account's; admins' and class members' set before the hub starts
# The users these tests sign up are in no class and are the subjects of other things (the
# line, isolation, the portal): no limits for them, and sign-up open even beside a class, as
# explicit choices. A test of the defaults passes open_signup=None and a default group of its own
# in groups ({}: the built-in default rules).
NO_LIMITS = {"max_slice": None, "max_gpus": None, "budget": None, "servers_per_user": None}


def _command(pid: int) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return list(psutil.Process(pid).cmdline())
    return []


def process_alive(pid: int) -> bool:
    """Running: not gone, and not a zombie that its (new) parent has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(") ", 1)[1][0] != "Z"


@dataclass
class Platform:
    root: Path
    settings: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    # Class members left without a password (as after `gpuslice class add` before they join);
    # every other member gets PASSWORD before the hub starts, as `gpuslice user set-password` does.
    unclaimed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.data_dir = self.root / "data"
        base = {
            "port": self.port,
            "hub_port": free_port(),
            "proxy_api_port": free_port(),
            "portal_port": free_port(),
            "data_dir": str(self.data_dir),
            "admin_users": ["admin"],
            "gpus": {"simulate": "2x16GiB:T4"},
            "monitoring": {"enabled": False},  # tests that want it pass free ports
            # One account for every user, as on a personal machine: these tests are about other
            # things. tests/e2e/test_attacker.py passes isolation=None to run under the defaults.
            "isolation": "none",
            "open_signup": True,
        }
        admin_password = self.root / "admin-password"
        write_private(admin_password, PASSWORD)
        base["admin_password_from"] = f"file:{admin_password}"
        self.config = self.root / "gpuslice.yaml"
        merged = {**base, **self.settings}
        monitoring = merged.get("monitoring") or {}
        if monitoring.get("enabled", True) and "recorder_port" not in monitoring:
            merged["monitoring"] = {**monitoring, "recorder_port": free_port()}  # never the default 9095 of another
        if merged.get("groups") is not None or "groups" not in self.settings:
            merged["groups"] = {"default": NO_LIMITS, **(merged.get("groups") or {})}
        self.config.write_text(yaml.safe_dump({k: v for k, v in merged.items() if v is not None}))
        self.log = self.root / "platform.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90) -> None:
        store = passwords_path(self.data_dir)
        for group in (self.settings.get("groups") or {}).values():
            for member in group.get("members") or ():
                if member not in self.unclaimed and not has_password(store, member):
                    set_password(store, member, PASSWORD)
        with self.log.open("ab") as log:
            # A process group of its own: what a stop cannot end is ended by group (see stop).
            self.proc = subprocess.Popen(
                [GPUSLICE, "up", "--config", str(self.config)], stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._failed_to_start(f"gpuslice up exited early:\n{self.log.read_text()[-4000:]}")
            try:
                if requests.get(f"{self.url}/hub/health", timeout=2).status_code == 200:
                    # The gpu-patrol service holds each card never checked for a moment as the hub
                    # first starts: a spawn then would find a one-card machine full (a 409).
                    self.wait_patrolled(timeout_s=max(deadline - time.monotonic(), 30))
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self._failed_to_start(f"the hub did not answer in {timeout_s}s:\n{self.log.read_text()[-4000:]}")

    def _failed_to_start(self, why: str) -> NoReturn:
        """End what the failed start left (whoever called start), then fail."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        stop_trees(self.processes_left(wait_s=0), grace_s=5)
        raise AssertionError(why)

    def stop(self) -> None:
        """Stop the platform as its operator does (SIGTERM to `gpuslice up`), then end whatever of it
        is left, by process group and by recorded pid. A stop that left anything running fails
        (after ending it); after a test killed the hub, what it left is ended quietly."""
        graceful = self.proc is not None and self.proc.poll() is None
        if self.proc is not None and graceful:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        left = self.processes_left()
        named = "\n".join(f"  pid {p.pid}: {' '.join(_command(p.pid) or ['?'])[:160]}" for p in left)
        stop_trees(left, grace_s=5)
        confinement = for_machine(self.data_dir.absolute())
        cgroups = sorted(confinement.names()) if confinement is not None else []
        for name in cgroups:
            confinement.remove(name)  # type: ignore[union-attr]
        if graceful and left:
            raise AssertionError(f"gpuslice up stopped but left {len(left)} process(es) running (now ended):\n{named}")
        if graceful and cgroups:
            raise AssertionError(f"gpuslice up stopped but left these server cgroups (now removed): {cgroups}")

    def processes_left(self, wait_s: float = 30) -> list[Proc]:
        """This platform's processes still running once `gpuslice up` has ended: its process group,
        the servers the ledger records, and anything working in its folder (hub, proxy, monitoring,
        servers and kernels under isolation none). Those still stopping get ``wait_s`` to end."""
        mine: list[Proc] = []
        group = self.proc.pid if self.proc is not None else None
        for process in psutil.process_iter(["cwd"]):
            with contextlib.suppress(psutil.Error, OSError):
                in_root = Path(process.info["cwd"] or "/").is_relative_to(self.root)
                if in_root or (group is not None and os.getpgid(process.pid) == group):
                    mine.append(Proc(process.pid, process.create_time()))
        if (self.data_dir / "ledger.sqlite").exists():
            mine += [Proc(p.pid, p.started) for p in Ledger(self.data_dir / "ledger.sqlite").processes()]
        deadline = time.monotonic() + wait_s
        left = [p for p in set(mine) if running(p)]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for p in left if running(p)]
        return left

    def monitoring_auth(self) -> tuple[str, str]:
        """Prometheus's and Alertmanager's basic auth, read from the 0600 file as the platform's account can."""
        return ("gpuslice", (self.data_dir / "monitoring" / "web-password").read_text().strip())

    def hub_pid(self) -> int:
        return int((self.data_dir / "jupyterhub.pid").read_text())

    def kill_hub(self) -> None:
        """kill -9 of JupyterHub itself: the proxy and the notebook servers live on."""
        os.kill(self.hub_pid(), signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(timeout=30)

    def ledger(self) -> list[tuple[str, int, int]]:
        db = sqlite3.connect(self.data_dir / "ledger.sqlite")
        try:
            return db.execute("SELECT key, gpu_index, memory_bytes FROM allocation ORDER BY key").fetchall()
        finally:
            db.close()

    def wait_patrolled(self, timeout_s: float = 120) -> None:
        """Until the gpu-patrol service's first round (each card never checked, checked as the hub
        starts, each held by a ``patrol/gpu-N`` allocation meanwhile) is over: a test that spawns or
        counts the ledger's rows from the start does not meet the patrol's. start() waits for it."""
        from spawner.card_health import CardLedger
        from spawner.gpus import machine

        settings = yaml.safe_load(self.config.read_text())
        cards = {g.index for g in machine(str((settings.get("gpus") or {}).get("simulate", ""))).gpus}
        deadline = time.monotonic() + timeout_s
        while True:
            checked = {c.gpu for c in CardLedger(self.data_dir / "ledger.sqlite").health()}
            rows = self.ledger()
            patrolling = [row for row in rows if row[0].startswith("patrol/")]
            held = {gpu for key, gpu, _ in rows if not key.startswith("patrol/")}  # the patrol waits for those
            if cards <= checked | held and not patrolling:
                return
            assert time.monotonic() < deadline, f"the patrol's first round: {len(checked)} of {len(cards)} cards"
            time.sleep(0.2)

    def last_event(self, key: str) -> tuple[str, str] | None:
        """(kind, message) of the server's latest recorded event, read straight from SQLite."""
        db = sqlite3.connect(self.data_dir / "ledger.sqlite")
        try:
            row = db.execute(
                "SELECT kind, message FROM server_event WHERE key = ? ORDER BY id DESC LIMIT 1", (key,)
            ).fetchone()
        finally:
            db.close()
        return None if row is None else (str(row[0]), str(row[1]))

    def login(self, user: str, password: str = PASSWORD) -> Session:
        session = Session(self.url)
        session.get(f"{self.url}/hub/login")
        response = session.post(
            f"{self.url}/hub/login",
            data={"username": user, "password": password, "_xsrf": session.xsrf()},
            allow_redirects=False,
        )
        assert response.status_code == 302, f"login of {user} failed: {response.status_code} {response.text[:300]}"
        return session

    def token(self, user: str) -> str:
        session = self.login(user)
        response = session.api("POST", f"/users/{user}/tokens", json={"note": "tests"})
        assert response.status_code == 201, response.text
        return str(response.json()["token"])


class Session(requests.Session):
    """A browser-like session: cookies from login, XSRF header on API calls."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base

    def xsrf(self) -> str:
        """The hub's XSRF cookie (the user's server sets its own under /user/)."""
        for cookie in self.cookies:
            if cookie.name == "_xsrf" and not (cookie.path or "/").startswith("/user"):
                return str(cookie.value)
        return ""

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"X-XSRFToken": self.xsrf(), **kwargs.pop("headers", {})}
        return self.request(method, f"{self.base}/hub/api{path}", headers=headers, timeout=60, **kwargs)

    def wait_ready(self, user: str, server: str = "", timeout_s: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            model = self.api("GET", f"/users/{user}").json()
            spawner = model["servers"].get(server)
            if spawner and spawner.get("ready"):
                return dict(spawner)
            if not spawner or not spawner.get("pending"):
                raise AssertionError(f"{user}'s server stopped while starting: {model}")
            time.sleep(0.5)
        raise AssertionError(f"{user}'s server not ready in {timeout_s}s")


def admin_api(platform: Platform, token: str, method: str, path: str, **kwargs: Any) -> requests.Response:
    headers = {"Authorization": f"token {token}"}
    return requests.request(method, f"{platform.url}/hub/api{path}", headers=headers, timeout=120, **kwargs)
