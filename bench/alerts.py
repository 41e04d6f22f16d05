"""Alert quality, measured: replay a simulated platform through the real rules with promtool.

A 16-GPU platform (4 nodes of 4 cards) is simulated minute by minute in the metric names
the exporter and the hub really serve (dcgm-exporter's DCGM_FI_*, the hub's slice
allocations, the exporter's per-process memory, Prometheus' ``up``): healthy noise on a
daily load pattern, plus injected faults. The series become a ``promtool test rules``
file whose alert tests expect silence at every minute, so promtool prints every alert
that fires and when; the episodes are then matched against the injected faults.

Reported per alert: precision (episodes explained by a fault / all episodes), recall
(faults detected / faults injected) and time to detect (first firing minute minus the
minute the fault became observable), against the target ``for:`` + two scrape intervals.

    python -m bench.alerts --days 7 --seed 2      # or: gpuslice bench alerts
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from hub.monitoring import RULE_FILES

STEP_MIN = 1  # one sample and one rule evaluation a minute: the replay's scrape interval
NODES = tuple(f"gpu-node-{n}" for n in range(1, 5))
GPUS_PER_NODE = 4
MODEL = "A100"
GiB = 1024**3
SLICE_BYTES = 10 * GiB
IDLE_POWER_W, FULL_POWER_W = 50.0, 400.0
HEARTBEAT = "Watchdog"  # always fires by design: the dead man's switch, not scored

# What each fault should raise, and which other alerts it explains (they belong to its incident).
FAULT_ALERTS: dict[str, tuple[str, frozenset[str]]] = {
    "xid_storm": ("GpuXidError", frozenset()),
    "ecc_double_bit": ("GpuEccDoubleBitErrors", frozenset()),
    "thermal_runaway": ("GpuTemperatureHigh", frozenset()),
    "hung_gpu": ("GpuHung", frozenset()),
    "leaking_notebook": ("GpuMemoryOverSlice", frozenset()),
    "idle_slice_held": ("IdleGpuSlicesHeld", frozenset()),
    "exporter_down": ("GpuExporterDown", frozenset()),
    "node_down": ("NodeDown", frozenset({"GpuExporterDown"})),
}
# Minutes each fault lasts once injected (the leak and the thermal runaway build up first).
FAULT_MINUTES = {
    "xid_storm": 20,
    "ecc_double_bit": 15,
    "thermal_runaway": 90,
    "hung_gpu": 60,
    "leaking_notebook": 120,
    "idle_slice_held": 180,
    "exporter_down": 30,
    "node_down": 45,
}
NODE_FAULTS = {"exporter_down", "node_down"}
SESSION_FAULTS = {"hung_gpu", "leaking_notebook", "idle_slice_held"}  # need a server on the card


@dataclass(frozen=True)
class Fault:
    kind: str
    node: str
    gpu: int | None
    start: int  # minute injected
    end: int  # minute it is over (exclusive)
    onset: int = -1  # minute it becomes observable in the metrics; set by the generator

    @property
    def alert(self) -> str:
        return FAULT_ALERTS[self.kind][0]


@dataclass
class Replay:
    minutes: int
    series: dict[str, list[float | None]]  # series selector -> value per minute (None: no sample)
    faults: list[Fault]
    servers: dict[str, tuple[str, int]] = field(default_factory=dict)  # user -> (node, gpu)


def schedule_faults(rng: random.Random, minutes: int, per_kind: int) -> list[Fault]:
    """Faults at random times, never two at once on one node, each kind `per_kind` times."""
    kinds = [kind for kind in FAULT_ALERTS for _ in range(per_kind)]
    rng.shuffle(kinds)
    faults: list[Fault] = []
    busy: dict[str, list[tuple[int, int]]] = {node: [] for node in NODES}
    for kind in kinds:
        for _ in range(1000):
            node, gpu = rng.choice(NODES), rng.randrange(GPUS_PER_NODE)
            day = rng.randrange(max(1, minutes // 1440))
            # Faults that need a server happen in working hours; the others at any time.
            start = day * 1440 + (
                rng.randrange(9 * 60, 14 * 60) if kind in SESSION_FAULTS else rng.randrange(60, 1440 - 300)
            )
            end = start + FAULT_MINUTES[kind]
            if end + 60 < minutes and all(end + 60 < s or start > e + 60 for s, e in busy[node]):
                busy[node].append((start, end))
                faults.append(Fault(kind, node, None if kind in NODE_FAULTS else gpu, start, end))
                break
        else:
            raise ValueError(f"cannot place {per_kind} faults of each kind in {minutes} minutes: replay longer")
    return sorted(faults, key=lambda f: f.start)


def load(minute: int) -> float:
    """The platform's daily pattern: quiet at night, a morning and an afternoon peak, quieter weekends."""
    hour = (minute % 1440) / 60
    weekend = (minute // 1440) % 7 >= 5
    day = math.exp(-(((hour - 11) / 2.0) ** 2)) + 0.8 * math.exp(-(((hour - 15.5) / 2.0) ** 2))
    return (0.4 if weekend else 1.0) * min(1.0, day)


def generate(seed: int, days: float, faults_per_kind: int = 1) -> Replay:
    rng = random.Random(seed)
    minutes = int(days * 1440)
    faults = schedule_faults(rng, minutes, faults_per_kind)
    series: dict[str, list[float | None]] = {}
    servers: dict[str, tuple[str, int]] = {}
    for node in NODES:
        _node_series(series, node, minutes)
        for gpu in range(GPUS_PER_NODE):
            user = f"user-{node[-1]}{gpu}"
            servers[user] = (node, gpu)
            _gpu_series(rng, series, node, gpu, user, minutes, faults)
    for job in ("jupyterhub", "alertmanager", "prometheus"):
        series[f'up{{job="{job}",instance="hub:{job}"}}'] = [1.0] * minutes
    observed = [replace(f, onset=_onset(f, series)) for f in faults]
    return Replay(minutes, series, observed, servers)


def _node_series(series: dict[str, list[float | None]], node: str, minutes: int) -> None:
    series[f'up{{job="node",instance="{node}:9100",node="{node}"}}'] = [1.0] * minutes
    series[f'up{{job="gpu-exporter",instance="{node}:9400",node="{node}"}}'] = [1.0] * minutes
    series[f'gpuslice_exporter_source_up{{job="gpu-exporter",instance="{node}:9400",node="{node}"}}'] = [1.0] * minutes
    disk = f'job="node",instance="{node}:9100",node="{node}",mountpoint="/",fstype="ext4"'
    series[f"node_filesystem_size_bytes{{{disk}}}"] = [1e12] * minutes
    series[f"node_filesystem_avail_bytes{{{disk}}}"] = [6e11 - 1e6 * m for m in range(minutes)]


def _sessions(rng: random.Random, minutes: int, node: str, gpu: int, faults: Sequence[Fault]) -> list[bool]:
    """Minutes a server holds a slice of this card: working hours, some days none; faults that need one get one."""
    held = [False] * minutes
    for day in range(math.ceil(minutes / 1440)):
        if (day % 7 >= 5 and rng.random() < 0.7) or rng.random() < 0.15:
            continue
        start, stop = day * 1440 + rng.randrange(8 * 60, 10 * 60), day * 1440 + rng.randrange(16 * 60, 20 * 60)
        for m in range(start, min(stop, minutes)):
            held[m] = True
    for f in faults:
        if f.kind in SESSION_FAULTS and (f.node, f.gpu) == (node, gpu):
            for m in range(max(0, f.start - 30), min(f.end + 30, minutes)):
                held[m] = True
    return held


def _gpu_series(
    rng: random.Random,
    series: dict[str, list[float | None]],
    node: str,
    gpu: int,
    user: str,
    minutes: int,
    faults: Sequence[Fault],
) -> None:
    held = _sessions(rng, minutes, node, gpu, faults)
    mine = [f for f in faults if f.node == node and f.gpu in (gpu, None)]
    util, temp, power, sm, fb, xid, dbe = ([0.0] * minutes for _ in range(7))
    allocated: list[float | None] = [None] * minutes
    process: list[float | None] = [None] * minutes
    # The last card of each node sits in a hot spot: at full load it brushes 85 C now and then.
    ambient = rng.uniform(41, 43) if gpu == GPUS_PER_NODE - 1 else rng.uniform(30, 36)
    errors = 0.0
    app_xid = _application_xids(rng, held)
    work = rng.uniform(0.5, 1.0)  # how hard this card's user works it
    for m in range(minutes):
        u = min(100.0, max(3.0, 100 * work * load(m) + rng.gauss(0, 8))) if held[m] else 0.0
        s = u / 100 * rng.uniform(0.6, 0.9)
        mem = 6 * GiB + rng.uniform(-0.5, 0.5) * GiB if held[m] else None
        t = ambient + 0.4 * u + rng.gauss(0, 1.5)
        x = app_xid[m]
        for f in mine:
            if not f.start <= m < f.end:
                continue
            age = m - f.start
            if f.kind == "xid_storm":
                x = rng.choice((79.0, 48.0, 63.0, 94.0))
            elif f.kind == "ecc_double_bit" and age == 0:
                errors += rng.choice((1, 2, 4))
            elif f.kind == "thermal_runaway":
                t = min(97.0, t + 1.0 * age) if age < f.end - f.start - 15 else t
            elif f.kind == "hung_gpu":
                u, s = 100.0, 0.01
            elif f.kind == "leaking_notebook":
                mem = 6 * GiB + 64 * 1024**2 * age
            elif f.kind == "idle_slice_held":
                u, s = 0.0, 0.0
        util[m], sm[m], temp[m], xid[m], dbe[m] = round(u), round(s, 2), round(t, 1), x, errors
        power[m] = round(IDLE_POWER_W + (FULL_POWER_W - IDLE_POWER_W) * (s / 0.9 if s > 0.05 else 0.0), 1)
        fb[m] = round((mem or 0.0) / 1024**2 + 500)
        allocated[m] = float(SLICE_BYTES) if held[m] else None
        process[m] = float(mem) if mem is not None else None
    scrape = f'job="gpu-exporter",instance="{node}:9400"'
    labels = f'gpu="{gpu}",UUID="GPU-{node[-1]}{gpu}",modelName="NVIDIA {MODEL}",Hostname="{node}",{scrape}'
    dcgm = {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_GPU_TEMP": temp,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_PROF_SM_ACTIVE": sm,
        "DCGM_FI_DEV_FB_USED": fb,
        "DCGM_FI_DEV_XID_ERRORS": xid,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": dbe,
    }
    down = _exporter_down(minutes, node, faults)
    for name, values in dcgm.items():
        series[f"{name}{{{labels}}}"] = [None if down[m] else v for m, v in enumerate(values)]
    proc = f'gpu="{gpu}",Hostname="{node}",user="{user}",server="",pid="4242",job="gpu-exporter",instance="{node}:9400"'
    series[f"gpuslice_process_gpu_memory_bytes{{{proc}}}"] = [None if down[m] else v for m, v in enumerate(process)]
    hub = f'node="{node}",gpu="{gpu}",user="{user}",server="",job="jupyterhub",instance="hub:jupyterhub"'
    series[f"gpuslice_gpu_memory_allocated_bytes{{{hub}}}"] = allocated
    for f in mine:
        if f.kind in NODE_FAULTS:
            for sel in series:
                if f'instance="{node}:9400"' in sel and sel.startswith(("up{", "gpuslice_exporter_source_up")):
                    _set(series[sel], f, 0.0 if sel.startswith("up{") else None)
                if f.kind == "node_down" and f'instance="{node}:9100"' in sel:
                    _set(series[sel], f, 0.0 if sel.startswith("up{") else None)


def _application_xids(rng: random.Random, held: Sequence[bool]) -> list[float]:
    """Healthy, not faults: a user's program crashes now and then (Xid 13, 31, 43, 45).

    About once in 25 hours of a server running.
    """
    xid = [0.0] * len(held)
    for m in range(len(held)):
        if held[m] and rng.random() < 1 / 1500:
            code = rng.choice((13.0, 31.0, 43.0, 45.0))
            for k in range(m, min(m + rng.randrange(2, 30), len(held))):
                xid[k] = code
    return xid


def _set(values: list[float | None], fault: Fault, value: float | None) -> None:
    for m in range(fault.start, fault.end):
        values[m] = value


def _exporter_down(minutes: int, node: str, faults: Sequence[Fault]) -> list[bool]:
    down = [False] * minutes
    for f in faults:
        if f.kind in NODE_FAULTS and f.node == node:
            for m in range(f.start, f.end):
                down[m] = True
    return down


def _onset(fault: Fault, series: dict[str, list[float | None]]) -> int:
    """The first minute the fault shows in the metrics: what a perfect rule could see."""
    if fault.kind == "thermal_runaway":
        return _first(fault, series, "DCGM_FI_DEV_GPU_TEMP", lambda v: v > 85)
    if fault.kind == "leaking_notebook":
        return _first(fault, series, "gpuslice_process_gpu_memory_bytes", lambda v: v > 1.05 * SLICE_BYTES)
    return fault.start


def _first(fault: Fault, series: dict[str, list[float | None]], metric: str, test: object) -> int:
    key = next(k for k in series if k.startswith(metric + "{") and f'gpu="{fault.gpu}"' in k and f'"{fault.node}"' in k)
    for m in range(fault.start, fault.end):
        v = series[key][m]
        if v is not None and test(v):  # type: ignore[operator]
            return m
    raise ValueError(f"{fault.kind} on {fault.node}/{fault.gpu} never shows: make it last longer")


# --- promtool -----------------------------------------------------------------------------


def notation(values: Sequence[float | None]) -> str:
    """promtool's series notation, runs compressed: 'v+0xN' repeats v N+1 times, '_xN' skips N samples.

    A series that stops is marked stale, as Prometheus does when a scrape fails.
    """
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        run = j - i + 1
        v = values[i]
        if v is None:
            stale = i > 0 and values[i - 1] is not None
            parts.append("stale" if stale else "_")
            if run > 1:
                parts.append(f"_x{run - 1}")
        else:
            text = f"{v:g}"
            parts.append(text if run == 1 else f"{text}+0x{run - 1}")
        i = j + 1
    return " ".join(parts)


def alert_names(rule_files: Iterable[Path] = RULE_FILES) -> list[str]:
    return [
        r["alert"]
        for path in rule_files
        for group in yaml.safe_load(path.read_text())["groups"]
        for r in group["rules"]
        if "alert" in r
    ]


def alert_for_minutes(rule_files: Iterable[Path] = RULE_FILES) -> dict[str, float]:
    units = {"s": 1 / 60, "m": 1.0, "h": 60.0}
    out: dict[str, float] = {}
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for r in group["rules"]:
                if "alert" in r:
                    text = str(r.get("for", "0s"))
                    out[r["alert"]] = sum(float(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", text))
    return out


def test_file(replay: Replay, rule_files: Sequence[Path]) -> dict[str, object]:
    """A promtool test that expects no alert at any minute: its failures list every alert firing."""
    names = [n for n in alert_names(rule_files) if n != HEARTBEAT]
    return {
        "rule_files": [str(p.resolve()) for p in rule_files],
        "evaluation_interval": f"{STEP_MIN}m",
        "tests": [
            {
                "interval": f"{STEP_MIN}m",
                "input_series": [{"series": s, "values": notation(v)} for s, v in replay.series.items()],
                "alert_rule_test": [
                    {"eval_time": f"{m}m", "alertname": name, "exp_alerts": []}
                    for m in range(replay.minutes)
                    for name in names
                ],
            }
        ],
    }


DURATION = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
DURATION_MIN = {"ms": 1 / 60000, "s": 1 / 60, "m": 1, "h": 60, "d": 1440, "w": 10080, "y": 525600}
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_firing(output: str) -> list[tuple[int, dict[str, str]]]:
    """(minute, labels) of every alert promtool reports as got-but-not-expected."""
    firing: list[tuple[int, dict[str, str]]] = []
    minute = -1
    for line in output.splitlines():
        head = re.search(r"alertname: (\w+), time: (\w+),", line)
        if head:
            minute = round(sum(int(n) * DURATION_MIN[u] for n, u in DURATION.findall(head.group(2))))
        elif line.strip().startswith("Labels:{"):
            firing.append((minute, dict(LABEL.findall(line))))
        elif "err:" in line or "rule:" in line:
            raise RuntimeError(f"promtool could not evaluate the rules: {line.strip()}")
    return firing


def run_promtool(
    replay: Replay, rule_files: Sequence[Path] = RULE_FILES, promtool: str | None = None
) -> list[tuple[int, dict[str, str]]]:
    binary = promtool or shutil.which("promtool")
    if not binary:
        raise SystemExit("promtool is missing: scripts/setup installs it (apt-get install prometheus)")
    with tempfile.TemporaryDirectory(prefix="gpuslice-replay-") as folder:
        path = Path(folder) / "replay_test.yml"
        path.write_text(json.dumps(test_file(replay, rule_files)))  # JSON is YAML, and far faster to write
        result = subprocess.run([binary, "test", "rules", str(path)], capture_output=True, text=True, timeout=3600)
    output = result.stdout + result.stderr
    if result.returncode != 0 and "FAILED" not in output:
        raise RuntimeError(f"promtool test rules failed to run: {output[-2000:]}")
    return parse_firing(output)


# --- scoring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Episode:
    alert: str
    labels: tuple[tuple[str, str], ...]
    start: int
    end: int  # last firing minute


def episodes(firing: Iterable[tuple[int, dict[str, str]]]) -> list[Episode]:
    """Consecutive firing minutes of one alert series are one episode."""
    minutes: dict[tuple[str, tuple[tuple[str, str], ...]], list[int]] = {}
    for minute, found in firing:
        key = (found["alertname"], tuple(sorted(found.items())))
        minutes.setdefault(key, []).append(minute)
    out: list[Episode] = []
    for (alert, labels), ms in minutes.items():
        ms.sort()
        start = ms[0]
        for prev, m in itertools.pairwise(ms):
            if m > prev + STEP_MIN:  # a gap: the last episode ended at prev
                out.append(Episode(alert, labels, start, prev))
                start = m
        out.append(Episode(alert, labels, start, ms[-1]))
    return sorted(out, key=lambda e: (e.start, e.alert))


def _where(episode: Episode, servers: dict[str, tuple[str, int]]) -> tuple[str | None, int | None]:
    labels = dict(episode.labels)
    if labels.get("user") in servers:
        return servers[labels["user"]]
    where = labels.get("node") or labels.get("Hostname")
    return where, int(labels["gpu"]) if labels.get("gpu", "").isdigit() else None


def explains(fault: Fault, episode: Episode, servers: dict[str, tuple[str, int]], for_min: float) -> bool:
    expected, explained = FAULT_ALERTS[fault.kind]
    if episode.alert != expected and episode.alert not in explained:
        return False
    node, gpu = _where(episode, servers)
    if node is not None and node != fault.node:
        return False
    if fault.gpu is not None and gpu is not None and gpu != fault.gpu:
        return False
    # An alert may fire until its `for:` and a 15-minute window after the fault (the ECC increase) pass.
    return episode.start >= fault.start and episode.start <= fault.end + for_min + 15


@dataclass
class AlertScore:
    alert: str
    episodes: int = 0
    true_episodes: int = 0
    faults: int = 0
    detected: int = 0
    detect_minutes: list[int] = field(default_factory=list)
    target_min: float = 0.0

    @property
    def precision(self) -> float | None:
        return self.true_episodes / self.episodes if self.episodes else None

    @property
    def recall(self) -> float | None:
        return self.detected / self.faults if self.faults else None

    @property
    def median_detect(self) -> float | None:
        return statistics.median(self.detect_minutes) if self.detect_minutes else None


@dataclass
class Score:
    alerts: dict[str, AlertScore]
    false_alarms: list[Episode]
    missed: list[Fault]


def score(replay: Replay, found: Sequence[Episode], for_minutes: dict[str, float]) -> Score:
    scores = {
        name: AlertScore(name, target_min=for_minutes[name] + 2 * STEP_MIN) for name in for_minutes if name != HEARTBEAT
    }
    false_alarms: list[Episode] = []
    for ep in found:
        if ep.alert == HEARTBEAT:
            continue
        s = scores[ep.alert]
        s.episodes += 1
        if any(explains(f, ep, replay.servers, for_minutes[ep.alert]) for f in replay.faults):
            s.true_episodes += 1
        else:
            false_alarms.append(ep)
    missed: list[Fault] = []
    for f in replay.faults:
        s = scores.setdefault(f.alert, AlertScore(f.alert + " (no such rule)"))
        s.faults += 1
        hits = [ep for ep in found if ep.alert == f.alert and explains(f, ep, replay.servers, for_minutes[f.alert])]
        if hits:
            s.detected += 1
            s.detect_minutes.append(min(ep.start for ep in hits) - f.onset)
        else:
            missed.append(f)
    return Score(scores, false_alarms, missed)


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def table(result: Score) -> str:
    header = ("alert", "faults", "recall", "episodes", "precision", "TTD median", "TTD max", "target")
    rows = ["{:<24} {:>6} {:>6} {:>8} {:>9} {:>10} {:>7} {:>6}".format(*header)]
    for s in result.alerts.values():
        worst = max(s.detect_minutes) if s.detect_minutes else None
        cells = (
            s.alert,
            s.faults,
            _fmt(s.recall),
            s.episodes,
            _fmt(s.precision),
            _fmt(s.median_detect, "{:.0f} min"),
            _fmt(worst, "{:.0f}"),
            f"{s.target_min:.0f}",
        )
        rows.append("{:<24} {:>6} {:>6} {:>8} {:>9} {:>10} {:>7} {:>6}".format(*cells))
    for ep in result.false_alarms:
        rows.append(f"false alarm: {ep.alert} {dict(ep.labels)} minutes {ep.start}-{ep.end}")
    for f in result.missed:
        rows.append(f"missed: {f.kind} on {f.node}/{f.gpu} at minute {f.start}")
    return "\n".join(rows)


def replay_and_score(
    seed: int, days: float, faults_per_kind: int, rule_files: Sequence[Path] = RULE_FILES
) -> tuple[Replay, Score]:
    replay = generate(seed, days, faults_per_kind)
    found = episodes(run_promtool(replay, rule_files))
    return replay, score(replay, found, alert_for_minutes(rule_files))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--days", type=float, default=7.0, help="days to simulate (default: a week)")
    parser.add_argument("--seed", type=int, default=2, help="random seed (the rules were tuned on seed 1)")
    parser.add_argument("--faults-per-kind", type=int, default=3, help="injected faults of each kind")
    args = parser.parse_args(argv)
    replay, result = replay_and_score(args.seed, args.days, args.faults_per_kind)
    print(
        f"Replay: {len(NODES) * GPUS_PER_NODE} GPUs on {len(NODES)} nodes, {args.days:g} days at one sample a minute, "
        f"seed {args.seed}, {len(replay.faults)} faults injected ({', '.join(sorted(FAULT_ALERTS))}); "
        "Prometheus down is watched from outside Prometheus (Watchdog), not replayable here."
    )
    print(table(result))
    return 0 if not result.false_alarms and not result.missed else 1


if __name__ == "__main__":
    raise SystemExit(main())
