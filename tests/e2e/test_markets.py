"""The markets end to end: a real hub launches an image's environment and mounts a model read-only."""

import json
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import requests

from market.store import Image, Store
from tests.e2e.platform import Platform


def make_image_env(prefix: Path) -> Path:
    """A real, separate Python environment that can run jupyterhub-singleuser (borrowing our packages)."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(prefix)], check=True)  # type: ignore[attr-defined]
    site = next((prefix / "lib").glob("python3*/site-packages"))
    (site / "gpuslice-platform.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    launcher = prefix / "bin" / "jupyterhub-singleuser"
    launcher.write_text(f"#!{prefix}/bin/python\nfrom jupyterhub.singleuser import main\nmain()\n")
    launcher.chmod(0o755)
    return prefix


def test_launch_an_image_with_a_model_mounted_read_only(platform: Platform, tmp_path: Path) -> None:
    env = make_image_env(tmp_path / "envs" / "science")
    store = Store(f"sqlite:///{platform.data_dir / 'market.sqlite'}")
    store.save_image(Image("science", "Science", "1", "python", local_path=str(env)), actor="admin")
    store.select_model("ann", "langid-97", True)  # "Use in notebook" on the Models page

    ann = platform.login("ann")
    response = ann.api("POST", "/users/ann/server", json={"gpu_memory": "1GiB", "image": "science"})
    assert response.status_code in (201, 202), response.text
    ann.wait_ready("ann")
    pid = _pid(platform, "ann")
    assert Path(f"/proc/{pid}/exe").resolve().parent == (env / "bin").resolve() or _cmd(pid).startswith(str(env))

    # The server's own contents API, as JupyterLab's file browser uses it.
    auth = {"Authorization": f"token {platform.token('ann')}"}
    base = f"{platform.url}/user/ann/api/contents/models/langid-97"
    listing = requests.get(base, headers=auth, timeout=30)
    assert listing.status_code == 200, listing.text
    assert [c["name"] for c in listing.json()["content"]] == ["langid-model.txt"]
    body = {"type": "file", "format": "text", "content": "x"}
    write = requests.put(f"{base}/mine.txt", data=json.dumps(body), headers=auth, timeout=30)
    assert write.status_code >= 400, write.text  # read-only: the server cannot write it
    assert "Read-only file system" in write.text or "Permission denied" in write.text, write.text
    assert not (platform.data_dir / "models" / "langid-97" / "mine.txt").exists()
    assert _environ(pid)["GPUSLICE_MODELS"] == "langid-97"


def test_a_deprecated_image_is_refused_and_running_servers_are_unharmed(platform: Platform) -> None:
    store = Store(f"sqlite:///{platform.data_dir / 'market.sqlite'}")
    bo = platform.login("bo")
    assert bo.api("POST", "/users/bo/server", json={"image": "default"}).status_code in (201, 202)
    bo.wait_ready("bo")
    store.set_image_status("default", "deprecated", actor="admin")
    cy = platform.login("cy")
    refused = cy.api("POST", "/users/cy/server", json={"image": "default"})
    assert refused.status_code == 400 and "deprecated" in refused.json()["message"]
    assert bo.get(f"{platform.url}/user/bo/lab").status_code == 200


def _pid(platform: Platform, user: str) -> int:
    for _ in range(40):
        for event in reversed(_events(platform, f"{user}/")):
            if "(pid " in event:
                return int(event.split("(pid ")[1].split(")")[0])
        time.sleep(0.25)
    raise AssertionError(f"no pid recorded for {user}")


def _events(platform: Platform, key: str) -> list[str]:
    import sqlite3

    db = sqlite3.connect(platform.data_dir / "ledger.sqlite")
    try:
        return [m for (m,) in db.execute("SELECT message FROM server_event WHERE key = ? ORDER BY id", (key,))]
    finally:
        db.close()


def _cmd(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)
