"""A student's notebook against the limits of its server's cgroup, on a real platform as root.

The settings a teacher writes for a class, with the class's own limits (``limits.classes``) and nothing about
isolation (the defaults as root: an account per user, each server in a cgroup of its own).
Two students start servers with slices through the real hub and run code in their kernels,
as notebook cells do: one allocates past its memory, forks without end, opens the other
card's device node and fills /tmp and /dev/shm. Each attack stops at its limit, and the
classmate's kernel keeps answering. The same attacks without the limits succeed
(tests/spawner/test_cgroupfs.py and test_confined_start.py run each beside its control).

The machine has no NVIDIA GPU: the test makes the cards' device nodes (mknod, major 195 as
NVIDIA's driver uses) in a folder the platform is pointed at (GPUSLICE_DEVICE_DIR). With no
driver behind them, a node the cgroup allows fails to open with ENXIO, one it refuses with EPERM.
"""

from __future__ import annotations

import json
import os
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

from spawner.cgroupfs import detect
from spawner.ledger import Ledger
from tests.e2e.platform import Platform, process_alive

STUDENTS = ("dora", "emil")
LIMITS = {"memory": "768MiB", "processes": 128, "tmp": "64MiB", "shm": "32MiB"}


@pytest.fixture
def devices() -> Iterator[Path]:
    """Two cards' nodes and nvidiactl, in a folder every account may walk into."""
    if os.geteuid() != 0 or detect() is None:
        pytest.skip("the limits need root and a cgroup filesystem: run as root (CI does)")
    folder = Path(tempfile.mkdtemp(prefix="gpuslice-dev-"))
    folder.chmod(0o755)
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        os.mknod(folder / name, 0o666 | 0o020000, os.makedev(195, minor))
        (folder / name).chmod(0o666)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
    for name in STUDENTS:
        subprocess.run(["userdel", "--remove", f"jupyter-{name}"], check=False, capture_output=True)


@pytest.fixture
def school(devices: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Platform]:
    monkeypatch.setenv("GPUSLICE_DEVICE_DIR", str(devices))  # gpuslice up and its hub inherit it
    root = Path(tempfile.mkdtemp(prefix="gpuslice-limits-"))
    settings = {"groups": {"ml101": {"members": list(STUDENTS)}}, "limits": {"classes": {"ml101": LIMITS}}}
    settings["isolation"] = None
    platform = Platform(root, settings)
    try:
        platform.start(timeout_s=300)  # the first start as root builds the users' environment
        yield platform
    finally:
        platform.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_each_attack_stops_at_its_limit_and_the_classmate_goes_on(school: Platform, devices: Path) -> None:
    tokens = {name: school.token(name) for name in STUDENTS}
    for name in STUDENTS:
        answer = requests.post(
            f"{school.url}/hub/api/users/{name}/server",
            headers={"Authorization": f"token {tokens[name]}"},
            json={"gpu_memory": "12GiB"},  # one card each: two 12 GiB slices do not share a 16 GiB card
            timeout=60,
        )
        assert answer.status_code in (201, 202), answer.text
    for name in STUDENTS:
        school.login(name).wait_ready(name, timeout_s=180)
    cards = {key.rstrip("/"): gpu for key, gpu, _ in school.ledger()}
    dora, emil = (Kernel(school, name, tokens[name]) for name in STUDENTS)
    try:
        own, other = devices / f"nvidia{cards['dora']}", devices / f"nvidia{cards['emil']}"
        assert dora.run(OPEN.format(paths=[str(own), str(other), str(devices / "nvidiactl"), "/dev/null"])) == (
            "ENXIO EPERM ENXIO opened\n"  # her card (no driver here), not emil's, the control node, /dev/null
        )
        assert dora.run(FILES) == "64 32 ENOSPC ENOSPC\n"  # /tmp and /dev/shm of their own size, full there
        assert emil.run("import os; print(sorted(f for f in os.listdir('/tmp') if f.startswith('fill-')))") == "[]\n"
        assert dora.run(FORK_BOMB) == "stopped True\n"  # at the 128 processes of her class, not the machine's
        server_pid = _server_pid(school, "dora")
        assert dora.run_until_killed(ALLOCATE), "allocating 1 GiB past 768 MiB should kill the kernel"
        assert process_alive(server_pid)  # only the kernel went: her server answers
        assert dora.answers() and emil.run("print(6 * 7)") == "42\n"  # and emil's kernel did not notice
    finally:
        dora.close()
        emil.close()


OPEN = """
import errno, os
found = []
for path in {paths!r}:
    try:
        os.close(os.open(path, os.O_RDWR))
        found.append("opened")
    except OSError as exc:
        found.append(errno.errorcode[exc.errno])
print(" ".join(found))
"""
FILES = """
import errno, shutil
sizes = [shutil.disk_usage(p).total // 2**20 for p in ("/tmp", "/dev/shm")]
full = []
for path in ("/tmp/fill-me", "/dev/shm/fill-me"):  # 100 MiB each: past both
    try:
        with open(path, "wb") as f:
            f.write(b"x" * 100 * 2**20)
        full.append("wrote")
    except OSError as exc:
        full.append(errno.errorcode[exc.errno])
print(*sizes, *full)
"""
FORK_BOMB = """
import os, time
children = []
try:
    while len(children) < 1000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError as exc:
    print("stopped", exc.errno == 11 and len(children) < 128)
for pid in children:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""
ALLOCATE = "b = bytearray(1024 * 2**20); print('allocated', len(b))"


def _server_pid(platform: Platform, user: str) -> int:
    [pid] = [p.pid for p in Ledger(platform.data_dir / "ledger.sqlite").processes() if p.key == f"{user}/"]
    return pid


class Kernel:
    """A kernel of the user's server, driven over its websocket as JupyterLab does."""

    def __init__(self, platform: Platform, user: str, token: str) -> None:
        self.headers = {"Authorization": f"token {token}"}
        self.base = f"{platform.url}/user/{user}/api"
        made = requests.post(f"{self.base}/kernels", headers=self.headers, json={}, timeout=60)
        assert made.status_code == 201, made.text
        self.id = made.json()["id"]
        url = f"ws://127.0.0.1:{platform.port}/user/{user}/api/kernels/{self.id}/channels"
        self.socket = websocket.create_connection(url, header=[f"Authorization: token {token}"], timeout=120)

    def run(self, code: str) -> str:
        """Run ``code`` as a cell; its printed output."""
        output, died = self._execute(code)
        assert not died, f"the kernel died running {code!r}"
        return output

    def run_until_killed(self, code: str) -> bool:
        """Run ``code``; whether the kernel died of it (jupyter_server then says it restarts)."""
        return self._execute(code)[1]

    def answers(self) -> bool:
        return requests.get(f"{self.base}/status", headers=self.headers, timeout=30).status_code == 200

    def _execute(self, code: str) -> tuple[str, bool]:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": msg_id, "version": "5.3"}
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
        request = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
        self.socket.send(json.dumps(request))
        output: list[str] = []
        while True:
            message: dict[str, Any] = json.loads(self.socket.recv())
            state = message.get("content", {}).get("execution_state")
            if message["msg_type"] == "status" and state in ("restarting", "dead"):
                return "".join(output), True
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "stream":
                output.append(message["content"]["text"])
            elif message["msg_type"] == "error":
                raise AssertionError("\n".join(message["content"]["traceback"]))
            elif message["msg_type"] == "status" and state == "idle":
                return "".join(output), False

    def close(self) -> None:
        self.socket.close()
