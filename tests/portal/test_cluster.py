"""portal/data/cluster.py against a real ledger file, and the Jobs view built on it."""

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from portal import views
from portal.data import access, cluster
from portal.data.access import Scope
from portal.data.hub import ServerRow
from spawner import line_admin
from spawner.ledger import Ledger
from spawner.quotas import read_groups


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.record("ann/", "requested", 10, "asked for 4 GiB of one GPU with image default")
    ledger.record("ann/", "placed", 20, "placed: 4 GiB of GPU 0 (T4, simulated); starting the server")
    ledger.record("bo/lab", "refused", 100, "Group 'ml101' allows slices up to 4 GiB; you asked for 8 GiB.")
    return path


def test_users_read_only_their_own_events_admins_all(ledger_path: Path) -> None:
    assert set(access.events(cluster.latest_events(ledger_path), Scope("root", everyone=True))) == {"ann/", "bo/lab"}
    mine = access.events(cluster.latest_events(ledger_path), Scope("ann"))
    assert list(mine) == ["ann/"] and mine["ann/"].kind == "placed"
    assert access.events(cluster.latest_events(ledger_path.with_name("missing.sqlite")), Scope("ann")) == {}


def test_history_is_authorized_on_the_server_side(ledger_path: Path) -> None:
    assert [e.kind for e in cluster.server_history(ledger_path, Scope("ann"), "ann", "")] == ["requested", "placed"]
    assert len(cluster.server_history(ledger_path, Scope("root", everyone=True), "bo", "lab")) == 1
    with pytest.raises(PermissionError, match="only admins"):
        cluster.server_history(ledger_path, Scope("ann"), "bo", "lab")


def test_job_rows_join_hub_state_and_events(ledger_path: Path) -> None:
    started = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
    servers = [
        ServerRow("ann", "", "starting", "4GiB", 0, "default", None, None),
        ServerRow("bo", "lab", "stopped", "8GiB", 0, "default", None, None),
        ServerRow("cy", "", "running", "0", 0, "default", started, started),
        ServerRow("di", "", "stopped", "0", 0, "default", started, started),
    ]
    events = access.events(cluster.latest_events(ledger_path), Scope("root", everyone=True))
    rows = views.server_rows(servers, [], events, now_ts=started.timestamp() + 3 * 3600 + 60)
    assert [(r.state, r.progress) for r in rows] == [
        ("pending", 20),
        ("refused", None),
        ("running", None),
        ("stopped", None),
    ]
    assert rows[0].detail.startswith("placed: 4 GiB of GPU 0")
    assert rows[1].detail.startswith("Group 'ml101' allows") and rows[1].slice == "8 GiB"  # as every size is written
    assert views.duration_text(rows[2].age_s) == "3 h 1 min" and rows[2].slice == "CPU only"
    assert rows[3].age_s is None and rows[3].idle_s is None and rows[3].slice == ""


def test_who_stopped_a_server_reaches_the_jobs_row(ledger_path: Path) -> None:
    from spawner.ledger import stop_message

    with pytest.raises(PermissionError):
        cluster.note_stop(ledger_path, Scope("bo"), "ann", "")
    cluster.note_stop(ledger_path, Scope("root", everyone=True), "ann", "")
    ledger = Ledger(ledger_path)
    # What the spawner's stop() writes, reading the note the portal left just before.
    ledger.record("ann/", "stopped", 100, stop_message(ledger.history("ann/")[-1], time.time()))
    stopped = [ServerRow("ann", "", "stopped", "4GiB", 0, "default", None, None)]
    row = views.server_rows(stopped, [], access.events(cluster.latest_events(ledger_path), Scope("ann")), time.time())[
        0
    ]
    assert (row.state, row.detail) == ("stopped", "stopped by root in the portal")


def test_stop_messages_name_the_actor_where_it_is_known() -> None:
    from spawner.ledger import ServerEvent, stop_message

    note = ServerEvent("ann/", "stopping", 90, "tina in the portal", 1000.0)
    assert stop_message(note, 1010.0) == "stopped by tina in the portal"
    assert stop_message(note, 1000.0 + 600).startswith("stopped from the hub")  # an old note is not why
    started = ServerEvent("ann/", "started", 50, "answering", 0.0)
    idle = stop_message(started, 10_000.0, last_activity=10_000.0 - 3700, idle_timeout_s=3600)
    assert idle == "stopped by the idle culler: no activity for 61 min"
    recent = stop_message(started, 10_000.0, last_activity=9_990.0, idle_timeout_s=3600)
    assert recent.startswith("stopped from the hub")


def test_last_activity_is_words_never_none() -> None:
    assert views.ago_text(None, 100.0) == "never"
    assert views.ago_text(datetime.fromtimestamp(40.0, UTC), 100.0) == "1 min ago"


def test_a_server_started_again_after_a_failure_is_not_failed() -> None:
    from spawner.ledger import ServerEvent

    failed = {"ann/": ServerEvent("ann/", "died", 100, "killed", 0.0)}
    pending = views.server_rows([ServerRow("ann", "", "starting", "1GiB", 0, "default", None, None)], [], failed, 1.0)
    assert (pending[0].state, pending[0].detail) == ("pending", "spawn requested")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, ""), (-5, "0 s"), (42, "42 s"), (600, "10 min"), (7500, "2 h 5 min"), (3 * 86400 + 4 * 3600, "3 d 4 h")],
)
def test_duration_text(seconds: float | None, text: str) -> None:
    assert views.duration_text(seconds) == text


def test_the_queue_is_in_line_order_admins_see_everyone_users_their_own_place(tmp_path: Path) -> None:
    from spawner.ledger import Held
    from spawner.placement import Demand
    from spawner.waitline import Entry

    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.restore([Held("ann/", 0, "ann", "", 8 * 2**30)])  # ann holds one: her second request goes last
    slice_ = Demand(slice_units=float(4 * 2**30))
    for key, arrived in (("ann/lab", 100.0), ("bo/", 200.0), ("cy/", 300.0)):
        entry = Entry(
            key, key.split("/")[0], slice_, 4 * 2**30, "ml101", arrived, seen=arrived, label="4 GiB of one GPU"
        )
        ledger.take_turn(key, lambda holds, line, mine, reservations, e=entry: (None, e))
    admin = line_admin.waiting_line(path, Scope("root", everyone=True), now=310.0)
    assert [(w.position, w.user, w.server) for w in admin] == [(1, "bo", ""), (2, "cy", ""), (3, "ann", "lab")]
    assert [w.away for w in admin] == [True, False, True]  # not seen for over a minute
    assert admin[0].asked == "4 GiB of one GPU" and admin[0].group == "ml101" and admin[0].since == 200.0
    assert [(w.position, w.user) for w in line_admin.waiting_line(path, Scope("cy"), now=310.0)] == [(2, "cy")]
    assert line_admin.waiting_line(tmp_path / "missing.sqlite", Scope("cy"), now=0.0) == []


def test_on_kubernetes_the_queue_counts_the_servers_the_pods_hold(tmp_path: Path) -> None:
    """The ledger holds no slices there: the hub passes the pods' holds, and ann's second request goes last."""
    from spawner.ledger import Held
    from spawner.placement import Demand
    from spawner.waitline import Entry

    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    slice_ = Demand(slice_units=float(4 * 2**30))
    for key, arrived in (("ann/lab", 100.0), ("bo/", 200.0)):
        entry = Entry(key, key.split("/")[0], slice_, 4 * 2**30, None, arrived, seen=300.0)
        ledger.take_turn(key, lambda holds, line, mine, reservations, e=entry: (None, e))
    everyone = Scope("root", everyone=True)
    assert [w.user for w in line_admin.waiting_line(path, everyone, now=310.0)] == ["ann", "bo"]  # nobody holds
    pods = [Held("ann/", 0, "ann", "", 8 * 2**30)]
    kube_line = line_admin.waiting_line(path, everyone, 310.0, pods)
    assert [(w.position, w.user) for w in kube_line] == [(1, "bo"), (2, "ann")]


def test_a_least_served_class_is_queued_by_what_each_member_held_today(tmp_path: Path) -> None:
    """ann came first but held a GPU for an hour today; bo held nothing: in a least-served class bo goes first."""
    import time as clock

    from spawner.placement import Demand
    from spawner.waitline import Entry, day_start

    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    # Yesterday's noon (UTC, the line's day): an hour held before now that is all "today" at any time the
    # test runs (at the clock's now, the first 100 s after midnight would put the hour in yesterday).
    now = day_start(clock.time()) - 12 * 3600
    ledger.end_hold("ann/", "ann", "ml101", now - 3700, now - 100)
    slice_ = Demand(slice_units=float(4 * 2**30))
    for key, arrived in (("ann/", now - 60), ("bo/", now - 30)):
        entry = Entry(key, key.split("/")[0], slice_, 4 * 2**30, "ml101", arrived, seen=now)
        ledger.take_turn(key, lambda holds, line, mine, reservations, e=entry: (None, e))
    everyone = Scope("root", everyone=True)
    assert [w.user for w in line_admin.waiting_line(path, everyone, now)] == ["ann", "bo"]  # round-robin: arrival
    ordered = line_admin.waiting_line(path, everyone, now, least_served=frozenset({"ml101"}))
    assert [(w.position, w.user) for w in ordered] == [(1, "bo"), (2, "ann")]


def test_a_teacher_manages_only_their_class_in_the_line(tmp_path: Path) -> None:
    from spawner.placement import Demand
    from spawner.waitline import Entry

    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    for user, group, arrived in (("ann", "ml101", 1.0), ("bo", "cv202", 2.0)):
        entry = Entry(f"{user}/", user, Demand(slice_units=float(4 * 2**30)), 4 * 2**30, group, arrived, seen=arrived)
        ledger.take_turn(entry.key, lambda holds, line, mine, reservations, e=entry: (None, e))
    rules = read_groups([{"name": "ml101", "teachers": ["tom"]}, {"name": "cv202", "teachers": ["vic"]}])
    tom = line_admin.line_manager("tom", False, rules)
    with pytest.raises(PermissionError, match="tom teaches ml101, not cv202"):
        line_admin.put_first(path, tom, "bo", "")
    with pytest.raises(PermissionError, match="tom teaches ml101, not cv202"):
        line_admin.cancel_waiting(path, tom, "bo", "")
    assert line_admin.put_first(path, tom, "ann", "")
    assert line_admin.cancel_waiting(path, tom, "ann", "")
    assert [e.key for e in ledger.line()] == ["bo/"]
    assert ledger.latest_events()["ann/"].message == "cancelled by tom (teacher) in the portal"
    with pytest.raises(PermissionError, match="ann may not change the GPU line"):
        line_admin.cancel_waiting(path, line_admin.line_manager("ann", False, rules), "bo", "")
    assert line_admin.cancel_waiting(path, line_admin.line_manager("root", True, rules), "bo", "")


def test_reservations_from_the_portal_are_authorized_and_never_over_commit(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path)
    rules = read_groups([{"name": "ml101", "teachers": ["tom"]}])
    tom, root = line_admin.line_manager("tom", False, rules), line_admin.line_manager("root", True, rules)
    GiB = 2**30  # noqa: N806
    with pytest.raises(PermissionError):
        line_admin.reserve(path, tom, "cv202", 8 * GiB, 0, 100, 32 * GiB)
    made = line_admin.reserve(path, tom, "ml101", 24 * GiB, 0, 100, 32 * GiB)
    with pytest.raises(ValueError, match="more than the 32 GiB"):
        line_admin.reserve(path, root, "cv202", 16 * GiB, 50, 60, 32 * GiB)
    assert [(r.group, r.by) for r in line_admin.reservations(path, now=50)] == [("ml101", "tom")]
    assert line_admin.reservations(path, now=100) == []  # over
    for tried in (made, made + 1):  # hers to drop or not there at all: refused alike
        with pytest.raises(PermissionError):
            line_admin.drop_reservation(path, line_admin.line_manager("ann", False, rules), tried)
    assert line_admin.drop_reservation(path, tom, made)


def test_wait_times_are_per_class_and_day_in_the_viewers_scope(tmp_path: Path) -> None:
    from spawner.placement import Demand
    from spawner.waitline import Entry

    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    now = time.time()
    for user, group in (("ann", "ml101"), ("bo", "cv202"), ("cy", "ml101")):
        entry = Entry(f"{user}/", user, Demand(slice_units=float(4 * 2**30)), 4 * 2**30, group, now - 300, seen=now)
        ledger.take_turn(entry.key, lambda holds, line, mine, reservations, e=entry: (None, e))
        ledger.leave_line(entry.key)
    rules = read_groups([{"name": "ml101", "teachers": ["tom"]}])

    def classes(viewer: str, admin: bool = False) -> list[tuple[str | None, int]]:
        found = line_admin.wait_times(path, line_admin.line_manager(viewer, admin, rules), now - 3600)
        return [(s.group, s.waits) for s in found]

    assert classes("root", admin=True) == [("cv202", 1), ("ml101", 2)]
    assert classes("tom") == [("ml101", 2)]
    assert classes("bo") == [("cv202", 1)]  # her own wait, nobody else's
    assert classes("dan") == []
    assert line_admin.wait_times(tmp_path / "missing.sqlite", line_admin.line_manager("root", True, rules), 0) == []
