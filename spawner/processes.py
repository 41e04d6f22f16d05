"""Local processes by identity, and stopping one with everything it started (Linux, through psutil).

A pid alone does not name a process: once a process ends, its number goes to a later one.
``Proc`` is a pid with the process's start time, so a notebook server recorded before a
hub was killed is recognised after the restart, and a stranger that took its number is
left alone. The local backend records each server's ``Proc`` in the ledger as soon as the
process exists (spawner/lifecycle.py); `gpuslice up` stops the recorded servers no hub
claims (hub/recovery.py) and, at a full stop, every one left (hub/platform.py).
"""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass

import psutil

STOP_GRACE_S = 10.0  # a jupyter server shuts its kernels down on SIGTERM: give it this long


@dataclass(frozen=True)
class Proc:
    pid: int
    started: float  # the process's start time (seconds since the epoch, as psutil gives it)


def identify(pid: int) -> Proc | None:
    """The process now running as ``pid`` (None: no such process)."""
    try:
        return Proc(pid, psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, ValueError):
        return None


def running(proc: Proc) -> bool:
    """Whether ``proc`` still runs: the same pid and start time, and not a zombie waiting to be reaped."""
    try:
        process = psutil.Process(proc.pid)
        return process.create_time() == proc.started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_trees(procs: list[Proc], grace_s: float = STOP_GRACE_S) -> list[Proc]:
    """Stop each of ``procs`` and every process it started; return those that were still running.

    SIGTERM first, to each process alone (a jupyter server then shuts down its kernels, which
    run in sessions of their own), then after at most ``grace_s`` SIGKILL to whatever of the
    trees is left, descendants found before the first signal included (they may have been
    orphaned since). All at once: twenty servers take one grace period, not twenty.
    """
    roots: list[psutil.Process] = []
    trees: list[psutil.Process] = []
    for proc in procs:
        try:
            root = psutil.Process(proc.pid)
            if root.create_time() != proc.started:
                continue
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        roots.append(root)
        trees.extend(p for p in tree if _is_running(p))
    for root in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            root.send_signal(signal.SIGTERM)
    psutil.wait_procs(roots, timeout=grace_s)
    for process in trees:
        with contextlib.suppress(psutil.NoSuchProcess):
            if _is_running(process):
                process.send_signal(signal.SIGKILL)
    psutil.wait_procs(trees, timeout=grace_s)
    return [Proc(p.pid, p.create_time()) for p in trees]


def stop_tree(proc: Proc, grace_s: float = STOP_GRACE_S) -> list[Proc]:
    """``stop_trees`` for one process."""
    return stop_trees([proc], grace_s)


def _is_running(process: psutil.Process) -> bool:
    # psutil.Process remembers its start time: is_running() is False for a later process with the pid.
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
