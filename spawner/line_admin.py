"""The GPU line as people manage it: who waits where, wait times, put first, cancel, reserve.

Read and changed in the ledger's SQLite file by the hub's line API (hub/line_api.py), on both
backends: the portal asks the hub, and never opens the file itself. Who may see what is
``Viewer.sees`` (spawner/scope.py's ``Scope``); who may change what is ``may_manage``
(spawner/waitline.py), checked again inside the ledger's transaction. The JSON forms are what
the hub's API sends and the portal reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from spawner.ledger import Held, Ledger, server_key
from spawner.quotas import GroupRules
from spawner.waitline import (
    Entry,
    Manager,
    Reservation,
    WaitStats,
    day_start,
    may_manage,
    positions,
    reservation_problem,
    sees_wait,
    wait_stats,
    with_served,
)

WAIT_DAYS = 14  # how many days of wait times the Queue's readers get (the Overview; the hub's API by default)


class Viewer(Protocol):
    def sees(self, user: str) -> bool: ...


@dataclass(frozen=True)
class Waiting:
    """One request in the GPU line, as the Queue view shows it."""

    position: int
    user: str
    server: str
    asked: str
    group: str | None
    since: float  # arrival, seconds since the epoch
    away: bool  # its spawn has not looked at the line for a while (hub restarted, spawn lost)
    estimated_start: float | None = None  # from its waiting spawn, where the hub holds one (None: unknown)


def waiting_line(
    ledger_path: Path,
    viewer: Viewer,
    now: float,
    holds: Iterable[Held] | None = None,
    least_served: frozenset[str] = frozenset(),
) -> list[Waiting]:
    """The GPU line in its order: the places of the people the viewer sees (admins: all).

    ``holds``: what the cluster holds, where that is not the ledger's rows (on Kubernetes the
    pods: the hub's spawner lists them); a user's running GPU servers put their next request
    behind those of people who hold none (round-robin between users), as the spawns see it.
    ``least_served``: the classes whose requests are ordered by what their members held today.
    """
    if not ledger_path.exists():
        return []
    ledger = Ledger(ledger_path)
    line = ledger.line()
    if any(e.group in least_served for e in line):
        line = with_served(line, least_served, ledger.served(day_start(now), now))
    held: dict[str, set[str]] = {}
    for h in ledger.holdings() if holds is None else holds:
        held.setdefault(h.user, set()).add(h.key)
    places = positions(line, {user: len(keys) for user, keys in held.items()})
    rows = [
        Waiting(places[e.key], e.user, e.key.split("/", 1)[1], e.label, e.group, e.arrived, e.away(now))
        for e in line
        if viewer.sees(e.user)
    ]
    return sorted(rows, key=lambda w: w.position)


def wait_times(ledger_path: Path, manager: Manager, since: float) -> list[WaitStats]:
    """Wait-time percentiles per class and day since ``since``, of the waits the viewer may see
    (admins every class, a teacher their classes, anyone else their own waits)."""
    if not ledger_path.exists():
        return []
    return wait_stats(w for w in Ledger(ledger_path).waits(since) if sees_wait(manager, w))


def line_manager(viewer: str, admin: bool, rules: Iterable[GroupRules]) -> Manager:
    """Who acts on the line: an admin, or the teacher of the classes whose rules list them under ``teachers``."""
    taught = frozenset(r.name for r in rules if viewer in r.teachers)
    return Manager(viewer, admin=admin, classes=taught)


def _allowed(manager: Manager) -> Callable[[Entry], None]:
    def check(entry: Entry) -> None:
        why = may_manage(manager, entry.group, f"{entry.user}'s request")
        if why:
            raise PermissionError(why)

    return check


def _no_students(manager: Manager) -> None:
    """Refused before the ledger is opened: someone who neither administers nor teaches."""
    if not manager.admin and not manager.classes:
        raise PermissionError(may_manage(manager, None))


def put_first(ledger_path: Path, manager: Manager, user: str, server: str) -> bool:
    """Put a waiting request first (admins; a class's teachers for their class); whether it was waiting."""
    _no_students(manager)
    return ledger_path.exists() and Ledger(ledger_path).put_first(server_key(user, server), _allowed(manager))


def cancel_waiting(ledger_path: Path, manager: Manager, user: str, server: str) -> bool:
    """Take a request out of the line, noting who; the waiter's page then says so. Whether it was waiting."""
    _no_students(manager)
    if not ledger_path.exists():
        return False
    by = f"{manager.name} ({'admin' if manager.admin else 'teacher'}) in the portal"
    return Ledger(ledger_path).cancel(server_key(user, server), by, _allowed(manager)) is not None


def reservations(ledger_path: Path, now: float) -> list[Reservation]:
    """The reservations not yet over (class names and sizes are not personal: everyone may see them)."""
    return [r for r in Ledger(ledger_path).reservations() if r.end > now] if ledger_path.exists() else []


def reserve(
    ledger_path: Path, manager: Manager, group: str, size: int, start: float, end: float, capacity_bytes: int
) -> int:
    """Reserve ``size`` bytes for ``group`` from ``start`` to ``end``; PermissionError or ValueError (why) if not."""
    why = may_manage(manager, group, f"reservations for {group or 'a class'}")
    if why:
        raise PermissionError(why)
    new = Reservation(group, size, start, end, manager.name)
    return Ledger(ledger_path).reserve(new, lambda made, old: reservation_problem(made, old, capacity_bytes))


def drop_reservation(ledger_path: Path, manager: Manager, reservation_id: int) -> bool:
    """Remove a reservation (admins; the teachers of its class)."""
    _no_students(manager)  # whether the id exists or not: a student learns nothing by trying ids

    def check(found: Reservation) -> None:
        why = may_manage(manager, found.group, f"reservations for {found.group}")
        if why:
            raise PermissionError(why)

    return ledger_path.exists() and Ledger(ledger_path).drop_reservation(reservation_id, check)


# -- JSON, as the hub's line API sends it -------------------------------------------------

Row = TypeVar("Row", Waiting, WaitStats, Reservation)


def to_json(rows: Iterable[Waiting | WaitStats | Reservation]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]


def from_json(kind: type[Row], items: Any) -> list[Row]:
    """Rows of ``kind`` from the API's JSON; ValueError naming what is wrong (a hub of another version)."""
    if not isinstance(items, list):
        raise ValueError(f"expected a list of {kind.__name__} rows, got {type(items).__name__}")
    names = {f.name for f in fields(kind)}
    rows = []
    for item in items:
        if not isinstance(item, dict) or not set(item) <= names:
            raise ValueError(f"not a {kind.__name__} row: {item!r} (is the hub running the same gpuslice version?)")
        try:
            rows.append(kind(**item))
        except TypeError as exc:
            raise ValueError(f"not a {kind.__name__} row: {item!r} ({exc})") from exc
    return rows
