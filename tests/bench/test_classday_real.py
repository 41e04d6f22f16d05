"""`gpuslice bench class-day --validate` on a tiny day (the figures for the short day: docs/load.md)."""

from dataclasses import replace

from bench.classday_real import SHORT_DAY, report, validate

# Three students, one 4 GiB slice, everyone forgets their server: after the first, each is served
# only when the reclaimer takes the slice of the one before (5 model minutes idle, then a warning).
TINY = replace(
    SHORT_DAY,
    students=3,
    cards="1x4GiB:T4",
    work_range=(2.0, 4.0),
    gap_mean=1.0,
    forget_share=1.0,
    gpu_idle_timeout=5.0,
)


def test_a_tiny_day_on_the_real_platform_is_served_by_reclaiming_as_the_model_says() -> None:
    result = validate(seed=1, day=TINY, scale_s=2.0)
    real, model = result["real"], result["model"]
    assert real["failures"] == [], real["failures"]
    assert (model["served"], model["gave_up"]) == (3, 0)  # the day is the one described above
    assert (real["served"], real["gave_up"]) == (3, 0)
    assert real["over_commits"] == 0 and real["over_commit_samples"] > 0 and model["over_commits"] == 0
    assert real["reclaimed"] >= 2 and model["reclaimed"] >= 2  # each later student needed the slice before
    assert real["wait_min"]["count"] == model["wait_min"]["count"] == 3
    # Waits are the reclaimer's doing: at least the idle timeout and warning, on both sides.
    assert real["wait_min"]["max"] >= TINY.gpu_idle_timeout and model["wait_min"]["max"] >= TINY.gpu_idle_timeout
    assert "real run:" in report(result)
