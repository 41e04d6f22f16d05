"""The waiting line in the ledger: atomic with the holds, and still there after a kill -9."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spawner.gpus import simulated_gpus
from spawner.inventory import build_local
from spawner.ledger import Held, Ledger, Turn
from spawner.placement import Demand
from spawner.waitline import Entry, Reservation, admit, reservation_problem

GiB = 2**30
CARDS = simulated_gpus("2x16GiB:T4")


def turn_for(key: str, gib: int, wait: bool = True) -> Turn:
    """A turn as the spawner takes it: through the line's admit, over the two cards."""
    user = key.split("/")[0]

    def turn(
        holds: list[Held], line: list[Entry], mine: Entry | None, reservations: list[Reservation]
    ) -> tuple[list[Held] | None, Entry | None]:
        now = time.time()
        arrived, priority = (mine.arrived, mine.priority) if mine else (now, 0)
        me = Entry(key, user, Demand(slice_units=float(gib * GiB)), gib * GiB, None, arrived, priority, seen=now)
        inventory = build_local(CARDS, [(h.gpu_index, h.allocation()) for h in holds])
        for a in admit([*line, me], inventory, budgets={}, group_bytes={}, now=now, reservations=reservations):
            if a.entry.key == key:
                return [Held(key, CARDS[a.choice.gpus[0]].index, user, "", gib * GiB)], None
        return None, me if wait else None

    return turn


def test_waiting_then_placed_when_room_frees(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for i in range(8):
        assert ledger.take_turn(f"u{i}/", turn_for(f"u{i}/", 4)) is not None
    assert ledger.take_turn("late/", turn_for("late/", 4)) is None
    assert [e.key for e in ledger.line()] == ["late/"]
    freed = next(h.gpu_index for h in ledger.holdings() if h.key == "u3/")
    ledger.release("u3/")
    placed = ledger.take_turn("late/", turn_for("late/", 4))
    assert placed is not None and placed[0].gpu_index == freed
    assert ledger.line() == []


def test_without_wait_nothing_is_written(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for i in range(4):
        ledger.take_turn(f"u{i}/", turn_for(f"u{i}/", 8))
    assert ledger.take_turn("late/", turn_for("late/", 4, wait=False)) is None
    assert ledger.line() == []


def test_the_line_keeps_arrival_order_and_put_first(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for i in range(4):
        ledger.take_turn(f"u{i}/", turn_for(f"u{i}/", 8))
    for name in ("ann/", "bob/", "cy/"):
        ledger.take_turn(name, turn_for(name, 4))
    ledger.take_turn("ann/", turn_for("ann/", 4))  # a later turn keeps the first arrival
    assert [e.key for e in ledger.line()] == ["ann/", "bob/", "cy/"]
    assert ledger.put_first("cy/")
    ledger.release("u0/")  # room for two of the three
    assert ledger.take_turn("bob/", turn_for("bob/", 4)) is None
    assert ledger.take_turn("cy/", turn_for("cy/", 4)) is not None
    assert ledger.take_turn("ann/", turn_for("ann/", 4)) is not None
    assert ledger.leave_line("bob/") and not ledger.leave_line("bob/")


def test_each_finished_wait_is_recorded_with_how_it_ended(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    before = time.time()
    for i in range(8):
        ledger.take_turn(f"u{i}/", turn_for(f"u{i}/", 4))
    for name in ("ann/", "bob/", "cy/"):
        assert ledger.take_turn(name, turn_for(name, 4)) is None
    assert ledger.waits(0) == []  # the direct spawns never waited; the three still wait
    ledger.release("u0/")
    assert ledger.take_turn("ann/", turn_for("ann/", 4)) is not None
    assert ledger.leave_line("bob/") and not ledger.leave_line("bob/")
    assert ledger.cancel("cy/", "tom (teacher) in the portal") is not None
    waits = ledger.waits(0)
    assert [(w.key, w.user, w.outcome) for w in waits] == [
        ("ann/", "ann", "placed"),
        ("bob/", "bob", "left"),
        ("cy/", "cy", "cancelled"),
    ]
    assert all(before <= w.queued <= w.ended <= time.time() for w in waits)
    assert ledger.waits(time.time() + 1) == []


WAITER = """
import sys, time
from spawner.ledger import Ledger
from tests.spawner.test_ledger_line import turn_for
ledger = Ledger(sys.argv[1])
ledger.take_turn("waiting/", turn_for("waiting/", 4))
print("joined", flush=True)
def stuck(holds, line, mine, reservations):
    print("inside", flush=True)
    time.sleep(600)
ledger.take_turn("half/", stuck)
"""


@pytest.mark.process
def test_the_line_survives_a_kill_9_in_the_middle_of_a_turn(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    for i in range(4):
        ledger.take_turn(f"u{i}/", turn_for(f"u{i}/", 8))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen([sys.executable, "-c", WAITER, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "joined"
    assert child.stdout.readline().strip() == "inside"  # holding the write lock
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    reopened = Ledger(path, timeout_s=5)
    assert [e.key for e in reopened.line()] == ["waiting/"]
    assert len(reopened.holdings()) == 4
    reopened.release("u0/")
    assert reopened.take_turn("waiting/", turn_for("waiting/", 4)) is not None


PROC = """
import sys, time
from pathlib import Path
from spawner.ledger import Ledger
from tests.spawner.test_ledger_line import turn_for
path, i, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
ledger = Ledger(path)
while not go.exists():
    time.sleep(0.001)
ledger.take_turn(f"p{i}/", turn_for(f"p{i}/", 5))
"""


@pytest.mark.process
def test_concurrent_arrivals_never_over_commit_and_all_are_served(tmp_path: Path) -> None:
    path, go = str(tmp_path / "ledger.sqlite"), tmp_path / "go"
    ledger = Ledger(path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", PROC, path, str(i), str(go)], env=env) for i in range(10)]
    time.sleep(1)
    go.touch()
    assert [p.wait(timeout=300) for p in procs] == [0] * 10
    assert len(ledger.holdings()) == 6 and len(ledger.line()) == 4  # three 5 GiB slices per card
    for _ in range(10):  # bounded: a line that never empties fails here instead of hanging
        if not ledger.line():
            break
        for gpu in (0, 1):
            assert sum(h.memory_bytes for h in ledger.holdings() if h.gpu_index == gpu) <= 16 * GiB
        ledger.release(ledger.holdings()[0].key)
        for e in ledger.line():
            ledger.take_turn(e.key, turn_for(e.key, 5))
    assert ledger.line() == [] and len(ledger.holdings()) == 6


def refuse(entry: object) -> None:
    raise PermissionError("sam may not change the GPU line")


def test_cancel_notes_who_and_a_refused_check_changes_nothing(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    for i in range(4):
        ledger.take_turn(f"u{i}/", turn_for(f"u{i}/", 8))
    for name in ("ann/", "bob/"):
        ledger.take_turn(name, turn_for(name, 4))
    with pytest.raises(PermissionError):
        ledger.cancel("ann/", "sam in the portal", refuse)
    with pytest.raises(PermissionError):
        ledger.put_first("bob/", refuse)
    assert [(e.key, e.priority) for e in ledger.line()] == [("ann/", 0), ("bob/", 0)]
    assert ledger.put_first("bob/", lambda e: None) and [e.priority for e in ledger.line()] == [0, 1]
    cancelled = ledger.cancel("ann/", "tom in the portal", lambda e: None)
    assert cancelled is not None and cancelled.key == "ann/"
    assert [e.key for e in ledger.line()] == ["bob/"]
    assert ledger.latest_events()["ann/"].message == "cancelled by tom in the portal"
    assert ledger.cancel("ann/", "tom") is None  # no longer waiting: nothing to cancel, nothing noted


def test_reservations_are_checked_against_the_others_inside_the_write(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")

    def problem(new: Reservation, made: list[Reservation]) -> str | None:
        return reservation_problem(new, made, 32 * GiB)

    first = ledger.reserve(Reservation("ml101", 24 * GiB, 0, 100, "tom"), problem)
    with pytest.raises(ValueError, match="would keep 40 GiB at once"):
        ledger.reserve(Reservation("cv202", 16 * GiB, 50, 150, "root"), problem)
    ledger.reserve(Reservation("cv202", 16 * GiB, 100, 150, "root"), problem)
    assert [(r.group, r.by) for r in ledger.reservations()] == [("ml101", "tom"), ("cv202", "root")]
    with pytest.raises(PermissionError):
        ledger.drop_reservation(first, refuse)
    assert ledger.drop_reservation(first) and not ledger.drop_reservation(first)
    assert [r.group for r in ledger.reservations()] == ["cv202"]
