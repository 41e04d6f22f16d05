"""The Anomalies page's data path on a real Prometheus: three days of a replay backfilled with
`promtool tsdb create-blocks-from openmetrics`, read through portal/sources.py as the page reads
"the last three days", and the models' findings mapped back to the injected faults.

Seed 1 is a design seed of the models: this checks the path (queries, grid, labels, times), not
the models' quality; the false-positive rate on fresh seeds is `python -m bench.anomaly --page`
(docs/operations.md)."""

import random
import shutil

import pytest

from bench.anomaly import RULE_SHAPES, SUBTLE, false_positives, inject_subtle, page_findings, report
from bench.faultgen import generate

pytestmark = pytest.mark.skipif(
    not (shutil.which("promtool") and shutil.which("prometheus")),
    reason="Prometheus is missing: apt-get install prometheus",
)


def test_the_page_finds_the_subtle_faults_in_a_backfilled_prometheus() -> None:
    replay = inject_subtle(generate(1, 3, 0, RULE_SHAPES), random.Random(1), 1)
    found = page_findings(replay)
    table = report(replay, found, None)
    for kind in SUBTLE:
        assert any(line.split()[:3] == [kind, "1", "1"] for line in table.splitlines()), table
    for finding in found:  # every finding on a card of the replay, at a minute inside it
        assert finding.node.startswith("gpu-node-") and 0 <= finding.finding.found < replay.minutes
    assert len(false_positives(replay, found)) <= 1, table
