"""A student of a class attacks the platform, against a real platform (issues 13 and 29).

Run as root (the suite does), with the settings a teacher writes for a class (docs/platform.md,
`gpuslice class add`) and nothing about isolation: the defaults. The student logs in, starts their
server through the real hub, and runs code in its kernel, as a curious student would in a notebook
cell: it tries to read each secret in the data folder, the environment of every platform process
(the portal's identity key, the services' hub tokens), another student's home, and to query
Prometheus, silence an alert in Alertmanager and read the exporter's and node-exporter's series
without credentials. It gets none. Then the student tries to keep a slice from a waiting classmate
by forging activity with the server's own token (once, 59 minutes ahead; then every second), to
claim the teacher's name, to sign up a look-alike of a classmate's name, to guess a password, and
to take whole cards with a second account. Each fails. (Memory, processes and device nodes: the
limits' own tests, tests/e2e/test_limits.py.)

Each test's platform has its own students (their accounts are removed at the end), so that two
workers running these at once never share an account.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket

from spawner import secretenv
from spawner.ports import free_port
from tests.e2e.conftest import stop_all
from tests.e2e.platform import GPUSLICE, PASSWORD, Platform, Session, admin_api

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


def remove_accounts(names: tuple[str, ...]) -> None:
    for name in names:
        subprocess.run(["userdel", "--remove", f"jupyter-{name}"], check=False, capture_output=True)


@pytest.fixture
def as_root() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("the default as root is an account per user: run the attacker test as root (CI does)")
    yield
    remove_accounts(STUDENTS)


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
    settings = {
        "groups": {"default": {}, "ml101": {"members": list(STUDENTS)}},  # the built-in default rules
        "isolation": None,
        "open_signup": None,
        "monitoring": ports,
    }
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
            ("GET", f"http://127.0.0.1:{ports['node_exporter_port']}/metrics", ""),  # the machine's figures
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


# -- issue 29: the class's rules hold for every account ------------------------------------------


# The class as docs/platform.md writes it, on one simulated 4 GiB card: one slice, so a second
# student waits in line. Short timeouts so that a reclaim happens within the test: idle 20 s
# (warned 6.7 s before), and max_hold 90 s.
def class_settings(members: list[str], **rules: object) -> dict[str, Any]:
    group = {"members": members, "teachers": ["tina"], "max_slice": "4GiB", "servers_per_user": 1, **rules}
    return {
        "groups": {"default": {}, "ml101": group},  # the built-in default rules for users in no class
        "isolation": None,
        "open_signup": None,  # the default: closed, as a class is configured
        "gpus": {"simulate": "1x4GiB:T4"},
        "gpu_idle_timeout": 20,
    }


@pytest.fixture
def class_platform(tmp_path: Path) -> Iterator[Callable[..., Platform]]:
    """A platform started as root with a class of the given students; their accounts go at the end."""
    if os.geteuid() != 0:
        pytest.skip("the class's defaults as root: run the attacker tests as root (CI does)")
    made: list[tuple[Platform, tuple[str, ...]]] = []

    def start(
        members: list[str], also: tuple[str, ...] = (), settings: dict[str, Any] | None = None, **rules: object
    ) -> Platform:
        """``also``: other names whose accounts the test may make; ``settings``: over the class's."""
        platform = Platform(tmp_path / f"p{len(made)}", {**class_settings(members, **rules), **(settings or {})})
        made.append((platform, (*members, "tina", *also)))
        platform.start(timeout_s=300)  # the first start as root builds the users' environment
        return platform

    yield start
    try:
        stop_all([platform for platform, _ in made])  # every platform, even when stopping one fails
    finally:
        for _, names in made:
            remove_accounts(names)


# What a student can run in a notebook cell: a post to the hub's activity API with the server's
# own token, saying the server was used 59 minutes from now (JupyterHub refuses an hour or more).
FORGE_ONCE = """
import datetime, json, os, urllib.request
token = os.environ.get("JUPYTERHUB_API_TOKEN")
if not token:  # or read it where the server keeps it: its own environment
    parent = dict(kv.split("=", 1) for kv in open(f"/proc/{os.getppid()}/environ").read().split("\\0") if "=" in kv)
    token = parent["JUPYTERHUB_API_TOKEN"]
def report(when):
    stamp = when.isoformat().replace("+00:00", "Z")
    server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
    body = json.dumps({"last_activity": stamp, "servers": {server: {"last_activity": stamp}}})
    request = urllib.request.Request(os.environ["JUPYTERHUB_ACTIVITY_URL"], data=body.encode(), method="POST",
        headers={"Authorization": "token " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status
now = datetime.datetime.now(datetime.timezone.utc)
print("FORGED", report(now + datetime.timedelta(minutes=59)))
"""
# The same, every second, from a thread the kernel keeps running: the server looks used forever.
FORGE_FOREVER = (
    FORGE_ONCE
    + """
import threading, time
def keep_reporting():
    while True:
        report(datetime.datetime.now(datetime.timezone.utc))
        time.sleep(1)
threading.Thread(target=keep_reporting, daemon=True).start()
"""
)


def hub_last_activity(platform: Platform, token: str, user: str) -> datetime:
    server = admin_api(platform, token, "GET", f"/users/{user}").json()["servers"][""]
    return datetime.fromisoformat(server["last_activity"].replace("Z", "+00:00"))


def events(platform: Platform, key: str) -> list[tuple[str, str]]:
    db = sqlite3.connect(platform.data_dir / "ledger.sqlite")
    try:
        rows = db.execute("SELECT kind, message FROM server_event WHERE key = ? ORDER BY id", (key,)).fetchall()
        return [(str(kind), str(message)) for kind, message in rows]
    finally:
        db.close()


def start_slice(platform: Platform, user: str) -> Session:
    session = platform.login(user)
    started = session.api("POST", f"/users/{user}/server", json={"gpu_memory": "4GiB"})
    assert started.status_code in (201, 202), started.text
    session.wait_ready(user, timeout_s=180)
    return session


def wait_for_the_line(platform: Platform, user: str) -> Session:
    session = platform.login(user)
    waiting = session.api("POST", f"/users/{user}/server", json={"gpu_memory": "4GiB", "wait": True})
    assert waiting.status_code in (201, 202), waiting.text
    return session


@pytest.mark.waits
def test_a_forged_activity_does_not_keep_a_slice_from_a_waiting_classmate(
    class_platform: Callable[..., Platform],
) -> None:
    """kim holds the class's one slice and, from a notebook cell, reports with her server's token that
    it was used 59 minutes from now: the hub keeps now instead, so her idle server is reclaimed for lee
    after the idle timeout. She then starts again and reports activity every second from a thread:
    the server looks used, but at the class's max_hold (90 s) she is warned and stopped anyway."""
    platform = class_platform(["kim", "lee"], max_hold="90s")
    admin = platform.token("admin")
    start_slice(platform, "kim")
    forged = run_in_kernel(platform, "kim", platform.token("kim"), FORGE_ONCE)
    assert "FORGED 200" in forged, forged
    seen = hub_last_activity(platform, admin, "kim")
    assert seen <= datetime.now(UTC), f"the hub believes kim's server is used at {seen}, in the future"

    wait_for_the_line(platform, "lee").wait_ready("lee", timeout_s=150)  # idle 20 s, warned, stopped
    stopped = [message for kind, message in events(platform, "kim/") if kind == "stopping"]
    assert stopped and "idle for over" in stopped[-1], events(platform, "kim/")  # idle, not max_hold
    admin_api(platform, admin, "DELETE", "/users/lee/server")
    wait_until(lambda: not platform.ledger(), "lee's slice to be free")

    start_slice(platform, "kim")
    forging = run_in_kernel(platform, "kim", platform.token("kim"), FORGE_FOREVER)
    assert "FORGED 200" in forging, forging
    placed = time.time()
    wait_for_the_line(platform, "lee").wait_ready("lee", timeout_s=240)
    held = time.time() - placed
    kinds = [kind for kind, _ in events(platform, "kim/")]
    assert kinds[-3:] == ["warned", "stopping", "stopped"], events(platform, "kim/")
    warned, stopping = (message for kind, message in events(platform, "kim/")[-3:-1])
    assert warned.startswith("held past the max_hold") and "max_hold" in stopping, (warned, stopping)
    assert held < 90 + 60, f"lee waited {held:.0f} s for a slice held past its 90 s"


def wait_until(done: Callable[[], object], what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.5)
    raise AssertionError(f"waited {timeout_s} s for {what}")


def try_login(platform: Platform, user: str, password: str) -> requests.Response:
    session = Session(platform.url)
    session.get(f"{platform.url}/hub/login")
    return session.post(
        f"{platform.url}/hub/login",
        data={"username": user, "password": password, "_xsrf": session.xsrf()},
        allow_redirects=False,
    )


def join(platform: Platform, user: str, code: str, password: str) -> requests.Response:
    session = Session(platform.url)
    session.get(f"{platform.url}/hub/join")
    form = {"username": user, "code": code, "password": password, "password2": password, "_xsrf": session.xsrf()}
    return session.post(f"{platform.url}/hub/join", data=form, allow_redirects=False)


def test_a_teachers_name_cannot_be_claimed_nor_a_classmates_imitated_nor_a_password_guessed(
    class_platform: Callable[..., Platform],
) -> None:
    platform = class_platform(["pat", "quinn", "ruth"])
    # The teacher, listed only under the class's teachers: whoever types the name first gets nothing.
    for password in ("mallory-was-here", "another-guess"):
        claim = try_login(platform, "tina", password)
        assert claim.status_code == 403 and "cannot be claimed" in claim.text, (claim.status_code, claim.text[-800:])
    invite = subprocess.run(
        [GPUSLICE, "user", "invite", "tina", "--config", str(platform.config)], capture_output=True, text=True
    )
    code = invite.stdout.strip().splitlines()[-1].split(",")[1]
    assert join(platform, "tina", code, "tinas-own-password").status_code == 302
    platform.login("tina", "tinas-own-password")

    # A look-alike of a classmate's name: refused, saying which character and what to type.
    for look_alike, said in (("pat\u0430", "U+0430 CYRILLIC SMALL LETTER A"), ("pat\u200b", "ZERO WIDTH SPACE")):
        for attempt in (try_login(platform, look_alike, "a-long-password"), join(platform, look_alike, code, "x" * 9)):
            assert attempt.status_code == 403 and said in attempt.text, (attempt.status_code, attempt.text[-800:])
            assert "letters a-z, digits 0-9" in attempt.text
        created = admin_api(platform, platform.token("admin"), "POST", f"/users/{look_alike}")
        assert created.status_code == 400, created.text  # not even an admin makes one by mistake
    names = [u["name"] for u in admin_api(platform, platform.token("admin"), "GET", "/users").json()]
    assert all(name.isascii() for name in names), names

    # Guessing quinn's password: from the 11th wrong one on, the name is locked, the right one too.
    attempts = [try_login(platform, "quinn", f"guess-{n}") for n in range(20)]
    answers = [a.status_code for a in attempts]
    assert answers == [403] * 20, answers
    assert "Too many failed logins for quinn" not in attempts[9].text  # ten wrong guesses: still only wrong
    assert all("Too many failed logins for quinn" in a.text for a in attempts[10:]), answers
    locked = try_login(platform, "quinn", PASSWORD)  # the 21st in a minute, the right password
    assert locked.status_code == 403 and "Too many failed logins for quinn" in locked.text
    # Guessing across names from one address: by its 20th failure in a minute the address is locked.
    for n in range(12):
        guess = try_login(platform, "pat", f"guess-{n}")
        if "from your address" in guess.text:
            break
    assert "from your address" in guess.text, guess.text[-800:]
    refused = try_login(platform, "ruth", PASSWORD)  # a classmate's right password, from the same address
    assert refused.status_code == 403 and "from your address" in refused.text, refused.text[-800:]


def test_a_second_account_gets_no_gpu_outside_the_rules(class_platform: Callable[..., Platform]) -> None:
    """sam, a student of the class, makes a second account to skip the class's rules: under the defaults
    there is no sign-up beside a class; where an admin opened it, the new account has the finite default
    rules (no whole cards), and gets no card while the class's student is refused."""
    closed = class_platform(["sam"], also=("sam2",))
    signup = try_login(closed, "sam2", "sams-second-password")
    assert signup.status_code == 403, signup.status_code  # no second account at all

    opened = class_platform(["sam"], also=("sam2",), settings={"open_signup": True})
    second = opened.login("sam2", "sams-second-password")
    started = second.api("POST", "/users/sam2/server", json={"gpus": 1})
    assert started.status_code in (400, 403, 409), f"sam2 got a whole card: {started.status_code} {started.text}"
    assert "no whole GPUs" in started.json()["message"], started.text
    assert opened.ledger() == []
