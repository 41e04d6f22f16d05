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

import random
from dataclasses import dataclass, field, fields, replace
from typing import Any

from bench.stats import percentile
from spawner.gpus import simulated_gpus
from spawner.inventory import Allocation, build_local
from spawner.placement import Demand
from spawner.shares import GiB
from spawner.waitline import Entry, Holder, admit, reclaim, warning_lead

DESIGN_SEEDS = tuple(range(1, 6))
REPORT_SEEDS = tuple(range(101, 121))
REGIMES = ("retry", "line", "line+reclaim")
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


def students(day: Day, seed: int) -> list[Student]:
    rng = random.Random(seed)
    made = []
    for i in range(day.students):
        lab = day.labs[i % len(day.labs)]
        arrives = lab + min(rng.expovariate(1 / day.arrival_mean), day.lab_minutes / 2)
        work = rng.uniform(*day.work_range)
        made.append(Student(f"s{i:02d}", arrives, work, rng.random() < day.forget_share, random.Random(rng.random())))
    return made


@dataclass
class Outcome:
    waits: list[float] = field(default_factory=list)
    student_waits: list[float] = field(default_factory=list)  # each student's waits added up
    idle_gpu_hours: float = 0.0
    idle_while_waiting: float = 0.0  # the part of it while someone waited for a slice
    over_commits: int = 0
    reclaimed: int = 0
    interrupted: int = 0  # stops of a student with work left: they lose their kernels and wait again
    served: int = 0
    gave_up: int = 0
    finished: int = 0
    students: int = 0


def simulate(regime: str, day: Day, seed: int) -> Outcome:
    """One day under ``regime``; the same students (same seed) in every regime."""
    if regime not in (*REGIMES, ORACLE):
        raise ValueError(f"unknown regime {regime!r}; use one of {', '.join((*REGIMES, ORACLE))}")
    if regime == ORACLE:
        # The same draws (students() draws whether each forgets either way), nobody forgetting.
        regime, day = "line+reclaim", replace(day, forget_share=0.0)
    cards = simulated_gpus(day.cards)
    slice_bytes = day.slice_gib * GiB
    demand = Demand(slice_units=float(slice_bytes))
    people = students(day, seed)
    out = Outcome(students=len(people))
    end = max(day.labs) + day.lab_minutes + day.patience + 120.0
    now = min(s.arrives for s in people) - STEP_MIN

    def inventory() -> Any:
        held = [(s.holding, Allocation(s.name, "", slice_bytes, s.name)) for s in people if s.holding is not None]
        return build_local(cards, held)

    def place(s: Student, gpu: int) -> None:
        assert s.waiting_since is not None
        s.waits.append(now - s.waiting_since)
        s.holding, s.waiting_since, s.served = gpu, None, True
        s.phase, s.phase_left, s.idle_since = "burst", s.rng.expovariate(1 / day.burst_mean), None

    def release(s: Student) -> None:
        s.holding, s.idle_since = None, None

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
        if regime == "line+reclaim" and waiting:
            holders = [Holder(s.name, True, s.idle_since, s.idle_since) for s in people if s.holding is not None]
            _, stop = reclaim(
                holders,
                waiting=len(waiting),
                now=now,
                gpu_idle_timeout=day.gpu_idle_timeout,
                warn_before=day.warn_before,
            )
            for s in [s for s in people if s.name in stop]:
                release(s)
                out.reclaimed += 1
                # Reclaimed in the middle of their work: back in line when they come back.
                if s.phase == "gap":
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
            entries = [_entry(s, demand, slice_bytes, now) for s in waiting]
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


def _entry(s: Student, demand: Demand, slice_bytes: int, now: float) -> Entry:
    assert s.waiting_since is not None
    return Entry(s.name, s.name, demand, slice_bytes, None, s.waiting_since, seen=now)


def _advance(s: Student, now: float, day: Day, request: Any, release: Any) -> None:
    """One step of a student's own day: arrive, work, pause, finish, come back after a reclaim."""
    if s.phase == "away" and now >= s.arrives:
        request(s)
    elif s.phase == "burst":
        s.work_left -= STEP_MIN
        s.phase_left -= STEP_MIN
        if s.work_left <= 0:
            if s.forgets:
                s.phase, s.idle_since = "forgotten", now
            else:
                release(s)
                s.phase = "done"
        elif s.phase_left <= 0:
            s.phase, s.phase_left, s.idle_since = "gap", s.rng.expovariate(1 / day.gap_mean), now
    elif s.phase in ("gap", "reclaimed"):
        s.phase_left -= STEP_MIN
        if s.phase_left <= 0:
            if s.phase == "reclaimed":
                request(s)
            else:
                s.phase, s.phase_left, s.idle_since = "burst", s.rng.expovariate(1 / day.burst_mean), None
    if s.holding is not None and s.idle_since is not None and now - s.idle_since >= day.idle_timeout:
        release(s)  # JupyterHub's idle culler
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


def run(seeds: tuple[int, ...] = REPORT_SEEDS, day: Day | None = None) -> dict[str, Any]:
    """Every regime over ``seeds``: served fraction, waits, idle allocated GPU-hours, over-commits."""
    day = day or Day()
    result: dict[str, Any] = {"seeds": list(seeds), "day": day.__dict__, "regimes": {}}
    for regime in (*REGIMES, ORACLE):
        result["regimes"][regime] = summary([simulate(regime, day, seed) for seed in seeds])
    base, best = result["regimes"]["retry"], result["regimes"]["line+reclaim"]
    result["p95_wait_ratio"] = best["wait_min"]["p95"] / base["wait_min"]["p95"] if base["wait_min"]["p95"] else None
    base_idle = base["idle_gpu_hours_per_day"]
    result["idle_ratio"] = best["idle_gpu_hours_per_day"] / base_idle if base_idle else None
    base_blocking = base["idle_while_waiting_gpu_hours_per_day"]
    blocking = best["idle_while_waiting_gpu_hours_per_day"]
    result["idle_while_waiting_ratio"] = blocking / base_blocking if base_blocking else None
    bound = result["regimes"][ORACLE]
    result["oracle_p95_wait_ratio"] = (
        bound["wait_min"]["p95"] / base["wait_min"]["p95"] if base["wait_min"]["p95"] else None
    )
    result["oracle_idle_ratio"] = bound["idle_gpu_hours_per_day"] / base_idle if base_idle else None
    return result


def report(result: dict[str, Any]) -> str:
    lines = [f"gpuslice bench class-day: seeds {result['seeds'][0]}-{result['seeds'][-1]} (model designed on 1-5)"]
    lines.append(
        f"{'regime':<14}{'served':>8}{'finished':>10}{'wait p50':>10}{'wait p95':>10}{'idle GPU-h':>12}"
        f"{'idle, others waiting':>22}{'over-commits':>14}{'reclaimed':>11}{'interrupted':>13}{'student p95':>13}"
    )
    for name, r in result["regimes"].items():
        lines.append(
            f"{name:<14}{r['served_fraction']:>8.1%}{r['finished_fraction']:>10.1%}{r['wait_min']['p50']:>8.1f} m"
            f"{r['wait_min']['p95']:>8.1f} m{r['idle_gpu_hours_per_day']:>12.2f}"
            f"{r['idle_while_waiting_gpu_hours_per_day']:>22.2f}{r['over_commits']:>14}"
            f"{r['reclaimed_per_day']:>11.1f}{r['interrupted_per_day']:>13.1f}{r['student_wait_min']['p95']:>11.1f} m"
        )
    p95, idle, blocking = result["p95_wait_ratio"], result["idle_ratio"], result["idle_while_waiting_ratio"]
    if p95 is None or idle is None or blocking is None:
        lines.append("line+reclaim vs retry: the baseline had no waits or no idle slices")
    else:
        lines.append(
            f"line+reclaim vs retry: p95 wait x{p95:.2f} (target <= 0.5); idle allocated GPU-hours x{idle:.2f}"
            f" (target <= 0.5), of them while others waited x{blocking:.2f}"
        )
    oracle_p95, oracle_idle = result.get("oracle_p95_wait_ratio"), result.get("oracle_idle_ratio")
    if oracle_p95 is not None and oracle_idle is not None:
        lines.append(
            f"oracle vs retry (line+reclaim, each forgotten slice freed the moment its owner leaves, which no"
            f" platform can know): p95 wait x{oracle_p95:.2f}, idle allocated GPU-hours x{oracle_idle:.2f}"
        )
    lines.append(
        f"GPU-hours in card-equivalents per simulated day; waits in minutes, gave-up waits counted at"
        f" {result['day']['patience']:g} m; reclaimed and interrupted (a working student stopped in a gap of"
        f" their work) per day; student p95: each student's waits added up"
    )
    return "\n".join(lines)


# The numbers of the day that a what-if may change (not the cards or the labs' times).
VARIABLE = tuple(f.name for f in fields(Day) if isinstance(f.default, int | float) and not isinstance(f.default, bool))
# What only reclaiming reads: the retry baseline of a what-if changing these is the day's own.
RECLAIM_ONLY = ("gpu_idle_timeout", "warn_before")


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
