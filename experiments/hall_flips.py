"""The sign-flip tests opro ran before the betting test, kept here for the side-by-side measurement
(``validation_errors.py``, ``bench_compare_tests.py --errors``): the flips of the studentized mean
corrected for skewness (Hall 1992), as ``opro/stats/skew.py`` defined them.

Hall's transformation of the studentized mean ``th = mean / sd`` with the sample's skewness ``g``::

    T = sqrt(n) * (th + g th**2 / 3 + g**2 th**3 / 27 + g / (6 n))

Flipping ``T`` is exact where the differences are symmetric and held the error rate where they were
skewed from about 30 pairs, but not where most pairs tie: a sample whose differences are all the same
has no spread, and got the statistic :data:`NO_SPREAD` (larger than any sample with spread), so 15
tied pairs had p = 2^-15. :func:`min_pairs` was the size below which a failure on 1 question in 10
goes unseen more often than alpha. Neither is used by opro any longer (docs/statistics.md).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

#: Up to this many pairs every sign flip is enumerated (exact); above, seeded random flips.
EXACT_MAX_N = 16
#: The statistic of a sample without spread (every difference the same): larger than that of any
#: sample with spread, with the mean's sign (0 for a mean of 0). Finite, so that a look keeps it in JSON.
NO_SPREAD = 1e6
#: The rate of rare failures a claim must survive: :func:`min_pairs` is where a sample misses every
#: failure of this rate with probability below alpha.
FAILURE_RATE = 0.1
_BLOCK = 1000
#: What the tests flip, in words (for reports and designs).
STATISTIC = "Hall's skew-corrected studentized mean"


def spent(alpha: float, t: float) -> float:
    """The O'Brien-Fleming-type alpha spent by information fraction ``t`` (0 at 0, ``alpha`` at 1): how the
    flips' looks shared alpha (the betting test spends none)."""
    from statistics import NormalDist

    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return 2 * (1 - NormalDist().cdf(z / math.sqrt(t)))


def min_pairs(alpha: float, *, failure_rate: float = FAILURE_RATE) -> int:
    """The fewest pairs with which a claim about the mean holds its error rate where the losses are
    rare and large: a sample of ``n`` misses every failure of ``failure_rate`` with probability
    ``(1 - failure_rate)**n``, which must be at most ``alpha`` (29 pairs at 0.05, 16 at 0.2)."""
    return max(1, math.ceil(math.log(alpha) / math.log(1.0 - failure_rate) - 1e-12))


def hall_statistic(s1: np.ndarray | float, s2: np.ndarray | float, s3: np.ndarray | float,
                   n: np.ndarray | int) -> np.ndarray:
    """Hall's transformed studentized mean from the power sums ``s1 = sum x``, ``s2 = sum x**2``,
    ``s3 = sum x**3`` of ``n`` values (element-wise over arrays, broadcast together);
    :data:`NO_SPREAD` with the mean's sign where the values do not vary (or are fewer than 2)."""
    s1, s2, s3, k = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (s1, s2, s3, n)))
    m = s1 / k
    var = (s2 - k * m * m) / np.maximum(k - 1, 1)
    # The power sums lose the variance of values that barely vary to rounding (about 1e-16 of the
    # mean square): below 1e-10 of it, the values are taken as equal.
    flat = (var <= 1e-10 * s2 / k) | (k < 2)
    sd = np.where(flat, 1.0, np.sqrt(np.maximum(var, 0.0)))
    th = m / sd
    g = (s3 - 3 * m * s2 + 3 * m * m * s1 - k * m * m * m) / k / (sd * sd * sd)
    t = np.sqrt(k) * (th + g * th * th / 3 + g * g * th * th * th / 27 + g / (6 * k))
    scale = np.sqrt(s2 / k)
    return np.where(flat, np.where(np.abs(m) > 1e-9 * (1 + scale), np.sign(m) * NO_SPREAD, 0.0), t)


def statistic(differences: Sequence[float]) -> float:
    """:func:`hall_statistic` of ``differences``."""
    x = np.asarray(differences, dtype=float)
    return float(hall_statistic(x.sum(), (x * x).sum(), (x * x * x).sum(), len(x)))


def flip_signs(n: int, *, draws: int, seed: int, exact_max_n: int = EXACT_MAX_N) -> np.ndarray:
    """Sign flips of ``n`` values, a row each: all ``2**n`` up to ``exact_max_n``, else ``draws`` seeded ones."""
    if n <= exact_max_n:
        return np.array(list(itertools.product((1.0, -1.0), repeat=n))) if n else np.ones((1, 0))
    return np.random.default_rng(seed).choice((1.0, -1.0), size=(draws, n))


def flipped(differences: Sequence[float], signs: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """The statistic of each flip (row of ``signs``) of the first ``sizes[j]`` differences, column ``j``:
    a flip keeps each squared difference and changes the sign of its value and its cube."""
    a = np.abs(np.asarray(differences, dtype=float))
    starts = [0, *sizes[:-1]]
    s1 = np.add.reduceat(signs * a, starts, axis=1).cumsum(axis=1) if len(a) else np.zeros((len(signs), 1))
    s3 = np.add.reduceat(signs * a**3, starts, axis=1).cumsum(axis=1) if len(a) else s1
    s2 = np.cumsum(np.add.reduceat(a * a, starts)) if len(a) else np.zeros(1)
    return hall_statistic(s1, s2[None, :], s3, np.asarray(sizes)[None, :])


def flip_p_value(differences: Sequence[float], *, alternative: str = "greater", n_resamples: int = 10_000,
                 seed: int = 0, exact_max_n: int = EXACT_MAX_N) -> tuple[float, bool]:
    """The sign-flip p-value of :func:`statistic` for ``mean(differences) > 0`` (``"greater"``) or
    two-sided (``"two-sided"``: the flips at least as far from 0): exact over the ``2**n`` flips up to
    ``exact_max_n`` pairs, else ``(1 + hits) / (1 + n_resamples)`` from seeded flips. Returns the
    p-value and whether it is exact."""
    if alternative not in ("greater", "two-sided"):
        raise ValueError(f"alternative must be 'greater' or 'two-sided', got {alternative!r}")
    n = len(differences)
    if n == 0:
        return 1.0, True
    observed = statistic(differences)
    exact = n <= exact_max_n
    if exact:
        stats = flipped(differences, flip_signs(n, draws=0, seed=seed, exact_max_n=exact_max_n), [n])[:, 0]
    else:
        rng = np.random.default_rng(seed)  # in blocks: memory stays small for long held-out sets
        stats = np.concatenate([flipped(differences, rng.choice((-1.0, 1.0), size=(min(_BLOCK, n_resamples - start), n)),
                                        [n])[:, 0] for start in range(0, n_resamples, _BLOCK)])
    tol = 1e-9 * max(1.0, abs(observed))
    # Flipping every sign negates the statistic, so its flip distribution is symmetric: the two-sided
    # p-value counts the flips at least as far from 0 as the observed one (twice the smaller tail).
    if alternative == "two-sided":
        stats, observed = np.abs(stats), abs(observed)
    hits = int(np.sum(stats >= observed - tol))
    p = hits / len(stats) if exact else (1 + hits) / (1 + len(stats))
    return min(1.0, p), exact

__all__ = [
    "EXACT_MAX_N",
    "FAILURE_RATE",
    "NO_SPREAD",
    "STATISTIC",
    "flip_p_value",
    "flip_signs",
    "flipped",
    "hall_statistic",
    "min_pairs",
    "spent",
    "statistic",
]
