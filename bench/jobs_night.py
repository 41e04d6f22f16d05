"""`gpuslice bench jobs` (3): a class day, then a night of backfill jobs, through the line's own code.

The teaching day of bench/classday.py (its students, labs, bursts and forgotten servers, the
line with reclaiming, the idle culler), lived for 24 hours from the first arrival, twice with the
same students: without backfill, and with a backlog of backfill jobs that never runs dry (each
needs ``job_hours`` of GPU time in a ``job_gib`` slice and keeps its progress when stopped: it
checkpoints). The line's ``admit`` places backfill jobs only when every student who waits was
placed; when a student waits and cannot be placed, spawner/jobs_backfill.py ``preemptions`` chooses
the backfill jobs to stop: each keeps its slice for the grace period (one step, 30 s: SIGTERM, the
checkpoint), then goes back in line.

Reported: the share of the otherwise idle GPU-hours (capacity less what students hold, in the run
without backfill) that backfill jobs used (target >= 80 %); the students' p95 wait with backfill
against without (target: at most 5 % longer); over-commits (cards holding more than their memory
after any step, counted apart from the line's arithmetic: target 0); preemptions per day.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.classday import REPORT_SEEDS, STEP_MIN, Day, Student, _advance, _entry, students
from bench.stats import percentile
from spawner.gpus import simulated_gpus
from spawner.inventory import Allocation, build_local
from spawner.jobs_backfill import Running, preemptions
from spawner.placement import Demand
from spawner.shares import GiB
from spawner.waitline import Entry, Holder, admit, reclaim

HOURS = 24.0


@dataclass(frozen=True)
class Night:
    """The backfill backlog: jobs of ``job_hours`` GPU time in ``job_gib`` slices, more than any night can run."""

    jobs: int = 400
    job_hours: float = 2.0
    job_gib: int = 4
    grace_steps: int = 1  # 30 s: SIGTERM, the checkpoint, then the slice is free


@dataclass
class Job:
    name: str
    left: float  # minutes of work left
    holding: int | None = None
    yielding: int = 0  # steps left of its grace period (0: not stopping)
    started: float = 0.0


@dataclass
class NightOutcome:
    waits: list[float] = field(default_factory=list)
    student_gpu_hours: float = 0.0  # what students held (card-equivalents)
    backfill_gpu_hours: float = 0.0  # what backfill jobs held
    over_commits: int = 0
    preemptions: int = 0
    jobs_done: int = 0


def live(day: Day, night: Night | None, seed: int) -> NightOutcome:
    """24 hours from the first arrival; ``night`` None: no backfill jobs."""
    cards = simulated_gpus(day.cards)
    student_bytes = day.slice_gib * GiB
    job_bytes = (night.job_gib if night else day.slice_gib) * GiB
    people = students(day, seed)
    jobs = [Job(f"job{i}", night.job_hours * 60) for i in range(night.jobs)] if night else []
    out = NightOutcome()
    start = min(s.arrives for s in people) - STEP_MIN
    now = start

    def inventory() -> Any:
        held = [(s.holding, Allocation(s.name, "", student_bytes, s.name)) for s in people if s.holding is not None]
        held += [(j.holding, Allocation("night", j.name, job_bytes, j.name)) for j in jobs if j.holding is not None]
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

    while now < start + HOURS * 60:
        now += STEP_MIN
        for s in people:
            _advance(s, now, day, request, release)
        for s in [s for s in people if s.phase == "waiting" and now - (s.waiting_since or now) >= day.patience]:
            s.waits.append(now - (s.waiting_since or now))
            s.phase, s.waiting_since = "gave-up", None
        _step_jobs(jobs, out)
        waiting = [s for s in people if s.phase == "waiting"]
        if waiting:  # the reclaimer: idle servers, while anyone waits
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
                s.phase, s.interrupted = (
                    ("reclaimed", s.interrupted + 1) if s.phase == "gap" else ("done", s.interrupted)
                )
        entries = [_entry(s, Demand(slice_units=float(student_bytes)), student_bytes, now) for s in waiting]
        queued = [j for j in jobs if j.holding is None and j.left > 0]
        room = sum(g.free_bytes for g in inventory().gpus()) // job_bytes  # the head of the backlog that may fit
        entries += [_job_entry(j, job_bytes, now) for j in queued[: room + 1]]
        by_name = {s.name: s for s in waiting}
        by_job = {j.name: j for j in jobs}
        for a in admit(entries, inventory(), budgets={}, group_bytes={}, now=now):
            gpu = cards[a.choice.gpus[0]].index
            if a.entry.key in by_job:
                by_job[a.entry.key].holding, by_job[a.entry.key].started = gpu, now
            else:
                place(by_name[a.entry.user], gpu)
        if night:
            still = [
                _entry(s, Demand(slice_units=float(student_bytes)), student_bytes, now)
                for s in people
                if s.phase == "waiting"
            ]
            _preempt(jobs, still, inventory(), now, night, out)
        out.over_commits += _over_commits(people, jobs, cards, student_bytes, job_bytes)
        out.student_gpu_hours += sum(
            STEP_MIN / 60 * student_bytes / cards[s.holding].memory_bytes for s in people if s.holding is not None
        )
        out.backfill_gpu_hours += sum(
            STEP_MIN / 60 * job_bytes / cards[j.holding].memory_bytes for j in jobs if j.holding is not None
        )
    for s in people:
        out.waits.extend(s.waits)
    out.jobs_done = sum(1 for j in jobs if j.left <= 0)
    return out


def _job_entry(job: Job, job_bytes: int, now: float) -> Entry:
    return Entry(job.name, "night", Demand(slice_units=float(job_bytes)), job_bytes, None, 0.0, seen=now, backfill=True)


def _step_jobs(jobs: list[Job], out: NightOutcome) -> None:
    """Running jobs work a step; yielding ones count down their grace, then free their slice."""
    for job in jobs:
        if job.holding is None:
            continue
        if job.yielding:
            job.yielding -= 1
            if not job.yielding:
                job.holding = None  # checkpointed: its progress is kept, it goes back in line
            continue
        job.left -= STEP_MIN
        if job.left <= 0:
            job.holding = None


def _preempt(
    jobs: list[Job], entries: list[Entry], inventory: Any, now: float, night: Night, out: NightOutcome
) -> None:
    running = [Running(j.name, "night", None, night.job_gib * GiB, j.started) for j in jobs if j.holding is not None]
    stopping = {j.name for j in jobs if j.yielding}
    people = [e for e in entries if not e.backfill]
    for chosen in preemptions(
        people,
        inventory,
        [r for r in running if r.key not in stopping],
        stopping=stopping,
        budgets={},
        group_bytes={},
        held_by_user={},
        now=now,
    ):
        job = next(j for j in jobs if j.name == chosen.key)
        job.yielding = night.grace_steps
        out.preemptions += 1


def _over_commits(people: list[Student], jobs: list[Job], cards: list[Any], student: int, job: int) -> int:
    held: dict[int, int] = {}
    for s in people:
        if s.holding is not None:
            held[s.holding] = held.get(s.holding, 0) + student
    for j in jobs:
        if j.holding is not None:
            held[j.holding] = held.get(j.holding, 0) + job
    return sum(1 for card in cards if held.get(card.index, 0) > card.memory_bytes)


NIGHT_SEEDS = REPORT_SEEDS[:10]  # 101-110: a day and a night takes about ten seconds a seed


def run(seeds: tuple[int, ...] = NIGHT_SEEDS, day: Day | None = None, night: Night | None = None) -> dict[str, Any]:
    day, night = day or Day(), night or Night()
    cards = simulated_gpus(day.cards)
    capacity = len(cards) * HOURS  # card-hours in the 24 hours
    without = [live(day, None, seed) for seed in seeds]
    with_jobs = [live(day, night, seed) for seed in seeds]
    idle = sum(capacity - o.student_gpu_hours for o in without)
    used = sum(o.backfill_gpu_hours for o in with_jobs)
    p95_without = percentile([w for o in without for w in o.waits], 95)
    p95_with = percentile([w for o in with_jobs for w in o.waits], 95)
    return {
        "seeds": [seeds[0], seeds[-1]],
        "day": day.__dict__,
        "night": night.__dict__,
        "idle_gpu_hours_per_day": idle / len(seeds),
        # Above 100 %: students held a little less with backfill (their later starts end later, past the 24 h).
        "student_gpu_hours_per_day": {
            "without": sum(o.student_gpu_hours for o in without) / len(seeds),
            "with": sum(o.student_gpu_hours for o in with_jobs) / len(seeds),
        },
        "backfill_gpu_hours_per_day": used / len(seeds),
        "idle_used_by_backfill": used / idle if idle else None,
        "student_wait_p95_min": {"without": p95_without, "with": p95_with},
        "student_wait_p95_growth": (p95_with / p95_without - 1) if p95_without else None,
        "student_wait_p50_min": {
            "without": percentile([w for o in without for w in o.waits], 50),
            "with": percentile([w for o in with_jobs for w in o.waits], 50),
        },
        "over_commits": sum(o.over_commits for o in (*without, *with_jobs)),
        "preemptions_per_day": sum(o.preemptions for o in with_jobs) / len(seeds),
        "backfill_jobs_done_per_day": sum(o.jobs_done for o in with_jobs) / len(seeds),
    }


def report(result: dict[str, Any]) -> str:
    used, growth = result["idle_used_by_backfill"], result["student_wait_p95_growth"]
    p95 = result["student_wait_p95_min"]
    return "\n".join(
        [
            f"(3) a class day and a night of backfill jobs, 24 h, seeds {result['seeds'][0]}-{result['seeds'][1]}:",
            f"    otherwise idle GPU-hours {result['idle_gpu_hours_per_day']:.1f}/day, used by backfill"
            f" {result['backfill_gpu_hours_per_day']:.1f}/day: {used:.1%} (target >= 80%)",
            f"    students' p95 wait {p95['without']:.1f} min without backfill, {p95['with']:.1f} min with:"
            f" {growth:+.1%} (target <= +5%)",
            f"    over-commits: {result['over_commits']} (target 0);"
            f" preemptions {result['preemptions_per_day']:.1f}/day;"
            f" backfill jobs finished {result['backfill_jobs_done_per_day']:.1f}/day",
        ]
    )
