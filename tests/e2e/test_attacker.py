"""A student of a class attacks the platform from their own notebook (issue 13), against a real platform.

Run as root (the suite does), with the settings a teacher writes for a class and nothing about
isolation: the defaults. The student logs in, starts their server through the real hub, and
runs code in its kernel, as a curious student would in a notebook cell: it tries to read each
secret in the data folder, the environment of every platform process (the portal's identity key,
the services' hub tokens), another student's home, and to query Prometheus, silence an alert in
Alertmanager and read the exporter's per-process series without credentials. It gets none.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket

from spawner import secretenv
from tests.e2e.platform import Platform, free_port

STUDENTS = ("bob", "carol")
ATTACK = """
import json, os, urllib.request, base64
found = {"uid": os.getuid(), "read": [], "listed": [], "answered": [], "wrote": []}
for path in WRITES:
    try:
        with open(path, "a") as f:
            f.write("# bob was here")
        found["wrote"].append(path)
    except OSError:
        pass
for path in PATHS:
    try:
        with open(path, "rb") as f:
            f.read(1)
        found["read"].append(path)
    except OSError:
        pass
for folder in FOLDERS:
    try:
        os.listdir(folder)
        found["listed"].append(folder)
    except OSError:
        pass
for method, url, body in URLS:
    request = urllib.request.Request(url, data=body.encode() if body else None, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            found["answered"].append([url, response.status])
    except urllib.error.HTTPError as exc:
        if exc.code not in (401, 403):
            found["answered"].append([url, exc.code])
    except OSError:
        pass
print("ATTACK" + json.dumps(found))
"""


@pytest.fixture
def as_root() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("the default as root is an account per user: run the attacker test as root (CI does)")
    yield
    for name in STUDENTS:
        subprocess.run(["userdel", "--remove", f"jupyter-{name}"], check=False, capture_output=True)


def platform_pids(platform: Platform) -> list[int]:
    """Every process of this platform: the hub, the proxy, its services, the portal, monitoring."""
    mine: list[int] = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            text = environ.read_bytes()
        except OSError:
            continue
        if str(platform.data_dir).encode() in text or str(platform.config).encode() in text:
            mine.append(int(environ.parent.name))
    return mine


def run_in_kernel(platform: Platform, user: str, token: str, code: str) -> str:
    """Run ``code`` in a new kernel of the user's server, as a notebook cell does; its printed output."""
    headers = {"Authorization": f"token {token}"}
    base = f"{platform.url}/user/{user}/api"
    kernel = requests.post(f"{base}/kernels", headers=headers, json={}, timeout=60)
    assert kernel.status_code == 201, kernel.text
    ws_url = f"ws://127.0.0.1:{platform.port}/user/{user}/api/kernels/{kernel.json()['id']}/channels"
    socket = websocket.create_connection(ws_url, header=[f"Authorization: token {token}"], timeout=120)
    try:
        msg_id = uuid.uuid4().hex
        socket.send(json.dumps(_execute_request(msg_id, code)))
        output: list[str] = []
        while True:
            message: dict[str, Any] = json.loads(socket.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            content = message["content"]
            if message["msg_type"] == "stream":
                output.append(content["text"])
            elif message["msg_type"] == "error":
                raise AssertionError("\n".join(content["traceback"]))
            elif message["msg_type"] == "status" and content["execution_state"] == "idle":
                return "".join(output)
    finally:
        socket.close()


def _execute_request(msg_id: str, code: str) -> dict[str, Any]:
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": msg_id, "version": "5.3"}
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}


def test_a_student_under_the_defaults_as_root_reads_no_secret_and_reaches_nothing(as_root: None) -> None:
    root = Path(tempfile.mkdtemp(prefix="gpuslice-attack-"))
    root.chmod(0o755)  # the student may walk up to the data folder: the data folder itself must stop them
    ports = {k: free_port() for k in ("exporter_port", "prometheus_port", "alertmanager_port", "node_exporter_port")}
    settings = {"groups": {"ml101": {"members": list(STUDENTS)}}, "isolation": None, "monitoring": ports}
    platform = Platform(root, settings)
    platform.data_dir.mkdir(mode=0o755)  # as an admin might have made it; gpuslice must close it
    platform.start(timeout_s=300)  # the first start as root builds the users' environment
    try:
        tokens = {name: platform.token(name) for name in STUDENTS}
        for name in STUDENTS:
            started = requests.post(
                f"{platform.url}/hub/api/users/{name}/server",
                headers={"Authorization": f"token {tokens[name]}"},
                json={"gpu_memory": "0"},
                timeout=60,
            )
            assert started.status_code in (201, 202), started.text + platform.log.read_text()[-3000:]
        for name in STUDENTS:
            platform.login(name).wait_ready(name, timeout_s=180)
        carol = pwd.getpwnam("jupyter-carol")
        secret = Path(carol.pw_dir) / "notes.txt"
        secret.write_text("carol's own")
        os.chown(secret, carol.pw_uid, carol.pw_gid)
        _servers_run_as_their_own_accounts(platform)
        _no_secret_in_any_environment(platform)

        paths = [str(p) for p in platform.data_dir.rglob("*") if p.is_file()]
        assert any(p.endswith("jupyterhub_cookie_secret") for p in paths), paths
        assert any(p.endswith("web-password") for p in paths), paths
        bob = pwd.getpwnam("jupyter-bob")
        environs = [f"/proc/{pid}/environ" for pid in platform_pids(platform) if _owner(pid) != bob.pw_uid]
        assert len(environs) >= 6, environs  # hub, proxy, services, gate, Streamlit, monitoring
        targets = [*paths, *environs, str(secret)]
        folders = [str(platform.data_dir), carol.pw_dir]
        urls = [
            ("GET", f"http://127.0.0.1:{ports['prometheus_port']}/api/v1/query?query=up", ""),
            ("GET", f"http://127.0.0.1:{ports['alertmanager_port']}/api/v2/alerts", ""),
            ("POST", f"http://127.0.0.1:{ports['alertmanager_port']}/api/v2/silences", _SILENCE),
            ("GET", f"http://127.0.0.1:{ports['exporter_port']}/metrics", ""),  # whose process uses what
        ]
        for _, url, _ in urls:  # they listen (as root we see the refusal): bob's refusals are not silence
            assert requests.get(url, timeout=10).status_code == 401, url
        writes = _code_every_classmates_server_runs("carol")
        code = f"PATHS = {targets!r}\nFOLDERS = {folders!r}\nURLS = {urls!r}\nWRITES = {writes!r}\n{ATTACK}"
        output = run_in_kernel(platform, "bob", tokens["bob"], code)
        found = json.loads(output.split("ATTACK", 1)[1])
        assert found["uid"] == bob.pw_uid != 0
        assert found["read"] == [], "bob's notebook read these"
        assert found["listed"] == [], "bob's notebook listed these"
        assert found["answered"] == [], "these answered bob's notebook without credentials"
        assert found["wrote"] == [], "bob's notebook changed code that carol's server runs"
        assert platform.data_dir.stat().st_mode & 0o777 == 0o700
    finally:
        platform.stop()
        shutil.rmtree(root, ignore_errors=True)


_SILENCE = json.dumps(
    {
        "matchers": [{"name": "alertname", "value": "GpuXid", "isRegex": False}],
        "startsAt": "2030-01-01T00:00:00Z",
        "endsAt": "2030-01-02T00:00:00Z",
        "createdBy": "bob",
        "comment": "quiet",
    }
)


def _code_every_classmates_server_runs(name: str) -> list[str]:
    """What ``name``'s server runs from the shared users' environment, as its environment names it:
    the server config that decides what counts as use (JUPYTER_CONFIG_PATH, executed by every
    server), a new config file beside it, and the kernel hook (PYTHONPATH)."""
    account = pwd.getpwnam(f"jupyter-{name}")
    server = next(
        pid
        for pid in (int(p.name) for p in Path("/proc").glob("[0-9]*"))
        if _owner(pid) == account.pw_uid and b"jupyterhub-singleuser" in _cmdline(pid)
    )
    pairs = (item.split(b"=", 1) for item in Path(f"/proc/{server}/environ").read_bytes().split(b"\0"))
    environ = {k.decode(): v.decode() for k, v in (pair for pair in pairs if len(pair) == 2)}
    config = Path(environ["JUPYTER_CONFIG_PATH"]) / "jupyter_server_config.py"
    hook = Path(environ["PYTHONPATH"]) / "sitecustomize.py"
    assert config.is_file() and hook.is_file(), (config, hook)
    assert not str(config).startswith(str(Path(__file__).parents[2])), config  # the users' copy, not the source
    return [str(config), str(config.with_suffix(".json")), str(hook)]


def _servers_run_as_their_own_accounts(platform: Platform) -> None:
    """Each student's server is their own account's, never root's, without --allow-root; homes 0700."""
    for name in STUDENTS:
        account = pwd.getpwnam(f"jupyter-{name}")
        assert Path(account.pw_dir).stat().st_mode & 0o777 == 0o700
        servers = [
            pid
            for pid in (int(p.name) for p in Path("/proc").glob("[0-9]*"))
            if _owner(pid) == account.pw_uid and b"jupyterhub-singleuser" in _cmdline(pid)
        ]
        assert servers, f"no server process runs as jupyter-{name}"
        for pid in servers:
            assert b"--allow-root" not in _cmdline(pid)


def _no_secret_in_any_environment(platform: Platform) -> None:
    """No platform process was started with a secret in its environment (what /proc/PID/environ shows
    to its own account): no hub token, no portal key, no password or token from the data folder.
    The proxy's CONFIGPROXY_AUTH_TOKEN is the one left (docs/security.md)."""
    files = ["prometheus-hub-token", "portal-hub-token", "monitoring/web-password", "jupyterhub_cookie_secret"]
    values = [(platform.data_dir / name).read_bytes().strip() for name in files]
    pids = platform_pids(platform)
    assert any(b"portal.gate" in _cmdline(pid) for pid in pids) and any(b"streamlit" in _cmdline(pid) for pid in pids)
    for pid in pids:
        environ = dict(
            item.split(b"=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in item
        )
        environ.pop(b"CONFIGPROXY_AUTH_TOKEN", None)
        held = [name for name in secretenv.SECRET_NAMES if environ.get(name.encode())]
        assert held == [], f"{_cmdline(pid)!r} has {held} in its environment"
        for value in values:
            assert not any(value in v for v in environ.values()), f"{_cmdline(pid)!r} holds a secret file's text"


def _owner(pid: int) -> int | None:
    try:
        return Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
