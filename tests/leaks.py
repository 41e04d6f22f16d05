"""The suite leaves no process behind: whatever a test started and left running is named and ended.

Each process that runs tests (pytest alone, or each pytest-xdist worker) makes itself a
child subreaper (``PR_SET_CHILD_SUBREAPER``): a process the suite started whose parent
ends (a notebook server whose hub was killed, a daemon that forked twice) is re-parented to
it rather than to PID 1, so everything the suite started stays one tree under it. Around
each test the tree is listed; a process that appeared during a test (its setup and
teardown included) belongs to that test. At the end of the session, after every fixture
is torn down, any process of the tree still running is a leak: the session fails, naming
each process and the test that started it, and the process is ended. Under xdist each
worker checks its own tree and hands its findings to the controller, which fails the run.

A subreaper must also reap: an orphan that ends stays a zombie until its new parent waits
for it, and a zombie still answers ``kill(pid, 0)``, so a restarted hub would take a dead
server for a live one. A thread reaps orphaned zombies, never a child that this process
started itself (``subprocess.Popen``, ``os.fork``): their owners wait for those, and would
otherwise lose the exit status.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

_PR_SET_CHILD_SUBREAPER = 36  # from <linux/prctl.h>
REAP_EVERY_S = 0.25
EXIT_GRACE_S = 15.0  # what is stopping at the session's end (a proxy its hub signalled) gets this long


@dataclass(frozen=True)
class Process:
    pid: int
    started: int  # clock ticks since boot (/proc/PID/stat field 22): with the pid, one process
    command: str


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def children(pid: int) -> set[int]:
    """Direct children of ``pid``, whichever of its threads started them (or adopted them)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found.update(int(child) for child in (task / "children").read_text().split())
    return found


def descendants(root: int) -> dict[int, Process]:
    """Every running (not zombie) process under ``root``."""
    found: dict[int, Process] = {}
    todo = list(children(root))
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is None or pid in found:
            continue
        todo.extend(children(pid))
        if stat[0] != "Z":
            found[pid] = Process(pid, stat[1], _command(pid))
    return found


# Podman's DNS server for its networks: started by podman for the first container on a network and shared by
# every podman network on the machine, it outlives the test's own network by podman's design. Ended at the end
# of the run like a leak, but not counted as one.
PODMAN_DAEMONS = ("/usr/lib/podman/aardvark-dns ",)


def podmans_own(process: Process) -> bool:
    return process.command.startswith(PODMAN_DAEMONS)


def alive(process: Process) -> bool:
    stat = _stat(process.pid)
    return stat is not None and stat[0] != "Z" and stat[1] == process.started


class Reaper:
    """Reaps orphaned zombies re-parented to this process; leaves its own children to their owners."""

    def __init__(self) -> None:
        self.own: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.forked: set[int] = set()
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orphan-reaper", daemon=True)

    def install(self) -> None:
        original_init: Callable[..., None] = subprocess.Popen.__init__
        original_fork = os.fork
        reaper = self

        def init(popen: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
            original_init(popen, *args, **kwargs)
            reaper.own[popen.pid] = popen

        def fork() -> int:
            pid = original_fork()
            if pid:
                reaper.forked.add(pid)
            return pid

        subprocess.Popen.__init__ = init  # type: ignore[method-assign]
        os.fork = fork
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(REAP_EVERY_S):
            self.reap()

    def reap(self) -> None:
        # A zombie is reaped on the second look: a child just started is registered by then.
        zombies = {pid for pid in children(os.getpid()) if (_stat(pid) or ("", 0))[0] == "Z"}
        for pid in zombies & self._seen:
            popen = self.own.get(pid)
            if (popen is None or popen.returncode is not None) and pid not in self.forked:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        self._seen = zombies


def become_subreaper() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def end(processes: list[Process], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in processes:
            if alive(process):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, sig)
        _wait_gone(processes, grace_s)


def _wait_gone(processes: list[Process], timeout_s: float) -> list[Process]:
    deadline = time.monotonic() + timeout_s
    left = [p for p in processes if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    return left


class LeakCheck:
    """The pytest plugin: one per process that runs tests, plus the xdist controller's summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.owners: dict[Process, str] = {}
        self.leaks: list[str] = []
        self.runs_tests = hasattr(config, "workerinput") or not _distributed(config)
        if self.runs_tests:
            if not become_subreaper():
                raise RuntimeError("prctl(PR_SET_CHILD_SUBREAPER) failed: the process leak check needs Linux")
            Reaper().install()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        before = descendants(os.getpid()) if self.runs_tests else {}
        yield
        if self.runs_tests:
            for process in descendants(os.getpid()).values():
                if before.get(process.pid) != process:
                    self.owners.setdefault(process, item.nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.runs_tests:
            left = _wait_gone(list(descendants(os.getpid()).values()), EXIT_GRACE_S)
            during = {p: self.owners.get(p, "no test (collection or a plugin)") for p in left if not podmans_own(p)}
            self.leaks = [f"pid {p.pid} started during {test}: {p.command[:200]}" for p, test in during.items()]
            end(left)
            workeroutput = getattr(self.config, "workeroutput", None)
            if workeroutput is not None:
                workeroutput["gpuslice_leaks"] = self.leaks
                return
        if self.leaks:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.leaks.extend(getattr(node, "workeroutput", {}).get("gpuslice_leaks", []))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.leaks:
            terminalreporter.write_sep("=", "processes the tests left running (now ended)", red=True, bold=True)
            for line in self.leaks:
                terminalreporter.write_line(line)


def _distributed(config: pytest.Config) -> bool:
    """Whether this is an xdist controller whose workers run the tests."""
    return bool(getattr(config.option, "numprocesses", None)) and getattr(config.option, "dist", "no") != "no"
