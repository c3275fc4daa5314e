"""Forecasting a service's arrival rate from its own history: a recurring pattern, then a trend.

Pure Python (the operator's image has no numpy); the series are short (one sample a minute over a
few hours). The history is the service's arrival rate as Prometheus has it
(``sum(rate(cosyvoice_requests_total[1m]))`` over ``lookbackSeconds``), oldest first, evenly spaced.

* ``detect_period``: among the local maxima of the autocorrelation of the series less its linear trend,
  between ``min_period_s`` and half the history (two whole periods must have been seen), the shortest
  lag within the estimate's standard error of the highest (a multiple of the period correlates as
  well). A pattern is used only when its autocorrelation reaches ``min_correlation``: successive
  periods must look alike.
* ``seasonal``: the value one period ago at each future step (seasonal naive), averaged over the
  periods seen, scaled by the level now against the level one period ago (a growing service keeps
  its shape). That is what pre-warms for the next peak and what stops a scale-down from removing
  replicas a recurring peak will need within the cold start.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Season:
    period_s: float
    correlation: float


def _acf(x: Sequence[float], lag: int) -> float:
    n = len(x) - lag
    if n <= 1:
        return 0.0
    a, b = x[:n], x[lag:]
    ma, mb = sum(a) / n, sum(b) / n
    va = sum((v - ma) ** 2 for v in a)
    vb = sum((v - mb) ** 2 for v in b)
    if va <= 0 or vb <= 0:
        return 0.0
    return sum((p - ma) * (q - mb) for p, q in zip(a, b)) / math.sqrt(va * vb)


def slope(series: Sequence[float]) -> float:
    """The least-squares slope of ``series`` per sample (two samples at least)."""
    n = len(series)
    mid, mean = (n - 1) / 2, sum(series) / n
    return sum((i - mid) * (v - mean) for i, v in enumerate(series)) / sum((i - mid) ** 2 for i in range(n))


def detect_period(series: Sequence[float], step_s: float, min_period_s: float, min_correlation: float,
                  noise_var: float = 0.0) -> Season | None:
    """The recurring period of ``series`` (None: none strong enough, or too little history).

    ``noise_var`` is the variance counting noise alone gives the series (a Poisson rate measured over a
    window): a series that varies less than four times that (a swing under twice the noise) has no
    pattern to find, however its noise happens to correlate over a few samples.
    """
    lo = max(2, int(math.ceil(min_period_s / step_s)))
    hi = len(series) // 2
    if hi <= lo + 1:
        return None
    # Without its linear trend: a rising or falling series correlates with itself at every lag, and its
    # noise then makes some lag a local maximum above any threshold (a trend is not a recurring pattern)
    n = len(series)
    mid, mean, rise = (n - 1) / 2, sum(series) / n, slope(series)
    series = [v - mean - rise * (i - mid) for i, v in enumerate(series)]
    if sum(v * v for v in series) / n < 4 * noise_var:
        return None
    acf = [_acf(series, lag) for lag in range(lo - 1, hi + 2)]
    peaks = [(acf[i], lo - 1 + i) for i in range(1, len(acf) - 1)
             if acf[i] >= acf[i - 1] and acf[i] >= acf[i + 1] and lo - 1 + i <= hi]
    if not peaks or max(peaks)[0] < min_correlation:
        return None
    # A pattern correlates as well at every multiple of its period: the shortest lag within the estimate's
    # standard error (1/√n) of the best is the period (more cycles averaged, found after two of them)
    top = max(peaks)[0]
    best = min((lag, r) for r, lag in peaks if r >= top - 1 / math.sqrt(n))[::-1]
    # the peak between samples (a parabola through the three around it): a period off by a fraction of a
    # step drifts a whole step every few periods
    i = best[1] - (lo - 1)
    a, b, c = acf[i - 1], acf[i], acf[i + 1]
    shift = 0.5 * (a - c) / (a - 2 * b + c) if (a - 2 * b + c) < 0 else 0.0
    return Season((best[1] + max(-0.5, min(0.5, shift))) * step_s, best[0])


def seasonal(series: Sequence[float], step_s: float, season: Season, horizon_s: float) -> list[float]:
    """Forecast of the next ``horizon_s`` (one value per step, the first one step ahead)."""
    period = season.period_s / step_s  # in samples, fractional
    p = int(round(period))
    n = len(series)
    # the level: the last whole period against the one before. A shorter window would compare different
    # phases whenever the period is off by a sample, and read an edge of the pattern as growth.
    now_level = sum(series[-p:]) / len(series[-p:])
    then = series[max(0, n - 2 * p):n - p]
    level = now_level / (sum(then) / len(then)) if then and sum(then) > 0 else 1.0
    level = min(2.0, max(0.5, level))  # a level change is a scale, not a new pattern

    def at(x: float) -> float:  # linear interpolation between samples
        i = int(math.floor(x))
        return series[i] + (series[i + 1] - series[i]) * (x - i) if i + 1 < n else series[i]

    out = []
    for h in range(1, int(math.ceil(horizon_s / step_s)) + 1):
        # each period seen, at this phase and one sample either side (the period is known to about a
        # sample, and the error grows with each period back): the highest of the three, so a peak is not
        # forecast late or low because the cycles jitter; then averaged over the periods, so the counting
        # noise of one cycle averages out rather than its highest sample being taken
        cycles = [[at(x) for d in (-1, 0, 1) if 0 <= (x := n - 1 + h - k * period + d) < n]
                  for k in range(1, int(n // period) + 1)]
        past = [max(c) for c in cycles if c]
        out.append(level * sum(past) / len(past) if past else now_level)
    return out
