"""Bring the ledger and the servers' processes back in line with the hub before it starts.

After a crash (kill -9 of the hub included) the ledger may hold slices of servers
that never finished starting, or that died while the hub was down, and processes may run
that no hub will ever look after. The hub's database says which servers it believes run,
with each one's process id; the ledger names every server process from the moment it
exists (``server_process``). A server the database claims (by its process id, or, for one
whose start the hub never finished recording, by the ledger's process of that server) is
kept, for the restarted hub to adopt. Every other recorded process still running is an
orphan: it is stopped with everything it started and its slice released, and the log says
so. After the machine restarted, or the state was restored on another, a pid the database
recorded may name some other process: the database forgets it, so that the hub neither
adopts nor stops that process. At a full stop of the platform, ``stop_servers`` ends
whatever the hub left running.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spawner.confinement import Confinement
from spawner.job_ledger import JobLedger
from spawner.jobs import ACTIVE, GRACE_S, SHUTDOWN, Ending, line_entry, outcome
from spawner.ledger import Held, Ledger, ServerProcess, server_key
from spawner.processes import Proc, running, stop_trees


def running_servers(hub_db: Path) -> dict[str, int]:
    """user/server -> pid (0 when not recorded) for every server the hub's database records as running."""
    if not hub_db.exists():
        return {}
    db = sqlite3.connect(f"file:{hub_db}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT users.name, spawners.name, spawners.state FROM spawners"
            " JOIN users ON users.id = spawners.user_id WHERE spawners.server_id IS NOT NULL"
        ).fetchall()
    except sqlite3.Error:
        return {}  # a fresh or foreign database: nothing is known to run
    finally:
        db.close()
    running = {}
    for user, name, state in rows:
        pid = int((json.loads(state) if state else {}).get("pid") or 0)
        running[server_key(user, name or "")] = pid
    return running


def forget_pids(hub_db: Path, keys: set[str]) -> None:
    """JupyterHub's record of these servers' pids dropped (before it starts): it then finds them stopped."""
    db = sqlite3.connect(hub_db)
    try:
        rows = db.execute(
            "SELECT spawners.id, users.name, spawners.name, spawners.state FROM spawners"
            " JOIN users ON users.id = spawners.user_id WHERE spawners.server_id IS NOT NULL"
        ).fetchall()
        for spawner_id, user, name, state in rows:
            if server_key(user, name or "") in keys:
                kept = {k: v for k, v in (json.loads(state) if state else {}).items() if k != "pid"}
                db.execute("UPDATE spawners SET state = ? WHERE id = ?", (json.dumps(kept), spawner_id))
        db.commit()
    finally:
        db.close()


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Plan:
    live: set[str]  # servers the restarted hub will find running: their slices stay
    orphans: list[ServerProcess]  # running, but no hub claims them: stop them
    ended: list[ServerProcess]  # recorded, no longer running: forget them
    # The hub's claim names a pid that another process has now (the machine restarted, or the state was
    # restored on another one): JupyterHub must forget that pid, or it would poll that process and stop it.
    mistaken: set[str] = field(default_factory=set)


def plan(
    recorded: dict[str, int], alive_pids: set[int], processes: list[ServerProcess], still_running: set[ServerProcess]
) -> Plan:
    """What to keep, stop and forget (pure).

    ``recorded``: the hub database's running servers and their pids (0: the hub was killed
    before it recorded one); ``alive_pids``: which of those pids run; ``processes``: the
    ledger's server processes, oldest first; ``still_running``: which of them run.

    A pid the hub recorded is its server only if the ledger knows that server's process by the
    same pid (and start time: ``still_running``), or knows no process of that server at all (a
    server started by a release before the ledger kept processes).
    """
    known = {p.key for p in processes}
    ours = {(p.key, p.pid) for p in processes if p in still_running}
    claimed_alive = {key for key, pid in recorded.items() if pid in alive_pids}
    live = {key for key in claimed_alive if (key, recorded[key]) in ours or key not in known}
    mistaken = claimed_alive - live
    adopted: dict[str, ServerProcess] = {}
    for process in processes:  # the newest running process of a server whose pid the hub never recorded
        if process in still_running and recorded.get(process.key) == 0:
            adopted[process.key] = process
    live |= set(adopted)
    claimed = set(adopted.values())
    orphans = [
        p
        for p in processes
        if p in still_running and p not in claimed and not (recorded.get(p.key) == p.pid and p.pid in alive_pids)
    ]
    ended = [p for p in processes if p not in still_running]
    return Plan(live, orphans, ended, mistaken)


def reconcile(
    ledger: Ledger, hub_db: Path, say: Callable[[str], None] = print, confinement: Confinement | None = None
) -> list[Held]:
    """Stop orphan servers, forget ended ones, release every hold no live server owns; return the released holds.

    With ``confinement``, every server cgroup (or scope) no kept server runs in is emptied and
    removed too: a server that never made it into the ledger is found there.
    """
    recorded = running_servers(hub_db)
    processes = ledger.processes()
    still_running = {p for p in processes if running(Proc(p.pid, p.started))}
    decided = plan(recorded, {pid for pid in recorded.values() if alive(pid)}, processes, still_running)
    _stop(ledger, decided.orphans, "no hub claims it (its hub was killed, or stopped without stopping it)", say)
    for process in decided.ended:
        ledger.forget_process(process)
    if decided.mistaken:
        forget_pids(hub_db, decided.mistaken)
        for key in sorted(decided.mistaken):
            say(f"gpuslice: the server of {key} is gone; pid {recorded[key]} is another process now, left alone")
    jobs = JobLedger(ledger.path).jobs(states=sorted(ACTIVE))  # their runners outlive hubs: the dispatcher sees to them
    kept = {p.unit for p in still_running - set(decided.orphans) if p.unit} | {j.unit for j in jobs if j.unit}
    _remove_units(confinement, kept, "no hub claims it", say)
    return ledger.reconcile(decided.live | {j.key for j in jobs})


def stop_jobs(ledger: Ledger, say: Callable[[str], None] = print, grace_s: float = GRACE_S + 15) -> list[int]:
    """At a full stop: every running job stopped (SIGTERM, its grace period, SIGKILL) and put back in line, to run
    again at the next start (a stop of the platform is not a failure of the job); returns the jobs stopped."""
    jobs = JobLedger(ledger.path)
    active = jobs.jobs(states=sorted(ACTIVE))
    for job in active:
        jobs.ask_stop(job.id, SHUTDOWN, "the platform stopped")
        if job.runner is None or not running(job.runner) or not _tell(job.runner):
            ending = Ending(None, SHUTDOWN, "the platform stopped")
            result = outcome(ending, failures_before=job.failures, retries=job.spec.retries, time_limit_s=1)
            jobs.finish(job.id, result, None, line_entry(job.id, job.user, job.spec, job.plan, job.submitted, 0))
    deadline = time.monotonic() + grace_s
    for job in active:
        while job.runner is not None and running(job.runner) and time.monotonic() < deadline:
            time.sleep(0.1)
        say(f"gpuslice: stopped job {job.id} of {job.user}: it runs again at the next start")
    return [j.id for j in active]


def _tell(runner: Proc) -> bool:
    try:
        os.kill(runner.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_servers(
    ledger: Ledger, say: Callable[[str], None] = print, confinement: Confinement | None = None
) -> list[Held]:
    """At a full stop, after the hub has stopped what it knew of: end every server process left
    and release its slice (a hub stops the servers it adopted after a restart too; this is for
    one it lost track of), and remove every server cgroup. Returns the released holds."""
    processes = ledger.processes()
    _stop(ledger, [p for p in processes if running(Proc(p.pid, p.started))], "the hub left it running", say)
    _remove_units(confinement, set(), "the hub left it", say)
    keys = {p.key for p in processes}
    released = [h for h in ledger.holdings() if h.key in keys]
    for key in keys:
        ledger.release(key)
    for process in processes:
        ledger.forget_process(process)
    return released


def _stop(ledger: Ledger, processes: list[ServerProcess], why: str, say: Callable[[str], None]) -> None:
    stop_trees([Proc(p.pid, p.started) for p in processes])
    for process in processes:
        say(f"gpuslice: stopped the server of {process.key} (pid {process.pid}): {why}")
        ledger.forget_process(process)


def _remove_units(confinement: Confinement | None, kept: set[str], why: str, say: Callable[[str], None]) -> None:
    """Empty and remove every server cgroup or scope but ``kept``; say which held processes."""
    if confinement is None:
        return
    for name in sorted(confinement.names() - kept):
        ended = confinement.remove(name)
        if ended:
            say(f"gpuslice: ended {len(ended)} process(es) in {name} ({confinement.kind}): {why}")
