"""`gpuslice bench class-day`: a simulated teaching day, three ways of sharing two cards.

A discrete-time model (30 s steps) of one machine: 60 students in two sections, two
simulated 16 GiB cards, 4 GiB slices (eight at a time). The line's order and every
placement go through the platform's own pure code (spawner/waitline.py ``admit``, the
placement policy, ``build_local``); over-commits are counted independently, by summing
what each card holds after every step.

The day (stated, not fitted; see ``Day``): section A's lab runs 09:00-12:00, section B's
13:00-16:00. Students arrive at their lab's start plus an exponential delay (mean 10
min). Each needs ``work`` minutes of GPU activity, uniform in 10-30, in bursts with
exponential lengths (mean 8 min) separated by idle gaps (mean 5 min: reading, thinking).
When done, 60 % stop their server; 40 % forget it (kernel and GPU idle from then on).
A student who has not had a slice after 90 minutes gives up. JupyterHub's idle culler
stops servers idle for 60 minutes in every regime.

The three regimes:

* ``retry``: plain JupyterHub: refused when nothing fits, the student presses Start again
  every 2 minutes;
* ``line``: the waiting line, no reclaiming;
* ``line+reclaim``: the line, and while anyone waits a slice whose kernels and GPU have
  been idle for ``gpu_idle_timeout`` (15 min) is reclaimed (spawner.waitline ``reclaim``:
  longest idle first, no more than the line needs); a student reclaimed in the middle of
  their work joins the line again when they come back.

And a bound, not a regime anyone can run: ``oracle``, the line with reclaiming where each
forgotten slice is freed the moment its owner leaves (the same students, none forgetting).
No platform knows that moment: reclaiming that waits for ``gpu_idle_timeout`` of idleness
can free a forgotten slice no sooner, so its waits are no shorter than the oracle's unless
it stops students who are still working (or changes the line's order).

Besides the issue's figures (served fraction, the p95 of all waits, idle allocated GPU-hours,
over-commits) each regime reports what reclaiming costs: students *interrupted* (stopped in a
gap of their work: they lose their kernels and wait again) and the p95 of each student's waits
added up, since a student stopped three times adds three short waits that lower the p95 of waits
while they wait longer in all. ``sweep`` (``--sweep FIELD=V1,V2``) varies one number of the day
against the retry baseline on the same day: an analysis of what a setting buys and costs; it
changes neither ``Day`` nor the platform's defaults.

Seeds: the model was written and checked on seeds 1-5 (``DESIGN_SEEDS``); the figures
reported come from seeds 101-120 (``REPORT_SEEDS``), never looked at while designing.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, fields, replace
from typing import Any

from bench.stats import percentile
from spawner.gpus import simulated_gpus
from spawner.inventory import Allocation, build_local
from spawner.line_timeouts import GPU_LEFT_TIMEOUT_S, GPU_NO_INPUT_TIMEOUT_S, GPU_RELEASE_TIMEOUT_S
from spawner.placement import Demand
from spawner.shares import GiB
from spawner.waitline import (
    Entry,
    Holder,
    Presence,
    PresenceRule,
    ReclaimWarning,
    activity_report_interval,
    admit,
    follow_warnings,
    reclaims,
    warning_lead,
)

DESIGN_SEEDS = tuple(range(1, 6))
REPORT_SEEDS = tuple(range(101, 121))
IDLE_ONLY, PLATFORM = "idle only", "line+reclaim"
REGIMES = ("retry", "line", IDLE_ONLY, PLATFORM)
# The platform's rule with a class's choices: its max_hold (Day.max_hold), or the least-served order.
VARIANTS = ("+max_hold", "+least-served")
ORACLE = "oracle"  # a bound: see the module's docstring
STEP_MIN = 0.5


@dataclass(frozen=True)
class Day:
    """The day's stated distributions (minutes unless named otherwise)."""

    students: int = 60
    cards: str = "2x16GiB:T4"
    slice_gib: int = 4
    labs: tuple[float, ...] = (9 * 60.0, 13 * 60.0)  # each section's lab start, minutes after midnight
    lab_minutes: float = 180.0
    arrival_mean: float = 10.0
    work_range: tuple[float, float] = (10.0, 30.0)
    burst_mean: float = 8.0
    gap_mean: float = 5.0
    forget_share: float = 0.4
    patience: float = 90.0
    idle_timeout: float = 60.0  # JupyterHub's idle culler
    gpu_idle_timeout: float = 15.0  # reclaiming while anyone waits
    warn_before: float = 3.0  # the reclaimer's warning lead (spawner.waitline warning_lead: 3 min at 15)
    retry_every: float = 2.0
    # Presence (stated, not fitted; drawn from each student's own stream, so the draws above are
    # the same as before it was added).
    close_tab_share: float = 0.5  # of those who forget their server: close the tab (the rest leave it open)
    away_pause_share: float = 0.2  # pauses spent away from the page (another tab, a talk): no input in them
    input_every: float = 1.0  # mean minutes between inputs (typing, scrolling, clicking) in a pause at the page
    # The platform's presence rule (spawner.waitline PresenceRule; its defaults were chosen on the design seeds).
    gpu_left_timeout: float = GPU_LEFT_TIMEOUT_S / 60
    gpu_no_input_timeout: float = GPU_NO_INPUT_TIMEOUT_S / 60
    gpu_release_timeout: float = GPU_RELEASE_TIMEOUT_S / 60
    max_hold: float = 60.0  # the "+max_hold" regime's class max_hold


@dataclass
class Student:
    name: str
    arrives: float
    work_left: float
    forgets: bool
    rng: random.Random
    holding: int | None = None  # the GPU index held, if any
    waiting_since: float | None = None
    next_retry: float = 0.0
    phase: str = "away"  # away, waiting, burst, gap, forgotten, done, gave-up
    phase_left: float = 0.0
    idle_since: float | None = None  # holding and idle since (kernel and GPU)
    served: bool = False
    waits: list[float] = field(default_factory=list)
    interrupted: int = 0  # times their slice was taken in a gap of their work (reclaimed or culled)
    presence_rng: random.Random = field(default_factory=random.Random)
    page_open: bool = False  # a JupyterLab page of their server is open
    at_page: bool = True  # in a pause: at the page (input now and then) or away from it (none)
    last_input: float | None = None
    last_page: float | None = None  # when the page was last seen open (closing the tab)
    held_since: float | None = None
    held_today: float = 0.0  # minutes held before the current hold (least-served order)


def students(day: Day, seed: int) -> list[Student]:
    rng = random.Random(seed)
    made = []
    for i in range(day.students):
        lab = day.labs[i % len(day.labs)]
        arrives = lab + min(rng.expovariate(1 / day.arrival_mean), day.lab_minutes / 2)
        work = rng.uniform(*day.work_range)
        forgets = rng.random() < day.forget_share
        presence = random.Random(f"{seed}:{i}:presence")  # its own stream: the draws above stay as they were
        made.append(Student(f"s{i:02d}", arrives, work, forgets, random.Random(rng.random()), presence_rng=presence))
    return made


@dataclass(frozen=True)
class Decision:
    """One stop by reclaiming: whose, when (model minute), why (spawner.waitline RECLAIM_REASONS), and
    whether they were still at work (in a pause of it, or running cells)."""

    student: str
    minute: float
    reason: str
    working: bool


@dataclass
class Outcome:
    waits: list[float] = field(default_factory=list)
    student_waits: list[float] = field(default_factory=list)  # each student's waits added up
    idle_gpu_hours: float = 0.0
    idle_while_waiting: float = 0.0  # the part of it while someone waited for a slice
    over_commits: int = 0
    reclaimed: int = 0
    interrupted: int = 0  # stops of a student with work left: they lose their kernels and wait again
    decisions: list[Decision] = field(default_factory=list)  # every stop reclaiming made, in order
    served: int = 0
    gave_up: int = 0
    finished: int = 0
    students: int = 0


def simulate(regime: str, day: Day, seed: int) -> Outcome:
    """One day under ``regime``; the same students (same seed) in every regime."""
    if regime not in (*REGIMES, *VARIANTS, ORACLE):
        raise ValueError(f"unknown regime {regime!r}; use one of {', '.join((*REGIMES, *VARIANTS, ORACLE))}")
    if regime == ORACLE:
        # The same draws (students() draws whether each forgets either way), nobody forgetting.
        regime, day = IDLE_ONLY, replace(day, forget_share=0.0)
    rule = presence_rule(day) if regime in (PLATFORM, *VARIANTS) else None
    max_hold = day.max_hold if regime == "+max_hold" else None
    least_served = regime == "+least-served"
    cards = simulated_gpus(day.cards)
    slice_bytes = day.slice_gib * GiB
    demand = Demand(slice_units=float(slice_bytes))
    people = students(day, seed)
    out = Outcome(students=len(people))
    end = max(day.labs) + day.lab_minutes + day.patience + 120.0
    now = min(s.arrives for s in people) - STEP_MIN
    warned: dict[str, ReclaimWarning] = {}
    report_every = activity_report_interval(day.warn_before * 60) / 60  # the servers' reports, in minutes

    def inventory() -> Any:
        held = [(s.holding, Allocation(s.name, "", slice_bytes, s.name)) for s in people if s.holding is not None]
        return build_local(cards, held)

    def place(s: Student, gpu: int) -> None:
        assert s.waiting_since is not None
        s.waits.append(now - s.waiting_since)
        s.holding, s.waiting_since, s.served, s.held_since = gpu, None, True, now
        s.phase, s.phase_left, s.idle_since = "burst", s.rng.expovariate(1 / day.burst_mean), None
        s.page_open, s.at_page, s.last_input, s.last_page = True, True, now, now  # JupyterLab opens

    def release(s: Student) -> None:
        if s.held_since is not None:
            s.held_today += now - s.held_since
        s.holding, s.idle_since, s.held_since, s.page_open = None, None, None, False

    def request(s: Student) -> None:
        s.phase, s.waiting_since, s.next_retry = "waiting", now, now

    while now < end:
        now += STEP_MIN
        for s in people:
            _advance(s, now, day, request, release)
        waiting = [s for s in people if s.phase == "waiting"]
        for s in waiting:
            assert s.waiting_since is not None
            if now - s.waiting_since >= day.patience:
                s.waits.append(now - s.waiting_since)
                s.phase, s.waiting_since = "gave-up", None
        waiting = [s for s in people if s.phase == "waiting"]
        if regime not in ("retry", "line"):
            holders = [_holder(s, now, rule is not None, max_hold) for s in people if s.holding is not None]
            decided = reclaims(
                holders,
                waiting=len(waiting),
                now=now,
                gpu_idle_timeout=day.gpu_idle_timeout,
                warn_before=day.warn_before,
                presence=rule,
            )
            if regime == IDLE_ONLY:  # as this model had it before presence: stopped the minute it is due
                stops = decided.stop
            else:  # the reclaimer's own warnings: stopped at the time each announced
                warned, ending = follow_warnings(warned, decided, now, report_every)
                stops = {key: warned.pop(key).reason for key in ending}
            for s in [s for s in people if s.name in stops]:
                working = s.phase in ("gap", "burst")
                out.decisions.append(Decision(s.name, now, stops[s.name], working))
                release(s)
                out.reclaimed += 1
                # Stopped in the middle of their work: back in line when they come back.
                if working:
                    if s.phase == "burst":  # stopped while running (its class's max_hold): back at once
                        s.phase_left = 0.0
                    s.phase, s.interrupted = "reclaimed", s.interrupted + 1
                else:
                    s.phase = "done"
        if regime == "retry":
            due = [s for s in waiting if now >= s.next_retry]
            s_rng = random.Random(seed * 1_000_003 + int(now * 2))
            s_rng.shuffle(due)  # whoever presses Start first in this half minute
            for s in due:
                got = admit([_entry(s, demand, slice_bytes, now)], inventory(), budgets={}, group_bytes={}, now=now)
                if got:
                    place(s, cards[got[0].choice.gpus[0]].index)
                else:
                    s.next_retry = now + day.retry_every
        elif waiting:
            entries = [_entry(s, demand, slice_bytes, now, least_served) for s in waiting]
            by_name = {s.name: s for s in waiting}
            for a in admit(entries, inventory(), budgets={}, group_bytes={}, now=now):
                place(by_name[a.entry.user], cards[a.choice.gpus[0]].index)
        out.over_commits += _over_commits(people, cards, slice_bytes)
        idle = sum(
            STEP_MIN / 60 * slice_bytes / cards[s.holding].memory_bytes
            for s in people
            if s.holding is not None and s.idle_since is not None
        )
        out.idle_gpu_hours += idle
        if any(s.phase == "waiting" for s in people):
            out.idle_while_waiting += idle
    for s in people:
        if s.phase == "waiting" and s.waiting_since is not None:
            s.waits.append(end - s.waiting_since)  # still waiting at the end: counted, censored
        out.waits.extend(s.waits)
        out.student_waits.append(sum(s.waits))
        out.interrupted += s.interrupted
    out.served = sum(1 for s in people if s.served)
    out.gave_up = sum(1 for s in people if s.phase == "gave-up")
    out.finished = sum(1 for s in people if s.work_left <= 0)
    return out


def presence_rule(day: Day) -> PresenceRule:
    """The platform's presence rule in the model's minutes (reports arrive every step: never stale)."""
    return PresenceRule(day.gpu_left_timeout, day.gpu_no_input_timeout, day.gpu_release_timeout, stale_after=math.inf)


def _holder(s: Student, now: float, presence: bool, max_hold: float | None) -> Holder:
    """``s``'s server as the reclaimer sees it: its kernels' and GPU's idleness, its hold, and (with the
    presence rule) what its server reports of its page: open or not, the last input in it."""
    pages = int(s.page_open)
    seen = Presence(now, pages, pages, False, s.last_input, s.last_page) if presence else None
    return Holder(s.name, True, s.idle_since, s.idle_since, s.held_since, max_hold, seen)


def _entry(s: Student, demand: Demand, slice_bytes: int, now: float, least_served: bool = False) -> Entry:
    assert s.waiting_since is not None
    served = s.held_today if least_served else 0.0
    return Entry(s.name, s.name, demand, slice_bytes, None, s.waiting_since, seen=now, served=served)


def _advance(s: Student, now: float, day: Day, request: Any, release: Any) -> None:
    """One step of a student's own day: arrive, work, pause, finish, come back after a reclaim; and what
    their page says meanwhile (input while working and now and then in a pause at it)."""
    if s.phase == "away" and now >= s.arrives:
        request(s)
    elif s.phase == "burst":
        s.work_left -= STEP_MIN
        s.phase_left -= STEP_MIN
        s.last_input = now  # running cells, typing
        if s.work_left <= 0:
            if s.forgets:
                s.phase, s.idle_since = "forgotten", now
                if s.presence_rng.random() < day.close_tab_share:  # gone, the tab closed; else left open on the screen
                    s.page_open, s.last_page = False, now
            else:
                release(s)
                s.phase = "done"
        elif s.phase_left <= 0:
            s.phase, s.phase_left, s.idle_since = "gap", s.rng.expovariate(1 / day.gap_mean), now
            s.at_page = s.presence_rng.random() >= day.away_pause_share
    elif s.phase in ("gap", "reclaimed"):
        s.phase_left -= STEP_MIN
        if s.phase == "gap" and s.at_page and s.presence_rng.random() < 1 - math.exp(-STEP_MIN / day.input_every):
            s.last_input = now
        if s.phase_left <= 0:
            if s.phase == "reclaimed":
                request(s)
            else:
                s.phase, s.phase_left, s.idle_since = "burst", s.rng.expovariate(1 / day.burst_mean), None
    if s.holding is not None and s.idle_since is not None and now - s.idle_since >= day.idle_timeout:
        release(s)  # JupyterHub's idle culler (its activity: kernels, saves; not a page's input)
        if s.phase == "gap":
            s.phase, s.interrupted = "reclaimed", s.interrupted + 1
        elif s.phase == "forgotten":
            s.phase = "done"


def _over_commits(people: list[Student], cards: list[Any], slice_bytes: int) -> int:
    """Cards holding more than their memory right now (checked apart from the line's arithmetic)."""
    held: dict[int, int] = {}
    for s in people:
        if s.holding is not None:
            held[s.holding] = held.get(s.holding, 0) + slice_bytes
    return sum(1 for card in cards if held.get(card.index, 0) > card.memory_bytes)


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """One regime's days together: served fraction, waits, idle allocated GPU-hours, over-commits, stops."""
    waits = [w for o in outcomes for w in o.waits]
    per_student = [w for o in outcomes for w in o.student_waits]
    total = sum(o.students for o in outcomes)
    days = len(outcomes)
    return {
        "served_fraction": sum(o.served for o in outcomes) / total,
        "finished_fraction": sum(o.finished for o in outcomes) / total,
        "gave_up": sum(o.gave_up for o in outcomes),
        "wait_min": {"p50": percentile(waits, 50), "p95": percentile(waits, 95)},
        "waits_per_day": len(waits) / days,
        # A student stopped in a gap waits again: each wait counts above, so many short second
        # waits can lower the p95 of waits while the same students wait longer in all.
        "student_wait_min": {"p50": percentile(per_student, 50), "p95": percentile(per_student, 95)},
        "idle_gpu_hours_per_day": sum(o.idle_gpu_hours for o in outcomes) / days,
        "idle_while_waiting_gpu_hours_per_day": sum(o.idle_while_waiting for o in outcomes) / days,
        "over_commits": sum(o.over_commits for o in outcomes),
        "reclaimed_per_day": sum(o.reclaimed for o in outcomes) / days,
        "interrupted_per_day": sum(o.interrupted for o in outcomes) / days,
    }


# With nobody giving up (the "patience long"): the retry baseline's p95 is then a wait, not its patience.
LONG_PATIENCE = 600.0


def run(seeds: tuple[int, ...] = REPORT_SEEDS, day: Day | None = None) -> dict[str, Any]:
    """Every regime and variant over ``seeds``, the oracle, and retry and the platform's rule with nobody
    giving up: served fraction, waits, idle allocated GPU-hours, over-commits, stops; and the targets' ratios."""
    day = day or Day()
    result: dict[str, Any] = {"seeds": list(seeds), "day": day.__dict__, "regimes": {}}
    for regime in (*REGIMES, *VARIANTS, ORACLE):
        result["regimes"][regime] = summary([simulate(regime, day, seed) for seed in seeds])
    patient = replace(day, patience=LONG_PATIENCE)
    result["nobody_gives_up"] = {
        regime: summary([simulate(regime, patient, seed) for seed in seeds]) for regime in ("retry", PLATFORM)
    }
    regimes = result["regimes"]
    ours, bound = regimes[PLATFORM], regimes[ORACLE]
    patient_runs = result["nobody_gives_up"]
    result["targets"] = {
        "p95_wait_vs_oracle": _over(ours["wait_min"]["p95"], bound["wait_min"]["p95"]),
        "idle_gpu_hours_vs_oracle": _over(ours["idle_gpu_hours_per_day"], bound["idle_gpu_hours_per_day"]),
        "p95_wait_vs_retry_nobody_gives_up": _over(
            patient_runs[PLATFORM]["wait_min"]["p95"], patient_runs["retry"]["wait_min"]["p95"]
        ),
        "interrupted_per_day": ours["interrupted_per_day"],
        "over_commits": sum(r["over_commits"] for r in regimes.values()),
        "gave_up": ours["gave_up"],
    }
    return result


def _over(ours: float, base: float) -> float | None:
    return ours / base if base else None


# The targets on the platform's rule (line+reclaim), each as (key, limit, words).
TARGETS = (
    ("p95_wait_vs_oracle", 1.10, "p95 wait vs the oracle's"),
    ("idle_gpu_hours_vs_oracle", 1.25, "idle allocated GPU-hours vs the oracle's"),
    (
        "p95_wait_vs_retry_nobody_gives_up",
        0.50,
        f"p95 wait vs retry's, nobody giving up (patience {LONG_PATIENCE:g} m)",
    ),
    ("interrupted_per_day", 3.0, "working students stopped per day"),
    ("over_commits", 0, "over-commits, every regime"),
    ("gave_up", 0, "students who gave up waiting, all days"),
)


def report(result: dict[str, Any]) -> str:
    lines = [f"gpuslice bench class-day: seeds {result['seeds'][0]}-{result['seeds'][-1]} (model designed on 1-5)"]
    lines.append(
        f"{'regime':<22}{'served':>8}{'finished':>10}{'wait p50':>10}{'wait p95':>10}{'idle GPU-h':>12}"
        f"{'idle, others waiting':>22}{'over-commits':>14}{'reclaimed':>11}{'interrupted':>13}{'student p95':>13}"
    )
    rows = [*result["regimes"].items()]
    rows += [(f"{name}, patient", r) for name, r in result.get("nobody_gives_up", {}).items()]
    for name, r in rows:
        lines.append(
            f"{name:<22}{r['served_fraction']:>8.1%}{r['finished_fraction']:>10.1%}{r['wait_min']['p50']:>8.1f} m"
            f"{r['wait_min']['p95']:>8.1f} m{r['idle_gpu_hours_per_day']:>12.2f}"
            f"{r['idle_while_waiting_gpu_hours_per_day']:>22.2f}{r['over_commits']:>14}"
            f"{r['reclaimed_per_day']:>11.1f}{r['interrupted_per_day']:>13.1f}{r['student_wait_min']['p95']:>11.1f} m"
        )
    for key, limit, words in TARGETS:
        value = result.get("targets", {}).get(key)
        if value is None:
            lines.append(f"{PLATFORM}: {words}: no figure (the baseline had none)")
            continue
        shown = f"x{value:.2f}" if isinstance(limit, float) and limit < 2 else f"{value:g}"
        limit_shown = f"x{limit:.2f}" if isinstance(limit, float) and limit < 2 else f"{limit:g}"
        verdict = "met" if value <= limit else "NOT met"
        lines.append(f"{PLATFORM}: {words} {shown} (target <= {limit_shown}: {verdict})")
    lines.append(
        f"{PLATFORM}: the platform's rule (idle, or left: no page for {result['day']['gpu_left_timeout']:g} m,"
        f" a page without input for {result['day']['gpu_no_input_timeout']:g} m; released after"
        f" {result['day']['gpu_release_timeout']:g} m); {IDLE_ONLY}: the rule before presence (idle"
        f" {result['day']['gpu_idle_timeout']:g} m); +max_hold: with a class max_hold of"
        f" {result['day']['max_hold']:g} m;"
        f" +least-served: that order in the line; oracle: each forgotten slice freed the moment its owner leaves"
        f" (no platform can know it), the idle rule otherwise"
    )
    lines.append(
        f"GPU-hours in card-equivalents per simulated day; waits in minutes, gave-up waits counted at"
        f" {result['day']['patience']:g} m; reclaimed and interrupted (a working student stopped in a gap of"
        f" their work) per day; student p95: each student's waits added up; patient: nobody gives up"
    )
    return "\n".join(lines)


# The numbers of the day that a what-if may change (not the cards or the labs' times).
VARIABLE = tuple(f.name for f in fields(Day) if isinstance(f.default, int | float) and not isinstance(f.default, bool))
# What only reclaiming reads: the retry baseline of a what-if changing these is the day's own.
RECLAIM_ONLY = (
    "gpu_idle_timeout",
    "warn_before",
    "gpu_left_timeout",
    "gpu_no_input_timeout",
    "gpu_release_timeout",
    "max_hold",
    "close_tab_share",
    "away_pause_share",
    "input_every",
)


def what_if(day: Day, name: str, value: float) -> Day:
    """``day`` with one stated number changed. The warning lead follows ``gpu_idle_timeout`` as on
    the platform (spawner.waitline ``warning_lead``)."""
    if name not in VARIABLE:
        raise ValueError(f"the day has no number {name!r} to vary: use one of {', '.join(VARIABLE)}")
    if name == "gpu_idle_timeout" and value <= 0:
        raise ValueError("gpu_idle_timeout must be above 0 minutes")
    if value < 0 or (name == "forget_share" and value > 1):
        raise ValueError(
            f"{name}={value:g} is out of range: "
            + ("a share from 0 to 1" if name == "forget_share" else "no negative numbers")
        )
    if isinstance(getattr(day, name), int) and value != int(value):
        raise ValueError(f"{name} is a whole number, not {value:g}")
    changed = replace(day, **{name: type(getattr(day, name))(value)})
    if name == "gpu_idle_timeout":
        changed = replace(changed, warn_before=warning_lead(value * 60) / 60)
    return changed


def sweep(
    name: str, values: list[float], seeds: tuple[int, ...] = REPORT_SEEDS, day: Day | None = None
) -> dict[str, Any]:
    """``line+reclaim`` against the retry baseline on the same day, one number of the day varied.

    An analysis of what a setting buys and costs, not a tuning: the benchmark's ``Day`` and the
    platform's defaults are unchanged by it.
    """
    day = day or Day()
    baselines: dict[Day, dict[str, Any]] = {}
    rows = []
    for value in values:
        varied = what_if(day, name, value)
        key = replace(varied, **{n: getattr(day, n) for n in RECLAIM_ONLY})
        if key not in baselines:
            baselines[key] = summary([simulate("retry", key, seed) for seed in seeds])
        best = summary([simulate("line+reclaim", varied, seed) for seed in seeds])
        rows.append({"value": value, "retry": baselines[key], "line+reclaim": best})
    return {"seeds": list(seeds), "field": name, "default": getattr(day, name), "rows": rows}


def _ratio(ours: float, base: float) -> str:
    return f"x{ours / base:.2f}" if base else "-"


def report_sweep(result: dict[str, Any]) -> str:
    name = result["field"]
    lines = [
        f"gpuslice bench class-day --sweep {name}: seeds {result['seeds'][0]}-{result['seeds'][-1]};"
        f" line+reclaim against retry on the same day (the day's {name}: {result['default']:g})"
    ]
    lines.append(
        f"{name:>18}{'served':>8}{'wait p95':>10}{'vs retry':>9}{'student p95':>13}{'vs retry':>9}"
        f"{'idle GPU-h':>12}{'vs retry':>9}{'interrupted':>13}{'reclaimed':>11}{'over-commits':>14}"
    )
    for row in result["rows"]:
        ours, base = row["line+reclaim"], row["retry"]
        p95, student_p95 = ours["wait_min"]["p95"], ours["student_wait_min"]["p95"]
        idle = ours["idle_gpu_hours_per_day"]
        lines.append(
            f"{row['value']:>18g}{ours['served_fraction']:>8.1%}{p95:>8.1f} m"
            f"{_ratio(p95, base['wait_min']['p95']):>9}{student_p95:>11.1f} m"
            f"{_ratio(student_p95, base['student_wait_min']['p95']):>9}{idle:>12.2f}"
            f"{_ratio(idle, base['idle_gpu_hours_per_day']):>9}{ours['interrupted_per_day']:>13.1f}"
            f"{ours['reclaimed_per_day']:>11.1f}{ours['over_commits'] + base['over_commits']:>14}"
        )
    lines.append(
        "per simulated day; interrupted: a working student stopped in a gap of their work (they lose their"
        " kernels and wait again); student p95: each student's waits added up; targets: x0.5 or less"
    )
    return "\n".join(lines)
