"""The statistic opro's paired tests flip: the studentized mean corrected for skewness (Hall 1992).

Every claim opro makes is about the **mean** score, tested by flipping the signs of the paired
differences (:mod:`opro.stats.sequential`, :mod:`opro.stats.noninferiority`,
:func:`opro.stats.paired.permutation_test`). Flipping is exact for *any* statistic when the
differences are symmetric about 0 under the null. Until issue 61 the flipped statistic was the sum
(a studentized sum is the same test: given the squares, which flips do not change, the studentized
mean is a monotone function of the sum), and where one prompt loses a lot on a few questions and
gains a little on the rest (a cost cut that fails on 1 question in 10) it claimed too often: the
samples that happen to hold few failures have a high mean *and* a small spread, and look like a
gain. Non-inferiority at exactly the margin was claimed in 0.10 of the validation stage's runs at
alpha 0.05 (``experiments/bench_selection.py --errors``).

Hall's transformation of the studentized mean ``th = mean / sd`` with the sample's skewness ``g``::

    T = sqrt(n) * (th + g th**2 / 3 + g**2 th**3 / 27 + g / (6 n))

(monotone in ``th``: its derivative is ``(1 + g th / 3)**2``) removes the first-order effect of
skewness on the studentized mean: a sample that shows its rare large losses is held to more than its
mean and spread say. Flipping ``T`` instead of the sum keeps the test exact for symmetric
differences (the flips do not care which statistic they flip) and, measured, holds the error rate
where the differences are skewed (``--errors``; the bootstrap of ``T``, the bootstrap-t and Johnson's
modified t were measured beside it, docs/statistics.md). Flipped samples have the same squares, and
their sums and sums of cubes are those of the flipped absolute values, so every flip's ``T`` is two
matrix products.

Below about 30 pairs no test of the mean can hold its error rate whatever the shape: a sample of
``n`` misses a failure on 1 question in 10 with probability ``0.9**n`` (35% at 10), and a sample
without its failures looks like a gain. :func:`min_pairs` is the smallest ``n`` at which that chance
is below ``alpha``.
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
    "statistic",
]
