"""The anomaly models on literal series (spawner/anomaly.py)."""

import math

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from spawner.anomaly import (
    correctable_errors_rising,
    hot_for_load,
    memory_growing,
    others_mean,
    sliding_slopes,
    utilization_collapsed,
)

MiB = 1024**2


def wave(minute: int) -> float:
    """A load that goes up and down, so that the model sees heat at every load."""
    return 50 + 45 * math.sin(minute / 30)


def noise(minute: int, size: float) -> float:
    return size * math.sin(minute * 12.9898) * 0.5  # deterministic, zero-mean wiggle


def test_a_card_hotter_than_its_load_explains_is_found_below_any_fixed_threshold() -> None:
    util = [wave(m) for m in range(600)]
    temp = [35 + 0.4 * u + noise(m, 2) for m, u in enumerate(util)]
    for m in range(400, 460):
        temp[m] += 12  # an hour 12 °C too warm for the load it carries
    found = hot_for_load(util, temp, slice(0, 300))
    assert [(f.kind, f.start, f.found) for f in found] == [("hot for its load", 400, 409)]
    assert "its model expects" in found[0].evidence
    assert hot_for_load(util, [35 + 0.4 * u + noise(m, 2) for m, u in enumerate(util)], slice(0, 300)) == []


def test_an_incident_in_the_cards_history_does_not_lift_its_limit_out_of_reach() -> None:
    util = [wave(m) for m in range(900)]
    temp = [35 + 0.4 * u + noise(m, 2) for m, u in enumerate(util)]
    for m in range(100, 130):
        temp[m] += 40  # a runaway half an hour long, in the history the model learns from
    for m in range(700, 760):
        temp[m] += 12  # later: an hour 12 °C too warm for its load
    found = hot_for_load(util, temp, slice(0, 600))
    assert [f.start for f in found] == [100, 700]  # the incident itself, and the hot hour after it


def test_no_model_without_history_under_load() -> None:
    idle = [0.0] * 300
    assert hot_for_load(idle, [35.0] * 300, slice(0, 300)) == []


def test_a_steady_climb_is_a_leak_and_noise_is_not() -> None:
    flat = [6 * 1024 * MiB + noise(m, 512 * MiB) for m in range(300)]
    leak = [v + (16 * MiB * (m - 150) if m >= 150 else 0) for m, v in enumerate(flat)]
    found = memory_growing(leak)
    assert found and found[0].kind == "memory growing"
    assert 150 < found[0].found < 210
    assert memory_growing(flat) == []
    gaps = [None if m % 50 == 0 else v for m, v in enumerate(leak)]  # no full window: no finding
    assert memory_growing(gaps, window=60) == []


def test_the_sliding_slope_is_scikit_learns_linear_fit_of_each_full_window() -> None:
    rng = np.random.default_rng(7)
    values = np.cumsum(rng.normal(3 * MiB, 40 * MiB, 400)) + 8 * 1024 * MiB
    values[[100, 250, 251]] = np.nan  # a window holding one of these has no slope
    slopes = sliding_slopes(values, 60)
    steps = np.arange(60, dtype=float).reshape(-1, 1)
    for start in range(len(values) - 59):
        window = values[start : start + 60]
        if np.isnan(window).any():
            assert np.isnan(slopes[start])
        else:
            expected = LinearRegression().fit(steps, window).coef_[0]
            assert slopes[start] == pytest.approx(expected, rel=1e-9, abs=1e-3)


def counter(per_sample: list[float]) -> list[float | None]:
    total, out = 0.0, []
    for increase in per_sample:
        total += increase
        out.append(total)
    return out


def test_a_rising_correctable_error_rate_is_found_and_a_steady_trickle_or_a_burst_is_not() -> None:
    minutes = 1440
    steady = [1.0 if m % 20 == 0 else 0.0 for m in range(minutes)]  # 3 an hour, every hour: its usual
    rising = list(steady)
    for m in range(900, 1260):  # doubling every hour for six hours, to 48 an hour
        rising[m] += 0.8 * 2 ** ((m - 1260) / 60) * 60 / 60
    found = correctable_errors_rising(counter(rising), slice(0, 720))
    assert [f.kind for f in found] == ["correctable errors rising"]
    assert 900 < found[0].found < 1260 and "rising" in found[0].evidence
    assert correctable_errors_rising(counter(steady), slice(0, 720)) == []
    burst = list(steady)
    burst[1000] += 40  # many errors at once, then its usual trickle: one bin, not a trend
    assert correctable_errors_rising(counter(burst), slice(0, 720)) == []
    restarted = counter(steady)[:800] + counter(steady[800:])  # the driver reloaded: the counter restarts
    assert correctable_errors_rising(restarted, slice(0, 720)) == []


def test_a_held_card_far_below_what_the_platforms_load_predicts_is_found() -> None:
    minutes = 900
    platform = [max(0.0, 60 + 35 * math.sin(m / 40)) for m in range(minutes)]
    util = [0.8 * p + noise(m, 8) for m, p in enumerate(platform)]
    held: list[float | None] = [10.0 * 2**30] * minutes
    collapsed = list(util)
    for m in range(600, 700):
        collapsed[m] = 5.0  # still held, at 5%: no work
    found = utilization_collapsed(collapsed, held, platform, slice(0, 500))
    assert [(f.kind, f.start) for f in found] == [("utilization collapsed", found[0].start)]
    assert 600 <= found[0].start < 640 and found[0].found == found[0].start + 29
    assert "its history predicts" in found[0].evidence
    assert utilization_collapsed(util, held, platform, slice(0, 500)) == []
    released: list[float | None] = [v if m < 600 else None for m, v in enumerate(held)]
    assert utilization_collapsed(collapsed, released, platform, slice(0, 500)) == []  # no server holds it


def test_the_platforms_load_for_a_card_is_the_other_held_cards_mean() -> None:
    util = {("n", "0"): [10.0, 90.0], ("n", "1"): [50.0, 30.0], ("n", "2"): [70.0, 0.0]}
    held: dict[tuple[str, str], list[float | None]] = {
        ("n", "0"): [1.0, 1.0],
        ("n", "1"): [1.0, 1.0],
        ("n", "2"): [1.0, None],
    }
    mean = others_mean(util, held)
    assert list(mean[("n", "0")]) == [60.0, 30.0]
    assert list(mean[("n", "2")]) == [30.0, 60.0]
