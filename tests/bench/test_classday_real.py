"""`gpuslice bench class-day --validate` on a tiny day (the figures for the short day: docs/load.md)."""

from dataclasses import replace

import pytest

from bench.classday_real import SHORT_DAY, report, validate

# Three students, one 4 GiB slice, everyone forgets their server, closing the tab or leaving it open
# (their page beats to the server as the lab extension's does): after the first, each is served only
# when the reclaimer takes the slice of the one before: 2 model minutes after a closed tab, 5 idle
# minutes for a page left open (its no-input timeout, 8, comes later), after a warning.
TINY = replace(
    SHORT_DAY,
    students=3,
    cards="1x4GiB:T4",
    work_range=(2.0, 4.0),
    gap_mean=1.0,
    forget_share=1.0,
    gpu_idle_timeout=5.0,
)


@pytest.mark.waits
def test_a_tiny_day_on_the_real_platform_is_served_by_reclaiming_as_the_model_says() -> None:
    result = validate(seed=1, day=TINY, scale_s=2.0)
    real, model = result["real"], result["model"]
    assert real["failures"] == [], real["failures"]
    assert (model["served"], model["gave_up"]) == (3, 0)  # the day is the one described above
    assert (real["served"], real["gave_up"]) == (3, 0)
    assert real["over_commits"] == 0 and real["over_commit_samples"] > 0 and model["over_commits"] == 0
    assert real["reclaimed"] >= 2 and model["reclaimed"] >= 2  # each later student needed the slice before
    assert real["wait_min"]["count"] == model["wait_min"]["count"] == 3
    # Waits are the reclaimer's doing: at least the shorter timeout, on both sides.
    assert real["wait_min"]["max"] >= TINY.gpu_left_timeout and model["wait_min"]["max"] >= TINY.gpu_left_timeout
    # The same decisions: the same students stopped for the same reasons (left or idle, as each closed the
    # tab or not: the same draws on both sides).
    decisions, text = result["decisions"], report(result)
    assert {why: n["model"] for why, n in decisions["by_reason"].items()} == {
        why: n["real"] for why, n in decisions["by_reason"].items()
    }, text
    assert sorted(d[0] for d in model["decisions"]) == sorted(d[0] for d in real["decisions"]), text
    assert "real run:" in text and "reclaim decisions, model/real by reason:" in text
