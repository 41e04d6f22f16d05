import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spawner.ledger import SCHEMA_STEPS, Held, Ledger, LedgerError, ServerProcess, server_key
from spawner.sqlite_schema import migrate

GiB = 2**30
CARD = 16 * GiB


def first_fit(key: str, user: str, amount: int, cards: int = 2):
    """A decision like the spawner's: the first card with room, or refuse."""

    def decide(holds: list[Held]) -> list[Held] | None:
        for gpu in range(cards):
            used = sum(h.memory_bytes for h in holds if h.gpu_index == gpu)
            if used + amount <= CARD:
                return [Held(key, gpu, user, "", amount)]
        return None

    return decide


def test_allocate_release_and_read_back(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert ledger.allocate("a/", first_fit("a/", "a", 4 * GiB)) == [Held("a/", 0, "a", "", 4 * GiB)]
    ledger.set_pid("a/", 1234)
    assert ledger.holdings() == [Held("a/", 0, "a", "", 4 * GiB, pid=1234)]
    assert ledger.release("a/") == 1
    assert ledger.release("a/") == 0
    assert ledger.holdings() == []


def test_server_processes_are_recorded_by_pid_and_start_time(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.allocate("a/", first_fit("a/", "a", 4 * GiB))
    first = ServerProcess("a/", 1234, 100.5, "http://127.0.0.1:5000")
    reused = ServerProcess("b/", 1234, 900.25, "http://127.0.0.1:6000", unit="gpuslice-b")  # the pid, later
    ledger.add_process(first)
    ledger.add_process(reused)
    assert ledger.processes() == [first, reused]
    assert ledger.holdings() == [Held("a/", 0, "a", "", 4 * GiB, pid=1234)]  # the hold names its process
    ledger.forget_process(first)
    assert ledger.processes() == [reused]


def test_a_refusal_writes_nothing_and_an_exception_rolls_back(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.allocate("a/", first_fit("a/", "a", 4 * GiB))
    assert ledger.allocate("b/", lambda holds: None) is None

    def boom(holds: list[Held]) -> list[Held]:
        raise RuntimeError("quota")

    with pytest.raises(RuntimeError):
        ledger.allocate("a/", boom)  # would have replaced a's hold
    assert [h.key for h in ledger.holdings()] == ["a/"]


def test_a_retry_does_not_count_against_itself(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.allocate("a/", first_fit("a/", "a", 16 * GiB, cards=1))
    assert ledger.allocate("a/", first_fit("a/", "a", 16 * GiB, cards=1)) is not None
    assert len(ledger.holdings()) == 1


def test_fifty_threads_never_overcommit(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    start = threading.Barrier(50)
    results: list[object] = []

    def spawn(i: int) -> None:
        key = server_key(f"u{i}", "")
        start.wait()
        results.append(ledger.allocate(key, first_fit(key, f"u{i}", 3 * GiB)))

    threads = [threading.Thread(target=spawn, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    granted = [r for r in results if r]
    assert len(granted) == 10  # five 3 GiB slices per 16 GiB card
    for gpu in (0, 1):
        assert sum(h.memory_bytes for h in ledger.holdings() if h.gpu_index == gpu) <= CARD


CHILD = """
import sys, time
from pathlib import Path
from spawner.ledger import Held, Ledger, server_key
path, i, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
ledger = Ledger(path)
key = server_key(f"p{i}", "")
def decide(holds):
    for gpu in (0, 1):
        if sum(h.memory_bytes for h in holds if h.gpu_index == gpu) + 5 * 2**30 <= 16 * 2**30:
            return [Held(key, gpu, f"p{i}", "", 5 * 2**30)]
    return None
while not go.exists():
    time.sleep(0.001)
ledger.allocate(key, decide)
"""


@pytest.mark.process
def test_separate_processes_never_overcommit(tmp_path: Path) -> None:
    path, go = str(tmp_path / "ledger.sqlite"), tmp_path / "go"
    Ledger(path)
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, path, str(i), str(go)], env=env) for i in range(12)]
    time.sleep(1)  # let them all reach the start line
    go.touch()
    assert [p.wait(timeout=300) for p in procs] == [0] * 12
    holds = Ledger(path).holdings()
    assert len(holds) == 6  # three 5 GiB slices per card
    for gpu in (0, 1):
        assert sum(h.memory_bytes for h in holds if h.gpu_index == gpu) <= CARD


def test_reconcile_drops_what_is_not_running(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for user in ("a", "b", "c"):
        ledger.allocate(f"{user}/", first_fit(f"{user}/", user, GiB))
    dropped = ledger.reconcile({"b/"})
    assert sorted(h.key for h in dropped) == ["a/", "c/"]
    assert [h.key for h in ledger.holdings()] == ["b/"]


def test_restore_puts_back_only_what_is_missing(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    hold = Held("a/", 1, "a", "", GiB, group="ml101", pid=7)
    ledger.restore([hold])
    ledger.restore([hold])
    assert ledger.holdings() == [hold]


def test_survives_reopening(tmp_path: Path) -> None:
    Ledger(tmp_path / "ledger.sqlite").allocate("a/", first_fit("a/", "a", GiB))
    assert len(Ledger(tmp_path / "ledger.sqlite").holdings()) == 1


def test_a_read_only_ledger_gives_a_clear_error_and_keeps_its_rows(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.allocate("a/", first_fit("a/", "a", GiB))
    readonly = Ledger.__new__(Ledger)
    readonly.path, readonly.timeout_s = ledger.path, 1.0
    readonly._connect = lambda: __import__("sqlite3").connect(  # type: ignore[method-assign]
        f"file:{ledger.path}?mode=ro", uri=True, isolation_level=None
    )
    with pytest.raises(LedgerError, match="could not be written"):
        readonly.allocate("b/", first_fit("b/", "b", GiB))
    assert [h.key for h in ledger.holdings()] == ["a/"]


def test_server_events_keep_the_latest_few_and_the_latest_per_server(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.record("ann/", "requested", 10, "asked for 4 GiB")
    ledger.record("ann/", "placed", 20, "placed: 4 GiB of GPU 0")
    ledger.record("bob/", "refused", 100, "Nothing can hold 8 GiB")
    latest = ledger.latest_events()
    assert {k: (e.kind, e.failure) for k, e in latest.items()} == {
        "ann/": ("placed", False),
        "bob/": ("refused", True),
    }
    for i in range(30):
        ledger.record("ann/", "stopped", 100, f"stop {i}")
    history = ledger.history("ann/")
    assert len(history) == 20 and history[-1].message == "stop 29" and history[0].message == "stop 10"
    assert [e.kind for e in ledger.history("bob/")] == ["refused"]


def test_an_unknown_event_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown server event kind 'exploded'"):
        Ledger(tmp_path / "ledger.sqlite").record("ann/", "exploded", 0, "")


def test_a_ledger_from_before_server_processes_were_recorded_gains_their_table(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    migrate(db, SCHEMA_STEPS[:1], "old")  # as the release before this one left it
    db.execute(
        "INSERT INTO allocation (key, gpu_index, user, server, memory_bytes, created) VALUES ('a/', 0, 'a', '', 1, 0)"
    )
    db.close()
    ledger = Ledger(path)
    assert [h.key for h in ledger.holdings()] == ["a/"] and ledger.processes() == []
    ledger.add_process(ServerProcess("a/", 7, 1.0, "http://127.0.0.1:1"))
    assert ledger.processes() == [ServerProcess("a/", 7, 1.0, "http://127.0.0.1:1")]


def test_the_time_each_user_held_today_counts_ended_holds_and_those_held_now(tmp_path: Path) -> None:
    import time as clock

    from spawner.waitline import Presence

    ledger = Ledger(tmp_path / "ledger.sqlite")
    now = clock.time()
    ledger.allocate("ann/", lambda holds: [Held("ann/", 0, "ann", "", 4 * 2**30)])
    ledger.record_presence("ann/", Presence(now, pages=1))
    ledger.end_hold("bo/", "bo", None, now - 7200, now - 3600)  # a pod's hour (Kubernetes)
    ledger.end_hold("cy/", "cy", None, now - 90000, now - 87000)  # yesterday's, before the day began
    assert ledger.served(now - 4000, now + 10) == pytest.approx({"ann": 10.0, "bo": 400.0}, abs=1.0)
    assert "ann/" in ledger.presence()
    ledger.release("ann/")
    later = clock.time()
    assert ledger.served(now - 4000, later)["ann"] == pytest.approx(later - now, abs=1.0)  # kept once ended
    assert "ann/" not in ledger.presence()  # a new server of hers reports anew
