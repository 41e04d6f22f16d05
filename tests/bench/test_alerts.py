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


# Shapes the rules are written to see, and shapes no rule can see by construction (the
# generator draws them from their sources either way; bench/faultgen.py says why each is blind).
SEEN = {
    ("xid_storm", "hardware_xid"),
    ("ecc_double_bit", "single_dbe"),
    ("ecc_double_bit", "dbe_burst"),
    ("ecc_double_bit", "dbe_then_reset"),
    ("thermal_runaway", "cooling_failure"),
    ("leaking_notebook", "uncapped_leak"),
    ("idle_slice_held", "idle"),
    ("exporter_down", "process_down"),
    ("exporter_down", "nvml_failing"),
    ("node_down", "down"),
}
BLIND = {
    ("xid_storm", "fallen_off_bus"),  # the card's series stop: no Xid is ever scraped
    ("xid_storm", "hardware_then_cleanup"),  # Xid 45 overwrites the hardware code within the minute
    ("hung_gpu", "spinning_kernel"),  # every SM busy spinning looks like work
    ("idle_slice_held", "polled_idle"),  # 1-3% now and then is not 0
    ("exporter_down", "flapping"),  # never down two minutes in a row
}


@needs_promtool
def test_the_shapes_the_rules_are_for_are_detected_in_time_and_the_blind_ones_are_missed() -> None:
    _, result = replay_and_score(seed=1, days=2, faults_per_kind=1)
    missed = {(f.kind, f.shape) for f in result.missed}
    assert not missed & SEEN, result.missed
    assert missed >= BLIND, BLIND - missed
    assert result.false_alarms == [], result.false_alarms
    for_minutes = alert_for_minutes()
    gradual = {("thermal_runaway", "cooling_failure"), ("leaking_notebook", "uncapped_leak")}  # noise crosses back
    for (kind, shape), score in result.shapes.items():
        if (kind, shape) in SEEN - gradual:  # the target: time to detect within for: plus two scrape intervals
            assert score.detect_minutes and max(score.detect_minutes) <= for_minutes[score.alert] + 2, score
