"""`gpuslice bench class-day --validate`: the class-day model against the real platform, on a short day.

The model (bench/classday.py) decides the benchmark's figures; this checks it against what it
models. The same students (same seed: arrivals, work, bursts and gaps, who forgets their
server) live a short day on one machine's real platform, in compressed time (``scale`` real
seconds per model minute): a real JupyterHub with gpuslice's configuration, its proxy,
jupyterlab servers on simulated GPUs, the GPU line, the gpu-reclaimer and the idle culler, the
timeouts scaled the same way. Each student is a thread that asks for a slice with
``wait: true``, works in bursts by using their server (writes through its contents API, which
the server reports to the hub as activity), pauses in gaps, then stops their server or
forgets it; a student whose server was reclaimed in a gap asks again when they come back.

Measured on the real platform, in model minutes: every wait in line (from the ledger's wait
table: joined to placed; a request placed at once waited 0), who was served, reclaims (the
servers the reclaimer stopped), over-commits (a card's slices summed from the ledger every
half second) and spawn failures. The model runs the same day and seed with the same
parameters (its warning lead the real one, which does not scale below 9 minutes).

What the model leaves out and the real run has: a server's start (seconds: minutes of model
time at this scale), the line's and the reclaimer's polling, the culler's period.
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.classday import PLATFORM, STEP_MIN, Day, Student, simulate, students
from bench.spawn import Hub
from bench.stats import percentile
from spawner.ledger import Ledger
from spawner.waitline import (
    HELD,
    HELD_TOO_LONG,
    IDLE,
    LEFT,
    RECLAIM_REASONS,
    RELEASED,
    activity_report_interval,
    warning_lead,
)

# The full day's distributions (bench/classday.py ``Day``) on a smaller class: 8 students of one
# section on one 8 GiB card (two 4 GiB slices: four students a slice, as the full day's 30 on 8).
SHORT_DAY = replace(Day(), students=8, cards="1x8GiB:T4", labs=(9 * 60.0,))
SCALE_S = 3.0  # real seconds per model minute
RECLAIMER_STOP = "stopped by the GPU line's reclaimer"
# Two decisions, the model's and the platform's, agree within this many model minutes: the platform's
# latencies (a start, the reclaimer's and the servers' reports) are seconds, which the compression
# turns into model minutes (docs/load.md).
DECISIONS_WITHIN_MIN = 5.0
GAVE_UP = "gave up"


@dataclass
class Lived:
    """One student's day on the real platform."""

    name: str
    placements: int = 0
    came_back: int = 0  # asked again after their server was stopped in a gap
    gave_up: bool = False  # waited ``Day.patience`` in line and left it
    stopped_while_working: int = 0
    pages: list[Page] = field(default_factory=list)  # each placement's page
    asked_to_ready_s: float = 0.0  # over their placements: the waits in line plus the servers' starts
    failures: list[str] = field(default_factory=list)


class Clock:
    """Model minutes on the real clock: minute ``start`` of the day is now."""

    def __init__(self, start: float, scale_s: float) -> None:
        self.t0, self.start, self.scale_s = time.monotonic(), start, scale_s

    def minutes(self) -> float:
        return self.start + (time.monotonic() - self.t0) / self.scale_s

    def sleep_until(self, minute: float) -> None:
        time.sleep(max(0.0, (minute - self.minutes()) * self.scale_s))


def real_settings(day: Day, scale_s: float) -> dict[str, int]:
    """The platform's timeouts for ``day`` in compressed time (seconds)."""
    return {
        "gpu_idle_timeout": round(day.gpu_idle_timeout * scale_s),
        "gpu_left_timeout": round(day.gpu_left_timeout * scale_s),
        "gpu_no_input_timeout": round(day.gpu_no_input_timeout * scale_s),
        "gpu_release_timeout": round(day.gpu_release_timeout * scale_s),
        "idle_timeout": round(day.idle_timeout * scale_s),
        "line_max_wait": round(4 * 60 * scale_s),
    }


class Page(threading.Thread):
    """A student's JupyterLab page as the lab extension is to its server: a beat every ``beat_s`` seconds
    saying whether there was input since the last one, at once at the first input after a quiet beat,
    and a last one when it closes (spawner/lab/gpuslice_presence.py counts them).

    A beat that fails is not the page's end, as it is not the extension's (a loaded server, the hub slow
    to check the token): the page beats on while its server is there, and counts what failed.
    """

    def __init__(self, hub: Hub, user: str, beat_s: float) -> None:
        super().__init__(daemon=True)
        self.url = f"{hub.url.removesuffix('/hub/api')}/user/{user}/api/gpuslice/presence"
        self.hub, self.user, self.beat_s, self.page = hub, user, beat_s, f"{user}-{time.monotonic_ns()}"
        self.had_input, self.quiet = True, False  # opening the page is someone at it
        self.closed = threading.Event()
        self.wake = threading.Event()
        self.failed = 0

    def run(self) -> None:
        while not self.closed.is_set():
            had, self.had_input = self.had_input, False
            self.quiet = not had
            if self.hub.post(self.url, {"page": self.page, "input": had}) != 200:
                self.failed += 1
                if not self._server_there():
                    return  # the server is gone: no page to beat
            self.wake.wait(self.beat_s)
            self.wake.clear()

    def _server_there(self) -> bool:
        try:
            return _server(self.hub, self.user) is not None
        except (RuntimeError, OSError):  # the hub is gone too (the day is over)
            return False

    def input(self) -> None:
        self.had_input = True
        if self.quiet:
            self.wake.set()

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.wake.set()
            self.hub.post(self.url, {"page": self.page, "input": False, "gone": True})


def model_day(day: Day, scale_s: float) -> Day:
    """``day`` as the real run lives it: the reclaimer's warning lead is the platform's, which does not scale."""
    return replace(day, warn_before=warning_lead(real_settings(day, scale_s)["gpu_idle_timeout"]) / scale_s)


def _server(hub: Hub, user: str) -> dict[str, Any] | None:
    status, model = hub.api("GET", f"/users/{user}")
    if status != 200:
        raise RuntimeError(f"the hub answered {status} for {user}: {model}")
    servers = model.get("servers") or {}
    return servers.get("")


def _start_and_wait(hub: Hub, user: str, slice_gib: int, patience_s: float) -> str | None:
    """Ask for a slice, waiting in line; None once the server is ready, else why it did not start."""
    status, body = hub.api("POST", f"/users/{user}/server", {"gpu_memory": f"{slice_gib}GiB", "wait": True})
    if status not in (201, 202):
        return f"spawn refused: {status} {body}"
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        server = _server(hub, user)
        if server and server.get("ready"):
            return None
        if server is None:
            return "the spawn ended without a server (see the hub's log)"
        time.sleep(0.5)
    hub.api("DELETE", f"/users/{user}/server")  # leaves the line, as the model's student does
    return GAVE_UP


def _use(hub: Hub, user: str, clock: Clock, until: float, page: Page) -> bool:
    """Work in the server until model minute ``until``: a write through its contents API every second,
    and input in the page.

    False as soon as a write fails (the server is stopping or gone).
    """
    url = f"{hub.url.removesuffix('/hub/api')}/user/{user}/api/contents/work.txt"
    while clock.minutes() < until:
        page.input()
        if hub.put(url, {"type": "file", "format": "text", "content": f"{time.time()}"}) not in (200, 201):
            return False
        time.sleep(min(1.0, max(0.0, (until - clock.minutes()) * clock.scale_s)))
    return True


def _pause(s: Student, day: Day, clock: Clock, gap: float, page: Page) -> None:
    """A pause of ``gap`` model minutes as the model lives it (the same draws from the student's presence
    stream): at the page, input now and then; away from it, none."""
    at_page = s.presence_rng.random() >= day.away_pause_share
    end = clock.minutes() + gap
    step = 0
    while step * STEP_MIN < gap:
        step += 1
        clock.sleep_until(min(end, clock.minutes() + STEP_MIN))
        if at_page and s.presence_rng.random() < 1 - math.exp(-STEP_MIN / day.input_every):
            page.input()


def _running(hub: Hub, user: str) -> bool:
    """The server is up and not on its way down (a reclaimed one is listed while it stops)."""
    server = _server(hub, user)
    return bool(server and server.get("ready") and not server.get("pending"))


def _until_gone(hub: Hub, user: str) -> None:
    while _server(hub, user) is not None:
        time.sleep(0.5)


def _until_all_gone(hub: Hub, users: list[str], clock: Clock, at_most: float) -> None:
    """Wait until none of ``users`` has a server, or until model minute ``at_most``.

    The servers left behind are stopped after their students are done: the last ones by the release rule
    or the culler, long after the day's last placement. The real day cannot end at the model's last
    decision: every server's start (seconds, so model minutes at this scale) puts the real day's stops
    later than the model's, and a stop cut off by the end would count as one the platform never made.
    JupyterHub's idle culler stops any forgotten server within ``idle_timeout``: ``at_most`` bounds a run
    whose reclaimer and culler both failed, and that run's missing stops then show in its decisions.
    """
    while clock.minutes() < at_most and any(_server(hub, user) is not None for user in users):
        time.sleep(0.5)


def live(hub: Hub, s: Student, day: Day, clock: Clock, lived: Lived, beat_s: float) -> None:
    """``s``'s day, as bench/classday.py's model lives it (the same draws from its own random streams),
    with a JupyterLab page open on the server while it runs (``Page``)."""
    clock.sleep_until(s.arrives)
    page: Page | None = None
    while s.work_left > 0:
        asked = time.monotonic()
        why = _start_and_wait(hub, s.name, day.slice_gib, day.patience * clock.scale_s)
        if why == GAVE_UP:
            lived.gave_up = True
            return
        if why:
            lived.failures.append(why)
            return
        lived.placements += 1
        lived.asked_to_ready_s += time.monotonic() - asked
        page = Page(hub, s.name, beat_s)
        lived.pages.append(page)
        page.start()
        burst = s.rng.expovariate(1 / day.burst_mean)
        while True:
            step = min(burst, s.work_left)
            began = clock.minutes()
            used = _use(hub, s.name, clock, began + step, page)
            s.work_left -= clock.minutes() - began if not used else step
            if not used:  # stopped while working (the model never stops a working server): count it
                lived.stopped_while_working += 1
            if s.work_left <= 0 and used:
                break
            if used:
                _pause(s, day, clock, s.rng.expovariate(1 / day.gap_mean), page)
            if not _running(hub, s.name):  # reclaimed (or culled): back in line once it is gone
                page.closed.set()
                _until_gone(hub, s.name)
                lived.came_back += 1
                break
            burst = s.rng.expovariate(1 / day.burst_mean)
    if page is None:
        return
    if not s.forgets:
        page.close()
        hub.api("DELETE", f"/users/{s.name}/server")
    elif s.presence_rng.random() < day.close_tab_share:  # gone, the tab closed; else left open on the screen
        page.close()


class LedgerWatch(threading.Thread):
    """Every half second, from the ledger: cards whose slices add up to more than their memory, and
    the reclaimer's stops (each server's latest event; the ledger keeps only 20 a server)."""

    def __init__(self, hub: Hub) -> None:
        super().__init__(daemon=True)
        self.hub = hub
        self.over_commits, self.samples = 0, 0
        self.reclaimer_stops: set[tuple[str, float, str]] = set()  # whose, when, why
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.look()

    def look(self) -> None:
        self.over_commits += self.hub.over_committed_cards()
        self.samples += 1
        for key, event in Ledger(self.hub.data / "ledger.sqlite").latest_events().items():
            if event.message.startswith(RECLAIMER_STOP):
                self.reclaimer_stops.add((key, event.created, stop_reason(event.message)))


def stop_reason(message: str) -> str:
    """The reclaimer's reason (spawner/waitline.py RECLAIM_REASONS) in a stop's words (hub/reclaimer.py)."""
    if HELD_TOO_LONG in message:
        return HELD
    if message.endswith(": released"):
        return RELEASED
    return LEFT if "nobody there" in message else IDLE


def real_day(day: Day, seed: int, scale_s: float) -> dict[str, Any]:
    """Live ``day`` on the real platform; waits in model minutes. The platform runs until every student is
    done and every server left behind is gone (reclaimed, released or culled, as the model's are), at most
    ``day.idle_timeout`` model minutes more (``_until_all_gone``)."""
    people = students(day, seed)
    with tempfile.TemporaryDirectory(prefix="gpuslice-classday-") as root:
        hub = Hub("gpuslice", Path(root), simulate=day.cards, extra_settings=real_settings(day, scale_s))
        watch = LedgerWatch(hub)
        try:
            for s in people:
                hub.api("POST", f"/users/{s.name}")
            watch.start()
            lived = {s.name: Lived(s.name) for s in people}
            began = time.time()
            clock = Clock(min(s.arrives for s in people), scale_s)
            beat_s = activity_report_interval(warning_lead(real_settings(day, scale_s)["gpu_idle_timeout"]))
            threads = [threading.Thread(target=live, args=(hub, s, day, clock, lived[s.name], beat_s)) for s in people]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            _until_all_gone(hub, [s.name for s in people], clock, clock.minutes() + day.idle_timeout)
            real_s = time.time() - began
            waits = Ledger(hub.data / "ledger.sqlite").waits(began - 1)
            watch.look()
        finally:
            watch.done.set()
            hub.close()
    placed = [w.seconds / scale_s for w in waits if w.outcome == "placed"]
    placements = sum(v.placements for v in lived.values())
    gave_up = [w.seconds / scale_s for w in waits if w.outcome != "placed"]
    all_waits = placed + gave_up + [0.0] * (placements - len(placed))  # placed at once: no wait recorded
    return {
        "served": sum(1 for v in lived.values() if v.placements),
        "students": len(people),
        "waits": all_waits,
        "gave_up": sum(1 for v in lived.values() if v.gave_up),
        # A server's start after its placement, on average: what the model counts as no time.
        "start_s_mean": (sum(v.asked_to_ready_s for v in lived.values()) - sum(placed) * scale_s) / max(1, placements),
        "reclaimed": len(watch.reclaimer_stops),
        "decisions": sorted(
            (key.split("/")[0], round(clock.start + (at - began) / scale_s, 1), why)  # the clock began with the day
            for key, at, why in watch.reclaimer_stops
        ),
        "came_back": sum(v.came_back for v in lived.values()),
        "stopped_while_working": sum(v.stopped_while_working for v in lived.values()),
        # Beats their servers did not answer 200 (the pages beat on, as the extension does).
        "beats_failed": sum(p.failed for v in lived.values() for p in v.pages),
        "over_commits": watch.over_commits,
        "over_commit_samples": watch.samples,
        "failures": [f"{v.name}: {why}" for v in lived.values() for why in v.failures],
        "real_seconds": real_s,
    }


def modelled_day(day: Day, seed: int, scale_s: float) -> dict[str, Any]:
    out = simulate(PLATFORM, model_day(day, scale_s), seed)
    return {
        "served": out.served,
        "students": out.students,
        "waits": out.waits,
        "reclaimed": out.reclaimed,
        "decisions": sorted((d.student, d.minute, d.reason) for d in out.decisions),
        "over_commits": out.over_commits,
        "gave_up": out.gave_up,
    }


def compare_decisions(
    model: list[tuple[str, float, str]], real: list[tuple[str, float, str]], within_min: float
) -> dict[str, Any]:
    """The model's reclaim decisions beside the platform's: per reason how many, and which agree (the same
    student stopped for the same reason within ``within_min`` model minutes, each matched once)."""
    left = list(real)
    agreed, model_only = [], []
    for student, minute, why in model:
        match = next((r for r in left if r[0] == student and r[2] == why and abs(r[1] - minute) <= within_min), None)
        if match is None:
            model_only.append((student, minute, why))
        else:
            left.remove(match)
            agreed.append({"student": student, "reason": why, "model_min": minute, "real_min": match[1]})
    return {
        "by_reason": {
            why: {"model": sum(d[2] == why for d in model), "real": sum(d[2] == why for d in real)}
            for why in RECLAIM_REASONS
        },
        "agreed": agreed,
        "model_only": model_only,
        "real_only": left,
    }


def _summary(waits: list[float]) -> dict[str, float]:
    if not waits:
        return {"count": 0, "p50": math.nan, "p95": math.nan, "max": math.nan, "mean": math.nan}
    return {
        "count": len(waits),
        "p50": percentile(waits, 50),
        "p95": percentile(waits, 95),
        "max": max(waits),
        "mean": sum(waits) / len(waits),
    }


def validate(seed: int, day: Day = SHORT_DAY, scale_s: float = SCALE_S) -> dict[str, Any]:
    """The model and the real platform on the same short day: served, waits, reclaims, over-commits."""
    model = modelled_day(day, seed, scale_s)
    real = real_day(day, seed, scale_s)
    return {
        "seed": seed,
        "scale_s_per_model_minute": scale_s,
        "day": asdict(model_day(day, scale_s)),
        "real": {**{k: v for k, v in real.items() if k != "waits"}, "wait_min": _summary(real["waits"])},
        "model": {**{k: v for k, v in model.items() if k != "waits"}, "wait_min": _summary(model["waits"])},
        "decisions": compare_decisions(model["decisions"], real["decisions"], DECISIONS_WITHIN_MIN),
    }


def report(result: dict[str, Any]) -> str:
    real, model = result["real"], result["model"]
    lines = [
        f"gpuslice bench class-day --validate: seed {result['seed']}, {result['day']['students']} students on"
        f" {result['day']['cards']}, {result['scale_s_per_model_minute']:g} s per model minute",
        f"{'':<8}{'served':>8}{'waits':>7}{'wait p50':>10}{'wait p95':>10}{'max':>8}{'mean':>8}"
        f"{'reclaimed':>11}{'over-commits':>14}",
    ]
    for name, r in (("model", model), ("real", real)):
        w = r["wait_min"]
        lines.append(
            f"{name:<8}{r['served']:>5}/{r['students']:<2}{w['count']:>7}{w['p50']:>8.1f} m{w['p95']:>8.1f} m"
            f"{w['max']:>6.1f} m{w['mean']:>6.1f} m{r['reclaimed']:>11}{r['over_commits']:>14}"
        )
    lines.append(
        f"real run: {real['real_seconds']:.0f} s, servers started {real['start_s_mean']:.1f} s after their placement"
        f" ({real['start_s_mean'] / result['scale_s_per_model_minute']:.1f} model minutes) on average,"
        f" {real['came_back']} came back after a stop ({real['stopped_while_working']} while working),"
        f" {real['beats_failed']} page beats unanswered,"
        f" {real['gave_up']} gave up (model: {model['gave_up']}), {len(real['failures'])} failures"
        + (f" ({'; '.join(real['failures'][:3])})" if real["failures"] else "")
    )
    decisions = result["decisions"]
    counts = ", ".join(
        f"{why} {n['model']}/{n['real']}" for why, n in decisions["by_reason"].items() if n["model"] or n["real"]
    )
    lines.append(
        f"reclaim decisions, model/real by reason: {counts or 'none'}; the same student for the same reason within"
        f" {DECISIONS_WITHIN_MIN:g} model minutes: {len(decisions['agreed'])}, the model's alone:"
        f" {len(decisions['model_only'])}, the platform's alone: {len(decisions['real_only'])}"
    )
    for who, rows in (("model alone", decisions["model_only"]), ("platform alone", decisions["real_only"])):
        if rows:
            lines.append(f"  {who}: " + "; ".join(f"{s} at {m:g} m ({why})" for s, m, why in rows))
    return "\n".join(lines)
