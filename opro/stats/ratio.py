"""An interval for the ratio of two paired means: how much cheaper one configuration is, as a share.

A relative saving is ``1 - mean(new) / mean(old)`` over the same questions. Dividing the interval of
the mean difference by ``mean(old)`` treats that mean as known; where costs vary from question to
question and the cut is about the same on each (a constant token cut), the difference hardly varies
but ``mean(old)`` does, and that interval covered the true saving in only 0.32-0.35 of samples.
Fieller's interval (Fieller 1954) inverts the t test of ``mean(new) - rho mean(old) = 0``, whose
variance ``(s_nn - 2 rho s_no + rho**2 s_oo) / n`` counts both means' sampling error and their
covariance (``experiments/bench_saving.py``: 0.94-0.96 in a constant-cut and a proportional-cut world).
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


def saving_interval(new: Sequence[float], old: Sequence[float], *,
                    level: float = 0.95) -> tuple[float, float] | None:
    """The ``level`` interval of the share saved, ``1 - mean(new) / mean(old)`` (paired costs), from
    :func:`ratio_interval`; None where that is None."""
    ratio = ratio_interval(new, old, level=level)
    return None if ratio is None else (1.0 - ratio[1], 1.0 - ratio[0])


__all__ = ["ratio_interval", "saving_interval"]
