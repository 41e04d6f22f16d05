"""`gpuslice up`: run the single-machine platform in the foreground.

Starts JupyterHub (which starts configurable-http-proxy, the idle culler and the
notebook servers) with hub/jupyterhub_config.py, prints the URLs once the hub
answers, and on SIGINT/SIGTERM stops it, and with it every child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType

from hub import recovery
from hub.settings import Settings
from spawner.ledger import Ledger
from spawner.mixin import machine
from spawner.shares import format_bytes

REPO = Path(__file__).resolve().parents[1]
CONFIG = Path(__file__).with_name("jupyterhub_config.py")
PROXY = REPO / "node_modules" / ".bin" / "configurable-http-proxy"


class PlatformError(RuntimeError):
    """The platform cannot start; the message says what to do."""


def hub_command() -> list[str]:
    return [sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)]


def prepare(settings: Settings, config_path: Path | None) -> tuple[Path, dict[str, str]]:
    """Check prerequisites, make the data folder, reconcile the ledger; return (data_dir, env)."""
    if not PROXY.exists():
        raise PlatformError(f"configurable-http-proxy is not installed at {PROXY}; run scripts/setup (it runs npm ci).")
    data_dir = settings.data_dir.absolute()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    dropped = recovery.reconcile(Ledger(data_dir / "ledger.sqlite"), data_dir / "jupyterhub.sqlite")
    for hold in dropped:
        print(f"gpuslice: released {hold.memory_bytes} bytes on GPU {hold.gpu_index} held by {hold.key} (not running)")
    env = dict(os.environ)
    env["GPUSLICE_SETTINGS"] = str(config_path.absolute()) if config_path else ""
    env["GPUSLICE_DATA_DIR"] = str(data_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return data_dir, env


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def up(settings: Settings, config_path: Path | None) -> int:
    data_dir, env = prepare(settings, config_path)
    gpus = machine(settings.simulate)
    proc = subprocess.Popen(hub_command(), cwd=data_dir, env=env)

    def forward(signum: int, frame: FrameType | None) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    base = f"http://127.0.0.1:{settings.port}"
    if wait_healthy(f"{base}/hub/health", proc):
        print(
            f"gpuslice is up.\n"
            f"  JupyterHub:  {base}/  (a new user name sets its password at first login)\n"
            f"  health:      {base}/hub/health\n"
            f"  GPUs:        {', '.join(f'{g.model} {format_bytes(g.memory_bytes)}' for g in gpus.gpus)}\n"
            f"               ({gpus.source})\n"
            f"  data folder: {data_dir}\n"
            "Stop with Ctrl-C.",
            flush=True,
        )
    return proc.wait()
