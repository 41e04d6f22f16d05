"""Secrets never in /proc/PID/environ of the platform's services (spawner/secretenv.py, issue 13)."""

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from spawner import secretenv

# A service that reports what its code sees, then waits to be looked at.
_SERVICE = "tests.hub.secret_service"


@pytest.mark.process
def test_a_service_run_by_with_hub_has_its_token_but_not_in_its_environ(tmp_path: Path) -> None:
    env = {**os.environ, "JUPYTERHUB_API_TOKEN": "hub-token-sekrit", "JPY_API_TOKEN": "hub-token-sekrit"}
    service = subprocess.Popen(
        [sys.executable, "-m", "hub.with_hub", _SERVICE], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert service.stdout is not None
        seen = json.loads(service.stdout.readline())
        assert seen["token"] == "hub-token-sekrit"  # the service's code still finds it
        assert seen["pid"] == service.pid  # the same process, started again (exec)
        environ = Path(f"/proc/{service.pid}/environ").read_bytes()
        assert b"sekrit" not in environ
        assert secretenv.FILE_VAR.encode() in environ  # named there, and gone once read:
        handover = environ.split(secretenv.FILE_VAR.encode() + b"=")[1].split(b"\0")[0].decode()
        assert not Path(handover).exists()
    finally:
        service.kill()
        service.wait()


def test_a_childs_secrets_go_in_a_private_file(tmp_path: Path) -> None:
    env = secretenv.child_env({"PATH": "/usr/bin", "GPUSLICE_PORTAL_SECRET": "ab" * 32, "JUPYTERHUB_API_TOKEN": "t"})
    assert set(env) == {"PATH", secretenv.FILE_VAR}
    handover = Path(env[secretenv.FILE_VAR])
    assert stat.S_IMODE(handover.stat().st_mode) == 0o600
    assert json.loads(handover.read_text()) == {"GPUSLICE_PORTAL_SECRET": "ab" * 32, "JUPYTERHUB_API_TOKEN": "t"}
    handover.unlink()
    assert secretenv.child_env({"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}


def test_pages_opened_at_once_all_find_the_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two people opening the portal together: Streamlit runs both first pages at once, in threads.

    Without a lock the second found the file's name gone, and "the portal has no gate secret",
    while the first was still reading the file. The read is slowed here so that the threads always
    overlap. (CI twice saw one of two first pages never show its title; this race is one way.)
    """
    monkeypatch.setenv(
        secretenv.FILE_VAR, secretenv.child_env({"GPUSLICE_PORTAL_SECRET": "cd" * 32})[secretenv.FILE_VAR]
    )
    monkeypatch.delenv("GPUSLICE_PORTAL_SECRET", raising=False)
    slow_load = json.load

    def read_slowly(file: Any) -> Any:
        time.sleep(0.3)
        return slow_load(file)

    monkeypatch.setattr(secretenv.json, "load", read_slowly)
    seen: list[str | None] = []
    start = threading.Barrier(4)

    def first_page() -> None:
        start.wait()
        secretenv.load_secrets()
        seen.append(os.environ.get("GPUSLICE_PORTAL_SECRET"))

    threads = [threading.Thread(target=first_page) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == ["cd" * 32] * 4
    assert secretenv.FILE_VAR not in os.environ
