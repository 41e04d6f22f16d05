"""`gpuslice bench spawn`: time from spawn request to a ready server, gpuslice vs plain JupyterHub.

Both hubs run here on loopback with the same proxy, database kind and single-user
server (jupyterlab); the baseline uses JupyterHub's own SimpleLocalProcessSpawner,
gpuslice its LocalGpuSpawner with a slice on simulated GPUs. Runs alternate between
the two so that machine noise falls on both; the figure that matters is the ratio.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hub.platform import CONFIG, PROXY, REPO, prepare_user_env
from hub.settings import load as load_settings
from spawner import environ
from spawner.gpus import simulated_gpus
from spawner.ledger import Ledger
from spawner.ports import free_port

# access:servers: bench/classday_real.py's students use their servers (the contents API) as the bench service;
# tokens: bench/jobs.py submits its jobs with a token of the bench's user's own (the jobs API answers users)
ADMIN_SCOPES = ["admin:users", "admin:servers", "list:users", "read:users", "access:servers", "tokens"]


def _config(kind: str, data: Path, token: str) -> str:
    service = {"name": "bench", "api_token": token}
    role = {"name": "bench", "scopes": ADMIN_SCOPES, "services": ["bench"]}
    common = """
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
"""
    if kind == "gpuslice":  # as shipped: with its portal and idle culler beside the bench's service
        return (
            f"load_subconfig({str(CONFIG)!r})\n"
            f"c.JupyterHub.services.append({service!r})\nc.JupyterHub.load_roles.append({role!r})\n" + common
        )
    common += f"c.JupyterHub.services = [{service!r}]\nc.JupyterHub.load_roles = [{role!r}]\n"
    args = ["--MappingKernelManager.kernel_info_timeout=180"] + (["--allow-root"] if os.geteuid() == 0 else [])
    return (
        f"""
c.JupyterHub.bind_url = "http://127.0.0.1:{free_port()}"
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
c.JupyterHub.db_url = "sqlite:///{data / "jupyterhub.sqlite"}"
c.JupyterHub.cookie_secret_file = "{data / "cookie_secret"}"
c.JupyterHub.pid_file = "{data / "jupyterhub.pid"}"
c.ConfigurableHTTPProxy.pid_file = "{data / "proxy.pid"}"
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{data}/homes/{{username}}"
c.Spawner.cmd = [{str(Path(sys.prefix) / "bin" / "jupyterhub-singleuser")!r}]
c.Spawner.args = {args!r}
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 180  # the same patience as gpuslice's configuration, for a fair baseline
c.Spawner.start_timeout = 300
"""
        + common
    )


class Hub:
    def __init__(
        self,
        kind: str,
        root: Path,
        admins: Sequence[str] = (),
        simulate: str = "2x16GiB:T4",
        extra_settings: Mapping[str, int] | None = None,
        groups: Mapping[str, Any] | None = None,
    ) -> None:
        """``simulate``: gpuslice's simulated GPUs; ``extra_settings``: more of its settings (timeouts, seconds);
        ``groups``: gpuslice's classes (settings ``groups``)."""
        self.kind, self.data, self.simulate = kind, root / kind, simulate
        self.data.mkdir(parents=True)
        self.token = secrets.token_hex(16)
        self.port = free_port()
        config = self.data / "config.py"
        config.write_text(_config(kind, self.data, self.token))
        settings = self.data / "gpuslice.yaml"
        settings.write_text(
            f"port: {self.port}\nhub_port: {free_port()}\nproxy_api_port: {free_port()}\nportal_port: {free_port()}\n"
            f"data_dir: {self.data}\ngpus: {{simulate: {simulate}}}\nmonitoring: {{enabled: false}}\n"
            f"admin_users: {json.dumps(list(admins))}\n"
            # The benchmarks' users are in no class: no limits for them, as the measured line and
            # placement had before the default rules (which protect a class, not what is timed here).
            "groups: {default: {max_slice: null, max_gpus: null, budget: null, servers_per_user: null}}\n"
            + "".join(f"{k}: {v}\n" for k, v in (extra_settings or {}).items())
            + (f"groups: {json.dumps(dict(groups))}\n" if groups else "")
        )
        if kind == "gpuslice":
            # As `gpuslice up` does: as root each user's servers run from the users' environment,
            # which must exist before the first spawn (on a fresh machine no other test made it).
            platform_settings = load_settings(settings)
            if platform_settings.isolation == "unix-users":
                prepare_user_env(platform_settings.user_env)
        env = {**os.environ, environ.SETTINGS.name: str(settings), environ.DATA_DIR.name: str(self.data)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        self.log = (self.data / "hub.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=self.data,
            env=env,
            stdout=self.log,
            stderr=self.log,
        )
        if kind != "gpuslice":
            self.port = int(config.read_text().split("http://127.0.0.1:")[1].split('"')[0])
        self._wait_health()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hub/api"

    def _wait_health(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/hub/health", timeout=2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.2)
        tail = (self.data / "hub.log").read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"{self.kind} hub did not start; {self.data / 'hub.log'} ends:\n" + "\n".join(tail))

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        return self._send(method, self.url + path, body, timeout_s=120)

    def put(self, url: str, body: dict[str, Any]) -> int:
        """PUT JSON with the bench's token to ``url`` (a user's server, through the proxy); the status."""
        try:
            return self._send("PUT", url, body, timeout_s=60)[0]
        except OSError:
            return 0  # the server went away meanwhile (reclaimed): the student finds out when they pause

    def post(self, url: str, body: dict[str, Any]) -> int:
        """POST JSON with the bench's token to ``url`` (a user's server, through the proxy); the status (0: gone)."""
        try:
            return self._send("POST", url, body, timeout_s=60)[0]
        except OSError:
            return 0

    def _send(self, method: str, url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
        """The status and the JSON answer (an error's text as it came) of one request with the bench's token."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"token {self.token}", "Content-Type": "application/json"}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                text = response.read()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def over_committed_cards(self) -> int:
        """gpuslice's cards whose slices in its ledger add up to more than their memory, now."""
        memory = {g.index: g.memory_bytes for g in simulated_gpus(self.simulate)}
        per_card: dict[int, int] = {}
        for held in Ledger(self.data / "ledger.sqlite").holdings():
            per_card[held.gpu_index] = per_card.get(held.gpu_index, 0) + held.memory_bytes
        return sum(1 for card, used in per_card.items() if used > memory[card])

    def spawn_seconds(self, user: str, options: dict[str, Any]) -> float:
        self.api("POST", f"/users/{user}")
        start = time.perf_counter()
        status, body = self.api("POST", f"/users/{user}/server", options)
        if status not in (201, 202):
            raise RuntimeError(f"{self.kind}: spawn of {user} failed: {status} {body}")
        while True:
            _, model = self.api("GET", f"/users/{user}")
            server = model["servers"].get("")
            if server and server.get("ready"):
                elapsed = time.perf_counter() - start
                break
            if time.perf_counter() - start > 120:
                raise RuntimeError(f"{self.kind}: {user} not ready in 120 s")
            time.sleep(0.05)
        self.api("DELETE", f"/users/{user}/server")
        while self.api("GET", f"/users/{user}")[1]["servers"]:
            time.sleep(0.1)
        return elapsed

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@contextmanager
def hubs(admins: Sequence[str] = (), groups: Mapping[str, Any] | None = None) -> Iterator[tuple[Hub, Hub]]:
    """A plain JupyterHub and gpuslice's (admins: gpuslice's admin users, for portal sessions; groups: its classes)."""
    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-") as root:
        plain = Hub("plain", Path(root))
        try:
            ours = Hub("gpuslice", Path(root), admins, groups=groups)
            try:
                yield plain, ours
            finally:
                ours.close()
        finally:
            plain.close()


def run(runs: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"plain": [], "gpuslice": []}
    with hubs() as (plain, ours):
        for i in range(runs + 1):  # the first round warms both up and is not counted
            for hub, options in ((plain, {}), (ours, {"gpu_memory": "4GiB"})):
                seconds = hub.spawn_seconds(f"bench{i}", options)
                if i:
                    times[hub.kind].append(seconds)
    p50 = {k: statistics.median(v) for k, v in times.items()}
    mean = {k: statistics.fmean(v) for k, v in times.items()}
    return {
        "runs": runs,
        "spawn_to_ready_s": {k: {"p50": p50[k], "mean": mean[k], "max": max(v)} for k, v in times.items()},
        "ratio_p50": p50["gpuslice"] / p50["plain"],
        "ratio_mean": mean["gpuslice"] / mean["plain"],
    }
