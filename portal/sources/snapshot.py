"""A shared source read in the background, so that no page waits for a busy hub.

The live pages share one snapshot of the hub's users, the GPUs, the servers' events, the line
and the classes (each narrowed to the reader later). Read on a page's own run, a hub busy
starting a class of sixty made every page wait for it: seconds before the first thing showed.
Here a thread keeps each snapshot fresh instead (as fast as the source answers, at most every
``every_s``), and a page takes the latest at once. Only the very first read of a fresh portal,
and a read just after the portal itself changed something (``refresh``), wait for the source.
The thread stops looking when nobody has read for a while, and starts again with the next read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from portal.data.errors import SourceUnavailableError

T = TypeVar("T")

IDLE_AFTER_S = 30.0  # nobody has read for this long: stop asking the source
FIRST_WAIT_S = 30.0  # how long the first read of a fresh snapshot may wait for it


class Snapshot(Generic[T]):
    def __init__(self, read: Callable[[], T], every_s: float, too_old_s: float = 60.0) -> None:
        """``too_old_s``: a value older than this (the source stopped answering) is not shown: its error is."""
        self._read, self.every_s, self.too_old_s = read, every_s, too_old_s
        self._lock = threading.Condition()
        self._value: T | None = None
        self._at = 0.0  # when the value was read (monotonic)
        self._error: Exception | None = None
        self._wanted = time.monotonic()
        self._begun = 0  # reads begun so far (one at a time, in order)
        self._done = 0  # of those, the last one that ended: a refresh waits for one begun after it
        self._thread: threading.Thread | None = None

    def get(self, wait_s: float = FIRST_WAIT_S) -> T:
        """The latest value, at once; the first one (or the first after ``refresh``) waits up to ``wait_s``."""
        with self._lock:
            self._wanted = time.monotonic()
            self._start()
            deadline = time.monotonic() + wait_s
            while self._value is None and self._error is None and time.monotonic() < deadline:
                self._lock.wait(deadline - time.monotonic())
            if self._value is not None and time.monotonic() - self._at <= self.too_old_s:
                return self._value
            if self._error is not None:
                raise self._error
            raise SourceUnavailableError(f"the source did not answer in {wait_s:.0f} s")

    def refresh(self, wait_s: float = 5.0) -> None:
        """Read again now, and wait (up to ``wait_s``) for that read: after a change made from the portal."""
        with self._lock:
            # A read already under way may have asked the source before the change: not that one.
            target = self._begun + 1
            self._wanted = time.monotonic()
            self._start()
            self._lock.notify_all()
            deadline = time.monotonic() + wait_s
            while self._done < target and time.monotonic() < deadline:
                self._lock.wait(deadline - time.monotonic())

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="portal-snapshot", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            began = time.monotonic()
            with self._lock:
                self._begun += 1
                number = self._begun
            try:
                value, error = self._read(), None
            except Exception as exc:  # kept and raised to readers: a page says the source did not answer
                value, error = None, exc
            with self._lock:
                if error is None:
                    self._value, self._at, self._error = value, time.monotonic(), None
                else:
                    self._error = error
                self._done = number
                self._lock.notify_all()
                if time.monotonic() - self._wanted > IDLE_AFTER_S:
                    self._thread = None
                    return
                self._lock.wait(max(0.0, self.every_s - (time.monotonic() - began)))
