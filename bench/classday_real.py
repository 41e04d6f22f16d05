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

from bench.classday import Day, Student, simulate, students
from bench.spawn import Hub
from bench.stats import percentile
from spawner.ledger import Ledger
from spawner.waitline import warning_lead

# The full day's distributions (bench/classday.py ``Day``) on a smaller class: 8 students of one
# section on one 8 GiB card (two 4 GiB slices: four students a slice, as the full day's 30 on 8).
SHORT_DAY = replace(Day(), students=8, cards="1x8GiB:T4", labs=(9 * 60.0,))
SCALE_S = 3.0  # real seconds per model minute
RECLAIMER_STOP = "stopped by the GPU line's reclaimer"
GAVE_UP = "gave up"


@dataclass
class Lived:
    """One student's day on the real platform."""

    name: str
    placements: int = 0
    came_back: int = 0  # asked again after their server was stopped in a gap
    gave_up: bool = False  # waited ``Day.patience`` in line and left it
    stopped_while_working: int = 0
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
        "idle_timeout": round(day.idle_timeout * scale_s),
        "line_max_wait": round(4 * 60 * scale_s),
    }


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


def _use(hub: Hub, user: str, clock: Clock, until: float) -> bool:
    """Work in the server until model minute ``until``: a write through its contents API every second.

    False as soon as a write fails (the server is stopping or gone).
    """
    url = f"{hub.url.removesuffix('/hub/api')}/user/{user}/api/contents/work.txt"
    while clock.minutes() < until:
        if hub.put(url, {"type": "file", "format": "text", "content": f"{time.time()}"}) not in (200, 201):
            return False
        time.sleep(min(1.0, max(0.0, (until - clock.minutes()) * clock.scale_s)))
    return True


def _running(hub: Hub, user: str) -> bool:
    """The server is up and not on its way down (a reclaimed one is listed while it stops)."""
    server = _server(hub, user)
    return bool(server and server.get("ready") and not server.get("pending"))


def _until_gone(hub: Hub, user: str) -> None:
    while _server(hub, user) is not None:
        time.sleep(0.5)


def live(hub: Hub, s: Student, day: Day, clock: Clock, lived: Lived) -> None:
    """``s``'s day, as bench/classday.py's model lives it (the same draws from its own random stream)."""
    clock.sleep_until(s.arrives)
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
        burst = s.rng.expovariate(1 / day.burst_mean)
        while True:
            step = min(burst, s.work_left)
            began = clock.minutes()
            used = _use(hub, s.name, clock, began + step)
            s.work_left -= clock.minutes() - began if not used else step
            if not used:  # stopped while working (the model never stops a working server): count it
                lived.stopped_while_working += 1
            if s.work_left <= 0 and used:
                break
            if used:
                clock.sleep_until(clock.minutes() + s.rng.expovariate(1 / day.gap_mean))
            if not _running(hub, s.name):  # reclaimed (or culled): back in line once it is gone
                _until_gone(hub, s.name)
                lived.came_back += 1
                break
            burst = s.rng.expovariate(1 / day.burst_mean)
    if not s.forgets:
        hub.api("DELETE", f"/users/{s.name}/server")


class LedgerWatch(threading.Thread):
    """Every half second, from the ledger: cards whose slices add up to more than their memory, and
    the reclaimer's stops (each server's latest event; the ledger keeps only 20 a server)."""

    def __init__(self, hub: Hub) -> None:
        super().__init__(daemon=True)
        self.hub = hub
        self.over_commits, self.samples = 0, 0
        self.reclaimer_stops: set[tuple[str, float]] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.look()

    def look(self) -> None:
        self.over_commits += self.hub.over_committed_cards()
        self.samples += 1
        for key, event in Ledger(self.hub.data / "ledger.sqlite").latest_events().items():
            if event.message.startswith(RECLAIMER_STOP):
                self.reclaimer_stops.add((key, event.created))


def real_day(day: Day, seed: int, scale_s: float) -> dict[str, Any]:
    """Live ``day`` on the real platform; waits in model minutes."""
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
            threads = [threading.Thread(target=live, args=(hub, s, day, clock, lived[s.name])) for s in people]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
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
        "came_back": sum(v.came_back for v in lived.values()),
        "stopped_while_working": sum(v.stopped_while_working for v in lived.values()),
        "over_commits": watch.over_commits,
        "over_commit_samples": watch.samples,
        "failures": [f"{v.name}: {why}" for v in lived.values() for why in v.failures],
        "real_seconds": real_s,
    }


def modelled_day(day: Day, seed: int, scale_s: float) -> dict[str, Any]:
    out = simulate("line+reclaim", model_day(day, scale_s), seed)
    return {
        "served": out.served,
        "students": out.students,
        "waits": out.waits,
        "reclaimed": out.reclaimed,
        "over_commits": out.over_commits,
        "gave_up": out.gave_up,
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
    real = real_day(day, seed, scale_s)
    model = modelled_day(day, seed, scale_s)
    return {
        "seed": seed,
        "scale_s_per_model_minute": scale_s,
        "day": asdict(model_day(day, scale_s)),
        "real": {**{k: v for k, v in real.items() if k != "waits"}, "wait_min": _summary(real["waits"])},
        "model": {**{k: v for k, v in model.items() if k != "waits"}, "wait_min": _summary(model["waits"])},
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
        f" {real['gave_up']} gave up (model: {model['gave_up']}), {len(real['failures'])} failures"
        + (f" ({'; '.join(real['failures'][:3])})" if real["failures"] else "")
    )
    return "\n".join(lines)
