"""The single-machine platform with real JupyterHub, proxy and jupyterlab processes."""

import os
import re
import signal
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.e2e.platform import Platform, admin_api, process_alive

GiB = 2**30


def test_login_spawn_with_a_slice_through_the_form_reach_it_and_stop(platform: Platform) -> None:
    alice = platform.login("alice")
    form = alice.get(f"{platform.url}/hub/spawn")
    assert form.status_code == 200
    assert '<label for="gpu"' in form.text and "(simulated)" in form.text and "16 GiB free of 16 GiB" in form.text
    # Submit the form as a browser does.
    response = alice.post(
        f"{platform.url}/hub/spawn",
        data={"gpu": "4GiB", "image": "default", "_xsrf": alice.xsrf()},
    )
    assert response.status_code == 200, response.text[:500]
    alice.wait_ready("alice")
    assert platform.ledger() == [("alice/", 0, 4 * GiB)]

    # Through the proxy, with the server's own OAuth login.
    lab = alice.get(f"{platform.url}/user/alice/lab")
    assert lab.status_code == 200 and "JupyterLab" in lab.text
    # The server's environment carries the slice.
    pid = _server_pid(platform, "alice")
    env = _environ(pid)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["GPUSLICE_GPU_MEMORY_BYTES"] == str(4 * GiB)
    assert env["GPUSLICE_GPU_MEMORY_FRACTION"] == "0.250000"
    assert env["GPUSLICE_SIMULATED"] == "1"
    assert env["HOME"] == str(platform.data_dir / "homes" / "alice")
    _notebooks_see_only_the_kernel_hook(pid, env)

    kind, message = platform.last_event("alice/") or ("", "")
    assert kind == "started" and f"pid {pid}" in message, (kind, message)
    assert alice.api("DELETE", "/users/alice/server").status_code in (202, 204)
    _wait(lambda: platform.ledger() == [], "the ledger to empty after stop")
    # The hub's API does not say who asked (the portal and the idle culler are named).
    assert platform.last_event("alice/") == (
        "stopped",
        "stopped from the hub: by its owner or an admin, or when the platform shut down",
    )


def test_rest_api_spawn_and_refusals_leave_nothing_allocated(platform: Platform) -> None:
    bob = platform.login("bob")
    bad = [
        ({"gpu_memory": "-4GiB"}, "cannot be negative"),
        ({"gpu_memory": "64GiB"}, "more than any GPU here has (the largest has 16 GiB)"),
        ({"gpu_memory": 7}, "gpus=7"),
        ({"gpu_memory": "4GiB", "gpus": 1}, "either a slice of one GPU"),
        ({"gpu_memory": ["4GiB"]}, "text or a number"),
        ({"gpus": 3}, "more than any machine has"),
        ({"image": "tensorflow"}, "Image 'tensorflow' is not installed on this machine"),
        ({"image": "caffe"}, "Unknown image 'caffe'; choose one of: default."),
        ({"models": ["no-such-model"]}, "Model 'no-such-model' is not an approved model in the market."),
        ({"gpu_memory": "4GiB", "colour": "red"}, "Unknown spawn option(s): colour"),
        ({"gpu_memory": "0.0000001"}, 'below the smallest slice, 256 MiB; ask for "256MiB" or more'),
        ({"gpu_memory": "1e-400"}, 'below the smallest slice, 256 MiB; ask for "256MiB" or more'),
        ({"gpu_memory": "1e400"}, "more than a card"),
        ({"gpu_memory": "9" * 1_000_000}, "1000000 characters long"),
        ({"gpu_memory": 10**400}, "more than a card"),
    ]
    for options, message in bad:
        response = bob.api("POST", "/users/bob/server", json=options)
        assert response.status_code == 400, (options, response.status_code, response.text)
        assert message in response.json()["message"], (options, response.json())
        assert platform.ledger() == []
        assert bob.api("GET", "/users/bob").json()["servers"] == {}

    response = bob.api("POST", "/users/bob/server", json={"gpu_memory": "0.5"})
    assert response.status_code in (201, 202), response.text
    bob.wait_ready("bob")
    assert platform.ledger() == [("bob/", 0, 8 * GiB)]
    metrics = bob.get(f"{platform.url}/hub/metrics")
    if metrics.status_code == 200:  # admins only by default
        assert 'gpuslice_spawn_refused_total{reason="invalid"} 15.0' in metrics.text


def test_no_room_is_refused_with_an_explanation(platform: Platform) -> None:
    token = platform.token("admin")
    for user in ("u1", "u2", "u3"):
        assert admin_api(platform, token, "POST", f"/users/{user}").status_code in (201, 409)
    assert admin_api(platform, token, "POST", "/users/u1/server", json={"gpu_memory": "12GiB"}).status_code in (
        201,
        202,
    )
    assert admin_api(platform, token, "POST", "/users/u2/server", json={"gpu_memory": "12GiB"}).status_code in (
        201,
        202,
    )
    refused = admin_api(platform, token, "POST", "/users/u3/server", json={"gpu_memory": "8GiB"})
    assert refused.status_code == 409
    message = refused.json()["message"]
    assert "Nothing can hold 8 GiB of one GPU right now." in message
    assert "The largest free slice is 4 GiB on localhost GPU 0 (T4): ask for that or less to start now." in message
    assert platform.last_event("u3/") == ("refused", message)  # the portal shows it as why u3 has no server
    metrics = admin_api(platform, token, "GET", "/../metrics")
    assert 'gpuslice_spawn_refused_total{reason="capacity"} 1.0' in metrics.text
    assert re.search(
        r'gpuslice_gpu_memory_allocated_bytes\{gpu="\d",node="localhost",server="",user="u1"\} 1.2884901888e\+10',
        metrics.text,
    )
    assert (
        'gpuslice_gpu_memory_capacity_bytes{gpu="0",model="T4",node="localhost",simulated="true"} 1.7179869184e+10'
        in metrics.text
    )


def test_fifty_spawns_at_once_never_overcommit_two_cards(platform: Platform) -> None:
    token = platform.token("admin")
    users = [f"s{i:02d}" for i in range(50)]
    response = admin_api(platform, token, "POST", "/users", json={"usernames": users})
    assert response.status_code == 201, response.text

    def spawn(user: str) -> int:
        return admin_api(platform, token, "POST", f"/users/{user}/server", json={"gpu_memory": "4GiB"}).status_code

    with ThreadPoolExecutor(max_workers=50) as pool:
        codes = list(pool.map(spawn, users))
    assert set(codes) <= {201, 202, 409}, codes
    # 202 only says the spawn outlived slow_spawn_timeout: on a loaded machine a refusal can
    # come after it. Each spawn is followed to its end before counting.
    outcomes = {user: _spawn_outcome(platform, token, user, code) for user, code in zip(users, codes, strict=True)}
    started = sorted(u for u, outcome in outcomes.items() if outcome == "ready")
    assert len(started) == 8, outcomes  # 2 cards x 16 GiB / 4 GiB
    assert list(outcomes.values()).count("refused") == 42, outcomes
    ledger = platform.ledger()
    for gpu in (0, 1):
        assert sum(m for _, g, m in ledger if g == gpu) <= 16 * GiB
    assert sorted(k for k, _, _ in ledger) == [f"{u}/" for u in started]
    for user in started:
        admin_api(platform, token, "DELETE", f"/users/{user}/server")
    _wait(lambda: platform.ledger() == [], "every slice to be released", timeout_s=120)


def _spawn_outcome(platform: Platform, token: str, user: str, code: int, timeout_s: float = 180) -> str:
    """'ready' or 'refused' (with the capacity reason recorded) once the user's spawn has ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server = admin_api(platform, token, "GET", f"/users/{user}").json()["servers"].get("")
        if server and server.get("ready"):
            return "ready"
        if not server or not server.get("pending"):
            event = platform.last_event(f"{user}/")
            assert event is not None and event[0] == "refused", (user, code, event)
            assert "Nothing can hold 4 GiB" in event[1], event
            return "refused"
        time.sleep(0.5)
    raise AssertionError(f"{user}'s spawn (answered {code}) had not ended after {timeout_s}s")


def test_hub_kill_9_and_restart_keeps_running_servers_and_their_slices(make_platform: object) -> None:
    platform, pid = _platform_with_a_server(make_platform, "carol", "8GiB")
    before = platform.ledger()

    platform.kill_hub()
    assert process_alive(pid), "the notebook server must outlive the hub"
    platform.start()
    assert platform.ledger() == before  # no leak, no double allocation
    carol = platform.login("carol")
    assert carol.get(f"{platform.url}/user/carol/lab").status_code == 200  # reachable again
    # The slice still counts: 8 GiB more fits on card 1, 16 GiB on one card does not.
    dave = platform.login("dave")
    assert dave.api("POST", "/users/dave/server", json={"gpu_memory": "16GiB"}).status_code in (201, 202)
    dave.wait_ready("dave")
    erin = platform.login("erin")
    refused = erin.api("POST", "/users/erin/server", json={"gpu_memory": "9GiB"})
    assert refused.status_code == 409, refused.text
    platform.stop()
    assert not process_alive(pid)


@pytest.mark.waits
def test_a_dead_server_gives_its_slice_back(platform: Platform) -> None:
    frank = platform.login("frank")
    assert frank.api("POST", "/users/frank/server", json={"gpu_memory": "2GiB"}).status_code in (201, 202)
    frank.wait_ready("frank")
    os.killpg(_server_pid(platform, "frank"), signal.SIGKILL)
    _wait(lambda: _released_and_recorded(platform, "frank/"), "the dead server's slice and event", timeout_s=90)
    kind, message = platform.last_event("frank/") or ("", "")
    assert (kind, message) == ("died", "the server was killed by signal 9 (not stopped through the hub)")


def test_group_quota_refuses_with_the_rule(make_platform: object) -> None:
    platform: Platform = make_platform(  # type: ignore[operator]
        groups={"ml101": {"members": ["gina", "hank"], "max_slice": "4GiB", "budget": "6GiB", "servers_per_user": 1}}
    )
    platform.start()
    gina = platform.login("gina")
    too_big = gina.api("POST", "/users/gina/server", json={"gpu_memory": "8GiB"})
    assert too_big.status_code == 403
    assert "Group 'ml101' allows slices up to 4 GiB; you asked for 8 GiB." in too_big.json()["message"]
    assert gina.api("POST", "/users/gina/server", json={"gpu_memory": "4GiB"}).status_code in (201, 202)
    hank = platform.login("hank")
    over = hank.api("POST", "/users/hank/server", json={"gpu_memory": "4GiB"})
    assert over.status_code == 403
    assert "2 GiB left" in over.json()["message"]
    assert [k for k, _, _ in platform.ledger()] == ["gina/"]


def test_a_server_that_dies_while_the_hub_restarts_gives_its_slice_back_at_once(make_platform: object) -> None:
    """JupyterHub alone would wait http_timeout (180 s) for it to answer, pending and holding its slice."""
    platform, pid = _platform_with_a_server(make_platform, "ivy", "2GiB")
    platform.kill_hub()
    os.killpg(pid, signal.SIGSTOP)  # alive but silent when the restarted hub first looks at it
    try:
        platform.start()
    finally:
        os.killpg(pid, signal.SIGKILL)
    _wait(lambda: _released_and_recorded(platform, "ivy/"), "the slice and the event", timeout_s=45, log=platform.log)
    token = platform.token("admin")
    assert admin_api(platform, token, "GET", "/users/ivy").json()["servers"] == {}
    kind, message = platform.last_event("ivy/") or ("", "")
    # Not the restarted hub's child: its exit status is not known, only that it ended.
    assert (kind, message) == (
        "died",
        "the server process ended without being stopped through the hub (killed, crashed or out of memory)",
    )
    platform.stop()


def _platform_with_a_server(make_platform: object, user: str, memory: str) -> tuple[Platform, int]:
    """A platform of its own (the test kills its hub) with one ready server, and the server's pid."""
    platform: Platform = make_platform()  # type: ignore[operator]
    platform.start()
    session = platform.login(user)
    assert session.api("POST", f"/users/{user}/server", json={"gpu_memory": memory}).status_code in (201, 202)
    session.wait_ready(user)
    return platform, _server_pid(platform, user)


def _released_and_recorded(platform: Platform, key: str) -> bool:
    """The slice is free and the server's end recorded (the release comes a moment before the event)."""
    event = platform.last_event(key)
    return platform.ledger() == [] and event is not None and event[0] != "started"


def _server_pid(platform: Platform, user: str) -> int:
    for _ in range(40):
        db = sqlite3.connect(platform.data_dir / "ledger.sqlite")
        row = db.execute("SELECT pid FROM allocation WHERE key = ?", (f"{user}/",)).fetchone()
        db.close()
        if row and row[0]:
            return int(row[0])
        time.sleep(0.25)
    raise AssertionError(f"no pid recorded for {user}")


PLATFORM_PACKAGES = ("hub", "spawner", "portal", "market", "bench", "sizes")


def _notebooks_see_only_the_kernel_hook(pid: int, env: dict[str, str]) -> None:
    """The server's Python path holds the kernel hook and nothing of the platform's (issue 13).

    The server's own interpreter, started with the server's environment as a kernel is,
    finds none of the platform's packages: a user's ``hub`` package is theirs.
    """
    repo = Path(__file__).parents[2]
    assert env["PYTHONPATH"] == str(repo / "spawner" / "kernel_hook"), env["PYTHONPATH"]
    assert not any(value == str(repo) or value.startswith(f"{repo}{os.pathsep}") for value in env.values())
    python = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    probe = "import importlib.util as u, sys; print([n for n in sys.argv[1:] if u.find_spec(n)])"
    found = subprocess.run(
        [python, "-c", probe, *PLATFORM_PACKAGES], env=env, cwd=env["HOME"], capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == "[]", found.stdout + found.stderr
    hook = subprocess.run([python, "-c", "import gpuslice_limits"], env=env, capture_output=True, text=True)
    assert hook.returncode == 0, hook.stderr


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _wait(check: object, what: str, timeout_s: float = 60, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    tail = "\n" + log.read_text(errors="replace")[-6000:] if log else ""
    raise AssertionError(f"timed out waiting for {what}{tail}")


_ = requests


def test_the_spawn_benchmark_runs_both_hubs() -> None:
    from bench.spawn import run

    result = run(runs=1)
    assert set(result["spawn_to_ready_s"]) == {"plain", "gpuslice"}
    assert result["ratio_p50"] > 0


def test_hub_kill_9_during_twenty_pending_spawns(make_platform: object) -> None:
    """Killed while a class presses Start: the restarted hub adopts every server whose process
    started (the hub had recorded none of them), frees the rest, and its stop leaves nothing."""
    platform: Platform = make_platform()  # type: ignore[operator]
    platform.start()
    token = platform.token("admin")
    users = [f"k{i:02d}" for i in range(20)]
    assert admin_api(platform, token, "POST", "/users", json={"usernames": users}).status_code == 201
    with ThreadPoolExecutor(max_workers=20) as pool:
        list(
            pool.map(
                lambda u: admin_api(platform, token, "POST", f"/users/{u}/server", json={"gpu_memory": "1GiB"}), users
            )
        )
    # Some server processes exist (recorded by the ledger the moment they do), none has answered yet or only some.
    _wait(lambda: len(_server_processes(platform)) >= 3, "three server processes to start", log=platform.log)
    platform.kill_hub()
    started = _server_processes(platform)
    platform.start()
    token = platform.token("admin")

    def settled() -> bool:
        servers = [admin_api(platform, token, "GET", f"/users/{u}").json()["servers"].get("") for u in users]
        return all(not s or not s.get("pending") for s in servers)

    _wait(settled, "every spawn to finish or be dropped after the restart", timeout_s=180, log=platform.log)
    # The restarted hub's portal logs people in: a portal left behind by the killed hub would hold
    # the port with an OAuth client secret that the new hub has replaced.
    admin = platform.login("admin")
    _wait(
        lambda: admin.get(f"{platform.url}/services/portal/", timeout=30).status_code == 200,
        "the portal to log admin in through the restarted hub",
        timeout_s=90,
        log=platform.log,
    )
    running = {
        u for u in users if admin_api(platform, token, "GET", f"/users/{u}").json()["servers"].get("", {}).get("ready")
    }
    # Servers whose process had started are adopted: the hub had not recorded them, the ledger had.
    assert {key.rstrip("/") for key, _ in started} <= running, (started, running)
    held = [key for key, _, _ in platform.ledger()]
    assert len(held) == len(set(held)), held  # no double allocation
    assert set(held) == {f"{u}/" for u in running}  # no leaked slice, none missing
    for gpu in (0, 1):
        assert sum(m for _, g, m in platform.ledger() if g == gpu) <= 16 * GiB
    for user in sorted(running)[:3]:  # reachable again through the restarted hub's proxy
        response = requests.get(
            f"{platform.url}/user/{user}/api/status", headers={"Authorization": f"token {token}"}, timeout=30
        )
        assert response.status_code == 200, (user, response.status_code)
    stopped = sorted(running)[: len(running) // 2]
    for user in stopped:  # half stopped through the API, the rest by stopping the platform
        admin_api(platform, token, "DELETE", f"/users/{user}/server")
    _wait(lambda: not {k for k, _, _ in platform.ledger()} & {f"{u}/" for u in stopped}, "their slices to go")
    pids = {pid for _, pid in started} | {pid for _, pid in _server_processes(platform)}
    platform.stop()  # fails if gpuslice up's stop left any process of the platform running
    assert not [pid for pid in pids if process_alive(pid)]
    assert _server_processes(platform) == [] and platform.ledger() == []


def _server_processes(platform: Platform) -> list[tuple[str, int]]:
    """(server, pid) of every server process the ledger records."""
    db = sqlite3.connect(platform.data_dir / "ledger.sqlite")
    try:
        return [(str(k), int(p)) for k, p in db.execute("SELECT key, pid FROM server_process ORDER BY created")]
    except sqlite3.OperationalError:
        return []  # not made yet
    finally:
        db.close()
