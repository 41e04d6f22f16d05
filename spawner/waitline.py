"""The GPU waiting line: who waits for what, in which order, and who is placed now. Pure code.

A request that cannot be placed now (no room, or its group's budget is used up) may wait
here instead of being refused. The order is fair share:

* a teacher's "put first" (``priority``) goes before everything else;
* then round-robin between users: a user's n-th waiting request counts as their
  n-th turn, plus one turn per server they already hold, so someone holding nothing
  goes before a second server for someone else;
* then arrival time; in a class that chooses the least-served order (``line_order``), each
  second its member already held a GPU today counts as a second later (``Entry.served``),
  so who held least today goes first among those who arrived together.

``admit`` walks that order against the free room and places what fits, committing each
placement to its copy of the cluster so that two admissions never share the same memory.
It is strict: the first entry that the cluster cannot hold stops the walk (nobody behind
it jumps ahead, so a large request is not starved by a stream of small ones). An entry
held back by its group's budget only blocks later entries of the same group. Entries
whose spawn has not been seen for ``away_after_s`` (the hub restarted, the tab went
away and the spawn ended) keep their place but do not hold up the line.

Each finished wait (joined the line, then placed or left it) is a ``Wait``; ``wait_stats``
gives their percentiles per class and per day, ``sees_wait`` who may see which.

Admins, and a class's teachers for their class's requests, manage the line
(``may_manage``): put a request first, cancel it, or reserve GPU memory for a class for a
time window (``Reservation``). While a reservation is on, the memory it keeps that its
class does not already hold is not handed to anyone else (``admit``); reservations
together never promise more than the machine has (``reservation_problem``).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import KW_ONLY, dataclass, replace

from spawner.inventory import Inventory
from spawner.line_timeouts import GPU_IDLE_TIMEOUT_S, GPU_LEFT_TIMEOUT_S, GPU_NO_INPUT_TIMEOUT_S, GPU_RELEASE_TIMEOUT_S
from spawner.placement import Choice, ClusterState, Demand, arrived_counts, held_demands, known_workload, make_policy
from spawner.shares import format_bytes

AWAY_AFTER_S = 60.0


@dataclass(frozen=True)
class Entry:
    """One request waiting for a GPU."""

    key: str  # "user/server"
    user: str
    demand: Demand  # what placement needs
    asked_bytes: int  # GPU memory charged against the group's budget
    group: str | None  # the group charged (None: no group rules)
    arrived: float  # seconds since the epoch
    priority: int = 0  # > 0: put first by a teacher (higher first)
    seen: float | None = None  # last time the waiting spawn was alive; None: at arrival
    label: str = ""  # what was asked, in words (for people)
    _: KW_ONLY  # two flags of the same kind as the fields before them: named, never by position
    served: float = 0.0  # least-served order: seconds its user held a GPU today, as if arrived that much later
    backfill: bool = False  # a backfill job: placed only when nobody else waits (``admit``), behind everyone

    def in_order(self) -> float:
        """The arrival the line's order uses: later by what the user already held today (``served``)."""
        return self.arrived + self.served

    def last_seen(self) -> float:
        return self.arrived if self.seen is None else self.seen

    def away(self, now: float, away_after_s: float = AWAY_AFTER_S) -> bool:
        return now - self.last_seen() > away_after_s


@dataclass(frozen=True)
class Admission:
    """An entry placed now, and where (``choice.gpus`` index the node's GPU list)."""

    entry: Entry
    choice: Choice


def fair_order(entries: Iterable[Entry], held_by_user: Mapping[str, int] | None = None) -> list[Entry]:
    """The line in fair-share order (see the module's docstring)."""
    held = held_by_user or {}
    turns: dict[tuple[str, bool], int] = {}  # a user's backfill jobs take no turns from their other requests
    keyed = []
    for entry in sorted(entries, key=lambda e: (e.arrived, e.key)):
        turn = turns.get((entry.user, entry.backfill), 0)
        turns[(entry.user, entry.backfill)] = turn + 1
        order = (entry.backfill, -entry.priority, held.get(entry.user, 0) + turn, entry.in_order(), entry.key)
        keyed.append((order, entry))
    return [entry for _, entry in sorted(keyed, key=lambda pair: pair[0])]


def with_served(entries: Iterable[Entry], groups: Set[str], served: Mapping[str, float]) -> list[Entry]:
    """The entries of ``groups`` (the classes that order their line least-served first) with what their users
    held today (``served``: seconds per user); the others as they are."""
    return [replace(e, served=served.get(e.user, 0.0)) if e.group in groups else e for e in entries]


def waits_for_room(entry: Entry, now: float, away_after_s: float = AWAY_AFTER_S) -> bool:
    """Whether ``entry`` holds up the line now: present, and not a backfill job (those wait for room nobody wants)."""
    return not entry.backfill and not entry.away(now, away_after_s)


def positions(entries: Iterable[Entry], held_by_user: Mapping[str, int] | None = None) -> dict[str, int]:
    """Each entry's place in line, 1 for the first."""
    return {e.key: i for i, e in enumerate(fair_order(entries, held_by_user), start=1)}


def admit(
    entries: Iterable[Entry],
    inventory: Inventory,
    *,
    budgets: Mapping[str, int | None],
    group_bytes: Mapping[str, int],
    held_by_user: Mapping[str, int] | None = None,
    policy: str = "default",
    now: float,
    away_after_s: float = AWAY_AFTER_S,
    reservations: Sequence[Reservation] = (),
) -> list[Admission]:
    """The entries that can be placed now, first in line first, with where they go.

    ``budgets``: each group's GPU budget in bytes (None or missing: no budget);
    ``group_bytes``: what each group holds now. Never places more than is free, and
    never gives another class the memory a reservation keeps for one (that entry is
    passed over; entries of the reserved class behind it still go).

    Backfill entries (jobs that use slices nobody waits for) come last and are placed only
    when every other entry present was: each where it fits, none holding up another.
    """
    state = ClusterState.from_inventory(inventory)
    line = fair_order(entries, held_by_user)
    # What the policy knows (the arrivals so far): what the servers hold and everyone in line.
    arrived = arrived_counts([*held_demands(inventory), *(e.demand for e in line)])
    used = dict(group_bytes)
    blocked_groups: set[str | None] = set()
    admitted: list[Admission] = []
    someone_waits = False  # a present entry that is not backfill stays in line: no backfill goes now
    for entry in line:
        if entry.backfill and someone_waits:
            break  # backfill entries are last in the order
        if entry.away(now, away_after_s) or (entry.group is not None and entry.group in blocked_groups):
            continue
        if not _within_budget(entry, budgets, used):
            if not entry.backfill:
                blocked_groups.add(entry.group)
                someone_waits = True
            continue
        others = arrived - Counter({entry.demand: 1})  # known_workload adds the one being placed
        choice = make_policy(policy, known_workload(others, entry.demand), once=True).choose(state, entry.demand)
        if choice is None:
            if entry.backfill:
                continue  # backfill takes what fits and holds up nobody
            break  # strict: nobody behind the first that does not fit goes ahead of it
        kept = kept_for_others(reservations, entry.group, used, now)
        if kept and _free_bytes(state) - float(state.taken(choice, entry.demand).sum()) < kept:
            someone_waits = someone_waits or not entry.backfill
            continue  # the room left is reserved for another class now
        state.commit(choice, entry.demand)
        if entry.group is not None:
            used[entry.group] = used.get(entry.group, 0) + entry.asked_bytes
        admitted.append(Admission(entry, choice))
    return admitted


def _free_bytes(state: ClusterState) -> float:
    return float(state.free[state.healthy].sum())


def _within_budget(entry: Entry, budgets: Mapping[str, int | None], used: Mapping[str, int]) -> bool:
    if entry.group is None:
        return True
    budget = budgets.get(entry.group)
    return budget is None or used.get(entry.group, 0) + entry.asked_bytes <= budget


def budget_holding_back(entry: Entry, budgets: Mapping[str, int | None], group_bytes: Mapping[str, int]) -> str | None:
    """The group whose GPU budget keeps ``entry`` waiting (its members hold too much of it), or None.

    Then only those members' servers ending can let it start, whatever the GPUs have free.
    """
    return None if _within_budget(entry, budgets, group_bytes) else entry.group


def never_fits(entry: Entry, inventory: Inventory, budgets: Mapping[str, int | None]) -> str | None:
    """Why ``entry`` could not be placed even on an empty machine (then it must not wait); None if it could."""
    budget = budgets.get(entry.group) if entry.group is not None else None
    if budget is not None and entry.asked_bytes > budget:
        return (
            f"group {entry.group!r} has a GPU budget of {format_bytes(budget)} in all,"
            f" less than the {format_bytes(entry.asked_bytes)} asked for"
        )
    empty = ClusterState.from_inventory(inventory)
    empty.free = empty.cap.copy()
    if make_policy("default", known_workload({}, entry.demand)).choose(empty, entry.demand) is None:
        return "no machine here could hold it even with every GPU free"
    return None


def estimated_start(position: int, frees_at: Sequence[float], now: float) -> float | None:
    """When the ``position``-th in line may start: when that many running servers have ended.

    ``frees_at``: for each running GPU server, the latest time it is expected to end (for
    example its last activity plus the idle timeout). None when fewer servers run than
    are ahead (nobody can say).
    """
    ends = sorted(max(now, t) for t in frees_at)
    if position < 1 or position > len(ends):
        return None
    return ends[position - 1]


def put_first(entries: Iterable[Entry], key: str) -> list[Entry]:
    """A teacher's "put first": ``key`` gets a priority above every other entry's."""
    entries = list(entries)
    top = max((e.priority for e in entries), default=0)
    return [replace(e, priority=top + 1) if e.key == key else e for e in entries]


def warning_lead(gpu_idle_timeout: float) -> float:
    """Seconds between the reclaimer's warning and the stop: 3 minutes, less for short timeouts."""
    return min(180.0, gpu_idle_timeout / 3)


# JupyterHub's single-user server reports its activity every JUPYTERHUB_ACTIVITY_INTERVAL
# seconds with up to 10 % jitter (jupyterhub/singleuser/extension.py keep_activity_updated).
ACTIVITY_REPORT_JITTER = 1.1


def activity_report_interval(warn_before: float) -> int:
    """Seconds between a notebook server's activity reports to the hub (JUPYTERHUB_ACTIVITY_INTERVAL).

    A sixth of the warning lead, whole seconds (JupyterHub reads an integer), at least 1 and
    at most JupyterHub's own default of 300: a use made during the warning reaches the hub
    well before the stop, without a class's servers writing to the hub's database every second.
    """
    return max(1, min(300, int(warn_before / 6)))


def stop_at(warned_at: float, warn_before: float, report_every: float) -> float:
    """When a server warned at ``warned_at`` is stopped if it stays idle: the time its warning announces.

    ``warn_before`` after the warning, and one activity report later: a use made just before
    then reaches the hub up to one report later, so whatever the owner did first is seen.
    """
    return warned_at + warn_before + ACTIVITY_REPORT_JITTER * report_every


def stop_due(warned_at: float, now: float, warn_before: float, report_every: float) -> bool:
    """Whether a warned server, idle as far as the hub knows, may be stopped now (its announced time)."""
    return now >= stop_at(warned_at, warn_before, report_every)


def expected_end(
    last_activity: float, warned_at: float | None, idle_timeout: float, warn_before: float, report_every: float
) -> float:
    """The latest a GPU server ends while anyone waits, from the line's state (not from the clock).

    Warned: the stop its warning announced. Else: if it stays idle, it is warned ``warn_before``
    before its idle timeout and stopped at that warning's announced time.
    """
    if warned_at is not None:
        return stop_at(warned_at, warn_before, report_every)
    return stop_at(last_activity + idle_timeout - warn_before, warn_before, report_every)


# -- presence: whether a server's owner is there (docs/platform.md#presence) ------------------------


@dataclass(frozen=True)
class Presence:
    """What a notebook server last reported of its owner, every time on the hub's clock (hub/presence.py
    stamps the report when it arrives and turns the server's ages into instants no later than that).

    The report is its owner's word, like the server's activity report: it can make a server look
    used (as activity can), and it can say that its owner has left, which only costs the owner.
    """

    reported: float  # when the hub received the latest report
    pages: int = 0  # JupyterLab pages open on the server that report their input (the lab extension)
    connections: int = 0  # its kernels' websocket connections, from any client
    busy: bool = False  # a kernel of it runs code now
    last_input: float | None = None  # the latest keyboard or pointer input in one of its pages
    last_page: float | None = None  # the latest time a page of it was seen open (its heartbeat)


@dataclass(frozen=True)
class PresenceRule:
    """Reclaiming by presence: while anyone waits a slice goes to the line ``left_timeout`` after its
    owner's last page closed, or ``no_input_timeout`` after the last input in a page left open; it is
    released ``release_timeout`` after they left also when nobody waits. A report older than
    ``stale_after`` says nothing of now (the server stopped reporting: the idle rule alone)."""

    left_timeout: float = GPU_LEFT_TIMEOUT_S
    no_input_timeout: float = GPU_NO_INPUT_TIMEOUT_S
    release_timeout: float = GPU_RELEASE_TIMEOUT_S
    stale_after: float = 90.0


def presence_stale_after(report_every: float) -> float:
    """Seconds after which a server's presence report is too old to speak for now: three reports
    missed (servers report every ``report_every`` seconds), and never under a minute."""
    return max(60.0, 3.0 * ACTIVITY_REPORT_JITTER * report_every)


@dataclass(frozen=True)
class Holder:
    """A running server as reclaiming sees it."""

    key: str
    has_gpu: bool
    kernels_idle_since: float | None  # None: a kernel is busy now
    gpu_idle_since: float | None  # None: its processes use the GPU now
    held_since: float | None = None  # when its slice was placed, as the platform recorded it
    max_hold_s: float | None = None  # its class's max_hold; None: no cap
    presence: Presence | None = None  # what the server last reported of its owner; None: nothing


def idle_since(h: Holder) -> float | None:
    """Since when nothing of the server was used: its kernels, its GPU, and input in a page of it (a use,
    like running a cell). None: in use now."""
    if h.kernels_idle_since is None or h.gpu_idle_since is None or (h.presence is not None and h.presence.busy):
        return None
    last_input = h.presence.last_input if h.presence is not None else None
    return max(h.kernels_idle_since, h.gpu_idle_since, -math.inf if last_input is None else last_input)


def away_since(h: Holder, now: float, stale_after: float) -> float | None:
    """Since when the owner has been away from a server whose presence is known now; None when they are
    at work now (a kernel or the GPU busy) or when nobody can tell (then the idle rule alone applies).

    Away since the later of: the last use (kernels, GPU, input in a page), and, with no page open, the
    moment the last page was seen (a closed tab, a laptop asleep). A page open without input is no
    presence (a screen left on). Nobody can tell when the report is older than ``stale_after`` (the
    server stopped reporting), or when kernels are connected from a client that does not report input
    (no page of the lab extension open: another editor, a script).
    """
    p = h.presence
    if p is None or now - p.reported > stale_after or (p.pages == 0 and p.connections > 0):
        return None
    since = idle_since(h)
    if since is None:
        return None
    return max(since, p.last_page) if p.pages == 0 and p.last_page is not None else since


# Why reclaiming warns or stops a server (the reclaimer's words and the model's counts name them):
# idle while others wait, its owner left while others wait, held past its class's max_hold while
# others wait, or its owner left long ago (released whoever waits).
IDLE, LEFT, HELD, RELEASED = "idle", "left", "held", "released"
RECLAIM_REASONS = (IDLE, LEFT, HELD, RELEASED)
# How the reclaimer's "warned" event begins for each reason but max_hold's (HELD_TOO_LONG):
# spawner/ledger.py ``reclaim_notice`` tells the owner from them what keeps the server.
WARNED = {
    IDLE: "idle while others wait for a GPU",
    LEFT: "nobody there while others wait for a GPU",
    RELEASED: "nobody there for long",
}


def past_left(h: Holder, now: float, rule: PresenceRule) -> float | None:
    """Seconds past the moment the left rule gives ``h``'s slice to the line (negative: before it): away
    ``rule.left_timeout`` with no page open, ``rule.no_input_timeout`` with a page open and no input
    in it. None when nobody can tell or the owner is at work (``away_since``)."""
    away = away_since(h, now, rule.stale_after)
    if away is None or h.presence is None:
        return None
    return now - away - (rule.left_timeout if h.presence.pages == 0 else rule.no_input_timeout)


@dataclass(frozen=True)
class Due:
    """When a server may be reclaimed for the line: ``past`` seconds past that moment (negative: before it),
    for ``reason`` (IDLE or LEFT), its owner warned ``lead`` seconds before it."""

    past: float
    reason: str
    lead: float


def due(
    h: Holder, now: float, gpu_idle_timeout: float, rule: PresenceRule | None = None, warn_before: float = 180.0
) -> Due | None:
    """Whichever rule makes ``h`` due first: idle for ``gpu_idle_timeout`` (warned ``warn_before`` ahead), or
    left (``past_left``: warned a third of its timeout ahead, at most ``warn_before``). None: not now (no
    GPU, or in use)."""
    since = idle_since(h) if h.has_gpu else None
    if since is None:
        return None
    idle = Due(now - since - gpu_idle_timeout, IDLE, warn_before)
    left = past_left(h, now, rule) if rule is not None else None
    if rule is None or left is None or left < idle.past:
        return idle
    timeout = rule.left_timeout if h.presence is not None and h.presence.pages == 0 else rule.no_input_timeout
    return Due(left, LEFT, min(warn_before, timeout / 3))


# GPU memory moves a little on its own (allocator caches, the driver); a change larger than
# this between two looks is a process at work.
GPU_MEMORY_STEADY_BYTES = 16 * 2**20
# A card this busy, used by one server's processes alone, is that server's work.
GPU_BUSY_PCT = 5.0


@dataclass(frozen=True)
class GpuTrace:
    """What reclaiming remembers of one server's GPU memory (all its processes together)."""

    memory_bytes: int  # the reading that later ones are compared with
    changed: float | None  # when it last moved by more than GPU_MEMORY_STEADY_BYTES; None: not since first seen


def follow_gpu_memory(
    traces: Mapping[str, GpuTrace],
    readings: Mapping[str, int],
    now: float,
    steady_bytes: int = GPU_MEMORY_STEADY_BYTES,
) -> dict[str, GpuTrace]:
    """Each server's trace after one more look (``readings``: its processes' GPU memory now, 0 for none).

    The reference reading moves only with a change, so a slow creep adds up until it counts.
    A server seen for the first time has no change yet: its GPU says nothing either way.
    """
    followed = {}
    for key, memory in readings.items():
        before = traces.get(key)
        if before is None:
            followed[key] = GpuTrace(memory, None)
        elif abs(memory - before.memory_bytes) > steady_bytes:
            followed[key] = GpuTrace(memory, now)
        else:
            followed[key] = before
    return followed


def busy_alone(cards: Iterable[tuple[float, Iterable[str]]], busy_pct: float = GPU_BUSY_PCT) -> set[str]:
    """The servers whose card is busy while their processes are the only ones on it.

    ``cards``: each card's utilization (%) and the servers owning its processes. A busy card
    shared by several servers' processes says nothing about which of them works, so none of
    them is counted busy by it (``busy_processes`` tells them apart where NVML samples processes).
    """
    busy: set[str] = set()
    for utilization, owners in cards:
        keys = set(owners)
        if utilization >= busy_pct and len(keys) == 1:
            busy |= keys
    return busy


def busy_processes(sm_pct: Mapping[str, float], busy_pct: float = GPU_BUSY_PCT) -> set[str]:
    """The servers whose own processes ran kernels since the last look (``sm_pct``: each server's
    highest per-process SM utilization, from NVML's per-process samples), whoever shares the card."""
    return {key for key, pct in sm_pct.items() if pct >= busy_pct}


def with_gpu_activity(holders: Iterable[Holder], traces: Mapping[str, GpuTrace], busy: Set[str]) -> list[Holder]:
    """The holders with their GPU's own evidence joined to JupyterHub's activity.

    A server alone on a busy card uses the GPU now; one whose GPU memory changed at ``t`` has
    been GPU-idle only since ``t``. The GPU can only make a server busier than JupyterHub says.
    """
    joined = []
    for h in holders:
        if h.key in busy:
            h = replace(h, gpu_idle_since=None)
        trace = traces.get(h.key)
        if trace is not None and trace.changed is not None and h.gpu_idle_since is not None:
            h = replace(h, gpu_idle_since=max(h.gpu_idle_since, trace.changed))
        joined.append(h)
    return joined


def reclaim(
    holders: Iterable[Holder],
    *,
    waiting: int,
    now: float,
    gpu_idle_timeout: float = GPU_IDLE_TIMEOUT_S,
    warn_before: float = 180.0,
    presence: PresenceRule | None = None,
) -> tuple[list[str], list[str]]:
    """Reclaiming while anyone waits: (servers to warn, servers to stop), the longest past due first.

    Only servers with a GPU that nobody uses (kernels, GPU, input in a page: ``idle_since``), due when
    idle for ``gpu_idle_timeout`` or, with a ``presence`` rule, when their owner has left (``due``,
    whichever comes first); from their lead before that their owners are warned; at most ``waiting``
    of them in all (the line gets no more than it needs, and nobody is warned of a stop that will not
    come). Nobody waiting: nothing (``release`` and the culler apply).
    """
    found = _reclaimable(holders, waiting, now, gpu_idle_timeout, warn_before, presence)
    return [k for k, d in found.items() if d.past < 0], [k for k, d in found.items() if d.past >= 0]


def _reclaimable(
    holders: Iterable[Holder],
    waiting: int,
    now: float,
    gpu_idle_timeout: float,
    warn_before: float,
    presence: PresenceRule | None,
) -> dict[str, Due]:
    if waiting <= 0:
        return {}
    found = {h.key: due(h, now, gpu_idle_timeout, presence, warn_before) for h in holders}
    return _first({k: d for k, d in found.items() if d is not None}, waiting)


def release(
    holders: Iterable[Holder], *, now: float, rule: PresenceRule, warn_before: float = 180.0
) -> tuple[list[str], list[str]]:
    """Whoever waits or not: (servers to warn, servers to stop) whose owners have left (``away_since``)
    for ``rule.release_timeout``, warned a third of it ahead (at most ``warn_before``). A server whose
    presence nobody can tell is left to the idle culler."""
    found = _released(holders, now, rule, warn_before)
    return [k for k, d in found.items() if d.past < 0], [k for k, d in found.items() if d.past >= 0]


def _released(holders: Iterable[Holder], now: float, rule: PresenceRule, warn_before: float) -> dict[str, Due]:
    lead = min(warn_before, rule.release_timeout / 3)
    found = {}
    for h in holders:
        away = away_since(h, now, rule.stale_after) if h.has_gpu else None
        if away is not None:
            found[h.key] = Due(now - away - rule.release_timeout, RELEASED, lead)
    return _first(found, None)


def _first(found: Mapping[str, Due], at_most: int | None) -> dict[str, Due]:
    """The servers within their lead of their due moment or past it, the longest past it first, at most
    ``at_most`` of them (None: all)."""
    chosen = sorted(((d, k) for k, d in found.items() if d.past >= -d.lead), key=lambda dk: (-dk[0].past, dk[1]))
    return {k: d for d, k in chosen[:at_most]}


# The words of the reclaimer's warning and stop note for a server held past its class's max_hold:
# spawner/ledger.py ``reclaim_notice`` tells the owner from them that using the server will not keep it.
HELD_TOO_LONG = "held past the max_hold"


def over_hold(
    holders: Iterable[Holder], *, waiting: int, now: float, warn_before: float = 180.0
) -> tuple[list[str], list[str]]:
    """While others wait: (servers to warn, servers to stop) for having held their slice past their
    class's ``max_hold``, used or not, longest past it first, at most ``waiting`` of them.

    What a server reports as activity is its owner's to forge (a cell that runs every few minutes,
    or a script that posts to the hub's activity API), so idleness alone cannot free a slice from
    someone determined to keep it; the time held can, measured from the platform's own record of
    the placement. Warned ``warn_before`` seconds ahead; nobody waiting: nothing.
    """
    if waiting <= 0:
        return [], []
    past: list[tuple[float, str]] = []
    for h in holders:
        if h.has_gpu and h.held_since is not None and h.max_hold_s is not None:
            beyond = now - h.held_since - h.max_hold_s
            if beyond >= -warn_before:
                past.append((beyond, h.key))
    past.sort(key=lambda pair: (-pair[0], pair[1]))
    chosen = past[:waiting]
    return [key for beyond, key in chosen if beyond < 0], [key for beyond, key in chosen if beyond >= 0]


@dataclass(frozen=True)
class Reclaims:
    """One look's decisions: each server to warn and each to stop, with its reason (RECLAIM_REASONS), and
    how long before its due moment each is warned."""

    warn: dict[str, str]
    stop: dict[str, str]
    lead: dict[str, float]


def reclaims(
    holders: Iterable[Holder],
    *,
    waiting: int,
    now: float,
    gpu_idle_timeout: float = GPU_IDLE_TIMEOUT_S,
    warn_before: float = 180.0,
    presence: PresenceRule | None = None,
) -> Reclaims:
    """Everything reclaiming decides at one look, in one place for the reclaimer (hub/reclaimer.py) and the
    class-day model (bench/classday.py): while ``waiting`` requests wait, idle or left servers (``reclaim``),
    then servers past their class's ``max_hold`` (``over_hold``) for the rest of the need; and, with a
    ``presence`` rule, whoever waits, servers whose owners left ``release_timeout`` ago (``release``).
    A server is named once, for the first of those reasons that applies. ``follow_warnings`` turns the
    decisions into warnings and stops at the times the warnings announce.

    Whoever else reclaims slices through the line (work that yields to people) can call this with
    their own holders: a ``Holder`` is any running work that holds a slice.
    """
    holders = list(holders)
    found = _reclaimable(holders, waiting, now, gpu_idle_timeout, warn_before, presence)
    rest = [h for h in holders if h.key not in found]
    wants_held, takes_held = over_hold(rest, waiting=waiting - len(found), now=now, warn_before=warn_before)
    found.update({k: Due(0.0 if k in takes_held else -1.0, HELD, warn_before) for k in [*wants_held, *takes_held]})
    if presence is not None:
        found.update(_released([h for h in rest if h.key not in found], now, presence, warn_before))
    return Reclaims(
        warn={k: d.reason for k, d in found.items() if d.past < 0},
        stop={k: d.reason for k, d in found.items() if d.past >= 0},
        lead={k: d.lead for k, d in found.items()},
    )


@dataclass(frozen=True)
class ReclaimWarning:
    """A warning given to a server's owner: when, why (RECLAIM_REASONS), and the stop it announced."""

    at: float
    reason: str
    stops_at: float


# How often an open JupyterLab asks the hub for notices, at most: often enough to see a warning well
# before its stop, rarely enough that a class's open tabs cost the hub little.
NOTICE_LOOK_EVERY_S = 30.0
# A save's own time: the documents written after the notice arrived, on a loaded server.
SAVE_TAKES_S = 5.0


def notice_look_interval(warn_before: float) -> float:
    """Seconds between an open JupyterLab's looks for notices: a sixth of the warning lead, at most
    NOTICE_LOOK_EVERY_S, so that a warning is seen within a sixth of its lead."""
    return max(0.5, min(NOTICE_LOOK_EVERY_S, warn_before / 6))


def warning_save_window(warn_before: float) -> float:
    """How long after a warning the activity it causes can come: JupyterLab saves every open document
    when it sees the warning (the lab extension, docs/platform.md), at its next look, and the save's
    time is what the server reports (whenever the report reaches the hub). A use after this window is
    a use, even inside the warning's lead."""
    return notice_look_interval(warn_before) + SAVE_TAKES_S


def without_warning_saves(
    holders: Iterable[Holder],
    warned: Mapping[str, ReclaimWarning],
    seen_at_warning: Mapping[str, float],
    window_s: float,
) -> list[Holder]:
    """The holders, each warned one's activity within ``window_s`` after its warning read as it was when warned
    (``seen_at_warning``): the save the warning itself caused is not a use. Input in a page still is (presence),
    and so is any activity later than the window."""
    found = []
    for holder in holders:
        warning, before = warned.get(holder.key), seen_at_warning.get(holder.key)
        if warning is not None and warning.reason != HELD and before is not None:
            until = warning.at + window_s
            holder = replace(
                holder,
                kernels_idle_since=_before_saved(holder.kernels_idle_since, before, until),
                gpu_idle_since=_before_saved(holder.gpu_idle_since, before, until),
            )
        found.append(holder)
    return found


def _before_saved(since: float | None, before: float, until: float) -> float | None:
    """``before`` for an activity between it and ``until`` (the warning's save); any other as it is."""
    return before if since is not None and before < since <= until else since


def follow_warnings(
    warned: Mapping[str, ReclaimWarning],
    decided: Reclaims,
    now: float,
    report_every: float,
    keep: Set[str] = frozenset(),
) -> tuple[dict[str, ReclaimWarning], list[str]]:
    """The warnings standing after one look, and the servers to stop now.

    A warning stands while its server is decided again for the same reason (``keep``: servers whose
    warnings stand as they are, not decided this time because the line's need is on its way); used
    again, or needed no more, it lapses; a new reason is a new warning. A new warning announces its
    stop ``lead`` later and, but for max_hold's (used or not), one activity report after that
    (``stop_at``: a use made before the announced time reaches the hub first). A server is stopped
    once it is due and its warning's announced time has come.
    """
    standing = {**decided.warn, **decided.stop}
    kept = {k: w for k, w in warned.items() if standing.get(k) == w.reason or (k in keep and k not in standing)}
    for key, reason in sorted(standing.items()):
        if key not in kept:
            lead = decided.lead[key]
            stops = now + lead if reason == HELD else stop_at(now, lead, report_every)
            kept[key] = ReclaimWarning(now, reason, stops)
    return kept, sorted(k for k in decided.stop if now >= kept[k].stops_at)


def still_freeing(freeing: Mapping[str, float], active: Set[str], now: float, grace_s: float) -> dict[str, float]:
    """The servers stopped for the line whose slices may not have reached it yet, and when last seen.

    A stopped server frees its slice only once the hub is done stopping it (it is still
    ``active`` until then: a pod takes a while to go), and the waiting spawn takes the slice at
    its next look: ``grace_s`` after that. Until then the line is not short of that slice, so
    no one else is warned for it.
    """
    kept = {key: seen for key, seen in freeing.items() if key in active or now - seen < grace_s}
    return {key: now if key in active else seen for key, seen in kept.items()}


@dataclass(frozen=True)
class Manager:
    """Someone acting on the line: an admin, or the teacher of ``classes`` (empty: a student)."""

    name: str
    admin: bool = False
    classes: frozenset[str] = frozenset()


def may_manage(manager: Manager, group: str | None, what: str = "this request") -> str | None:
    """Why ``manager`` may not change ``what`` (charged to ``group``) in the line; None if they may."""
    if manager.admin or (group is not None and group in manager.classes):
        return None
    if not manager.classes:
        return f"{manager.name} may not change the GPU line: only admins and the teachers of a class can"
    taught = ", ".join(sorted(manager.classes))
    return f"{manager.name} teaches {taught}, not {group or 'the class of ' + what}: only an admin may change {what}"


@dataclass(frozen=True)
class Reservation:
    """GPU memory kept for a class's requests from ``start`` to ``end`` (seconds since the epoch)."""

    group: str
    memory_bytes: int
    start: float
    end: float
    by: str = ""
    id: int | None = None  # the ledger's row, once written

    def on(self, now: float) -> bool:
        return self.start <= now < self.end


def kept_for_others(reservations: Iterable[Reservation], group: str | None, held: Mapping[str, int], now: float) -> int:
    """The memory reserved now for classes other than ``group`` that they do not already hold."""
    kept: dict[str, int] = {}
    for r in reservations:
        if r.on(now) and r.group != group:
            kept[r.group] = kept.get(r.group, 0) + r.memory_bytes
    return sum(max(0, total - held.get(name, 0)) for name, total in kept.items())


def reservation_problem(new: Reservation, existing: Iterable[Reservation], capacity_bytes: int) -> str | None:
    """Why ``new`` cannot be added (what to do instead); None if it can.

    Reservations that overlap in time must fit on the machine together, at every moment.
    """
    if not new.group:
        return "name the class to reserve for"
    if new.memory_bytes <= 0:
        return "reserve a positive amount of GPU memory, for example 8GiB"
    if new.end <= new.start:
        return "the window must end after it starts"
    overlapping = [r for r in existing if r.start < new.end and new.start < r.end]
    for moment in sorted({new.start, *(r.start for r in overlapping if r.start > new.start)}):
        total = new.memory_bytes + sum(r.memory_bytes for r in overlapping if r.on(moment))
        if total > capacity_bytes:
            return (
                f"with the reservations already made this would keep {format_bytes(total)} at once,"
                f" more than the {format_bytes(capacity_bytes)} of GPU memory here: reserve less or another time"
            )
    return None


# How a wait ended: placed on a GPU, or out of the line without one (the spawn stopped,
# it waited longer than the limit, a teacher or admin cancelled it).
WAIT_OUTCOMES = ("placed", "left", "cancelled")


@dataclass(frozen=True)
class Wait:
    """One finished wait in the line: from joining it (``queued``) to ``ended``, seconds since the epoch."""

    key: str
    user: str
    group: str | None
    queued: float
    ended: float
    outcome: str  # one of WAIT_OUTCOMES

    @property
    def seconds(self) -> float:
        return max(0.0, self.ended - self.queued)


@dataclass(frozen=True)
class WaitStats:
    """The waits that began on one UTC day for one class (``group`` None: charged to no class)."""

    day: str  # YYYY-MM-DD, UTC
    group: str | None
    waits: int
    placed: int  # the others left the line without a GPU
    p50_s: float
    p95_s: float
    longest_s: float


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile: the smallest value with at least p% of ``values`` at or below it."""
    if not values:
        raise ValueError("no values to take a percentile of")
    if not 0 < p <= 100:
        raise ValueError(f"a percentile is in (0, 100], not {p}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def day_start(stamp: float) -> float:
    """The start of ``stamp``'s UTC day (the least-served order counts what each user held since then)."""
    return stamp - stamp % 86400


def wait_day(stamp: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(stamp))


def wait_stats(waits: Iterable[Wait]) -> list[WaitStats]:
    """Wait-time percentiles per class and per day (the day a wait began, UTC); latest day first, then by class.

    A wait counts from joining the line to being placed or leaving it, so those who gave up
    count too (for as long as they waited): leaving them out would make a crowded day look short.
    """
    grouped: dict[tuple[str, str | None], list[Wait]] = {}
    for w in waits:
        grouped.setdefault((wait_day(w.queued), w.group), []).append(w)
    rows = []
    for (day, group), found in grouped.items():
        seconds = [w.seconds for w in found]
        placed = sum(w.outcome == "placed" for w in found)
        rows.append(
            WaitStats(day, group, len(found), placed, percentile(seconds, 50), percentile(seconds, 95), max(seconds))
        )
    rows.sort(key=lambda r: (r.group is None, r.group or ""))
    rows.sort(key=lambda r: r.day, reverse=True)
    return rows


def sees_wait(manager: Manager, wait: Wait) -> bool:
    """Admins see every class's waits, a teacher their classes' (and their own), anyone else only their own."""
    return manager.admin or (wait.group is not None and wait.group in manager.classes) or wait.user == manager.name
