"""Statistics for comparing prompts on the same questions.

Judge scores are small discrete numbers (1-5) on a few dozen questions at best, so everything here
is made for small paired samples: Student t intervals of means, clipped to what the judge's scale
allows (a percentile bootstrap covered 84% of a 95% interval at 6 questions, 89% at 10:
``experiments/bench_compare_tests.py --coverage``); for a paired difference, the interval and the
two-sided test of the betting confidence sequence (:mod:`opro.stats.betting`), which hold whatever the
differences' shape on the judge's scale (ties, a prompt that fails rarely near the ceiling); and the
Wilcoxon signed-rank test (exact up to 50 non-zero differences), shown beside it. Results are frozen
dataclasses.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opro.errors import DataError
from opro.stats import betting
from opro.stats.clusters import cluster_means, singletons

# Rows of bootstrap resamples drawn at once: bounds memory at ~8 MB for 1000 questions.
_BLOCK = 1000


@dataclass(frozen=True)
class ConfidenceInterval:
    """``estimate`` with a ``level`` interval ``[low, high]`` over ``n`` values, made by ``method``."""

    estimate: float
    low: float
    high: float
    level: float
    n: int
    #: The bootstrap's resamples and seed (0 for a t interval, which draws nothing).
    n_resamples: int = 0
    seed: int = 0
    method: Literal["t", "percentile bootstrap", "betting"] = "t"
    #: Why the interval is as wide as it is where the data cannot say more (too few values, or
    #: clipped to the scale); empty otherwise.
    note: str = ""

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class TestResult:
    """A two-sided paired test. ``exact`` tells whether the p-value is exact or approximate."""

    __test__ = False  # not a pytest test class despite the name

    name: str
    statistic: float
    p_value: float
    n: int
    exact: bool
    note: str = ""


@dataclass(frozen=True)
class WinTieLoss:
    """Per question: ``a`` better than ``b`` (win), equal within ``tolerance`` (tie), worse (loss)."""

    wins: int
    ties: int
    losses: int

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses

    def __str__(self) -> str:
        return f"{self.wins}/{self.ties}/{self.losses}"


@dataclass(frozen=True)
class PairedComparison:
    """``a`` against ``b`` on the same questions: difference ``a - b`` with interval and tests."""

    n: int
    mean_a: float
    mean_b: float
    difference: ConfidenceInterval
    win_tie_loss: WinTieLoss
    wilcoxon: TestResult
    #: The two-sided betting test of ``mean(a - b) = 0`` (:func:`betting_test`): it decides.
    test: TestResult
    alpha: float
    #: The fewest pairs on which any sample can be significant (:func:`opro.stats.betting.min_pairs`, from
    #: alpha and the scale); None: none within 10,000.
    min_pairs: int | None = None
    #: Comparisons in the family (several prompts against one baseline); the p-values below are
    #: Holm-adjusted over it. 1: no adjustment.
    n_comparisons: int = 1
    wilcoxon_adjusted: float | None = None
    test_adjusted: float | None = None

    @property
    def p_wilcoxon(self) -> float:
        return self.wilcoxon.p_value if self.wilcoxon_adjusted is None else self.wilcoxon_adjusted

    @property
    def p_test(self) -> float:
        return self.test.p_value if self.test_adjusted is None else self.test_adjusted

    @property
    def significant(self) -> bool:
        """The two-sided betting test at ``alpha`` (Holm-adjusted in a family): valid whatever the
        differences' shape, so the Wilcoxon p-value is shown beside it and decides nothing."""
        return self.p_test <= self.alpha

    def verdict(self) -> str:
        """A plain sentence for a report."""
        d = self.difference
        p = f"betting test p={self.p_test:.3g}, Wilcoxon p={self.p_wilcoxon:.3g}"
        if self.n_comparisons > 1:
            p += f", Holm-adjusted over {self.n_comparisons} comparisons"
        if self.n == 0:
            return "no question was scored for both prompts: nothing to compare"
        why = f", {d.note}" if d.note else ""
        if self.significant:
            direction = "better" if d.estimate > 0 else "worse"
            return (
                f"{direction} by {abs(d.estimate):.2f} points on average "
                f"({d.level:.0%} CI {d.low:+.2f} to {d.high:+.2f}{why}; {p}): significant at {self.alpha:g}"
            )
        few = self.min_pairs is None or self.n < self.min_pairs
        return (
            f"difference {d.estimate:+.2f} ({d.level:.0%} CI {d.low:+.2f} to {d.high:+.2f}{why}; {p}): "
            f"not significant at {self.alpha:g}"
            + (f"; no {self.n} paired questions can be: the test needs at least {self.min_pairs}" if few else
               f"; too few paired questions ({self.n}) to detect small differences" if self.n < 20 else "")
        )


def _values(values: Sequence[float], what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise DataError(f"{what}: expected a flat sequence of numbers, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise DataError(f"{what}: values must be finite numbers (drop invalid scores first)")
    return arr


def _pairs(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    x, y = _values(a, "first sample"), _values(b, "second sample")
    if x.shape != y.shape:
        raise DataError(f"paired samples differ in length ({len(x)} vs {len(y)}); pair them by question first")
    return x - y  # type: ignore[no-any-return]


def _check_level(level: float, n_resamples: int) -> None:
    if not 0.0 < level < 1.0:
        raise DataError(f"confidence level must be between 0 and 1 (e.g. 0.95), got {level}")
    if n_resamples < 100:
        raise DataError(f"n_resamples={n_resamples} is too few for a percentile interval; use >= 1000")


def bootstrap_mean_ci(
    values: Sequence[float], *, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> ConfidenceInterval:
    """Percentile bootstrap interval of the mean (resampling with replacement, seeded). It undercovers
    at the sizes opro compares (84% of a 95% interval at 6 values): :func:`t_mean_ci` is what reports use."""
    _check_level(level, n_resamples)
    x = _values(values, "bootstrap sample")
    n = len(x)
    if n == 0:
        raise DataError("cannot bootstrap the mean of an empty sample")
    estimate = float(x.mean())
    if n == 1 or np.all(x == x[0]):
        return ConfidenceInterval(estimate, estimate, estimate, level, n, n_resamples, seed, "percentile bootstrap")
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, _BLOCK):
        rows = min(_BLOCK, n_resamples - start)
        means[start : start + rows] = x[rng.integers(0, n, size=(rows, n))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return ConfidenceInterval(estimate, float(low), float(high), level, n, n_resamples, seed, "percentile bootstrap")


def paired_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], *, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> ConfidenceInterval:
    """Percentile bootstrap interval of ``mean(a - b)``, resampling questions (pairs stay together)."""
    return bootstrap_mean_ci(list(_pairs(a, b)), level=level, n_resamples=n_resamples, seed=seed)


def wilson_ci(values: Sequence[float], *, bounds: tuple[float, float], level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of the mean of values that lie within ``bounds``: rescaled to [0, 1] a
    value's variance is at most ``mu (1 - mu)`` when its mean is ``mu`` (the most a two-point law at the
    ends can have), so the score interval with that variance holds whatever the values' law. Wide: it
    is what is left where the sample cannot show its own spread (:func:`t_mean_ci`)."""
    from statistics import NormalDist

    lo, hi = bounds
    x = (_values(values, "sample") - lo) / (hi - lo)
    n = len(x)
    m = min(1.0, max(0.0, float(x.mean())))
    z = NormalDist().inv_cdf(0.5 + level / 2)
    center = (m + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(m * (1 - m) / n + z * z / (4 * n * n))
    return lo + (hi - lo) * max(0.0, center - half), lo + (hi - lo) * min(1.0, center + half)


def t_mean_ci(
    values: Sequence[float], *, level: float = 0.95, bounds: tuple[float, float] | None = None,
    resolution: float = 0.0,
) -> ConfidenceInterval:
    """Student's t interval of the mean, within ``bounds`` (the range the values can take, e.g. the
    judge's 1-5 scale): a mean never lies outside it, so neither does a bound worth printing.

    ``resolution`` is the scores' step (1 for integer judge scores): the spread is never taken below
    what it would be had one more value lain one step from the mean, ``(sum of squares +
    resolution**2) / n``, so a few integer scores that happen to agree do not collapse the interval
    (at 6 judge-like questions the plain t interval covered 0.91 of a 95% interval; with this, 0.93
    or more: ``experiments/bench_compare_tests.py --coverage``). It only ever widens the interval.

    Where the t interval reaches an end of ``bounds``, the values sit at that end and the sample
    cannot show how far the rare others lie (mostly 5s with a 1 on one question in 10: a sample of 10
    holds no 1 in 35% of draws, and the t interval covered 0.65): its other end is then taken from
    :func:`wilson_ci` where that lies farther, which holds whatever the values' law (0.98 or more in
    that world, ``--coverage``). ``note`` says so, or that the interval was clipped. Below 2 values
    there is no interval: it is the whole of ``bounds`` (infinite without them), and ``note`` says so."""
    from scipy.stats import t as student

    if not 0.0 < level < 1.0:
        raise DataError(f"confidence level must be between 0 and 1 (e.g. 0.95), got {level}")
    x = _values(values, "sample")
    n = len(x)
    if n == 0:
        raise DataError("cannot make an interval of the mean of an empty sample")
    lo, hi = bounds if bounds is not None else (-math.inf, math.inf)
    if not lo < hi:
        raise DataError(f"bounds must be (low, high) with low < high, got {bounds}")
    estimate = float(x.mean())
    if n < 2:
        return ConfidenceInterval(estimate, lo, hi, level, n, note="1 question: too few for an interval")
    squares = float(np.sum((x - estimate) ** 2))
    sd = math.sqrt(max(squares / (n - 1), (squares + resolution**2) / n))
    h = float(student.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    low, high = estimate - h, estimate + h
    if low > lo and high < hi:
        return ConfidenceInterval(estimate, low, high, level, n)
    if bounds is not None and math.isfinite(lo) and math.isfinite(hi):
        w_low, w_high = wilson_ci(x.tolist(), bounds=(lo, hi), level=level)
        wide_low, wide_high = (min(low, w_low) if high >= hi else low), (max(high, w_high) if low <= lo else high)
        if (wide_low, wide_high) != (low, high):
            return ConfidenceInterval(
                estimate, max(wide_low, lo), min(wide_high, hi), level, n,
                note=(f"{n} questions at the end of [{lo:g}, {hi:g}]: the other end is the Wilson bound, "
                      "as a rare score far from these may not have been drawn"))
    return ConfidenceInterval(estimate, max(low, lo), min(high, hi), level, n,
                              note=f"{n} questions: the interval reached past [{lo:g}, {hi:g}] and is clipped to it")


def questions_for_half_width(sd: float, half_width: float, *, level: float = 0.95, most: int = 100_000) -> int | None:
    """The fewest questions whose Student t interval of a mean (``level``) is at most ``half_width``
    either side when the values' sd is ``sd``: how many a pilot needs before a difference near 0 can
    be told from one of ``half_width``. None where ``sd`` or ``half_width`` is not positive or more
    than ``most`` would be needed."""
    from scipy.stats import t as student

    if not (sd > 0 and half_width > 0):
        return None
    q = 0.5 + level / 2

    def wide(n: int) -> bool:
        return float(student.ppf(q, n - 1)) * sd / math.sqrt(n) > half_width

    if wide(most):
        return None
    low, high = 2, most  # wide() falls as n grows: the first n that is not wide, by bisection
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if wide(mid) else (low, mid)
    return low


def paired_t_ci(
    a: Sequence[float], b: Sequence[float], *, level: float = 0.95, scale: tuple[float, float] | None = None,
    resolution: float = 0.0,
) -> ConfidenceInterval:
    """:func:`t_mean_ci` of ``a - b`` over the pairs; with the scores' ``scale`` (min, max), clipped
    to the differences it allows, ``[-(max - min), max - min]``."""
    bounds = None if scale is None else (-(scale[1] - scale[0]), scale[1] - scale[0])
    return t_mean_ci(list(_pairs(a, b)), level=level, bounds=bounds, resolution=resolution)


def _exact_signed_rank_p(nonzero: np.ndarray) -> tuple[float, float]:
    """Exact two-sided p-value of the signed-rank statistic, ties included (mid-ranks).

    Under the null every difference is as likely positive as negative, so ``W+`` is a sum of
    ranks with random signs. Mid-ranks are multiples of 0.5: doubled they are integers, and the
    null distribution of ``2 W+`` is a subset-sum count over the ``2**n`` sign assignments (dynamic
    programming, ``n * sum(ranks)`` steps). p = P(|W+ - E| >= |w+ - E|) with E = sum(ranks) / 2.
    """
    from scipy.stats import rankdata

    ranks2 = np.rint(2 * rankdata(np.abs(nonzero))).astype(int)
    counts = [0] * (int(ranks2.sum()) + 1)
    counts[0] = 1
    top = 0
    for r in ranks2:
        r = int(r)
        for total in range(top, -1, -1):
            if counts[total]:
                counts[total + r] += counts[total]
        top += r
    w2 = int(ranks2[nonzero > 0].sum())
    center2 = top  # 2 * E[2 W+] = sum of doubled ranks
    observed = abs(2 * w2 - center2)
    extreme = sum(c for total, c in enumerate(counts) if c and abs(2 * total - center2) >= observed)
    # Reported like scipy's two-sided statistic: the smaller of W+ and W-.
    return min(w2, top - w2) / 2.0, min(1.0, extreme / 2 ** len(ranks2))


def wilcoxon_signed_rank(a: Sequence[float], b: Sequence[float], *, exact_max_n: int = 50) -> TestResult:
    """Two-sided Wilcoxon signed-rank test of ``a - b`` (zero differences dropped, as scipy's 'wilcox').

    All differences zero (or no pairs) gives p = 1.0: there is no evidence of any difference.
    Up to ``exact_max_n`` non-zero differences the p-value is exact, ties included (judge scores
    tie all the time, and scipy's normal approximation is then anti-conservative: five +1
    differences give 0.025 where the exact value is 0.0625); above it, scipy's normal
    approximation with tie correction. ``exact`` says which.
    """
    d = _pairs(a, b)
    nonzero = d[d != 0]
    if len(nonzero) == 0:
        return TestResult("wilcoxon", 0.0, 1.0, len(d), True, "all differences are zero")
    note = f"{len(d) - len(nonzero)} zero differences dropped" if len(nonzero) < len(d) else ""
    if len(nonzero) <= exact_max_n:
        statistic, p = _exact_signed_rank_p(nonzero)
        return TestResult("wilcoxon", statistic, p, len(d), True, "; ".join(x for x in (note, "exact, ties by mid-ranks") if x))
    from scipy.stats import wilcoxon

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        res = wilcoxon(nonzero, zero_method="wilcox", alternative="two-sided", method="approx")
    p = float(res.pvalue)
    if math.isnan(p):
        p = 1.0
    return TestResult("wilcoxon", float(res.statistic), min(1.0, p), len(d), False,
                      "; ".join(x for x in (note, "normal approximation") if x))


def _units(d: np.ndarray, clusters: Sequence[str] | None) -> np.ndarray:
    """The differences a test counts: the cluster means where questions share a source passage
    (:mod:`opro.stats.clusters`: the mean over clusters is the estimand), else the differences."""
    if clusters is None or singletons(clusters):
        return d
    return cluster_means(d.tolist(), clusters)


def _cluster_note(d: np.ndarray, clusters: Sequence[str] | None) -> str:
    k = len(_units(d, clusters))
    return "" if k == len(d) else f"mean over {k} clusters of questions sharing a source passage"


def betting_test(a: Sequence[float], b: Sequence[float], *, scale: tuple[float, float],
                 alpha: float = 0.05, clusters: Sequence[str] | None = None) -> TestResult:
    """Two-sided test of ``mean(a - b) = 0`` for scores on the judge's ``scale``: the betting confidence
    sequence (:func:`opro.stats.betting.bound`, bets tuned to the number of pairs), significant at
    ``alpha`` exactly when its ``1 - alpha`` interval excludes 0. Valid on any number of pairs whatever
    the differences' shape; on few pairs it cannot be significant at all. ``statistic`` is the absolute
    mean difference. ``clusters`` (a key per pair): the test runs on the cluster means."""
    d = _pairs(a, b)
    if not len(d):
        return TestResult("betting", 0.0, 1.0, 0, True, "no pairs")
    u = _units(d, clusters)
    c = betting.bound(u.tolist(), scale=scale, alpha=alpha, planned=len(u))
    return TestResult("betting", abs(c.mean), c.p, len(d), True,
                      "; ".join(x for x in (betting.METHOD, _cluster_note(d, clusters)) if x))


def paired_betting_ci(a: Sequence[float], b: Sequence[float], *, scale: tuple[float, float],
                      level: float = 0.95, clusters: Sequence[str] | None = None) -> ConfidenceInterval:
    """The betting confidence sequence's ``level`` interval of ``mean(a - b)`` on the judge's ``scale``
    (:func:`opro.stats.betting.bound`): it covers the mean whatever the differences' shape, near the
    ceiling too (a prompt that fails rarely: the t interval, and its Wilson fallback for means only,
    covered 0.70 there at 20 pairs)."""
    if not 0.0 < level < 1.0:
        raise DataError(f"confidence level must be between 0 and 1 (e.g. 0.95), got {level}")
    d = _pairs(a, b)
    u = _units(d, clusters)
    c = betting.bound(u.tolist(), scale=scale, alpha=1 - level, planned=max(len(u), 1))
    note = _cluster_note(d, clusters) if len(d) >= 2 else f"{len(d)} question(s): the interval is the scale's whole width"
    return ConfidenceInterval(c.mean, c.low, c.high, level, len(d), method="betting", note=note)


def holm_family(comparisons: Sequence[PairedComparison]) -> list[PairedComparison]:
    """The comparisons with both tests' p-values Holm-adjusted over the family (one baseline, k prompts)."""
    from dataclasses import replace

    k = len(comparisons)
    w = holm([c.wilcoxon.p_value for c in comparisons])
    p = holm([c.test.p_value for c in comparisons])
    return [
        replace(c, n_comparisons=k, wilcoxon_adjusted=wa, test_adjusted=pa)
        for c, wa, pa in zip(comparisons, w, p, strict=True)
    ]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control over several comparisons)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def win_tie_loss(a: Sequence[float], b: Sequence[float], *, tolerance: float = 0.0) -> WinTieLoss:
    """Count questions where ``a`` beats, ties or loses to ``b`` (ties: ``|a - b| <= tolerance``)."""
    d = _pairs(a, b)
    return WinTieLoss(
        wins=int(np.sum(d > tolerance)), ties=int(np.sum(np.abs(d) <= tolerance)), losses=int(np.sum(d < -tolerance))
    )


def compare_paired(
    a: Sequence[float],
    b: Sequence[float],
    *,
    scale: tuple[float, float],
    level: float = 0.95,
    alpha: float = 0.05,
    clusters: Sequence[str] | None = None,
) -> PairedComparison:
    """Everything a report says about ``a`` against ``b`` on the same questions, scores on the judge's
    ``scale`` (min, max): the betting interval of the difference and the betting test that decides
    (:func:`paired_betting_ci`, :func:`betting_test`), the Wilcoxon test beside it. ``clusters``: a key
    per pair (:mod:`opro.stats.clusters`); the betting test and interval are then of the cluster means."""
    if not 0.0 < alpha < 1.0:
        raise DataError(f"alpha must be between 0 and 1 (e.g. 0.05), got {alpha}")
    d = _pairs(a, b)
    n = len(d)
    least = betting.min_pairs(alpha=alpha / 2, scale=scale, planned=max(len(_units(d, clusters)), 1))
    if n == 0:
        nan_ci = ConfidenceInterval(math.nan, math.nan, math.nan, level, 0, note="no pairs")
        none = TestResult("wilcoxon", 0.0, 1.0, 0, True, "no pairs")
        return PairedComparison(
            0, math.nan, math.nan, nan_ci, WinTieLoss(0, 0, 0), none,
            TestResult("betting", 0.0, 1.0, 0, True, "no pairs"), alpha, least,
        )
    return PairedComparison(
        n=n,
        mean_a=float(np.mean(a)),
        mean_b=float(np.mean(b)),
        difference=paired_betting_ci(a, b, scale=scale, level=level, clusters=clusters),
        win_tie_loss=win_tie_loss(a, b),
        wilcoxon=wilcoxon_signed_rank(a, b),
        test=betting_test(a, b, scale=scale, alpha=alpha, clusters=clusters),
        alpha=alpha,
        min_pairs=least,
    )


def paired_valid(a: Sequence[float | None], b: Sequence[float | None]) -> tuple[list[float], list[float]]:
    """The scores of ``a`` and ``b`` on the questions (positions) both scored validly."""
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if x is not None and y is not None]
    return [x for x, _ in pairs], [y for _, y in pairs]


__all__ = [
    "ConfidenceInterval",
    "PairedComparison",
    "TestResult",
    "WinTieLoss",
    "betting_test",
    "bootstrap_mean_ci",
    "compare_paired",
    "holm",
    "holm_family",
    "paired_betting_ci",
    "paired_bootstrap_ci",
    "paired_t_ci",
    "paired_valid",
    "questions_for_half_width",
    "t_mean_ci",
    "wilcoxon_signed_rank",
    "wilson_ci",
    "win_tie_loss",
]
