"""`gpuslice top --once` and `--json` against a real platform: the admin's view over ssh."""

import json
import subprocess
from pathlib import Path

from tests.e2e.platform import GPUSLICE, Platform


def test_top_shows_who_holds_which_slice_and_who_waits(tmp_path: Path) -> None:
    platform = Platform(
        tmp_path,
        {"gpus": {"simulate": "1x16GiB:T4"}, "groups": {"ml101": {"members": ["amy", "ben"], "max_slice": "16GiB"}}},
    )
    platform.start()
    try:
        amy = platform.login("amy")
        assert amy.api("POST", "/users/amy/server", json={"gpu_memory": "12GiB"}).status_code in (201, 202)
        amy.wait_ready("amy")
        ben = platform.login("ben")
        assert ben.api("POST", "/users/ben/server", json={"gpu_memory": "8GiB", "wait": True}).status_code == 202
        command = [GPUSLICE, "top", "--config", str(platform.config)]
        shown = subprocess.run([*command, "--once"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "12 GiB of 16 GiB held by 1 servers" in shown.stdout
        assert "amy" in shown.stdout
        assert "1. ben (default server) 8 GiB" in shown.stdout
        data = json.loads(subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60).stdout)
        assert [s["user"] for s in data["cards"][0]["slices"]] == ["amy"]
        assert [w["user"] for w in data["line"]] == ["ben"]
        assert data["problems"] == []
    finally:
        platform.stop()
