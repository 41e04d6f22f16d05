"""The anomaly models on literal series (spawner/anomaly.py)."""

import math

from spawner.anomaly import hot_for_load, memory_growing

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
