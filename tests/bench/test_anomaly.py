"""The anomaly models on a short replay of the design seed (bench/anomaly.py); the full table is the benchmark."""

import random

from bench.alerts import generate
from bench.anomaly import MODELS, RULE_SHAPES, SUBTLE, findings, inject_subtle, report


def test_the_models_find_what_stays_under_the_thresholds_and_nothing_on_healthy_cards() -> None:
    replay = inject_subtle(
        generate(1, 3.5, 1, RULE_SHAPES), random.Random(1), 1
    )  # seed 1: the models were designed on it
    found = findings(replay)
    table = report(replay, found, None)
    for kind in SUBTLE:
        assert any(line.split()[:3] == [kind, "1", "1"] for line in table.splitlines()), table
    assert "false positives: 0 findings" in table, table
    assert {c.finding.kind for c in found} == set(MODELS)
