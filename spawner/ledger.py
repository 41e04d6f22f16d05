"""The local backend's allocation ledger: durable and safe under concurrency.

One SQLite file holds every slice handed out on this machine. ``allocate`` reads
what is held, asks a decision function for a placement and writes it, all inside one
``BEGIN IMMEDIATE`` transaction: SQLite's write lock makes that read-decide-write
atomic across threads and processes, so two spawns can never both take the last
free memory of a card. The file survives hub restarts (kill -9 included);
``reconcile`` then drops what no running server holds.

The same file holds the GPU waiting line (spawner/waitline.py decides its order).
``take_turn`` reads the holds and the line and writes either the placement or the
place in line in the same transaction, so an admission from the line can never race
a direct spawn for the same memory, and the line survives restarts with the holds.
Whenever a request leaves the line (placed, left, cancelled) the same transaction
writes the finished wait to the ``wait`` table (``waits``: the Overview's percentiles).
The server events cannot serve for that: they keep the latest few per server and do
not name the class charged.

``server_process`` names each local server's process (pid and start time) from the moment it
exists until it ends, whether or not the hub lived to record it: `gpuslice up` stops those
no hub claims (hub/recovery.py), and every one at a full stop.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from spawner.inventory import Allocation, Pending
from spawner.placement import Demand
from spawner.sqlite_schema import migrate
from spawner.waitline import HELD_TOO_LONG, LEFT, RELEASED, WARNED, Entry, Presence, Reservation, Wait, put_first
from spawner.words import INSTANT, instant

# Step 1 is the schema as it stood when the stores were first versioned (spawner/sqlite_schema.py);
# a change to the tables is a new step appended to SCHEMA_STEPS, never an edit of an old one.
SCHEMA = """
CREATE TABLE IF NOT EXISTS allocation (
    key TEXT NOT NULL,           -- "user/server": one row per GPU the server holds
    gpu_index INTEGER NOT NULL,
    user TEXT NOT NULL,
    server TEXT NOT NULL,
    memory_bytes INTEGER NOT NULL,
    whole INTEGER NOT NULL DEFAULT 0,
    grp TEXT,                    -- the group whose budget is charged
    pid INTEGER,                 -- the server's process, once started
    created REAL NOT NULL,
    PRIMARY KEY (key, gpu_index)
);
CREATE TABLE IF NOT EXISTS server_event (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,           -- "user/server"
    kind TEXT NOT NULL,          -- see EVENT_KINDS
    progress INTEGER NOT NULL,   -- 0-100, as in JupyterHub's progress events
    message TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS server_event_key ON server_event (key, id);
CREATE TABLE IF NOT EXISTS waiting (
    key TEXT PRIMARY KEY,        -- "user/server": a request waiting in line for a GPU
    user TEXT NOT NULL,
    demand TEXT NOT NULL,        -- JSON: gpus, slice_units, slice_fraction, models
    asked_bytes INTEGER NOT NULL,
    grp TEXT,                    -- the group whose budget it will be charged to
    arrived REAL NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    seen REAL,                   -- last time its spawn was alive and waiting
    label TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS wait (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,           -- "user/server": a request that waited in line
    user TEXT NOT NULL,
    grp TEXT,                    -- the group it was charged to
    queued REAL NOT NULL,        -- when it joined the line
    ended REAL NOT NULL,         -- when it was placed or left the line
    outcome TEXT NOT NULL        -- spawner.waitline.WAIT_OUTCOMES
);
CREATE INDEX IF NOT EXISTS wait_queued ON wait (queued);
CREATE TABLE IF NOT EXISTS reservation (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    grp TEXT NOT NULL,           -- the class the GPU memory is kept for
    memory_bytes INTEGER NOT NULL,
    start REAL NOT NULL,         -- the window, seconds since the epoch
    end_ REAL NOT NULL,
    by_ TEXT NOT NULL            -- who reserved it
);
"""
# Step 2: each local server's process, from the moment it exists (docs/platform.md#releasing-slices-and-restarts).
SERVER_PROCESS = """
CREATE TABLE IF NOT EXISTS server_process (
    pid INTEGER NOT NULL,        -- a local notebook server's process, recorded as soon as it exists
    started REAL NOT NULL,       -- its start time: after it ends, its pid may name another process
    key TEXT NOT NULL,           -- "user/server"
    url TEXT NOT NULL,           -- where it listens (a hub that restarted before it answered asks)
    unit TEXT NOT NULL DEFAULT '', -- the cgroup or systemd unit it runs in ('' for none)
    created REAL NOT NULL,
    PRIMARY KEY (pid, started)
);
"""
# Step 3: what each server last reported of its owner's presence (hub/presence.py writes it, the
# reclaimer reads it), and each hold once it ended (the least-served order counts a user's day).
PRESENCE_AND_HELD = """
CREATE TABLE IF NOT EXISTS presence (
    key TEXT PRIMARY KEY,        -- "user/server"
    reported REAL NOT NULL,      -- when the hub received the report (its clock, as every time here)
    pages INTEGER NOT NULL,      -- JupyterLab pages open that report input
    connections INTEGER NOT NULL, -- kernel websocket connections, from any client
    busy INTEGER NOT NULL,       -- a kernel runs code
    last_input REAL,             -- the latest keyboard or pointer input in a page
    last_page REAL               -- the latest time a page was seen open
);
CREATE TABLE IF NOT EXISTS held (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,           -- "user/server"
    user TEXT NOT NULL,
    grp TEXT,                    -- the group charged
    start REAL NOT NULL,         -- placed
    ended REAL NOT NULL          -- released
);
CREATE INDEX IF NOT EXISTS held_ended ON held (ended);
"""
# Ended holds are kept this long (the least-served order reads today's).
HELD_KEPT_S = 2 * 86400
# Step 4: batch jobs (spawner/jobs.py, spawner/job_ledger.py): each job with what it asked and how it went,
# its events, and which line entries are backfill jobs (docs/jobs.md); each card's last patrol (spawner/patrol.py).
JOBS = """
CREATE TABLE IF NOT EXISTS job (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user TEXT NOT NULL,          -- its owner: it runs as them
    spec TEXT NOT NULL,          -- JSON: what was asked (spawner/jobs.py JobSpec), for resubmit
    plan TEXT NOT NULL,          -- JSON: what the platform made of it at submission (spawner/jobs.py JobPlan)
    state TEXT NOT NULL,         -- spawner/jobs.py STATES
    reason TEXT NOT NULL DEFAULT '',  -- why it is in that state, in words
    exit_code INTEGER,           -- the last attempt's exit status (negative: the signal that ended it)
    attempts INTEGER NOT NULL DEFAULT 0,  -- attempts started
    failures INTEGER NOT NULL DEFAULT 0,  -- attempts that failed (retries count these)
    preemptions INTEGER NOT NULL DEFAULT 0,
    submitted REAL NOT NULL,
    started REAL,                -- the current (or last) attempt's start
    finished REAL,
    runner_pid INTEGER,          -- the process that runs and watches it (spawner/job_runner.py) and its start
    runner_started REAL,
    pid INTEGER,                 -- the job's own process and its start time
    pid_started REAL,
    unit TEXT NOT NULL DEFAULT '',      -- its cgroup or systemd scope, or its Kubernetes Job
    placed TEXT NOT NULL DEFAULT '',    -- where its GPU is, in words
    stop_kind TEXT NOT NULL DEFAULT '', -- a stop asked for: spawner/jobs.py STOP_KINDS
    stop_reason TEXT NOT NULL DEFAULT '',
    stop_asked REAL
);
CREATE INDEX IF NOT EXISTS job_user ON job (user, id);
CREATE INDEX IF NOT EXISTS job_state ON job (state);
CREATE TABLE IF NOT EXISTS job_event (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job INTEGER NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS job_event_job ON job_event (job, id);
ALTER TABLE waiting ADD COLUMN backfill INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS card_health (
    gpu_index INTEGER PRIMARY KEY, -- a card of this machine
    healthy INTEGER NOT NULL,     -- 0: its patrol failed; out of placement until an admin clears it
    message TEXT NOT NULL,        -- what the last check found
    checked REAL NOT NULL,        -- when
    cleared_by TEXT NOT NULL DEFAULT ''  -- the admin who put it back, after a failure
);
"""
# Step 5: on a cluster, the placements whose pods its listing does not count yet (spawner.inventory.Pending): the
# hub's spawns and the job dispatcher are two processes, and each must see the room the other just took.
PLACING = """
CREATE TABLE IF NOT EXISTS placing (
    key TEXT PRIMARY KEY,         -- "user/server", or "user/job:N"
    pod TEXT NOT NULL,            -- the notebook's pod, or the batch job's Job
    node TEXT NOT NULL,
    gpus TEXT NOT NULL,           -- JSON: the node's cards it holds, as the inventory indexes them
    user TEXT NOT NULL,
    server TEXT NOT NULL,
    memory_bytes INTEGER NOT NULL, -- on each of those cards
    whole INTEGER NOT NULL,
    grp TEXT,                     -- the group charged
    asked_bytes INTEGER NOT NULL, -- what the group is charged
    placed REAL NOT NULL
);
"""
SCHEMA_STEPS = (SCHEMA, SERVER_PROCESS, PRESENCE_AND_HELD, JOBS, PLACING)
PLACING_KEPT_S = 86400  # a placing row this old is gone for good (its server or job long ended)

# What happened to a server, in the order it can happen. The portal's Servers page
# reads the latest one: why a pending server waits, why a stopped one failed.
# "stopping": someone asked to stop the server (the portal writes who); the spawner then writes "stopped".
# "cancelled": someone took the request out of the GPU line (the message says who).
EVENT_KINDS = (
    "requested",
    "waiting",
    "cancelled",
    "placed",
    "started",
    "warned",
    "stopping",
    "stopped",
    "refused",
    "failed",
    "died",
)
# Finished waits are kept this long (a row each; the Overview's wait percentiles read them).
WAITS_KEPT_S = 400 * 86400
STOP_NOTE_S = 120  # a "stopping" note older than this is not why a server stops now
FAILURE_KINDS = frozenset({"refused", "failed", "died", "cancelled"})
EVENTS_KEPT_PER_SERVER = 20


@dataclass(frozen=True)
class Held:
    """One ledger row: a server's hold on one GPU."""

    key: str
    gpu_index: int
    user: str
    server: str
    memory_bytes: int
    whole: bool = False
    group: str | None = None
    pid: int | None = None

    def allocation(self) -> Allocation:
        return Allocation(self.user, self.server, self.memory_bytes, self.key, self.whole)


@dataclass(frozen=True)
class ServerEvent:
    key: str
    kind: str
    progress: int
    message: str
    created: float

    @property
    def failure(self) -> bool:
        return self.kind in FAILURE_KINDS


def stop_message(
    last: ServerEvent | None, now: float, last_activity: float | None = None, idle_timeout_s: float = 0
) -> str:
    """Who stopped a server and why, from what the ledger and the hub know at stop time.

    The portal notes who asked ("stopping"); the idle culler is the one stopping a server
    idle for longer than its timeout; otherwise the hub does not say who asked.
    """
    if last is not None and last.kind == "stopping" and now - last.created < STOP_NOTE_S:
        return f"stopped by {last.message}"
    if idle_timeout_s and last_activity is not None and now - last_activity >= idle_timeout_s:
        return f"stopped by the idle culler: no activity for {int(now - last_activity) // 60} min"
    return "stopped from the hub: by its owner or an admin, or when the platform shut down"


def reclaim_notice(latest: ServerEvent | None, now: float, stop_after_s: float, grace_s: float = 15.0) -> str | None:
    """What to tell a server's owner while the GPU line's reclaimer has warned it (None: nothing).

    ``latest``: the server's latest event; a ``warned`` one announces the stop ``stop_after_s``
    after it, and stands until then and ``grace_s`` more, while the stop is under way (then the
    server is stopped, or it was used again and the warning lapsed).
    """
    if latest is None or latest.kind != "warned" or not 0 <= now - latest.created < stop_after_s + grace_s:
        return None
    # The time the warning announced (the reader's pages show it in their own time).
    announced = INSTANT.search(latest.message)
    at = announced.group(0) if announced else instant(latest.created + stop_after_s)
    if latest.message.startswith(HELD_TOO_LONG):
        return (
            f"Others wait and you have held this GPU as long as your class allows: this server stops at {at}."
            " Save your work now."
        )
    if latest.message.startswith(WARNED[LEFT]):  # what keeps it: any input in a page (docs/platform.md#presence)
        return f"You seem to be away while others wait for a GPU: this server stops at {at} unless you come back."
    if latest.message.startswith(WARNED[RELEASED]):
        return f"You seem to have left: this server stops at {at} to free its GPU, unless you come back."
    # Short enough for JupyterLab's notification, which cuts messages after 140 characters. What
    # counts as use: spawner/lab/jupyter_server_config.py (an open page alone does not).
    return (
        f"Idle while others wait for a GPU: this server stops at {at} unless you run a cell or save."
        " Save your work now."
    )


@dataclass(frozen=True)
class ServerProcess:
    """A local server's process as the ledger records it (``server_process``)."""

    key: str
    pid: int
    started: float
    url: str  # http://IP:PORT, without the server's prefix
    unit: str = ""


def server_key(user: str, server: str) -> str:
    return f"{user}/{server}"


_T = TypeVar("_T")


class LedgerError(RuntimeError):
    """The ledger could not be read or written (disk full, read-only, locked too long)."""


# A decision sees every current hold and returns the rows to add, or None to refuse.
Decide = Callable[[list[Held]], list[Held] | None]
# A turn sees every hold, the rest of the line, this key's own place in it (None: not
# waiting) and the reservations not yet over; it returns the rows to hold now, or the entry
# to keep waiting as (or neither).
Turn = Callable[[list[Held], list[Entry], Entry | None, list[Reservation]], tuple[list[Held] | None, Entry | None]]


@dataclass
class Placing:
    """One transaction's view of a cluster's placements not yet counted by its listing: the others' (``seen``, read
    as it begins) and the ones it decides (``made``, written if it places)."""

    seen: list[Pending] = field(default_factory=list)
    made: list[Pending] = field(default_factory=list)


# A check on a line change sees the entry (or reservation) it is about; it raises PermissionError to refuse.
Check = Callable[[_T], None]


class Ledger:
    def __init__(self, path: Path | str, *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = self._connect()
        try:
            migrate(db, SCHEMA_STEPS, f"the GPU ledger {self.path}")
        finally:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN ourselves, so the lock is taken up front.
        db = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise LedgerError(f"the GPU ledger {self.path} could not be written: {exc}") from exc
        finally:
            db.close()

    def _read_only(self, read: Callable[[sqlite3.Connection], _T]) -> _T:
        """``read`` on a connection of its own; any SQLite error becomes a LedgerError."""
        db = self._connect()
        try:
            return read(db)
        except sqlite3.Error as exc:
            raise LedgerError(f"the GPU ledger {self.path} could not be read: {exc}") from exc
        finally:
            db.close()

    def holdings(self) -> list[Held]:
        return self._read_only(_read)

    def hold_starts(self) -> dict[str, tuple[float, str | None]]:
        """Each holding server: when its slice was placed (its first row's time), and the group charged."""
        query = "SELECT key, MIN(created), grp FROM allocation GROUP BY key"
        rows = self._read_only(lambda db: db.execute(query).fetchall())
        return {str(key): (float(created), grp) for key, created, grp in rows}

    def allocate(self, key: str, decide: Decide) -> list[Held] | None:
        """Atomically: replace ``key``'s holds with what ``decide`` returns (None: refuse).

        ``decide`` sees every hold except ``key``'s own, so a retried spawn never
        counts against itself.
        """
        with self._write() as db:
            db.execute("DELETE FROM allocation WHERE key = ?", (key,))
            rows = decide(_read(db))
            if rows is None:
                return None
            _insert(db, key, rows)
            return rows

    def take_turn(self, key: str, turn: Turn, placing: Placing | None = None) -> list[Held] | None:
        """Atomically: place ``key`` if ``turn`` says so (and take it out of the line), else keep
        or put it in the line as ``turn`` returns it. Returns the rows held, or None.

        ``placing`` (a cluster): filled with the others' placements before ``turn``; what ``turn`` put in its
        ``made`` is written with the placement."""
        with self._write() as db:
            db.execute("DELETE FROM allocation WHERE key = ?", (key,))
            if placing is not None:
                db.execute("DELETE FROM placing WHERE key = ?", (key,))
                placing.seen, placing.made = _read_placing(db), []
            line = _read_line(db)
            mine = next((e for e in line if e.key == key), None)
            now = time.time()
            reservations = [r for r in _read_reservations(db) if r.end > now]
            rows, waiting = turn(_read(db), [e for e in line if e.key != key], mine, reservations)
            if rows is not None:
                _insert(db, key, rows)
                if placing is not None:
                    _insert_placing(db, placing.made)
                if mine is not None:
                    _leave(db, mine, "placed", now)
                return rows
            if waiting is not None:
                _insert_entry(db, waiting)
            return None

    def line(self) -> list[Entry]:
        """Everyone waiting, in arrival order (spawner.waitline.fair_order gives the line's order)."""
        return self._read_only(_read_line)

    def leave_line(self, key: str) -> bool:
        """Take ``key`` out of the line (its spawn ended without a GPU); whether it was waiting."""
        with self._write() as db:
            mine = next((e for e in _read_line(db) if e.key == key), None)
            if mine is None:
                return False
            _leave(db, mine, "left", time.time())
            return True

    def put_first(self, key: str, check: Check[Entry] | None = None) -> bool:
        """A teacher's "put first": ``key`` goes before everyone now waiting; whether it was waiting.

        ``check`` sees the entry inside the transaction (PermissionError: nothing changes).
        """
        with self._write() as db:
            line = _read_line(db)
            mine = next((e for e in line if e.key == key), None)
            if mine is None:
                return False
            if check is not None:
                check(mine)
            first = next(e for e in put_first(line, key) if e.key == key)
            db.execute("UPDATE waiting SET priority = ? WHERE key = ?", (first.priority, key))
            return True

    def cancel(self, key: str, by: str, check: Check[Entry] | None = None) -> Entry | None:
        """Take ``key`` out of the line on someone's word, noting who (a "cancelled" event); the entry, or
        None when it was not waiting. Its waiting spawn sees it gone at its next look and ends."""
        with self._write() as db:
            mine = next((e for e in _read_line(db) if e.key == key), None)
            if mine is None:
                return None
            if check is not None:
                check(mine)
            _leave(db, mine, "cancelled", time.time())
            _insert_event(db, key, "cancelled", 100, f"cancelled by {by}")
            return mine

    def waits(self, since: float) -> list[Wait]:
        """The finished waits that began at or after ``since``, oldest first."""
        query = "SELECT key, user, grp, queued, ended, outcome FROM wait WHERE queued >= ? ORDER BY queued, id"
        rows = self._read_only(lambda db: db.execute(query, (since,)).fetchall())
        return [Wait(*row) for row in rows]

    def reservations(self) -> list[Reservation]:
        """Every reservation, earliest first (those over included until ``drop_reservation``)."""
        return self._read_only(_read_reservations)

    def reserve(self, new: Reservation, problem: Callable[[Reservation, list[Reservation]], str | None]) -> int:
        """Add ``new`` unless ``problem`` (seeing every reservation, inside the transaction) names one
        (then ValueError with it); returns its id."""
        with self._write() as db:
            why = problem(new, _read_reservations(db))
            if why:
                raise ValueError(why)
            cursor = db.execute(
                "INSERT INTO reservation (grp, memory_bytes, start, end_, by_) VALUES (?, ?, ?, ?, ?)",
                (new.group, new.memory_bytes, new.start, new.end, new.by),
            )
            return int(cursor.lastrowid or 0)

    def drop_reservation(self, reservation_id: int, check: Check[Reservation] | None = None) -> bool:
        """Remove a reservation; whether it was there."""
        with self._write() as db:
            found = next((r for r in _read_reservations(db) if r.id == reservation_id), None)
            if found is None:
                return False
            if check is not None:
                check(found)
            db.execute("DELETE FROM reservation WHERE id = ?", (reservation_id,))
            return True

    def restore(self, rows: Iterable[Held]) -> None:
        """Put back holds recorded elsewhere (the hub's spawner state) if they are missing."""
        with self._write() as db:
            for r in rows:
                db.execute(
                    "INSERT OR IGNORE INTO allocation (key, gpu_index, user, server, memory_bytes, whole, grp, pid,"
                    " created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (r.key, r.gpu_index, r.user, r.server, r.memory_bytes, int(r.whole), r.group, r.pid, time.time()),
                )

    def missing(self, rows: Iterable[Held]) -> list[Held]:
        """Those of ``rows`` the ledger does not hold (a read: no write lock taken)."""
        held = {(h.key, h.gpu_index) for h in self.holdings()}
        return [r for r in rows if (r.key, r.gpu_index) not in held]

    def set_pid(self, key: str, pid: int) -> None:
        with self._write() as db:
            db.execute("UPDATE allocation SET pid = ? WHERE key = ?", (pid, key))

    def add_process(self, process: ServerProcess) -> None:
        """Record a server's process (and its pid on the server's holds), as soon as it exists."""
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO server_process (pid, started, key, url, unit, created)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (process.pid, process.started, process.key, process.url, process.unit, time.time()),
            )
            db.execute("UPDATE allocation SET pid = ? WHERE key = ?", (process.pid, process.key))

    def processes(self) -> list[ServerProcess]:
        """Every recorded server process, oldest first (some may have ended since)."""
        query = "SELECT key, pid, started, url, unit FROM server_process ORDER BY created"
        return [ServerProcess(*row) for row in self._read_only(lambda db: db.execute(query).fetchall())]

    def forget_process(self, process: ServerProcess) -> None:
        """The process has ended (or was stopped)."""
        with self._write() as db:
            db.execute("DELETE FROM server_process WHERE pid = ? AND started = ?", (process.pid, process.started))

    def placing(self) -> list[Pending]:
        """A cluster's placements whose pods may not be counted by its listing yet (oldest first)."""
        return self._read_only(_read_placing)

    def forget_placing(self, key: str) -> None:
        """``key``'s placement is over (its server stopped, its start failed)."""
        with self._write() as db:
            db.execute("DELETE FROM placing WHERE key = ?", (key,))

    def release(self, key: str) -> int:
        """Drop ``key``'s holds; returns how many rows went (0 when it held nothing). The hold's time is kept
        (``served``), and what its server reported of its owner is forgotten."""
        with self._write() as db:
            _end_holds(db, [key])
            return db.execute("DELETE FROM allocation WHERE key = ?", (key,)).rowcount

    def reconcile(self, running: set[str]) -> list[Held]:
        """Drop the holds of every server not in ``running``; return what was dropped."""
        with self._write() as db:
            stale = [h for h in _read(db) if h.key not in running]
            _end_holds(db, sorted({h.key for h in stale}))
            db.executemany("DELETE FROM allocation WHERE key = ?", [(k,) for k in {h.key for h in stale}])
            return stale

    def end_hold(self, key: str, user: str, group: str | None, start: float, ended: float) -> None:
        """A hold the ledger did not keep (a Kubernetes pod's) ended: its time counts in ``served``."""
        with self._write() as db:
            db.execute(
                "INSERT INTO held (key, user, grp, start, ended) VALUES (?, ?, ?, ?, ?)",
                (key, user, group, start, ended),
            )
            db.execute("DELETE FROM presence WHERE key = ?", (key,))

    def served(self, since: float, now: float) -> dict[str, float]:
        """Seconds each user held a GPU from ``since`` to ``now``: ended holds and those held now (the
        least-served order's measure, ``since`` the start of the day)."""

        def read(db: sqlite3.Connection) -> dict[str, float]:
            ended = db.execute("SELECT user, start, ended FROM held WHERE ended > ?", (since,)).fetchall()
            now_held = db.execute("SELECT user, MIN(created), ? FROM allocation GROUP BY key", (now,)).fetchall()
            totals: dict[str, float] = {}
            for user, start, end in [*ended, *now_held]:
                totals[user] = totals.get(user, 0.0) + max(0.0, min(end, now) - max(start, since))
            return totals

        return self._read_only(read)

    def record_presence(self, key: str, seen: Presence) -> None:
        """What ``key``'s server reports of its owner now (hub/presence.py)."""
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO presence (key, reported, pages, connections, busy, last_input, last_page)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, seen.reported, seen.pages, seen.connections, int(seen.busy), seen.last_input, seen.last_page),
            )

    def presence(self) -> dict[str, Presence]:
        """Each server's latest presence report."""
        query = "SELECT key, reported, pages, connections, busy, last_input, last_page FROM presence"
        rows = self._read_only(lambda db: db.execute(query).fetchall())
        return {
            str(key): Presence(reported, pages, conns, bool(busy), last_input, last_page)
            for key, reported, pages, conns, busy, last_input, last_page in rows
        }

    def record(self, key: str, kind: str, progress: int, message: str) -> None:
        """Append an event to ``key``'s history, keeping the latest few."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown server event kind {kind!r}; use one of {', '.join(EVENT_KINDS)}")
        with self._write() as db:
            _insert_event(db, key, kind, progress, message)

    def history(self, key: str) -> list[ServerEvent]:
        """``key``'s events, oldest first."""
        return self._events("WHERE key = ? ORDER BY id", (key,))

    def latest_events(self) -> dict[str, ServerEvent]:
        """Each server's most recent event."""
        events = self._events("WHERE id IN (SELECT MAX(id) FROM server_event GROUP BY key)", ())
        return {e.key: e for e in events}

    def _events(self, where: str, args: tuple[object, ...]) -> list[ServerEvent]:
        query = f"SELECT key, kind, progress, message, created FROM server_event {where}"
        rows = self._read_only(lambda db: db.execute(query, args).fetchall())
        return [ServerEvent(*row) for row in rows]


def _end_holds(db: sqlite3.Connection, keys: list[str]) -> None:
    """Keep the time of ``keys``' holds, ending now, and forget their presence (a new server reports anew)."""
    now = time.time()
    for key in keys:
        db.execute(
            "INSERT INTO held (key, user, grp, start, ended)"
            " SELECT key, user, grp, MIN(created), ? FROM allocation WHERE key = ? GROUP BY key",
            (now, key),
        )
        db.execute("DELETE FROM presence WHERE key = ?", (key,))
    db.execute("DELETE FROM held WHERE ended < ?", (now - HELD_KEPT_S,))


def _insert(db: sqlite3.Connection, key: str, rows: list[Held]) -> None:
    now = time.time()
    db.executemany(
        "INSERT INTO allocation (key, gpu_index, user, server, memory_bytes, whole, grp, pid, created)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(key, r.gpu_index, r.user, r.server, r.memory_bytes, int(r.whole), r.group, r.pid, now) for r in rows],
    )


def _insert_placing(db: sqlite3.Connection, made: Iterable[Pending]) -> None:
    now = time.time()
    db.execute("DELETE FROM placing WHERE placed < ?", (now - PLACING_KEPT_S,))
    db.executemany(
        "INSERT OR REPLACE INTO placing (key, pod, node, gpus, user, server, memory_bytes, whole, grp, asked_bytes,"
        " placed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                p.key,
                p.pod,
                p.node,
                json.dumps(list(p.gpus)),
                p.allocation.user,
                p.allocation.server,
                p.allocation.memory_bytes,
                int(p.allocation.whole),
                p.group,
                p.asked_bytes,
                p.placed_at or now,
            )
            for p in made
        ],
    )


def _read_placing(db: sqlite3.Connection) -> list[Pending]:
    rows = db.execute(
        "SELECT pod, node, gpus, user, server, memory_bytes, whole, grp, asked_bytes, placed FROM placing"
        " ORDER BY placed, key"
    ).fetchall()
    return [
        Pending(pod, node, tuple(json.loads(gpus)), Allocation(user, server, held, pod, bool(whole)), grp, asked, at)
        for pod, node, gpus, user, server, held, whole, grp, asked, at in rows
    ]


def _insert_event(db: sqlite3.Connection, key: str, kind: str, progress: int, message: str) -> None:
    db.execute(
        "INSERT INTO server_event (key, kind, progress, message, created) VALUES (?, ?, ?, ?, ?)",
        (key, kind, progress, message, time.time()),
    )
    db.execute(
        "DELETE FROM server_event WHERE key = ? AND id NOT IN"
        " (SELECT id FROM server_event WHERE key = ? ORDER BY id DESC LIMIT ?)",
        (key, key, EVENTS_KEPT_PER_SERVER),
    )


def _leave(db: sqlite3.Connection, entry: Entry, outcome: str, now: float) -> None:
    """``entry`` out of the line, its wait recorded (and waits older than WAITS_KEPT_S forgotten)."""
    db.execute("DELETE FROM waiting WHERE key = ?", (entry.key,))
    db.execute(
        "INSERT INTO wait (key, user, grp, queued, ended, outcome) VALUES (?, ?, ?, ?, ?, ?)",
        (entry.key, entry.user, entry.group, entry.arrived, now, outcome),
    )
    db.execute("DELETE FROM wait WHERE queued < ?", (now - WAITS_KEPT_S,))


def _read_reservations(db: sqlite3.Connection) -> list[Reservation]:
    rows = db.execute("SELECT id, grp, memory_bytes, start, end_, by_ FROM reservation ORDER BY start, id").fetchall()
    return [Reservation(grp, size, start, end, by, rid) for rid, grp, size, start, end, by in rows]


def _insert_entry(db: sqlite3.Connection, e: Entry) -> None:
    d = e.demand
    models = sorted(d.models) if d.models is not None else None
    demand = {"gpus": d.gpus, "slice_units": d.slice_units, "slice_fraction": d.slice_fraction, "models": models}
    db.execute(
        "INSERT OR REPLACE INTO waiting (key, user, demand, asked_bytes, grp, arrived, priority, seen, label, backfill)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (e.key, e.user, json.dumps(demand), e.asked_bytes, e.group, e.arrived, e.priority, e.seen, e.label, e.backfill),
    )


def _read_line(db: sqlite3.Connection) -> list[Entry]:
    rows = db.execute(
        "SELECT key, user, demand, asked_bytes, grp, arrived, priority, seen, label, backfill FROM waiting"
        " ORDER BY arrived, key"
    ).fetchall()
    return [
        Entry(key, user, _demand(demand), asked, grp, arrived, priority, seen, label, backfill=bool(backfill))
        for key, user, demand, asked, grp, arrived, priority, seen, label, backfill in rows
    ]


@functools.lru_cache(maxsize=1024)
def _demand(text: str) -> Demand:
    """A line entry's demand from its JSON; a long line has few distinct ones (read once each: Demand is frozen)."""
    d = json.loads(text)
    models = frozenset(d["models"]) if d.get("models") is not None else None
    return Demand(gpus=d["gpus"], slice_units=d["slice_units"], slice_fraction=d["slice_fraction"], models=models)


def _read(db: sqlite3.Connection) -> list[Held]:
    rows = db.execute(
        "SELECT key, gpu_index, user, server, memory_bytes, whole, grp, pid FROM allocation ORDER BY created, key"
    ).fetchall()
    return [Held(k, g, u, s, m, bool(w), grp, pid) for k, g, u, s, m, w, grp, pid in rows]
