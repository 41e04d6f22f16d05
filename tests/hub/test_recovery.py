import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub.recovery import Plan, alive, plan, reconcile, running_servers, stop_servers
from spawner.cgroupfs import detect
from spawner.cgroups import Limits
from spawner.confinement import CgroupFiles, Server, unit_name
from spawner.ledger import Held, Ledger, ServerProcess
from spawner.processes import identify
from tests.e2e.platform import process_alive

GiB = 2**30


def hub_db(path: Path, servers: list[tuple[str, str, int | None, bool]]) -> Path:
    """A database with JupyterHub's users/spawners tables (the columns recovery reads)."""
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
        "CREATE TABLE spawners (id INTEGER PRIMARY KEY, user_id INTEGER, server_id INTEGER, state TEXT, name TEXT);"
    )
    for i, (user, name, pid, running) in enumerate(servers, start=1):
        db.execute("INSERT INTO users VALUES (?, ?)", (i, user))
        state = json.dumps({"pid": pid}) if pid else None
        db.execute("INSERT INTO spawners VALUES (?, ?, ?, ?, ?)", (i, i, i if running else None, state, name))
    db.commit()
    db.close()
    return path


def test_running_servers_reads_the_hub_database(tmp_path: Path) -> None:
    path = hub_db(tmp_path / "hub.sqlite", [("a", "", 11, True), ("b", "gpu", 12, True), ("c", "", None, False)])
    assert running_servers(path) == {"a/": 11, "b/gpu": 12}
    assert running_servers(tmp_path / "missing.sqlite") == {}


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)


def _recorded(ledger: Ledger, key: str, proc: subprocess.Popen[bytes]) -> ServerProcess:
    found = identify(proc.pid)
    assert found is not None
    process = ServerProcess(key, found.pid, found.started, "http://127.0.0.1:1")
    ledger.add_process(process)
    return process


@pytest.mark.process
def test_reconcile_keeps_claimed_servers_and_stops_orphans(tmp_path: Path) -> None:
    live, adopted, orphan, stale = _sleeper(), _sleeper(), _sleeper(), _sleeper()
    said: list[str] = []
    try:
        ledger = Ledger(tmp_path / "ledger.sqlite")
        ledger.restore(
            [
                Held("live/", 0, "live", "", GiB),
                Held("dead/", 0, "dead", "", GiB),  # recorded, but its process is gone
                Held("adopted/", 0, "adopted", "", GiB),  # the hub was killed before it recorded the pid
                Held("orphan/", 1, "orphan", "", GiB),  # started, but the hub says it is not running
                Held("pending/", 1, "pending", "", GiB),  # hub died before the process started
            ]
        )
        for key, proc in (("live/", live), ("adopted/", adopted), ("orphan/", orphan), ("live/", stale)):
            _recorded(ledger, key, proc)
        path = hub_db(
            tmp_path / "hub.sqlite",
            [("live", "", live.pid, True), ("dead", "", 999_999_999, True), ("adopted", "", None, True)],
        )
        dropped = reconcile(ledger, path, said.append)
        assert sorted(h.key for h in dropped) == ["dead/", "orphan/", "pending/"]
        assert sorted(h.key for h in ledger.holdings()) == ["adopted/", "live/"]
        # Stopped (psutil reaped them: this test is their parent, as the hub is a server's).
        assert not process_alive(orphan.pid) and not process_alive(stale.pid)
        assert process_alive(live.pid) and process_alive(adopted.pid)
        assert sorted(p.key for p in ledger.processes()) == ["adopted/", "live/"]
        assert f"gpuslice: stopped the server of orphan/ (pid {orphan.pid}): no hub claims it" in "\n".join(said)
        assert f"gpuslice: stopped the server of live/ (pid {stale.pid})" in "\n".join(said)  # an older one of live/
    finally:
        for p in (live, adopted, orphan, stale):
            p.kill()
            p.wait()


@pytest.mark.process
def test_a_recorded_pid_that_now_names_another_process_is_left_alone(tmp_path: Path) -> None:
    stranger = _sleeper()
    try:
        ledger = Ledger(tmp_path / "ledger.sqlite")
        found = identify(stranger.pid)
        assert found is not None
        ledger.add_process(ServerProcess("gone/", stranger.pid, found.started - 100, "http://127.0.0.1:1"))
        reconcile(ledger, hub_db(tmp_path / "hub.sqlite", []), lambda _: None)
        assert stranger.poll() is None
        assert ledger.processes() == []  # the record's process has ended
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.process
def test_a_full_stop_ends_every_server_left_and_releases_its_slice(tmp_path: Path) -> None:
    left = _sleeper()
    said: list[str] = []
    try:
        ledger = Ledger(tmp_path / "ledger.sqlite")
        ledger.restore([Held("left/", 0, "left", "", GiB), Held("other/", 1, "other", "", GiB)])
        _recorded(ledger, "left/", left)
        released = stop_servers(ledger, said.append)
        assert [h.key for h in released] == ["left/"]
        assert not process_alive(left.pid)
        assert ledger.processes() == [] and [h.key for h in ledger.holdings()] == ["other/"]
        assert said == [f"gpuslice: stopped the server of left/ (pid {left.pid}): the hub left it running"]
    finally:
        left.kill()
        left.wait()


@pytest.mark.process
def test_a_pid_the_hub_recorded_before_a_reboot_is_forgotten_not_adopted(tmp_path: Path) -> None:
    """After a reboot (or a restore on another machine) the pid the hub recorded names another process:
    the hub must neither adopt it (its slice is released) nor stop it (the database forgets the pid)."""
    stranger = _sleeper()
    said: list[str] = []
    try:
        ledger = Ledger(tmp_path / "ledger.sqlite")
        ledger.restore([Held("amy/", 0, "amy", "", GiB)])
        found = identify(stranger.pid)
        assert found is not None
        # Amy's server, as recorded before the reboot: the same pid, another process (an earlier start).
        ledger.add_process(ServerProcess("amy/", stranger.pid, found.started - 3600, "http://127.0.0.1:1"))
        path = hub_db(tmp_path / "hub.sqlite", [("amy", "", stranger.pid, True)])
        assert [h.key for h in reconcile(ledger, path, said.append)] == ["amy/"]
        assert stranger.poll() is None
        assert running_servers(path) == {"amy/": 0}  # still said started, with no pid: JupyterHub clears it
        assert said == [f"gpuslice: the server of amy/ is gone; pid {stranger.pid} is another process now, left alone"]
    finally:
        stranger.kill()
        stranger.wait()


def test_the_plan() -> None:
    """Pure: which servers stay live, which processes are orphans, which records have ended."""
    a, b, c, d = (ServerProcess(k, pid, 1.0, "u") for k, pid in (("a/", 1), ("b/", 2), ("c/", 3), ("a/", 4)))
    decided = plan({"a/": 1, "b/": 0, "x/": 9, "c/": 7}, {1, 7, 9}, [a, b, c, d], {a, b, d})
    assert decided.live == {"a/", "b/", "x/"}  # x/: an older server with no process record
    assert decided.mistaken == {"c/"}  # pid 7 runs, but c/'s process was pid 3 (ended)
    assert decided.orphans == [d]  # a/'s second process: the hub claims pid 1
    assert decided.ended == [c]
    # b/'s pid never recorded and two of its processes run: the newest is adopted, the other stopped.
    older, newer = ServerProcess("b/", 5, 1.0, "u"), ServerProcess("b/", 6, 2.0, "u")
    assert plan({"b/": 0}, set(), [older, newer], {older, newer}) == Plan({"b/"}, [older], [], set())


def test_alive() -> None:
    assert alive(os.getpid())
    assert not alive(0) and not alive(999_999_999)


@pytest.mark.process
def test_a_server_cgroup_no_hub_claims_is_emptied_and_removed(tmp_path: Path) -> None:
    """A server whose process the ledger never recorded (the hub died in between) is still found: in its cgroup."""
    hierarchy = detect()
    if hierarchy is None or hierarchy.version != 1:
        pytest.skip("needs root and the cgroup v1 controllers (as CI runs)")
    confinement = CgroupFiles(hierarchy, f"test-{os.getpid()}")
    ledger = Ledger(tmp_path / "ledger.sqlite")
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    kept_name, lost_name = unit_name("t", "kept/", 1.0), unit_name("t", "lost/", 2.0)
    kept = subprocess.Popen(confinement.command(Server(kept_name, Limits(), set()), [], sleep), start_new_session=True)
    lost = subprocess.Popen(confinement.command(Server(lost_name, Limits(), set()), [], sleep), start_new_session=True)
    said: list[str] = []
    try:
        # Until each has become the sleep: while confined_start.py mounts its private /tmp, a `mount`
        # child is in the cgroup too, and the count said would be 2.
        _wait_for(lambda: _runs_alone(confinement, kept_name, kept) and _runs_alone(confinement, lost_name, lost))
        found = identify(kept.pid)
        assert found is not None
        ledger.add_process(ServerProcess("kept/", kept.pid, found.started, "http://127.0.0.1:1", kept_name))
        reconcile(ledger, hub_db(tmp_path / "hub.sqlite", [("kept", "", kept.pid, True)]), said.append, confinement)
        assert confinement.names() == {kept_name} and kept.poll() is None
        assert lost.wait(timeout=30) == -9
        assert said == [f"gpuslice: ended 1 process(es) in {lost_name} (cgroup v1): no hub claims it"]
        stop_servers(ledger, said.append, confinement)  # a full stop: none left
        assert confinement.names() == set() and not process_alive(kept.pid)
    finally:
        for proc in (kept, lost):
            proc.kill()
            proc.wait()
        for name in confinement.names():
            confinement.remove(name)


def _runs_alone(confinement: CgroupFiles, name: str, process: subprocess.Popen[bytes]) -> bool:
    """The cgroup holds the one process, and it has become its command (the sleep)."""
    try:
        command = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    except OSError:
        return False
    return confinement.pids(name) == {process.pid} and b"time.sleep" in command


def _wait_for(check: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    assert check(), "timed out"  # type: ignore[operator]
