"""The alert replay: notation and parsing on literals, then a short replay through the real promtool."""

import shutil

import pytest

from bench.alerts import (
    Episode,
    alert_for_minutes,
    episodes,
    generate,
    notation,
    parse_firing,
    replay_and_score,
    run_promtool,
)

needs_promtool = pytest.mark.skipif(
    not shutil.which("promtool"), reason="promtool is missing: scripts/setup installs it (apt-get install prometheus)"
)


def test_notation_compresses_runs_and_marks_a_stopped_series_stale() -> None:
    assert notation([1.0, 1.0, 1.0, None, None, 2.5, 0.0]) == "1+0x2 stale _x1 2.5 0"
    assert notation([None, None, 3.0]) == "_ _x1 3"


def test_parse_firing_reads_promtools_failures() -> None:
    output = """Unit Testing:  replay_test.yml
  FAILED:
    alertname: NodeDown, time: 1d2h3m,
        exp:[],
        got:[
            0:
              Labels:{alertname="NodeDown", instance="n1:9100", node="n1", severity="critical"}
              Annotations:{summary="Node n1 does not answer"}
            ]
    alertname: GpuHung, time: 1w,
        exp:[],
        got:[
            0:
              Labels:{alertname="GpuHung", gpu="0", node="n1"}
              Annotations:{}
            1:
              Labels:{alertname="GpuHung", gpu="1", node="n1"}
              Annotations:{}
            ]
"""
    assert parse_firing(output) == [
        (1440 + 120 + 3, {"alertname": "NodeDown", "instance": "n1:9100", "node": "n1", "severity": "critical"}),
        (10080, {"alertname": "GpuHung", "gpu": "0", "node": "n1"}),
        (10080, {"alertname": "GpuHung", "gpu": "1", "node": "n1"}),
    ]


def test_consecutive_minutes_are_one_episode() -> None:
    a = {"alertname": "X", "gpu": "0"}
    b = {"alertname": "X", "gpu": "1"}
    found = episodes([(5, a), (6, a), (7, a), (10, a), (6, b)])
    labels_a, labels_b = tuple(sorted(a.items())), tuple(sorted(b.items()))
    assert found == [Episode("X", labels_a, 5, 7), Episode("X", labels_b, 6, 6), Episode("X", labels_a, 10, 10)]


@needs_promtool
def test_a_healthy_day_raises_no_alert() -> None:
    replay = generate(seed=1, days=1, faults_per_kind=0)
    fired = {labels["alertname"] for _, labels in run_promtool(replay)}
    assert fired == set(), f"alerts on healthy data: {fired}"


@needs_promtool
def test_every_injected_fault_is_detected_in_time_and_nothing_else_fires() -> None:
    replay, result = replay_and_score(seed=1, days=1, faults_per_kind=1)
    assert {f.kind for f in replay.faults} == {
        "xid_storm", "ecc_double_bit", "thermal_runaway", "hung_gpu",
        "leaking_notebook", "idle_slice_held", "exporter_down", "node_down",
    }  # fmt: skip
    assert result.missed == [], result.missed
    assert result.false_alarms == [], result.false_alarms
    for_minutes = alert_for_minutes()
    for score in result.alerts.values():
        if score.detect_minutes:  # the target: median time to detect within for: plus two scrape intervals
            assert score.median_detect is not None and score.median_detect <= for_minutes[score.alert] + 2, score
