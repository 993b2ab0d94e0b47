"""Bounds on the mean of paired score differences that hold whatever their shape, at every look.

Judge scores live on a known scale (1-5), so a paired difference lies in ``[-w, w]`` with ``w`` the
scale's width (4). For such a bounded variable a test can hold its error rate for *every*
distribution (ties, rare large failures, anything), which no test built on the sample's spread can:
a sample of 15 tied pairs has no spread, and one that happens to miss a rare failure looks like a
gain. This module is the betting confidence sequence of Waudby-Smith & Ramdas (JRSS-B 2024,
"Estimating means of bounded random variables by betting"), one-sided:

Map each difference to ``y = (d + w) / 2w`` in [0, 1]. To test "the mean is at most ``m``", a
gambler starts with capital 1 and, before seeing pair ``t``, stakes a fraction ``lambda_t(m)`` on it
being above ``m``: ``K_t(m) = prod_i (1 + lambda_i(m) (y_i - m))``. Where the mean is at most ``m``
this is a nonnegative supermartingale, so by Ville's inequality the chance that it *ever* reaches
``1 / alpha`` is at most ``alpha``: the test may be looked at after every pair and continued at will
(the validation stage's looks and its extension cost nothing, no alpha is spent). ``m`` is rejected
once the running maximum of ``K_t(m)`` reaches ``1 / alpha``; the lower bound is the largest
rejected ``m``. Every factor decreases in ``m``, so the rejected means are an interval ``[0, L)``:
``L`` is found by bisection, vectorised over any number of samples (rows).

The bets are the paper's predictable plug-in: ``lambda_t = sqrt(2 log(1/alpha) / (s2_{t-1} N_t))``
from the running variance estimate ``s2`` (shrunk toward 1/4 by one pseudo-observation), with
``N_t = t log(1 + t)`` (anytime) or the planned number of pairs ``n`` (tuned to a planned size, as
valid: any bet that depends only on the past is), truncated to ``c / m`` so that a difference of
``-w`` can never take more than a share ``c`` of the capital. A claim on ``n`` pairs of identical
differences can only be as strong as that truncation allows: :func:`min_pairs` is the fewest pairs
with which *any* sample reaches a claim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: The share of the capital a bet may risk on the worst difference (the paper's ``c``). The decision is
#: the capital's running maximum, so a late loss cannot undo a claim already reached: measured in the
#: validation design, 0.5 / 0.75 / 0.9 / 0.99 showed a non-inferiority of equal configurations (measured
#: world) in 0.06 / 0.37 / 0.50 / 0.55 of runs, every error rate at most 0.021 (docs/statistics.md).
TRUNCATION = 0.9
#: What the bounds are, in words (for reports and designs).
METHOD = "betting confidence sequence for a bounded mean (Waudby-Smith & Ramdas 2024)"
_STEPS = 48  # bisection halvings of [0, 1]: below 1e-14, far under any score's resolution


def width(scale: tuple[float, float]) -> float:
    """The widest a paired difference of scores on ``scale`` can be (4 on 1-5)."""
    lo, hi = scale
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ValueError(f"a score scale is (low, high) with low < high, got {scale!r}")
    return float(hi - lo)


def _unit(differences: np.ndarray, w: float) -> np.ndarray:
    y = (np.asarray(differences, dtype=float) + w) / (2 * w)
    if y.size and (np.nanmin(y) < -1e-9 or np.nanmax(y) > 1 + 1e-9):
        raise ValueError(f"a paired difference lies outside [-{w:g}, +{w:g}], the judge scale's width")
    return np.clip(y, 0.0, 1.0)


def _bets(y: np.ndarray, *, alpha: float, planned: int | None) -> np.ndarray:
    """The predictable plug-in bet before each pair (rows x pairs), not yet truncated by ``m``."""
    n = y.shape[-1]
    t = np.arange(1, n + 1, dtype=float)
    mean = (0.5 + np.cumsum(y, axis=-1)) / (t + 1)  # shrunk toward 1/2 by one pseudo-observation
    prev_mean = np.concatenate([np.full((*y.shape[:-1], 1), 0.5), mean[..., :-1]], axis=-1)
    s2 = (0.25 + np.cumsum((y - prev_mean) ** 2, axis=-1)) / (t + 1)
    s2_before = np.concatenate([np.full((*y.shape[:-1], 1), 0.25), s2[..., :-1]], axis=-1)
    horizon = t * np.log1p(t) if planned is None else np.full(n, float(max(planned, 1)))
    return np.sqrt(2 * math.log(1 / alpha) / (np.maximum(s2_before, 1e-12) * horizon))


def _log_peak(y: np.ndarray, bets: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The running maximum of ``log K_t(m)`` over the pairs, per row (``m``: one per row)."""
    lam = np.minimum(bets, TRUNCATION / np.maximum(m, 1e-12)[..., None])
    log_k = np.cumsum(np.log1p(lam * (y - m[..., None])), axis=-1)
    return np.max(log_k, axis=-1, initial=0.0)


def lower_unit(y: np.ndarray, *, alpha: float, planned: int | None = None) -> np.ndarray:
    """The one-sided ``1 - alpha`` lower confidence bound (every look) of the mean of values in [0, 1],
    per row of ``y`` (rows x pairs, or one row); 0 where nothing can be rejected."""
    y = np.atleast_2d(np.asarray(y, dtype=float))
    if y.shape[-1] == 0:
        return np.zeros(y.shape[:-1])
    bets, target = _bets(y, alpha=alpha, planned=planned), math.log(1 / alpha)
    lo, hi = np.zeros(y.shape[:-1]), np.ones(y.shape[:-1])
    for _ in range(_STEPS):  # K_t(m) decreases in m: the rejected means are [0, L)
        mid = (lo + hi) / 2
        rejected = _log_peak(y, bets, mid) >= target
        lo, hi = np.where(rejected, mid, lo), np.where(rejected, hi, mid)
    return lo


def lower_bounds(differences: np.ndarray, *, scale: tuple[float, float], alpha: float,
                 planned: int | None = None) -> np.ndarray:
    """The one-sided ``1 - alpha`` lower bound of the mean paired difference, per row of ``differences``
    (rows x pairs in the order they were asked; each a difference of two scores on ``scale``)."""
    w = width(scale)
    return lower_unit(_unit(differences, w), alpha=alpha, planned=planned) * 2 * w - w


def upper_bounds(differences: np.ndarray, *, scale: tuple[float, float], alpha: float,
                 planned: int | None = None) -> np.ndarray:
    """The one-sided ``1 - alpha`` upper bound of the mean paired difference, per row."""
    return -lower_bounds(-np.asarray(differences, dtype=float), scale=scale, alpha=alpha, planned=planned)


@dataclass(frozen=True)
class Bound:
    """What :func:`bound` says of ``n`` paired differences (the order they were asked in)."""

    n: int
    mean: float
    #: Two-sided p-value of "the mean is 0": twice the smaller of ``1 / `` the capitals' peaks betting
    #: on either side (at most ``alpha`` exactly when the interval excludes 0).
    p: float
    #: The two-sided ``1 - alpha`` interval of the mean difference (``alpha / 2`` on each side): valid
    #: at every look, whatever the differences' shape, within the scale's width.
    low: float
    high: float
    alpha: float

    def text(self) -> str:
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def bound(differences: Sequence[float], *, scale: tuple[float, float], alpha: float,
          planned: int | None = None) -> Bound:
    """The interval of the mean of ``differences`` at level ``1 - alpha`` (:class:`Bound`)."""
    w = width(scale)
    d = np.asarray(differences, dtype=float)
    if not len(d):
        return Bound(n=0, mean=math.nan, p=1.0, low=-w, high=w, alpha=alpha)
    low = float(lower_bounds(d, scale=scale, alpha=alpha / 2, planned=planned)[0])
    high = float(upper_bounds(d, scale=scale, alpha=alpha / 2, planned=planned)[0])
    peak = max(float(log_capital(side * d, scale=scale, alpha=alpha / 2, planned=planned)[0]) for side in (1, -1))
    return Bound(n=len(d), mean=float(d.mean()), p=min(1.0, 2 * math.exp(-peak)), low=low, high=high, alpha=alpha)


def log_capital(differences: np.ndarray, *, scale: tuple[float, float], alpha: float, above: float = 0.0,
                planned: int | None = None) -> np.ndarray:
    """Per row: the largest log capital reached so far betting against "mean difference <= ``above``"
    (bets sized for level ``alpha``). ``exp(-it)`` is an anytime-valid p-value of that null."""
    w = width(scale)
    y = np.atleast_2d(_unit(differences, w))
    if y.shape[-1] == 0:
        return np.zeros(y.shape[:-1])
    m = np.full(y.shape[:-1], (above + w) / (2 * w))
    return _log_peak(y, _bets(y, alpha=alpha, planned=planned), m)


def claims(differences: np.ndarray, *, scale: tuple[float, float], alpha: float, above: float = 0.0,
           planned: int | None = None) -> np.ndarray:
    """Per row: whether "mean difference > ``above``" is shown at level ``alpha`` (``above = 0``: a gain;
    ``-margin``: not worse by more than the margin). The capital is evaluated at ``above`` directly,
    so a decision never depends on the bisection's precision."""
    return log_capital(differences, scale=scale, alpha=alpha, above=above, planned=planned) >= math.log(1 / alpha)


def claimed(differences: Sequence[float], *, scale: tuple[float, float], alpha: float, above: float = 0.0,
            planned: int | None = None) -> bool:
    """:func:`claims` of one sample."""
    return bool(claims(np.asarray(differences, dtype=float), scale=scale, alpha=alpha, above=above,
                       planned=planned)[0])


def min_pairs(*, alpha: float, scale: tuple[float, float], above: float = 0.0, planned: int | None = None,
              most: int = 10_000) -> int | None:
    """The fewest pairs with which "mean difference > ``above``" can be shown at all: the sample most in
    its favour (every difference the scale's width) reaches it from there, and no sample does below.
    None if not within ``most`` pairs. 6 at alpha 0.05 for a gain on 1-5, 5 for ``above = -0.25``."""
    w = width(scale)
    for n in range(1, most + 1):
        if claimed([w] * n, scale=scale, alpha=alpha, above=above, planned=planned):
            return n
    return None


__all__ = ["METHOD", "TRUNCATION", "Bound", "bound", "claimed", "claims", "log_capital", "lower_bounds", "lower_unit",
           "min_pairs", "upper_bounds", "width"]
