"""Turns to start: one machine starts a few servers at a time, and the others wait their turn in order.

A JupyterLab server costs a few seconds of CPU before it answers. A class pressing Start together on a
small machine starts every server at once: each gets a sliver of the cores, none answers within
``http_timeout``, and they fail together (measured: 0 of 60 on two cores with the portal open,
docs/load.md). With turns, a few servers start at full speed while the others wait, each told its place,
and a server's time to answer is counted from its turn. Nothing here does I/O but ask how many cores
this process may use; the spawner records and shows what a waiting student reads (spawner/lifecycle.py).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from spawner.words import counted

STARTS_PER_CORE = 2  # the default: a starting server is mostly one busy process, and waits on its disk a little
START_TURN_MAX_WAIT_S = 1800  # longest a server waits for its turn; each turn ends within http_timeout, so it moves
START_TURN_PROGRESS = 55  # the progress a server waiting for its turn shows (after its home and models are ready)
TURN_WORDS = "Waiting for a turn to start"  # how the message begins


def turn_words(ahead: int, limit: int) -> str:
    """What a student waiting for a turn reads: "Waiting for a turn to start: yours is next. ..." """
    if ahead == 0:
        place = "yours is next"
    else:
        place = f"{counted(ahead, 'server')} {'waits' if ahead == 1 else 'wait'} before yours"
    return f"{TURN_WORDS}: {place}. This machine starts {counted(limit, 'server')} at a time."


def default_limit() -> int:
    """Servers that start at once when the settings do not say: two per core this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return STARTS_PER_CORE * max(1, cores)


class TurnTimeoutError(TimeoutError):
    """A server waited longer than it may for its turn to start."""


@dataclass
class _Ticket:
    granted: asyncio.Future[None]
    told: Callable[[int], None]


class StartTurns:
    """At most ``limit`` holders at once; the others wait first come, first served.

    ``told(ahead)`` is called when a server must wait, and again each time the number of servers waiting
    before it changes: it is how the waiting student learns their place.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"servers that start at once must be 1 or more, not {limit}")
        self.limit = limit
        self.starting = 0
        self._waiting: deque[_Ticket] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @asynccontextmanager
    async def turn(self, told: Callable[[int], None], max_wait: float) -> AsyncIterator[None]:
        """Hold a turn for the body; wait for it first when ``limit`` servers are starting.

        Raises TurnTimeoutError after ``max_wait`` seconds of waiting. A cancelled wait (JupyterHub gave up
        on the start) leaves the line and lets the next one move up."""
        if self.starting < self.limit and not self._waiting:
            self.starting += 1
        else:
            await self._wait(told, max_wait)
        try:
            yield
        finally:
            self._pass_on()

    async def _wait(self, told: Callable[[int], None], max_wait: float) -> None:
        ticket = _Ticket(asyncio.get_running_loop().create_future(), told)
        self._waiting.append(ticket)
        told(len(self._waiting) - 1)
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that comes as the turn is granted,
            # and the server would start after JupyterHub (or its student) gave up on it.
            async with asyncio.timeout(max_wait):
                await ticket.granted
        except BaseException as exc:
            if ticket.granted.done() and not ticket.granted.cancelled():  # granted as the wait ended: hand it on
                self._pass_on()
            else:
                ticket.granted.cancel()
                if ticket in self._waiting:
                    self._waiting.remove(ticket)
                    self._tell_places()
            if isinstance(exc, TimeoutError):
                minutes = counted(max(1, round(max_wait / 60)), "minute")
                raise TurnTimeoutError(
                    f"this machine was busy starting other servers, and yours waited {minutes} for its turn. "
                    "Press Start again in a few minutes."
                ) from None
            raise

    def _pass_on(self) -> None:
        """A turn ended: the first one still waiting takes it over (the number starting stays the same)."""
        while self._waiting:
            ticket = self._waiting.popleft()
            if not ticket.granted.done():  # not one cancelled an instant ago, still to leave the line itself
                ticket.granted.set_result(None)
                self._tell_places()
                return
        self.starting -= 1

    def _tell_places(self) -> None:
        for ahead, ticket in enumerate(self._waiting):
            ticket.told(ahead)


# One set of turns per event loop and limit: a hub runs one loop; tests run several, one after another.
_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, StartTurns]] = weakref.WeakKeyDictionary()


def machine_turns(limit: int) -> StartTurns:
    """The turns every spawner of this hub shares (called in the hub's event loop)."""
    per_limit = _TURNS.setdefault(asyncio.get_running_loop(), {})
    if limit not in per_limit:
        per_limit[limit] = StartTurns(limit)
    return per_limit[limit]
