"""A sequential paired test: is prompt A better than prompt B, looked at after each batch of questions?

Built for a validation stage that asks its questions in batches and decides after each (a *look*):
stop for success once the evidence is strong enough, stop for futility once success is out of
reach, ask the next batch otherwise.

- **The test is the betting confidence sequence** of :mod:`opro.stats.betting`: judge scores lie on a
  known scale, so the paired differences are bounded, and betting against "the mean is at most 0"
  gives a capital that reaches ``1 / alpha`` with probability at most ``alpha`` *ever*, whatever the
  differences' shape (ties, rare large failures) and however often it is looked at. The looks and
  the extension are free: no alpha is spent, and a look is a function of the differences alone. The
  flips of Hall's skew-corrected statistic it replaces held their error rate in symmetric and skewed
  worlds but not where most pairs tie (a first look of 15 tied pairs had p = 2^-15), and below about
  30 pairs in none (docs/statistics.md measures both side by side).
- **Futility is non-binding**: stopping for it can only lower the error rate. A look before the last
  stops for it once ``A`` is not ahead (mean <= 0), the first look too. A non-inferiority test
  (``futility_confidence``) stops only once ``A`` is *clearly* behind (the one-sided upper confidence
  bound of the mean <= 0), as the cost race prunes.

The reported gain of a claim is adjusted for having been claimed (:func:`conditional_estimate`),
simulated through the same test; :func:`design_power` plans with it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opro.stats.betting import log_capital, width
from opro.stats.clusters import cluster_means

_EPS = 1e-9
#: What a look's ``statistic`` is: the log of the betting capital's running maximum (:mod:`opro.stats.betting`).
STATISTIC_OF = "betting"


def interval_text(lo: float, hi: float) -> str:
    """A gain's interval in words: ``-0.05 to +0.35``, or ``below +0.35`` where it is open below (``lo``
    is ``-inf``: a claimed gain too rare to simulate lower, :func:`conditional_estimate`)."""
    return f"below {hi:+.2f}" if lo == -math.inf else f"{lo:+.2f} to {hi:+.2f}"


def on_scale(ci: tuple[float, float] | None, low: float, high: float) -> tuple[float, float] | None:
    """``ci`` clipped to what the judge's scale allows (a few questions give a t interval past it); an
    end that is open (infinite: see :func:`interval_text`) stays open."""
    if ci is None:
        return None
    lo, hi = ci
    return (lo if math.isinf(lo) else min(max(lo, low), high), hi if math.isinf(hi) else min(max(hi, low), high))


def look_sizes(n_max: int, looks: int) -> tuple[int, ...]:
    """Questions seen at each look: ``looks`` near-even steps ending at ``n_max`` (duplicates dropped)."""
    if n_max < 1 or looks < 1:
        raise ValueError(f"n_max ({n_max}) and looks ({looks}) must be >= 1")
    return tuple(sorted({max(1, math.ceil(n_max * k / looks)) for k in range(1, looks + 1)}))


@dataclass(frozen=True)
class Look:
    """One interim decision: what was seen, the boundary it was held to, and what was decided."""

    look: int
    #: Paired questions (both prompts scored) at this look, and the planned maximum.
    n: int
    n_max: int
    #: The test's statistic (``statistic_of``) and the mean of the paired differences (A - B).
    statistic: float
    mean_difference: float
    #: The statistic at or above which this look rejects (``inf``: it cannot).
    boundary: float
    alpha_spent: float
    #: One-sided p-value in the stagewise ordering (an earlier crossing counts as more extreme): at
    #: most ``alpha`` exactly when some look succeeded. Valid for the whole sequence of looks.
    p_value: float
    #: ``success``: A is better (the null is rejected); ``futility``: stopped, A not ahead;
    #: ``continue``: ask the next batch; ``end``: the last look, not rejected.
    decision: str
    #: What ``statistic`` and ``boundary`` are: ``betting`` (the log of the betting capital's running
    #: maximum and ``log(1 / alpha)``, :mod:`opro.stats.betting`); ``hall`` (the flips of Hall's statistic)
    #: or ``sum`` (the flips of the sum) in looks made by earlier versions, which keep their stored form.
    statistic_of: str = "sum"

    def as_dict(self) -> dict[str, float | int | str | None]:
        out: dict[str, float | int | str | None] = {
            "look": self.look, "n": self.n, "n_max": self.n_max, "statistic": self.statistic,
            "mean_difference": self.mean_difference, "boundary": None if math.isinf(self.boundary) else self.boundary,
            "alpha_spent": self.alpha_spent, "p_value": self.p_value, "decision": self.decision}
        if self.statistic_of != "sum":  # absent from a look of the sum, as it was stored
            out["statistic_of"] = self.statistic_of
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Look:
        """The look :meth:`as_dict` wrote (a null boundary: one it could not cross, ``inf``); the values as
        stored, so that a stored look written again is the same."""
        boundary = data["boundary"]
        return cls(look=data["look"], n=data["n"], n_max=data["n_max"], statistic=data["statistic"],
                   mean_difference=data["mean_difference"], boundary=math.inf if boundary is None else boundary,
                   alpha_spent=data["alpha_spent"], p_value=data["p_value"], decision=data["decision"],
                   statistic_of=data.get("statistic_of", "sum"))


def futile(x: np.ndarray, *, confidence: float | None) -> np.ndarray:
    """Per row of paired differences ``x`` (rows x questions, or one row): whether a look stops for
    futility. ``confidence`` None: the mean is not ahead (<= 0); a level: the one-sided Student t
    upper bound of the mean at that level is <= 0 (clearly behind)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    mean = x.mean(1)
    if confidence is None or x.shape[1] < 2:
        return mean <= 0
    from scipy.stats import t as student

    n = x.shape[1]
    return mean + float(student.ppf(confidence, n - 1)) * x.std(1, ddof=1) / math.sqrt(n) <= 0


def decide(
    differences: Sequence[float], *, seen: Sequence[int], n_max: int, last: bool, earlier: Sequence[Look],
    alpha: float, scale: tuple[float, float], shift: float = 0.0, futility: bool = True,
    futility_confidence: float | None = None, seed: int = 0, clusters: Sequence[str] | None = None,
    planned_clusters: int | None = None,
) -> Look:
    """The look after ``seen[-1]`` paired differences, in the order asked, each shifted by ``+shift``
    (the margin under a non-inferiority claim; ``seen``: the count at every look so far, this one
    included; ``n_max``: the planned count, to which the bets are tuned; ``last``: no look follows),
    given the previous looks. The claim "mean > 0" of the shifted differences is decided by the betting
    confidence sequence of :mod:`opro.stats.betting` on the judge's ``scale``: valid at every look
    whatever the differences' shape, so no alpha is spent and ``earlier`` only has to be of the same
    test. ``futility_confidence``: see :func:`futile` (None: stop once not ahead). ``seed`` is kept in
    the signature of a look (the test draws nothing). ``clusters``: a key per difference, complete clusters
    only (:mod:`opro.stats.clusters`); the test and the futility rule then run on the cluster means (in the
    order the clusters complete) with bets tuned to ``planned_clusters``, and ``mean_difference`` is their
    mean; every cluster a single question is the per-question test exactly."""
    del seed  # the betting test is deterministic: a look is a function of the differences alone
    look = len(seen)
    n = seen[-1] if seen else 0
    if look < 1 or len(earlier) != look - 1 or len(differences) != n or n > n_max:
        raise ValueError(f"look {look}: {n} differences of at most {n_max}, one boundary per earlier look")
    if any(x.statistic_of != STATISTIC_OF for x in earlier):
        raise ValueError("an earlier look was made by another test: a decision is never resumed under another test")
    d = np.asarray(differences, dtype=float)
    planned = n_max
    if clusters is not None:
        d, planned = cluster_means(d.tolist(), clusters), planned_clusters or n_max
    target = math.log(1 / alpha)
    if n == 0:
        return Look(look=look, n=0, n_max=n_max, statistic=0.0, mean_difference=0.0, boundary=target,
                    alpha_spent=alpha, p_value=1.0, decision="end" if last else "continue", statistic_of=STATISTIC_OF)
    s = float(log_capital(d - shift, scale=scale, alpha=alpha, above=-shift, planned=planned)[0])
    if s >= target:
        decision = "success"
    elif last:
        decision = "end"
    elif futility and bool(futile(d, confidence=futility_confidence)[0]):
        decision = "futility"
    else:
        decision = "continue"
    return Look(look=look, n=n, n_max=n_max, statistic=s, mean_difference=float(d.mean()), boundary=target,
                alpha_spent=alpha, p_value=min(1.0, math.exp(-s)), decision=decision, statistic_of=STATISTIC_OF)


def t_interval(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float] | None:
    """Student's t interval for a mean (near its stated coverage at 5-30 values, where the percentile
    bootstrap covers 82-89% of a 95% interval); ``None`` below 2 values."""
    from scipy.stats import t as student

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return None
    m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
    h = float(student.ppf(0.5 + level / 2, len(x) - 1)) * se
    return (m - h, m + h)


@dataclass(frozen=True)
class Estimate:
    """A gain estimated given that the test claimed it (see :func:`conditional_estimate`)."""

    #: Conditionally median-unbiased: as likely to be above the true gain as below it among the
    #: claims the design makes (``raw`` is above it in most of them).
    gain: float
    #: ``level`` conditional confidence interval: covers the true gain in about ``level`` of the
    #: claims the test makes, not merely of all runs. Its lower end is ``-inf`` (open below) where
    #: the gains that could have produced this claim reach below those at which claims are frequent
    #: enough to simulate.
    ci: tuple[float, float]
    #: The plain mean of the differences, biased upward among claims.
    raw: float


def _betting_stopped(d: np.ndarray, sizes: Sequence[int], *, alpha: float, scale: tuple[float, float],
                     futility: bool, futility_confidence: float | None = None,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`decide`'s test run on each row of paired differences (clipped to the scale's width): (claimed,
    mean at the stopping look, questions asked by then)."""
    w = width(scale)
    d = np.clip(d, -w, w)
    rows, n_max, target = len(d), int(sizes[-1]), math.log(1 / alpha)
    claimed = np.zeros(rows, dtype=bool)
    done = np.zeros(rows, dtype=bool)
    mean = np.zeros(rows)
    asked = np.zeros(rows)
    for k, n in enumerate(sizes):
        x = d[:, :n]
        hit = ~done & (log_capital(x, scale=scale, alpha=alpha, planned=n_max) >= target)
        claimed |= hit
        stop = hit | (~done & (k == len(sizes) - 1))
        if futility and k < len(sizes) - 1:
            stop |= ~done & futile(x, confidence=futility_confidence)
        mean[stop & ~done] = x[stop & ~done].mean(1)
        asked[stop & ~done] = n
        done |= stop
    return claimed, mean, asked


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float) -> tuple[float, float]:
    """The bracket left after 30 halvings around where the increasing ``f`` crosses ``target``
    (clamped to ``[lo, hi]``)."""
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return lo, hi


def _resampled_residuals(d: np.ndarray, *, draws: int, n_max: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``draws`` resamples of ``n_max`` of the residuals of ``d`` (about its mean): as observed, and
    widened to the spread's one-sided 95% upper confidence bound."""
    # A claim is made more often when the sample's spread happened to look small (the test is
    # studentized), so the observed residuals understate the spread among claims: they are scaled
    # to the spread's one-sided 95% upper confidence bound. Without it the interval covered 0.92 at
    # a true gain of -0.2, where claims are rare (``experiments/bench_selection.py --coverage``).
    from scipy.stats import chi2

    # The point estimate keeps the observed spread: widened, it was adjusted past the truth (above it
    # in 31% of claims at +0.5 instead of half).
    widen = math.sqrt((len(d) - 1) / float(chi2.ppf(0.05, len(d) - 1)))
    raw = float(d.mean())
    draw = np.random.default_rng(seed).choice(len(d), size=(draws, n_max))
    return (d - raw)[draw], (d - raw)[draw] * widen


def conditional_estimate(
    differences: Sequence[float], *, sizes: Sequence[int], alpha: float, scale: tuple[float, float],
    futility: bool = True, futility_confidence: float | None = None, level: float = 0.95, draws: int = 4000,
    seed: int = 0,
) -> Estimate:
    """The gain of a claim made by :func:`decide` after ``differences`` (the pairs seen at the look
    that succeeded; ``sizes``: the design's planned look sizes), adjusted for having been claimed.

    Among the runs that claim a gain, the plain mean is inflated: a claim is made when the sample
    happened to look good (at +0.5 and 32 questions, by about +0.16). The adjusted estimate is the
    gain ``theta`` under which the observed mean is the median of the means *among the claims the
    design would make*, and the interval inverts the same conditional distribution at its tails
    (conditional inference after selection: Weinstein, Fithian & Benjamini 2013; the median rather
    than the mean-matching estimate of Whitehead 1986 because it has the smaller spread and stays in
    the interval). Near the boundary it can be at or below 0 although the test claimed a gain: the
    claim and the size of the gain are separate questions, and at the boundary the size is uncertain.

    The distribution is simulated: ``draws`` resamples of the observed differences' residuals
    (widened to their spread's upper confidence bound), shifted to ``theta`` (clipped to the ``scale``'s
    width) and run through the design's own test (the betting confidence sequence, every look). Common random numbers make every function of ``theta`` monotone enough
    to bisect. Below the gain at which fewer than ``max(50, draws / 100)`` of the runs claim, where
    a claim's mean cannot be simulated, nothing is assumed: if the observed mean is still within the
    interval's tail there, the interval is **open below** (lower end ``-inf``), and an end or gain
    that would lie below it is put at it, which only widens the interval (``experiments/
    bench_selection.py --coverage``: 0.93 or more at true gains from -0.2 to +1.0)."""
    d = np.asarray(differences, dtype=float)
    if len(d) < 2:
        raise ValueError("at least 2 paired differences")
    n_max = int(sizes[-1])
    raw = float(d.mean())
    if float(d.std()) == 0.0:  # every question moved by the same amount: nothing was selected on noise
        return Estimate(gain=raw, ci=(raw, raw), raw=raw)
    se = max(float(d.std(ddof=1)), 0.25) / math.sqrt(len(d))
    plain, widened = _resampled_residuals(d, draws=draws, n_max=n_max, seed=seed)
    floor = max(50, draws // 100)  # claims needed before a conditional tail is trusted

    def claims(theta: float, residuals: np.ndarray = widened) -> np.ndarray:
        claimed, mean, _ = _betting_stopped(residuals + theta, sizes, alpha=alpha, scale=scale, futility=futility,
                                            futility_confidence=futility_confidence)
        return mean[claimed]

    span = 8 * se
    # Below some gain the design claims too rarely for ``draws`` runs to say where a claim's mean
    # falls: the conditional distribution is simulated from there up only. The count of claims
    # grows with theta (common random numbers), so the lowest gain with enough of them is bisected.
    lowest, top = raw - span, raw + span
    def enough(theta: float) -> bool:
        return min(len(claims(theta, plain)), len(claims(theta, widened))) >= floor

    if not enough(lowest):
        if not enough(top):  # not even at the top: nothing can be said below it
            return Estimate(gain=raw, ci=(-math.inf, top), raw=raw)
        lowest = _bisect(lambda theta: float(enough(theta)), 0.5, lowest, top)[1]

    def p_above(theta: float, residuals: np.ndarray = widened) -> float:
        """P(mean at stop >= observed | claimed): increasing in theta."""
        return float(np.mean(claims(theta, residuals) >= raw - _EPS))

    def solve(target: float, hi: float, residuals: np.ndarray = widened) -> float:
        """Where ``p_above`` crosses ``target``; ``lowest`` when it is above it already there (the
        crossing is lower still: a bound that only widens what it bounds)."""
        if p_above(lowest, residuals) >= target:
            return lowest
        return sum(_bisect(lambda theta: p_above(theta, residuals), target, lowest, hi)) / 2

    tail = (1 - level) / 2
    # Open below where even the lowest simulable gain leaves the observed mean unsurprising among its
    # claims: every gain below it is as compatible, and clamping there was an artefact of the floor.
    # The interval joins those of the observed and the widened spread: widening alone moved some
    # upper ends down (at +0.5 it covered 0.80 of 148 claims, tests/stats/test_sequential.py).
    low = min(-math.inf if p_above(lowest, r) >= tail else solve(tail, top, r) for r in (plain, widened))
    high = max(solve(1 - tail, top, r) for r in (plain, widened))
    # A claim's selection only inflates: the adjusted gain is never above raw, nor outside the interval.
    gain = min(raw, max(low, min(high, solve(0.5, raw, plain))))
    return Estimate(gain=gain, ci=(low, high), raw=raw)


@dataclass(frozen=True)
class Power:
    """What a design can detect, for paired differences with standard deviation ``sd``."""

    #: The smallest true gain claimed with probability ``power`` (None: no gain can be claimed).
    detectable: float | None
    power: float
    #: Expected paired questions asked when there is no gain (futility stops most runs early) and
    #: when the gain is ``detectable``.
    questions_null: float
    questions_detectable: float


def design_power(
    sizes: Sequence[int], *, alpha: float, sd: float, scale: tuple[float, float], futility: bool = True,
    futility_confidence: float | None = None, power: float = 0.8, draws: int = 4000, seed: int = 0,
) -> Power:
    """The minimum detectable gain of the sequential design with looks at ``sizes``, by simulating normal
    paired differences with standard deviation ``sd`` (clipped to the judge ``scale``'s width) through
    :func:`decide`'s test (the betting confidence sequence), and the questions it asks on average."""
    n_max = int(sizes[-1])
    w = width(scale)
    noise = np.random.default_rng(seed).normal(0.0, sd, size=(draws, n_max))
    def run(theta: float) -> tuple[float, float]:
        claimed, _, asked = _betting_stopped(noise + theta, sizes, alpha=alpha, scale=scale, futility=futility,
                                             futility_confidence=futility_confidence)
        return float(claimed.mean()), float(asked.mean())

    _, asked_null = run(0.0)
    top = min(4.0 * sd, w)
    if run(top)[0] < power:
        return Power(detectable=None, power=power, questions_null=asked_null, questions_detectable=math.nan)
    _, hi = _bisect(lambda theta: run(theta)[0], power, 0.0, top)
    return Power(detectable=hi, power=power, questions_null=asked_null, questions_detectable=run(hi)[1])


def claim_rate(
    sizes: Sequence[int], *, gain: float, alpha: float, sd: float, scale: tuple[float, float], futility: bool = True,
    futility_confidence: float | None = None, draws: int = 4000, seed: int = 0,
) -> float:
    """The share of runs in which the design with looks at ``sizes`` claims a true ``gain`` (normal paired
    differences with standard deviation ``sd``, through :func:`decide`'s test): its power there. The
    noise is drawn question by question, so two designs of the same ``seed`` share their first questions
    (common random numbers: the rate of a design with more questions is not lower by chance)."""
    noise = np.random.default_rng(seed).normal(0.0, sd, size=(int(sizes[-1]), draws)).T
    claimed, _, _ = _betting_stopped(noise + gain, sizes, alpha=alpha, scale=scale, futility=futility,
                                     futility_confidence=futility_confidence)
    return float(claimed.mean())


__all__ = [
    "STATISTIC_OF",
    "Estimate",
    "Look",
    "Power",
    "claim_rate",
    "conditional_estimate",
    "decide",
    "design_power",
    "futile",
    "interval_text",
    "look_sizes",
    "t_interval",
]
