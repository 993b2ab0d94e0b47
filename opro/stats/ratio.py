"""An interval for the ratio of two paired means: how much cheaper one configuration is, as a share.

A relative saving is ``1 - mean(new) / mean(old)`` over the same questions. Dividing the interval of
the mean difference by ``mean(old)`` treats that mean as known; where costs vary from question to
question and the cut is about the same on each (a constant token cut), the difference hardly varies
but ``mean(old)`` does, and that interval covered the true saving in only 0.32-0.35 of samples.
Fieller's interval (Fieller 1954) inverts the t test of ``mean(new) - rho mean(old) = 0``, whose
variance ``(s_nn - 2 rho s_no + rho**2 s_oo) / n`` counts both means' sampling error and their
covariance (``experiments/bench_saving.py``: 0.94-0.96 in a constant-cut and a proportional-cut world).

Where the costs are heavy-tailed (context lengths lognormal with sigma 1.2) the mean of a few dozen is
dominated by the rare long ones a sample often misses, and Fieller's interval covered only 0.55-0.86.
There (the old costs' logarithms spread by more than :data:`HEAVY_TAIL`) the interval is a
studentized (bootstrap-t) one of the log ratio, which follows the skew of the ratio of means; it
covered 0.91-0.94 of 95% there, so the output says it is approximate (:func:`saving_caveat`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], *,
                   level: float = 0.95) -> tuple[float, float] | None:
    """Fieller's ``level`` interval of ``mean(numerator) / mean(denominator)``, paired by position.
    None below 2 pairs or where the denominator's mean is not clearly away from 0 (its own t interval
    holds 0: the set of compatible ratios is then unbounded)."""
    from scipy.stats import t as student

    x, y = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired values differ in length: {len(x)} and {len(y)}")
    n = len(x)
    if n < 2:
        return None
    mx, my = float(x.mean()), float(y.mean())
    cov = np.cov(x, y, ddof=1)
    q = float(student.ppf(0.5 + level / 2, n - 1)) ** 2 / n
    # rho is in the interval where (mx - rho my)**2 <= q (sxx - 2 rho sxy + rho**2 syy): a quadratic
    # a rho**2 - 2 b rho + c <= 0, bounded exactly when a > 0.
    a = my * my - q * cov[1, 1]
    b = mx * my - q * cov[0, 1]
    c = mx * mx - q * cov[0, 0]
    if a <= 0:
        return None
    # The discriminant is >= 0 up to rounding (it is a variance times q); where rounding makes it
    # negative the interval is the point estimate.
    root = math.sqrt(max(0.0, b * b - a * c))
    return ((b - root) / a, (b + root) / a)


#: The spread (sd) of the old costs' logarithms above which they count as heavy-tailed: about a
#: lognormal's sigma. bench_saving's worlds: gamma (cv 0.4) 0.4, lognormal 0.5 and 1.2 about theirs.
HEAVY_TAIL = 0.8
#: What the bootstrap-t interval covered (95%) in the lognormal sigma 1.2 world at 10-64 pairs.
HEAVY_COVERAGE = "0.91-0.94"
_DRAWS = 1999


def log_spread(costs: Sequence[float]) -> float | None:
    """The sd of the costs' logarithms (None below 2 costs or where one is not positive)."""
    x = np.asarray(costs, dtype=float)
    if len(x) < 2 or not np.all(x > 0):
        return None
    return float(np.std(np.log(x), ddof=1))


def _heavy(old: Sequence[float]) -> float | None:
    spread = log_spread(old)
    return spread if spread is not None and spread > HEAVY_TAIL else None


def _log_ratio(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: ``log(mean(x) / mean(y))`` and its delta-method standard error (nan where undefined)."""
    n = x.shape[-1]
    mx, my = x.mean(-1), y.mean(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = ((x - mx[..., None]) * (y - my[..., None])).sum(-1) / (n - 1)
        var = x.var(-1, ddof=1) / mx**2 + y.var(-1, ddof=1) / my**2 - 2 * cov / (mx * my)
        return np.log(mx / my), np.sqrt(np.maximum(var, 0.0) / n)


def bootstrap_t_ratio(numerator: Sequence[float], denominator: Sequence[float], *, level: float = 0.95,
                      draws: int = _DRAWS, seed: int = 0) -> tuple[float, float] | None:
    """The studentized bootstrap ``level`` interval of ``mean(numerator) / mean(denominator)`` (positive
    values, paired), on the log scale: ``draws`` resamples of the pairs, each log ratio's t statistic
    about the sample's. None below 3 pairs or where a mean is not positive."""
    x, y = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if len(x) < 3 or x.mean() <= 0 or y.mean() <= 0:
        return None
    r, se = (float(v) for v in _log_ratio(x, y))
    draw = np.random.default_rng(seed).integers(0, len(x), (draws, len(x)))
    rb, seb = _log_ratio(x[draw], y[draw])
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (rb - r) / seb
    t = t[np.isfinite(t)]
    if not len(t) or se == 0:
        return (math.exp(r), math.exp(r))
    lo, hi = np.quantile(t, [(1 - level) / 2, (1 + level) / 2])
    return (math.exp(r - float(hi) * se), math.exp(r - float(lo) * se))


def saving_interval(new: Sequence[float], old: Sequence[float], *,
                    level: float = 0.95) -> tuple[float, float] | None:
    """The ``level`` interval of the share saved, ``1 - mean(new) / mean(old)`` (paired costs), from
    :func:`ratio_interval`, or :func:`bootstrap_t_ratio` where the old costs are heavy-tailed; None
    where that is None."""
    method = bootstrap_t_ratio if _heavy(old) is not None else ratio_interval
    ratio = method(new, old, level=level)
    return None if ratio is None else (1.0 - ratio[1], 1.0 - ratio[0])


def saving_caveat(old: Sequence[float]) -> str:
    """Where the old costs are heavy-tailed, what the share saved's interval is worth (else empty)."""
    spread = _heavy(old)
    if spread is None:
        return ""
    return (f"costs heavy-tailed (log sd {spread:.2f} > {HEAVY_TAIL:g}): the share's interval is approximate, "
            f"a bootstrap-t one that covered {HEAVY_COVERAGE} of 95% in such a world")


__all__ = ["HEAVY_COVERAGE", "HEAVY_TAIL", "bootstrap_t_ratio", "log_spread", "ratio_interval", "saving_caveat",
           "saving_interval"]
