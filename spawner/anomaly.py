"""Per-card anomaly models (scikit-learn) for what fixed alert thresholds miss.

- *Hot for its load*: a robust regression (``HuberRegressor``) of the card's temperature on
  its utilization, fitted on the card's own history; a card running well above what its
  model expects for the load it carries, for ``minutes`` in a row, is unusual even below
  the 85 °C rule (a failing fan, a blocked airflow, dried thermal paste).
- *Memory growing without bound*: the least-squares slope of a server's GPU memory over a
  sliding hour (LinearRegression's fit, in closed form); a steady climb is a leak long before it crosses the slice (the
  GpuMemoryOverSlice rule).
- *Correctable errors rising*: a Poisson regression (``PoissonRegressor``) of the card's
  single-bit ECC errors per bin over a sliding two hours; a rate that at least doubles
  across the window, seen in most bins (not one burst), and ends well above the card's
  usual rate in its history, is memory going bad before a double-bit error.
- *Utilization that collapses*: a robust regression (``HuberRegressor``) of the card's
  utilization on the platform's (the other held cards' mean), fitted on its history; a
  held card far below what the platform's load now predicts for it, for ``minutes`` in a
  row, has stopped doing its work (a stalled data loader, a wedged job) though not at 0%.

Pure: series in (one value per sample, None where there is none), findings out, each with
its evidence in words. Designed on the replay's seed 1 (bench/anomaly.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from scipy import stats
from sklearn.linear_model import HuberRegressor, PoissonRegressor

MiB = 1024**2
Card = TypeVar("Card", bound=Hashable)  # (node, gpu) as the caller names it


@dataclass(frozen=True)
class Finding:
    kind: str  # "hot for its load", "memory growing", "correctable errors rising", "utilization collapsed"
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


def heat_model(
    utilization: Sequence[float | None], temperature: Sequence[float | None], train: slice, over_c: float = 8.0
) -> tuple[np.ndarray, float] | None:
    """The temperature the card's load explains at each sample, and how far above it is unusual.

    None when its history has not an hour under load: the slope of heat on load is unknown.
    The limit is ``over_c`` or twice the largest usual miss, whichever is more.
    """
    util, temp = _array(utilization), _array(temperature)
    seen = np.isfinite(util) & np.isfinite(temp)
    fit = np.zeros(len(util), dtype=bool)
    fit[train] = True
    fit &= seen
    if (util[fit] > 20).sum() < 60:
        return None
    model = HuberRegressor().fit(util[fit].reshape(-1, 1), temp[fit])
    expected = np.full(len(util), np.nan)
    expected[seen] = model.predict(util[seen].reshape(-1, 1))
    # Twice the usual largest miss, from a robust spread (the MAD, scaled to a normal's sigma): a history
    # that holds a few minutes of an incident (a runaway in its first days) must not lift the limit
    # out of reach. For normal noise it is the old rule, twice the 99.9th percentile of |miss|.
    sigma = float(stats.median_abs_deviation((temp - expected)[fit], scale="normal"))
    limit = max(over_c, 2 * float(stats.norm.ppf(0.9995)) * sigma)
    return expected, limit


def hot_for_load(
    utilization: Sequence[float | None],
    temperature: Sequence[float | None],
    train: slice,
    over_c: float = 8.0,
    minutes: int = 10,
) -> list[Finding]:
    """Stretches where the card is at least ``over_c`` (or twice its usual spread) hotter than its model."""
    model = heat_model(utilization, temperature, train, over_c)
    if model is None:
        return []
    util, temp = _array(utilization), _array(temperature)
    expected, limit = model
    excess = temp - expected
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


def sliding_slopes(values: np.ndarray, window: int) -> np.ndarray:
    """The least-squares slope of each ``window`` consecutive samples on their index (NaN where one is missing).

    The same fit as scikit-learn's LinearRegression on (0..window-1, values), in closed form over every
    window at once: sum((x - mean x) * y) / sum((x - mean x)^2). One LinearRegression a window cost 2 ms
    of checks and copies each, 20 s of CPU for a three-day replay of 16 cards (bench/anomaly.py).
    """
    steps = np.arange(window, dtype=float)
    centered = steps - steps.mean()
    windows = np.lib.stride_tricks.sliding_window_view(values, window)
    complete = np.isfinite(windows).all(axis=1)
    slopes = np.full(len(windows), np.nan)
    slopes[complete] = windows[complete] @ centered / float(centered @ centered)
    return slopes


def memory_growing(
    memory_bytes: Sequence[float | None],
    window: int = 60,
    mib_per_sample: float = 10.0,
    windows: int = 3,
) -> list[Finding]:
    """Stretches where the fitted slope over the last ``window`` samples exceeds ``mib_per_sample``."""
    memory = _array(memory_bytes)
    slopes = np.full(len(memory), np.nan)
    if len(memory) >= window:
        slopes[window - 1 :] = sliding_slopes(memory, window) / MiB
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


def _increments(counter: np.ndarray) -> np.ndarray:
    """Per-sample increase of a counter; a counter that restarted (driver reload) counts from zero."""
    increase = np.diff(counter, prepend=np.nan)
    restarted = increase < 0
    increase[restarted] = counter[restarted]
    return increase


def _binned(values: np.ndarray, size: int) -> np.ndarray:
    """Sums of ``size`` samples; NaN where fewer than half of a bin's samples exist."""
    usable = len(values) // size * size
    bins = values[:usable].reshape(-1, size)
    seen = np.isfinite(bins).sum(axis=1)
    return np.where(seen * 2 >= size, np.nansum(bins, axis=1), np.nan)


def correctable_errors_rising(
    counter: Sequence[float | None],
    train: slice,
    bin_samples: int = 10,
    window_bins: int = 12,
    factor: float = 4.0,
    floor_per_bin: float = 1.5,
    bins: int = 3,
) -> list[Finding]:
    """Windows where the card's correctable-error rate doubles and ends above ``factor`` times its usual rate.

    ``counter`` is the card's cumulative single-bit (correctable) ECC error count, one value a
    sample. The rate is fitted per ``bin_samples`` bin over ``window_bins`` bins; ``bins``
    such windows in a row make a finding.
    """
    counts = _binned(_increments(_array(counter)), bin_samples)
    history = counts[(train.start or 0) // bin_samples : (train.stop or len(counter)) // bin_samples]
    history = history[np.isfinite(history)]
    # Its usual rate, bursts aside: the mean of its history without the busiest 1% of bins.
    usual = float(history[history <= np.quantile(history, 0.99)].mean()) if len(history) else 0.0
    limit = max(factor * usual, floor_per_bin)
    place = np.linspace(0.0, 1.0, window_bins).reshape(-1, 1)
    flags = np.zeros(len(counts), dtype=bool)
    end_rates = np.full(len(counts), np.nan)
    for end in range(window_bins, len(counts) + 1):
        recent = counts[end - window_bins : end]
        if not np.isfinite(recent).all() or (recent > 0).sum() * 2 < window_bins:
            continue  # a gap, or errors in too few bins to be a rate
        if np.median(recent[window_bins // 2 :]) < limit:
            continue  # most recent bins under the limit: a burst at most, not a rising rate
        # The biggest bin counts as much as the next biggest: one burst of errors is not a trend.
        recent = np.minimum(recent, np.sort(recent)[-2])
        fit = PoissonRegressor(alpha=0.0).fit(place, recent)
        end_rates[end - 1] = float(np.exp(fit.intercept_ + fit.coef_[0]))
        flags[end - 1] = fit.coef_[0] >= np.log(2) and end_rates[end - 1] > limit
    per_hour = 60 / bin_samples  # the evidence in errors per hour, at one sample a minute
    return [
        Finding(
            "correctable errors rising",
            (start - window_bins + 1) * bin_samples,
            (found + 1) * bin_samples - 1,
            f"{end_rates[found] * per_hour:.0f} correctable ECC errors an hour and rising (more than doubled over "
            f"the last {window_bins * bin_samples} samples); its usual is {usual * per_hour:.1f} an hour "
            f"(unusual above {limit * per_hour:.0f})",
        )
        for start, found in _stretches(flags, bins)
    ]


def others_mean(
    utilization: Mapping[Card, Sequence[float | None]], held: Mapping[Card, Sequence[float | None]]
) -> dict[Card, np.ndarray]:
    """Per card, the mean utilization of the *other* cards that servers hold: the platform's load at each sample."""
    cards = list(utilization)
    length = max((len(v) for v in utilization.values()), default=0)
    util = np.full((len(cards), length), np.nan)
    for row, card in enumerate(cards):
        values = _array(utilization[card])
        holding = _array(held.get(card) or [None] * len(values))
        util[row, : len(values)] = np.where(np.nan_to_num(holding) > 0, values, np.nan)
    seen = np.isfinite(util)
    total, count = np.nansum(util, axis=0), seen.sum(axis=0)
    out = {}
    for row, card in enumerate(cards):
        others = count - seen[row]
        rest = total - np.nan_to_num(util[row])
        out[card] = np.divide(rest, others, out=np.full(length, np.nan), where=others > 0)
    return out


def utilization_collapsed(
    utilization: Sequence[float | None],
    held: Sequence[float | None],
    platform: Sequence[float | None] | np.ndarray,
    train: slice,
    below: float = 15.0,
    ratio: float = 0.33,
    minutes: int = 30,
) -> list[Finding]:
    """Stretches where a held card is ``below`` points and ``ratio`` under what the platform's load predicts."""
    util, holding = _array(utilization), np.nan_to_num(_array(held)) > 0
    load = np.asarray(platform, dtype=float) if isinstance(platform, np.ndarray) else _array(platform)
    seen = np.isfinite(util) & np.isfinite(load) & holding
    fit = np.zeros(len(util), dtype=bool)
    fit[train] = True
    fit &= seen
    if (load[fit] > 20).sum() < 60:
        return []  # never held while the platform worked for an hour: how much it works is unknown
    model = HuberRegressor().fit(load[fit].reshape(-1, 1), util[fit])
    expected = np.full(len(util), np.nan)
    expected[seen] = model.predict(load[seen].reshape(-1, 1))
    unusual = np.minimum(expected - below, ratio * expected)
    low = seen & (util < unusual)
    return [
        Finding(
            "utilization collapsed",
            start,
            found,
            f"{util[found]:.0f}% busy while its servers hold it; at the platform's load now ({load[found]:.0f}%) "
            f"its history predicts {expected[found]:.0f}% (unusual below {unusual[found]:.0f}%) "
            f"for {minutes} samples in a row",
        )
        for start, found in _stretches(low, minutes)
    ]
