"""Per-card anomaly models (scikit-learn) for what fixed alert thresholds miss.

- *Hot for its load*: a robust regression (``HuberRegressor``) of the card's temperature on
  its utilization, fitted on the card's own history; a card running well above what its
  model expects for the load it carries, for ``minutes`` in a row, is unusual even below
  the 85 °C rule (a failing fan, a blocked airflow, dried thermal paste).
- *Memory growing without bound*: the slope of a server's GPU memory over a sliding hour
  (``LinearRegression``); a steady climb is a leak long before it crosses the slice (the
  GpuMemoryOverSlice rule).

Pure: series in (one value per sample, None where there is none), findings out, each with
its evidence in words. Designed on the replay's seed 1 (bench/anomaly.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import HuberRegressor, LinearRegression

MiB = 1024**2


@dataclass(frozen=True)
class Finding:
    kind: str  # "hot for its load" or "memory growing"
    start: int  # the sample where the unusual stretch began
    found: int  # the sample where the model was sure (start + the stretch it needs)
    evidence: str


def _array(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _stretches(flags: np.ndarray, length: int) -> list[tuple[int, int]]:
    """(start, start + length - 1) of every run of at least ``length`` True samples."""
    runs, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start >= length:
                runs.append((start, start + length - 1))
            start = None
    return runs


def hot_for_load(
    utilization: Sequence[float | None],
    temperature: Sequence[float | None],
    train: slice,
    over_c: float = 8.0,
    minutes: int = 10,
) -> list[Finding]:
    """Stretches where the card is at least ``over_c`` (or twice its usual spread) hotter than its model."""
    util, temp = _array(utilization), _array(temperature)
    seen = np.isfinite(util) & np.isfinite(temp)
    fit = np.zeros(len(util), dtype=bool)
    fit[train] = True
    fit &= seen
    if (util[fit] > 20).sum() < 60:
        return []  # not an hour under load in its history: the slope of heat on load is unknown
    model = HuberRegressor().fit(util[fit].reshape(-1, 1), temp[fit])
    expected = np.full(len(util), np.nan)
    expected[seen] = model.predict(util[seen].reshape(-1, 1))
    excess = temp - expected
    limit = max(over_c, 2 * float(np.quantile(np.abs(excess[fit]), 0.999)))
    hot = np.nan_to_num(excess, nan=-np.inf) > limit
    return [
        Finding(
            "hot for its load",
            start,
            found,
            f"{temp[found]:.0f} °C at {util[found]:.0f}% load; its model expects {expected[found]:.0f} °C "
            f"(+{excess[found]:.0f} °C, unusual above +{limit:.0f} °C) for {minutes} samples in a row",
        )
        for start, found in _stretches(hot, minutes)
    ]


def memory_growing(
    memory_bytes: Sequence[float | None],
    window: int = 60,
    mib_per_sample: float = 10.0,
    windows: int = 3,
) -> list[Finding]:
    """Stretches where the fitted slope over the last ``window`` samples exceeds ``mib_per_sample``."""
    memory = _array(memory_bytes)
    slopes = np.full(len(memory), np.nan)
    steps = np.arange(window, dtype=float).reshape(-1, 1)
    for end in range(window, len(memory) + 1):
        recent = memory[end - window : end]
        if np.isfinite(recent).all():
            slopes[end - 1] = LinearRegression().fit(steps, recent).coef_[0] / MiB
    growing = np.nan_to_num(slopes, nan=0.0) > mib_per_sample
    return [
        Finding(
            "memory growing",
            found - window + 1,
            found,
            f"{memory[found] / 2**30:.1f} GiB and climbing {slopes[found]:.0f} MiB a sample over the last {window} "
            f"(unusual above {mib_per_sample:.0f})",
        )
        for _, found in _stretches(growing, windows)
    ]
