"""The GPU waiting line's spawn side, shared by both backends (spawner/waitline.py decides its order).

``WaitingLineMixin`` takes a spawn's turn in the line kept in the SQLite ledger (``Ledger.take_turn``:
the holds, the line and this request read and written in one transaction), waits there with its
position and an estimated start in the progress, and raises JupyterHub's start_timeout so JupyterHub
never gives up first. The spawn form always waits: Start with a size that is busy joins the line at
once (its page offers a server without a GPU meanwhile); the REST API waits when asked ("wait":
true) and is otherwise refused with its choices. A
backend says what the cluster holds: the local one from the ledger's own rows
(``spawner.lifecycle.LedgerGpuMixin``), Kubernetes from its pods and the placements whose pods
are not listed yet (``spawner.kube.KubeGpuSpawner``).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from traitlets import Float, Integer, Unicode

from spawner import metrics
from spawner.form import in_form_words
from spawner.holds import group_bytes_of, servers_by_user
from spawner.inventory import Inventory
from spawner.ledger import Held, Ledger, LedgerError, reclaim_notice
from spawner.line_timeouts import GPU_IDLE_TIMEOUT_S, LINE_MAX_WAIT_S
from spawner.mixin import GpuShareMixin, asked_bytes
from spawner.placement import Choice, Demand
from spawner.quotas import Usage, budgets, check, largest_slice, least_served_groups
from spawner.request import OPTION_KEYS, GpuRefused
from spawner.shares import GpuRequest, RequestKind, format_bytes, quantity_text
from spawner.waitline import (
    Entry,
    Reservation,
    activity_report_interval,
    admit,
    budget_holding_back,
    day_start,
    estimated_start,
    expected_end,
    never_fits,
    positions,
    stop_at,
    waits_for_room,
    warning_lead,
    with_served,
)
from spawner.words import counted, instant, place_words

WAITING_PROGRESS = 15  # the progress a spawn waiting in the GPU line shows
STOP_KINDS = ("stopped", "died", "failed", "refused")  # the events that say why a server is not running
STOP_TOLD_S = 86400  # a stop older than a day is not news on the home page
RECLAIMER_NOTE = "the GPU line's reclaimer"  # how its note before a stop begins (hub/reclaimer.py)
LINE_WORDS = "Waiting in line for"  # how a waiting spawn's progress message begins (the waiting page looks for it)


class LeftLineError(Exception):
    """A waiting spawn found its place in the line gone: someone cancelled it (the ledger says who)."""


class WaitingLineMixin(GpuShareMixin):
    """A spawn's turn in the GPU line, for any backend: place now, wait in line, or refuse.

    A backend provides ``_inventory`` (the cluster with ``holds``), ``_line_holds`` (what the
    cluster holds, as ledger rows), ``_decide`` (the direct path) and ``_rows`` (what a placement holds).
    """

    gpu_ledger_path = Unicode(
        "gpuslice-ledger.sqlite", help="The SQLite file holding every slice handed out on this machine."
    ).tag(config=True)
    gpu_line_max_wait = Integer(
        LINE_MAX_WAIT_S,
        help="""Longest a request may wait in the GPU line (seconds); it is then told so and leaves the line.
        A waiting spawn's start_timeout is raised by this much, so JupyterHub never gives up on it first.""",
    ).tag(config=True)
    gpu_line_poll = Float(2.0, help="Seconds between a waiting spawn's looks at the line.").tag(config=True)
    gpu_idle_timeout = Integer(
        GPU_IDLE_TIMEOUT_S,
        help="Seconds idle before a slice is reclaimed while anyone waits (for the line's estimated start times).",
    ).tag(config=True)
    gpu_option_keys = OPTION_KEYS | {"wait"}

    _gpu_ledger: Ledger | None = None
    _gpu_stages: list[Stage] | None = None
    _gpu_stage_listeners: set[asyncio.Event] | None = None  # each progress() reader, woken by a new stage
    _gpu_base_start_timeout: float | None = None
    _gpu_request: tuple[GpuRequest, str] | None = None
    _gpu_line_view: LineView | None = None  # the last turn's place in line

    @property
    def _ledger(self) -> Ledger:
        """This spawner's Ledger, made once (its constructor creates the schema: a write)."""
        if self._gpu_ledger is None or self._gpu_ledger.path != Path(self.gpu_ledger_path):
            self._gpu_ledger = Ledger(self.gpu_ledger_path)
        return self._gpu_ledger

    def _inventory(self, holds: list[Held]) -> Inventory:
        """The cluster with ``holds`` taken (the backend knows its GPUs)."""
        raise NotImplementedError

    def _line_holds(self, rows: list[Held]) -> list[Held]:
        """What the cluster holds, as ledger rows, given the ledger's own ``rows`` (locally: those)."""
        return rows

    async def _refresh_view(self) -> None:
        """Before each look at the line while waiting: read the cluster again (locally: nothing to read)."""

    def _decide(self, request: GpuRequest, image: str, holds: list[Held]) -> list[Held]:
        raise NotImplementedError

    def _rows(self, request: GpuRequest, inventory: Inventory, group: str | None, choice: Choice | None) -> list[Held]:
        raise NotImplementedError

    def _refused(self, refusal: GpuRefused) -> None:
        metrics.SPAWN_REFUSED.labels(reason=refusal.refusal).inc()
        if refusal.waitable:  # only the REST API without "wait": the form always waits
            metrics.SPAWN_OFFERED_LINE.labels(reason=refusal.refusal).inc()
            refusal.jupyterhub_message += " " + self._choices_text(self.largest_fit_now())
        if self._from_form():
            refusal.jupyterhub_message = in_form_words(refusal.jupyterhub_message)
        self._record("refused", 100, refusal.jupyterhub_message)

    def _choices_text(self, fits: int) -> str:
        """What an API caller can do instead, now: CPU only, ``fits`` (the largest slice that fits), or wait."""
        slice_now = f' start {format_bytes(fits)} now (gpu_memory "{quantity_text(fits)}");' if fits else ""
        return f'Or: start CPU-only now (gpu_memory "0");{slice_now} or wait in line for it (add "wait": true).'

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        """The form's choices; a GPU asked for from the form waits in line when none is free (never refused
        for room or budget, never started without one silently)."""
        options: dict[str, Any] = super().options_from_form(formdata)
        if options.get("gpu_memory") not in ("0", "") or str(options.get("gpus", "0")) != "0":
            options["wait"] = True
        return options

    def largest_fit_now(self) -> int:
        """The largest slice this user could start now (free on one card and within their groups)."""
        inventory, usage = self.form_state()
        largest_free = max((g.free_bytes for g in inventory.gpus() if g.healthy), default=0)
        card = max((g.memory_bytes for g in inventory.gpus()), default=0)
        return min(largest_free, largest_slice(self._quota_groups(), usage, card))

    @property
    def gpu_warning_lead(self) -> float:
        return warning_lead(self.gpu_idle_timeout)

    def gpu_reclaim_warning(self) -> tuple[str, float] | None:
        """The GPU line's warning standing for this server now, and when it was given (hub/notice.py).

        The reclaimer writes it to the ledger as a "warned" event, on both backends.
        """
        try:
            history = self._ledger.history(self._key)
        except LedgerError:
            return None
        latest = history[-1] if history else None
        said = reclaim_notice(latest, time.time(), self.gpu_stop_after)
        return (said, latest.created) if said and latest else None

    def gpu_reclaim_stop(self) -> tuple[str, float] | None:
        """The latest stop of this server by the GPU line's reclaimer in the last day, in its owner's words,
        and when (hub/notice.py: shown once in the JupyterLab of its next start). None: none. Read from the
        reclaimer's own note before it stops a server, which it writes to the ledger on both backends."""
        try:
            history = self._ledger.history(self._key)
        except LedgerError:
            return None
        stops = [e for e in history if e.kind == "stopping" and e.message.startswith(RECLAIMER_NOTE)]
        if not stops or time.time() - stops[-1].created > STOP_TOLD_S:
            return None
        latest = stops[-1]
        why = latest.message.removeprefix(RECLAIMER_NOTE).lstrip(": ")
        said = (
            f"Stopped at {instant(latest.created)} by the GPU line's reclaimer: {why}. What you had open is open again."
        )
        return said, latest.created

    def gpu_stop_reason(self) -> tuple[str, str] | None:
        """Why this server last stopped, or could not start, and when (an instant), for its owner's home
        page: its latest event, when that is a stop or a refusal of the last day (None: nothing to tell)."""
        try:
            history = self._ledger.history(self._key)
        except LedgerError:
            return None
        latest = history[-1] if history else None
        if latest is None or latest.kind not in STOP_KINDS or time.time() - latest.created > STOP_TOLD_S:
            return None
        return latest.message, instant(latest.created)

    @property
    def gpu_stop_after(self) -> float:
        """Seconds from the reclaimer's warning to the stop it announces (hub/reclaimer.py keeps to it)."""
        lead = self.gpu_warning_lead
        return stop_at(0.0, lead, activity_report_interval(lead))

    def _wants_to_wait(self) -> bool:
        return str((self.user_options or {}).get("wait", "")).lower() in {"true", "1", "on", "yes"}  # type: ignore[attr-defined]

    def _take_turn(self, request: GpuRequest, image: str, wait: bool, joined: bool = False) -> list[Held] | None:
        """``joined``: this spawn already waits in line (gone from it means someone cancelled it)."""
        return self._ledger.take_turn(
            self._key,
            lambda rows, line, mine, reservations: self._turn(
                request, image, wait, self._line_holds(rows), line, mine, reservations, joined
            ),
        )

    def _turn(
        self,
        request: GpuRequest,
        image: str,
        wait: bool,
        holds: list[Held],
        line: list[Entry],
        mine: Entry | None,
        reservations: list[Reservation],
        joined: bool = False,
    ) -> tuple[list[Held] | None, Entry | None]:
        """Inside the ledger's transaction: place now, or keep waiting (with ``wait``), or refuse."""
        now = time.time()
        if joined and mine is None:
            raise LeftLineError()
        wait = wait or mine is not None  # back after a hub restart: keep the place
        reserved = any(r.on(now) for r in reservations)
        if request.kind is RequestKind.CPU or (
            not wait and not reserved and not any(waits_for_room(e, now) for e in line)
        ):
            return self._decide(request, image, holds), None  # nobody waits: the direct path and its refusals
        inventory = self._inventory(holds)
        me = self._entry(request, image, inventory, holds, mine, now)
        budget_of = budgets(self.gpu_group_rules)
        why = never_fits(me, inventory, budget_of)
        if why:
            raise GpuRefused(409, f"{request.describe()} cannot wait in line: {why}.", "capacity")
        line, me = self._least_served_first([*line, me], now)
        admitted = admit(
            [*line, me],
            inventory,
            budgets=budget_of,
            group_bytes=group_bytes_of(holds),
            held_by_user=servers_by_user(holds),
            policy=self.gpu_policy,
            now=now,
            reservations=reservations,
        )
        placed = next((a for a in admitted if a.entry.key == self._key), None)
        if placed is not None:
            return self._rows(request, inventory, me.group, placed.choice), None
        if not wait:
            ahead = sum(1 for e in line if waits_for_room(e, now))
            why = f"{counted(ahead, 'request waits', 'requests wait')} in line for a GPU before yours."
            if not ahead:
                why = "The free GPU memory is reserved for another class now."
            refused = GpuRefused(409, why, "line")
            refused.waitable = True
            raise refused
        if now - me.arrived > self.gpu_line_max_wait:
            raise GpuRefused(
                409, f"Waited in line longer than {self.gpu_line_max_wait // 60} minutes; no GPU came free.", "line"
            )
        # The place as this transaction sees it: the progress words need not read the line again.
        present = [e for e in line if not e.away(now)]
        self._gpu_line_view = line_view(me, present, holds, budget_holding_back(me, budget_of, group_bytes_of(holds)))
        return None, me

    def _least_served_first(self, entries: list[Entry], now: float) -> tuple[list[Entry], Entry]:
        """The entries (this spawn's last) with what their users held today, in the classes that order
        their line least-served first (``line_order``); the others' unchanged."""
        ordered = least_served_groups(self.gpu_group_rules)
        if any(e.group in ordered for e in entries):
            entries = with_served(entries, ordered, self._ledger.served(day_start(now), now))
        return entries[:-1], entries[-1]

    def _entry(
        self, request: GpuRequest, image: str, inventory: Inventory, holds: list[Held], mine: Entry | None, now: float
    ) -> Entry:
        """This request as a line entry; GpuRefused for a group rule that waiting cannot help."""
        asked = asked_bytes(request, inventory)
        others = [h for h in holds if h.key != self._key]
        servers = len({h.key for h in others if h.user == self.user.name})  # type: ignore[attr-defined]
        # Budgets aside: the line admits within them (a budget the request exceeds in all is never_fits').
        rules = [replace(q, budget_bytes=None) for q in self._quota_groups()]
        decision = check(request, asked, image, rules, Usage(user_servers=servers))
        if not decision.allowed:
            raise GpuRefused(403, str(decision), "quota")
        arrived, priority = (mine.arrived, mine.priority) if mine else (now, 0)
        user = self.user.name  # type: ignore[attr-defined]
        demand = Demand.from_request(request)
        return Entry(self._key, user, demand, asked, decision.group, arrived, priority, now, request.describe())

    async def _wait_in_line(self, request: GpuRequest, image: str) -> list[Held]:
        """Look at the line every ``gpu_line_poll`` s until this request is placed; report the place.

        Cancelled (the user stopped the pending server, or JupyterHub gave up): leave the line.
        """
        said = ""
        try:
            while True:
                await self._refresh_view()
                holds = self._take_turn(request, image, wait=True, joined=True)
                if holds is not None:
                    return holds
                words = self._place_in_line(request)
                if words != said:
                    self._record("waiting", WAITING_PROGRESS, words)
                    self._stage(WAITING_PROGRESS, words)
                    said = words
                await asyncio.sleep(self.gpu_line_poll)
        except LeftLineError:
            refusal = GpuRefused(409, self._cancelled_words(), "cancelled")
            self._record("refused", 100, refusal.jupyterhub_message)
            raise refusal from None
        except GpuRefused as refusal:
            self._ledger.leave_line(self._key)
            self._refused(refusal)
            raise
        except BaseException:
            self._ledger.leave_line(self._key)
            raise

    def gpu_line_place(self) -> str:
        """This spawn's place in the GPU line in words while it waits there, else "" (for the pending page)."""
        stages = self._gpu_stages or []
        if stages and stages[-1].progress == WAITING_PROGRESS:
            return stages[-1].message
        return ""

    def _cancelled_words(self) -> str:
        """Who took this request out of the line, from the ledger's "cancelled" event."""
        note = next((e for e in reversed(self._ledger.history(self._key)) if e.kind == "cancelled"), None)
        who = note.message if note is not None else "cancelled by someone else"
        return f"Your place in the GPU line was {who}; no GPU is held. Start again to wait once more."

    def _place_in_line(self, request: GpuRequest) -> str:
        """The place and the expected start, in words (from the last turn's look at the line).

        Starts with ``LINE_WORDS``: the waiting page knows its own words by it. The time is an
        instant the pages show in the reader's own clock (spawner/words.py).
        """
        view = self._gpu_line_view
        position = view.position if view else 1
        eta = self.gpu_estimated_start(time.time())
        words = f"{LINE_WORDS} {request.describe()}. {place_words(position)}"
        if eta is not None:
            # The servers before it end then if left idle: sooner if someone stops, later if they keep working.
            words += f" Expected start: {instant(eta)}, sooner if someone stops their server."
        else:
            words += " No start time can be told yet: it depends on when others stop their servers."
        if view and view.budget_group:
            budget = budgets(self.gpu_group_rules).get(view.budget_group)
            in_all = f" ({format_bytes(budget)})" if budget else ""
            words += (
                f" Your class {view.budget_group} is using its whole GPU budget{in_all} now:"
                " you start when a classmate stops."
            )
        return words

    def gpu_estimated_start(self, now: float) -> float | None:
        """When this waiting spawn may start, from its last look at the line (None: unknown, or not waiting)."""
        view = self._gpu_line_view
        if view is None:
            return None
        return estimated_start(view.start_rank, self._frees_at(view.freeing, now), now)

    async def gpu_holds(self) -> list[Held]:
        """What the cluster holds now, as ledger rows (locally the ledger's; on Kubernetes pods, pending placements)."""
        await self._refresh_view()
        return self._line_holds(self._ledger.holdings())

    async def gpu_capacity_bytes(self) -> int:
        """The GPU memory of the healthy cards, as listed now: reservations together may not promise more."""
        await self._refresh_view()
        return sum(g.memory_bytes for g in self.form_state()[0].gpus() if g.healthy)

    def _frees_at(self, holds: list[Held], now: float) -> list[float]:
        """When each GPU server ends at the latest while anyone waits, from the line's state: a warned one at
        its announced stop, else at the stop it would be warned of once idle for the idle timeout."""
        return list(self.gpu_ends(holds, now).values())

    def gpu_ends(self, holds: list[Held], now: float) -> dict[str, float]:
        """Each GPU server's latest end while anyone waits (``_frees_at``), by its key (jobs' API too)."""
        activity = self._last_activity()
        warned = {key: e.created for key, e in self._ledger.latest_events().items() if e.kind == "warned"}
        lead = self.gpu_warning_lead
        report_every = activity_report_interval(lead)
        return {
            key: expected_end(activity.get(key, now), warned.get(key), self.gpu_idle_timeout, lead, report_every)
            for key in {h.key for h in holds}
        }

    def _last_activity(self) -> dict[str, float]:
        """Each running server's last activity (else its start) from JupyterHub's database (empty outside a hub)."""
        db = getattr(self, "db", None)
        if db is None:
            return {}
        from jupyterhub import orm

        found = {}
        for spawner in db.query(orm.Spawner).filter(orm.Spawner.server_id.isnot(None)):
            last = spawner.last_activity or spawner.started
            if last is not None:
                found[f"{spawner.user.name}/{spawner.name}"] = last.replace(tzinfo=datetime.UTC).timestamp()
        return found

    async def gpu_job_log(self, job: Any, read: LogRead) -> tuple[bytes, int]:
        """A job's output as ``read`` says, and its whole size (one machine: its log file; Kubernetes: its pod's)."""
        raise NotImplementedError

    def run_pre_spawn_hook(self) -> Any:
        # JupyterHub reads start_timeout once start() is called: a waiting spawn gets the line's
        # limit on top, and every spawn the wait for its turn to start, so JupyterHub never gives
        # up on it before the line or the turns do.
        hub_spawner: Any = self  # JupyterHub's Spawner, which this class is mixed into
        if self._gpu_base_start_timeout is None:
            self._gpu_base_start_timeout = float(hub_spawner.start_timeout)
        in_line = any(e.key == self._key for e in self._ledger.line())  # back after a hub restart
        extra = self.gpu_line_max_wait if self._wants_to_wait() or in_line else 0
        hub_spawner.start_timeout = int(self._gpu_base_start_timeout + extra + self._start_turn_allowance())
        return super().run_pre_spawn_hook()  # type: ignore[misc]

    def _start_turn_allowance(self) -> int:
        """Seconds a server may wait for its turn to start once placed (a backend that takes turns says)."""
        return 0

    def _record(self, kind: str, progress: int, message: str) -> None:
        try:
            self._ledger.record(self._key, kind, progress, message)
        except LedgerError as exc:
            # History is for people reading the portal; never fail a spawn or stop over it.
            self.log.warning("gpuslice: could not record %s event for %s: %s", kind, self._key, exc)  # type: ignore[attr-defined]

    def _stage(self, progress: int, message: str) -> None:
        if self._gpu_stages is not None:
            self._gpu_stages.append(Stage(progress, message, time.monotonic()))
            for listener in self._gpu_stage_listeners or ():
                listener.set()


@dataclass(frozen=True)
class LogRead:
    """Which part of a job's output to read: from ``offset``, or its last ``tail`` bytes; at most ``most``."""

    offset: int = 0
    tail: int = 0
    most: int | None = None

    def window(self, size: int) -> tuple[int, int | None]:
        """(start, length) of the part of an output of ``size`` bytes (length None: to its end)."""
        start = max(0, size - self.tail) if self.tail else min(self.offset, size)
        return start, self.most


@dataclass(frozen=True)
class Stage:
    """One step of a start, for the progress bar: percent, what happened, when (monotonic)."""

    progress: int
    message: str
    at: float


def usage_of(holds: list[Held], user: str) -> Usage:
    """What ``holds`` (everyone's but the server being started) count against the rules."""
    return Usage(user_servers=len({h.key for h in holds if h.user == user}), group_bytes=group_bytes_of(holds))


@dataclass(frozen=True)
class LineView:
    """A waiting spawn's place, as its last turn saw the line.

    ``freeing``: the servers whose end lets it start (its class's when the class's budget holds it
    back, else every GPU server); ``start_rank``: how many of them must end first (those ahead of
    it that wait on the same servers, and itself).
    """

    position: int
    freeing: list[Held]
    start_rank: int
    budget_group: str | None = None


def line_view(me: Entry, present: list[Entry], holds: list[Held], budget_group: str | None) -> LineView:
    """``me``'s place among the ``present`` entries, and which servers ending would let it start."""
    places = positions([*present, me], servers_by_user(holds))
    position = places.get(me.key, len(present) + 1)
    if budget_group is None:
        return LineView(position, holds, position)
    classmates_ahead = sum(1 for e in present if e.group == budget_group and places.get(e.key, position) < position)
    return LineView(position, [h for h in holds if h.group == budget_group], classmates_ahead + 1, budget_group)
