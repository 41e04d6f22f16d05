"""Batch jobs in the ledger's SQLite file, beside the slices and the GPU line (spawner/ledger.py).

A job's row says what was asked (``JobSpec``), what the platform made of it (``JobPlan``), its
state and why, and the processes that run it. Every change that touches the line or the slices
is one transaction with them: a job is submitted and joins the line at once; ``dispatch`` places
the jobs the line admits (their slices written, their places in line left) and marks those to stop;
``finish`` releases an attempt's slice, writes how it ended, and puts the job back in line when it
runs again. So a job is never placed twice, a slice is never held by a job that ended, and a
hub killed at any moment loses no job: queued, running and finished ones are all in the file, and
each running job's runner (spawner/job_runner.py, not a child of the hub) writes its end itself.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from spawner.jobs import (
    ACTIVE,
    CANCEL,
    CANCELLED,
    FINISHED,
    MOST_QUEUED_PER_USER,
    PREEMPT,
    QUEUED,
    RUNNING,
    SHUTDOWN,
    STARTING,
    STOPPING,
    JobPlan,
    JobSpec,
    Outcome,
    job_id_of,
    job_key,
)
from spawner.ledger import (
    Held,
    Ledger,
    Placing,
    _insert,
    _insert_entry,
    _insert_placing,
    _leave,
    _read,
    _read_line,
    _read_placing,
    _read_reservations,
)
from spawner.processes import Proc
from spawner.shares import RequestKind
from spawner.waitline import Entry, Reservation

EVENTS_KEPT_PER_JOB = 50
# Stops that would put a job back in line: a cancel asked while one is under way replaces it.
OVERRIDDEN_BY_CANCEL = (PREEMPT, SHUTDOWN)
LOG_NAME = "output.log"


@dataclass(frozen=True)
class JobRecord:
    """One job as the ledger has it."""

    id: int
    user: str
    spec: JobSpec
    plan: JobPlan
    state: str
    reason: str
    exit_code: int | None
    attempts: int
    failures: int
    preemptions: int
    submitted: float
    started: float | None
    finished: float | None
    runner: Proc | None
    process: Proc | None
    unit: str
    placed: str
    stop_kind: str
    stop_reason: str
    stop_asked: float | None

    @property
    def key(self) -> str:
        return job_key(self.user, self.id)

    @property
    def finished_for_good(self) -> bool:
        return self.state in FINISHED


@dataclass(frozen=True)
class JobEvent:
    job: int
    state: str
    message: str
    created: float


@dataclass(frozen=True)
class Stop:
    """A stop the dispatcher asks of a running job (a backfill job yielding to a person)."""

    job: int
    kind: str
    reason: str


@dataclass(frozen=True)
class Placement:
    """A job the line admits now: the slice it holds (no rows: CPU only) and where, in words."""

    job: int
    rows: list[Held]
    placed: str


@dataclass(frozen=True)
class Dispatch:
    """What one look at the line decided: jobs to start, jobs to stop, and queued jobs' reasons to wait (by id)."""

    placements: list[Placement] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)


@dataclass
class Looked:
    """The jobs one look at the line sees: the active ones, the CPU-only ones waiting (they are in no line),
    and any queued one by its key, read when asked (``load``: in the look's transaction)."""

    active: list[JobRecord]
    cpu_queued: list[JobRecord]
    load: Callable[[int], JobRecord | None]
    _read: dict[int, JobRecord] = field(default_factory=dict)

    def queued(self, key: str) -> JobRecord | None:
        job_id = job_id_of(key)
        if job_id is None:
            return None
        if job_id not in self._read:
            found = self.load(job_id)
            if found is None or found.state != QUEUED:
                return None
            self._read[job_id] = found
        return self._read[job_id]

    def by_id(self, job_id: int) -> JobRecord | None:
        return self._read.get(job_id) or next((j for j in self.cpu_queued if j.id == job_id), None)


# One look at the line: every hold, the line (jobs' entries marked present), the reservations not yet
# over, and the jobs (``Looked``); what to place and what to stop.
Decide = Callable[[list[Held], list[Entry], list[Reservation], Looked], Dispatch]
# A queued job that is in no line: a CPU-only one.
_NOT_IN_LINE = "(user || '/job:' || id) NOT IN (SELECT key FROM waiting)"
# Each look marks at least this share of the queued jobs' entries present (the stalest first): every entry
# within a few looks, far inside the line's AWAY_AFTER_S, at a cost that does not grow with the line.
PRESENCE_SHARE = 1 / 10

_COLUMNS = (
    "id, user, spec, plan, state, reason, exit_code, attempts, failures, preemptions, submitted, started, finished,"
    " runner_pid, runner_started, pid, pid_started, unit, placed, stop_kind, stop_reason, stop_asked"
)


class TooManyQueuedError(ValueError):
    """The owner already has ``MOST_QUEUED_PER_USER`` jobs waiting."""


class JobLedger(Ledger):
    """The ledger with its jobs (one SQLite file: the same transactions as the slices and the line)."""

    # -- reading ---------------------------------------------------------------------------------

    def job(self, job_id: int) -> JobRecord | None:
        rows = self._read_only(lambda db: db.execute(f"SELECT {_COLUMNS} FROM job WHERE id = ?", (job_id,)).fetchall())
        return _record(rows[0]) if rows else None

    def jobs(self, users: Iterable[str] | None = None, states: Iterable[str] | None = None) -> list[JobRecord]:
        """Jobs, newest first: of ``users`` (None: everyone's) in ``states`` (None: any)."""
        where, args = _where(users, states)
        query = f"SELECT {_COLUMNS} FROM job {where} ORDER BY id DESC"
        return [_record(row) for row in self._read_only(lambda db: db.execute(query, args).fetchall())]

    def events(self, job_id: int) -> list[JobEvent]:
        query = "SELECT job, state, message, created FROM job_event WHERE job = ? ORDER BY id"
        return [JobEvent(*row) for row in self._read_only(lambda db: db.execute(query, (job_id,)).fetchall())]

    # -- submitting ------------------------------------------------------------------------------

    def submit(self, user: str, spec: JobSpec, plan: JobPlan, entry_for: Callable[[int, float], Entry]) -> JobRecord:
        """A new job, in line at once (one transaction); TooManyQueuedError when its owner has too many waiting.

        ``entry_for(job_id, now)``: its place in the line.
        """
        with self._write() as db:
            waiting = db.execute("SELECT COUNT(*) FROM job WHERE user = ? AND state = ?", (user, QUEUED)).fetchone()[0]
            if waiting >= MOST_QUEUED_PER_USER:
                raise TooManyQueuedError(
                    f"{user} has {waiting} jobs waiting, the most one person may: cancel some or wait for them to run"
                )
            now = time.time()
            cursor = db.execute(
                "INSERT INTO job (user, spec, plan, state, reason, submitted) VALUES (?, ?, ?, ?, ?, ?)",
                (user, json.dumps(spec.to_json()), json.dumps(plan.to_json()), QUEUED, "waiting in line", now),
            )
            job_id = int(cursor.lastrowid or 0)
            if needs_gpu(plan):  # CPU only: nothing to wait for, the dispatcher starts it at its next look
                _insert_entry(db, entry_for(job_id, now))
            _event(db, job_id, QUEUED, f"submitted by {user}; waiting in line for {plan.label}")
        found = self.job(job_id)
        assert found is not None
        return found

    # -- the dispatcher's look at the line --------------------------------------------------------

    def dispatch(self, decide: Decide, placing: Placing | None = None) -> tuple[Dispatch, dict[int, JobRecord]]:
        """One atomic look at the line: the queued jobs' entries marked present (the dispatcher is their
        presence), then ``decide``'s placements written (slices held, places left, state starting) and its stops
        asked (state stopping). Returns what was decided, and the active jobs as they are after it.

        ``placing`` (a cluster): filled with the placements whose pods its listing may not count yet before
        ``decide``; those ``decide`` put in its ``made`` are written with their jobs' placements.

        A queued job is read only when ``decide`` asks for it (``Looked.queued``): a long line costs its
        entries, not its jobs' records."""
        with self._write() as db:
            now = time.time()
            _mark_present(db, now)
            looked = Looked(
                active=_select(db, "WHERE state IN (?, ?, ?)", (STARTING, RUNNING, STOPPING)),
                cpu_queued=_select(db, f"WHERE state = ? AND {_NOT_IN_LINE}", (QUEUED,)),
                load=lambda job_id: next(iter(_select(db, "WHERE id = ?", (job_id,))), None),
            )
            line = _read_line(db)
            reservations = [r for r in _read_reservations(db) if r.end > now]
            if placing is not None:
                placing.seen, placing.made = _read_placing(db), []
            decided = decide(_read(db), line, reservations, looked)
            in_line = {e.key: e for e in line}
            for placement in decided.placements:
                job = looked.by_id(placement.job)
                if job is None or job.state != QUEUED or (job.key not in in_line and needs_gpu(job.plan)):
                    continue
                _insert(db, job.key, placement.rows)
                if placing is not None:
                    _insert_placing(db, [p for p in placing.made if p.key == job.key])
                if job.key in in_line:
                    _leave(db, in_line[job.key], "placed", now)
                db.execute(
                    "UPDATE job SET state = ?, reason = ?, placed = ?, attempts = attempts + 1, started = NULL,"
                    " runner_pid = NULL, runner_started = NULL, pid = NULL, pid_started = NULL, unit = '',"
                    " stop_kind = '', stop_reason = '', stop_asked = NULL WHERE id = ?",
                    (STARTING, f"placed: {placement.placed}; starting", placement.placed, job.id),
                )
                _event(db, job.id, STARTING, f"placed: {placement.placed}")
            for job_id, why in decided.waiting.items():  # written only when it changes: a look writes little
                db.execute(
                    "UPDATE job SET reason = ? WHERE id = ? AND state = ? AND reason != ?", (why, job_id, QUEUED, why)
                )
            active = {j.id: j for j in looked.active}
            for stop in decided.stops:
                if stop.job in active and active[stop.job].state in (STARTING, RUNNING):
                    _ask_stop(db, stop.job, stop.kind, stop.reason, now)
            after = {j.id: j for j in _select(db, "WHERE state IN (?, ?, ?)", (STARTING, RUNNING, STOPPING))}
        return decided, after

    # -- a job's runner ---------------------------------------------------------------------------

    def runner_started(self, job_id: int, runner: Proc, runs: Callable[[Proc], bool]) -> JobRecord | None:
        """The runner is up: recorded, and the job as it is now (a stop may already have been asked); None when
        there is nothing for it to run, or another runner that still runs has the job (``runs``: whether one does).
        """
        with self._write() as db:
            found = _select(db, "WHERE id = ? AND state IN (?, ?)", (job_id, STARTING, STOPPING))
            other = found[0].runner if found else None
            if not found or (other is not None and other != runner and runs(other)):
                return None
            db.execute(
                "UPDATE job SET runner_pid = ?, runner_started = ? WHERE id = ?", (runner.pid, runner.started, job_id)
            )
            return _select(db, "WHERE id = ?", (job_id,))[0]

    def process_started(self, job_id: int, process: Proc, unit: str) -> JobRecord | None:
        """The job's process exists (its slice's rows name it, for the exporter); the job as it is now."""
        with self._write() as db:
            now = time.time()
            db.execute(
                "UPDATE job SET pid = ?, pid_started = ?, unit = ?, started = ?,"
                " state = CASE state WHEN ? THEN ? ELSE state END,"
                " reason = CASE state WHEN ? THEN 'running' ELSE reason END WHERE id = ?",
                (process.pid, process.started, unit, now, STARTING, RUNNING, STARTING, job_id),
            )
            found = _select(db, "WHERE id = ?", (job_id,))
            if found:
                db.execute("UPDATE allocation SET pid = ? WHERE key = ?", (process.pid, found[0].key))
                if found[0].state == RUNNING:
                    _event(db, job_id, RUNNING, f"running (attempt {found[0].attempts}, pid {process.pid})")
        return found[0] if found else None

    def unit_started(self, job_id: int, unit: str, placed: str) -> None:
        """On a cluster: the job's Job is made (its pod to come); the Job's name and where it goes recorded."""
        with self._write() as db:
            db.execute(
                "UPDATE job SET unit = ?, placed = ?, reason = ? WHERE id = ? AND state IN (?, ?)",
                (unit, placed, f"placed: {placed}; its pod starting", job_id, STARTING, STOPPING),
            )

    def unit_running(self, job_id: int) -> None:
        """On a cluster: the job's pod runs."""
        with self._write() as db:
            changed = db.execute(
                "UPDATE job SET state = ?, reason = 'running', started = ? WHERE id = ? AND state = ?",
                (RUNNING, time.time(), job_id, STARTING),
            ).rowcount
            if changed:
                _event(db, job_id, RUNNING, "running: its pod started")

    def ask_stop(
        self, job_id: int, kind: str, reason: str, check: Callable[[JobRecord], None] | None = None
    ) -> JobRecord | None:
        """Stop a job: a queued one leaves the line now (cancelled); an active one is marked stopping for its
        runner, which the caller then signals. ``check`` sees the job first (PermissionError: nothing
        changes). Returns the job as it was found (None: no such job)."""
        with self._write() as db:
            found = _select(db, "WHERE id = ?", (job_id,))
            if not found:
                return None
            job = found[0]
            if check is not None:
                check(job)
            now = time.time()
            if job.state == QUEUED and kind == CANCEL:
                entry = next((e for e in _read_line(db) if e.key == job.key), None)
                if entry is not None:
                    _leave(db, entry, "cancelled", now)
                _set_finished(db, job.id, CANCELLED, reason, None, now)
            elif job.state in ACTIVE:
                _ask_stop(db, job.id, kind, reason, now)
            return job

    def finish(self, job_id: int, outcome: Outcome, exit_code: int | None, requeue: Entry | None) -> JobRecord | None:
        """An attempt ended: its slice released, how it ended written; back in line as ``requeue`` when
        the outcome says it runs again, unless a cancel was asked meanwhile (the runner had seen an earlier
        stop). The job as it is now."""
        with self._write() as db:
            found = _select(db, "WHERE id = ?", (job_id,))
            if not found or found[0].state not in ACTIVE:
                return found[0] if found else None
            job, now = found[0], time.time()
            if job.stop_kind == CANCEL and outcome.state == QUEUED:  # cancelled while it was being stopped
                outcome = Outcome(CANCELLED, job.stop_reason or "cancelled", preempted=outcome.preempted)
            db.execute("DELETE FROM allocation WHERE key = ?", (job.key,))
            db.execute("DELETE FROM placing WHERE key = ?", (job.key,))
            db.execute(
                "UPDATE job SET failures = failures + ?, preemptions = preemptions + ?, exit_code = ?,"
                " runner_pid = NULL, runner_started = NULL, pid = NULL, pid_started = NULL, placed = '',"
                " stop_kind = '', stop_reason = '', stop_asked = NULL WHERE id = ?",
                (int(outcome.failed), int(outcome.preempted), exit_code, job_id),
            )
            if outcome.state == QUEUED and requeue is not None:
                if needs_gpu(job.plan):
                    _insert_entry(db, requeue)
                db.execute("UPDATE job SET state = ?, reason = ? WHERE id = ?", (QUEUED, outcome.reason, job_id))
                _event(db, job_id, QUEUED, outcome.reason)
            else:
                _set_finished(db, job_id, outcome.state, outcome.reason, exit_code, now)
            after = _select(db, "WHERE id = ?", (job_id,))
        return after[0]


def _mark_present(db: sqlite3.Connection, now: float) -> None:
    """The stalest tenth of the jobs' places in line (at least 50) marked present: the dispatcher is their presence."""
    count = db.execute("SELECT COUNT(*) FROM waiting WHERE key LIKE '%/job:%'").fetchone()[0]
    db.execute(
        "UPDATE waiting SET seen = ? WHERE key IN (SELECT key FROM waiting WHERE key LIKE '%/job:%'"
        " ORDER BY COALESCE(seen, arrived) LIMIT ?)",
        (now, max(50, int(count * PRESENCE_SHARE) + 1)),
    )


def needs_gpu(plan: JobPlan) -> bool:
    """Whether a job waits in the GPU line (a CPU-only one holds nothing there and never waits)."""
    return plan.request.kind is not RequestKind.CPU


def _ask_stop(db: sqlite3.Connection, job_id: int, kind: str, reason: str, now: float) -> None:
    """Mark an active job stopping. The first stop asked wins, but for a cancel during a preemption or the
    platform's stop: those would put the job back in line, and its owner wants it ended (``finish`` honours it).
    """
    preempt, shutdown = OVERRIDDEN_BY_CANCEL if kind == CANCEL else ("", "")
    changed = db.execute(
        "UPDATE job SET state = ?, stop_kind = ?, stop_reason = ?, stop_asked = COALESCE(stop_asked, ?), reason = ?"
        " WHERE id = ? AND stop_kind IN ('', ?, ?)",
        (STOPPING, kind, reason, now, f"stopping: {reason}", job_id, preempt, shutdown),
    ).rowcount
    if changed:
        _event(db, job_id, STOPPING, reason)


def _set_finished(
    db: sqlite3.Connection, job_id: int, state: str, reason: str, exit_code: int | None, now: float
) -> None:
    db.execute(
        "UPDATE job SET state = ?, reason = ?, exit_code = COALESCE(?, exit_code), finished = ? WHERE id = ?",
        (state, reason, exit_code, now, job_id),
    )
    _event(db, job_id, state, reason)


def _event(db: sqlite3.Connection, job_id: int, state: str, message: str) -> None:
    db.execute(
        "INSERT INTO job_event (job, state, message, created) VALUES (?, ?, ?, ?)",
        (job_id, state, message, time.time()),
    )
    db.execute(
        "DELETE FROM job_event WHERE job = ? AND id NOT IN"
        " (SELECT id FROM job_event WHERE job = ? ORDER BY id DESC LIMIT ?)",
        (job_id, job_id, EVENTS_KEPT_PER_JOB),
    )


def _where(users: Iterable[str] | None, states: Iterable[str] | None) -> tuple[str, tuple[object, ...]]:
    clauses, args = [], []
    for column, values in (("user", users), ("state", states)):
        if values is not None:
            wanted = list(values)
            clauses.append(f"{column} IN ({', '.join('?' for _ in wanted)})" if wanted else "0")
            args += wanted
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), tuple(args)


def _select(db: sqlite3.Connection, where: str, args: Sequence[object]) -> list[JobRecord]:
    return [_record(row) for row in db.execute(f"SELECT {_COLUMNS} FROM job {where} ORDER BY id", tuple(args))]


def _proc(pid: int | None, started: float | None) -> Proc | None:
    return Proc(pid, started) if pid is not None and started is not None else None


def _record(row: Sequence[object]) -> JobRecord:
    (job_id, user, spec, plan, state, reason, exit_code, attempts, failures, preemptions, submitted, started) = row[:12]
    (finished, runner_pid, runner_started, pid, pid_started, unit, placed, stop_kind, stop_reason, asked) = row[12:]
    return JobRecord(
        id=int(job_id),  # type: ignore[call-overload]
        user=str(user),
        spec=JobSpec.stored(json.loads(str(spec))),
        plan=JobPlan.from_json(json.loads(str(plan))),
        state=str(state),
        reason=str(reason),
        exit_code=None if exit_code is None else int(exit_code),  # type: ignore[call-overload]
        attempts=int(attempts),  # type: ignore[call-overload]
        failures=int(failures),  # type: ignore[call-overload]
        preemptions=int(preemptions),  # type: ignore[call-overload]
        submitted=float(submitted),  # type: ignore[arg-type]
        started=None if started is None else float(started),  # type: ignore[arg-type]
        finished=None if finished is None else float(finished),  # type: ignore[arg-type]
        runner=_proc(runner_pid, runner_started),  # type: ignore[arg-type]
        process=_proc(pid, pid_started),  # type: ignore[arg-type]
        unit=str(unit),
        placed=str(placed),
        stop_kind=str(stop_kind),
        stop_reason=str(stop_reason),
        stop_asked=None if asked is None else float(asked),  # type: ignore[arg-type]
    )
