"""Alert quality, measured: replay a simulated platform through the real rules with promtool.

The platform and its faults come from bench/faultgen.py, whose fault shapes are drawn from
published sources and never from the rules. The series become a ``promtool test rules``
file whose alert tests expect silence at every minute, so promtool prints every alert
that fires and when; the episodes are then matched against the injected faults.

Reported per alert: precision (episodes explained by a fault / all episodes), recall
(faults detected / faults injected) and time to detect (first firing minute minus the
minute the fault became observable), against the target ``for:`` + two scrape intervals;
and per fault shape the same, with each shape's drawn parameters for the ones missed.

    python -m bench.alerts --days 7 --seed 11      # or: gpuslice bench alerts
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.faultgen import (
    FAULT_ALERTS,
    GPUS_PER_NODE,
    KINDS,
    NODES,
    STEP_MIN,
    Fault,
    Replay,
    generate,
)
from hub.monitoring import RULE_FILES

__all__ = ["GPUS_PER_NODE", "NODES", "Fault", "Replay", "generate"]  # bench/anomaly.py takes them from here

HEARTBEAT = "Watchdog"  # always fires by design: the dead man's switch, not scored


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
class ShapeScore:
    kind: str
    shape: str
    alert: str
    faults: int = 0
    detected: int = 0
    detect_minutes: list[int] = field(default_factory=list)

    @property
    def recall(self) -> float | None:
        return self.detected / self.faults if self.faults else None


@dataclass
class Score:
    alerts: dict[str, AlertScore]
    false_alarms: list[Episode]
    missed: list[Fault]
    shapes: dict[tuple[str, str], ShapeScore] = field(default_factory=dict)


def score(replay: Replay, found: Sequence[Episode], for_minutes: dict[str, float]) -> Score:
    scores = {
        name: AlertScore(name, target_min=for_minutes[name] + 2 * STEP_MIN) for name in for_minutes if name != HEARTBEAT
    }
    shapes = {
        (kind, s.name): ShapeScore(kind, s.name, alert)
        for kind, (alert, _, kind_shapes) in KINDS.items()
        for s in kind_shapes
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
        shape = shapes.setdefault((f.kind, f.shape), ShapeScore(f.kind, f.shape, f.alert))
        s.faults += 1
        shape.faults += 1
        hits = [ep for ep in found if ep.alert == f.alert and explains(f, ep, replay.servers, for_minutes[f.alert])]
        if hits:
            s.detected += 1
            shape.detected += 1
            s.detect_minutes.append(min(ep.start for ep in hits) - f.onset)
            shape.detect_minutes.append(min(ep.start for ep in hits) - f.onset)
        else:
            missed.append(f)
    return Score(scores, false_alarms, missed, shapes)


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def _params(fault: Fault) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in fault.params)


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
    rows.append("")
    rows.append("{:<40} {:>6} {:>8} {:>6} {:>10} {:>7}".format("fault shape (alert)", "faults", "detected", "recall",
                                                              "TTD median", "TTD max"))  # fmt: skip
    for sh in result.shapes.values():
        if not sh.faults:
            continue
        median = statistics.median(sh.detect_minutes) if sh.detect_minutes else None
        worst = max(sh.detect_minutes) if sh.detect_minutes else None
        shape_cells = (f"{sh.kind}/{sh.shape} ({sh.alert})", sh.faults, sh.detected, _fmt(sh.recall),
                       _fmt(median, "{:.0f} min"), _fmt(worst, "{:.0f}"))  # fmt: skip
        rows.append("{:<40} {:>6} {:>8} {:>6} {:>10} {:>7}".format(*shape_cells))
    for ep in result.false_alarms:
        rows.append(f"false alarm: {ep.alert} {dict(ep.labels)} minutes {ep.start}-{ep.end}")
    for f in result.missed:
        rows.append(f"missed: {f.kind}/{f.shape} on {f.node}/{f.gpu} at minute {f.start} ({_params(f)})")
    return "\n".join(rows)


def replay_and_score(
    seed: int, days: float, faults_per_kind: int, rule_files: Sequence[Path] = RULE_FILES
) -> tuple[Replay, Score]:
    replay = generate(seed, days, faults_per_kind)
    found = episodes(run_promtool(replay, rule_files))
    return replay, score(replay, found, alert_for_minutes(rule_files))


def merged(results: Sequence[Score]) -> Score:
    """Several seeds' scores as one: counts added, times to detect pooled."""
    total = Score({}, [], [], {})
    for result in results:
        for name, s in result.alerts.items():
            into = total.alerts.setdefault(name, AlertScore(name, target_min=s.target_min))
            into.episodes += s.episodes
            into.true_episodes += s.true_episodes
            into.faults += s.faults
            into.detected += s.detected
            into.detect_minutes += s.detect_minutes
        for key, sh in result.shapes.items():
            shape = total.shapes.setdefault(key, ShapeScore(sh.kind, sh.shape, sh.alert))
            shape.faults += sh.faults
            shape.detected += sh.detected
            shape.detect_minutes += sh.detect_minutes
        total.false_alarms += result.false_alarms
        total.missed += result.missed
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--days", type=float, default=7.0, help="days to simulate (default: a week)")
    parser.add_argument(
        "--seed",
        type=int,
        nargs="+",
        default=[11],
        help="random seeds, scored together (1: the generator's debugging seed)",
    )
    parser.add_argument("--faults-per-kind", type=int, default=3, help="injected faults of each shape, per seed")
    parser.add_argument(
        "--rules", type=Path, nargs="+", default=list(RULE_FILES), help="rule files (default: the platform's)"
    )
    args = parser.parse_args(argv)
    results = [replay_and_score(seed, args.days, args.faults_per_kind, args.rules) for seed in args.seed]
    result = merged([score for _, score in results])
    print(
        f"Replay: {len(NODES) * GPUS_PER_NODE} GPUs on {len(NODES)} nodes, {args.days:g} days at one sample a minute, "
        f"seeds {', '.join(map(str, args.seed))}, {sum(len(r.faults) for r, _ in results)} faults injected "
        f"({args.faults_per_kind} of each shape per seed); Prometheus down is watched from outside Prometheus "
        "(Watchdog), not replayable here. Shapes and their sources: bench/faultgen.py."
    )
    print(table(result))
    return 0 if not result.false_alarms and not result.missed else 1


if __name__ == "__main__":
    raise SystemExit(main())
