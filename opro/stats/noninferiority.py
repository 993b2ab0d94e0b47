"""Non-inferiority of a prompt against a baseline on the same questions (``opro compare --margin``).

H0: mean(prompt - baseline) <= -margin, tested one-sided on the differences shifted by +margin by
flipping their signs, the statistic flipped being the skew-corrected studentized mean
(:mod:`opro.stats.skew`, as the validation stage does): exact where the shifted differences are
symmetric about a mean <= 0, and holding the error rate where they are not (a cheaper prompt that
fails badly on a few questions and gains a little on the rest), from enough pairs.

Below :func:`opro.stats.skew.min_pairs` pairs (29 at alpha 0.05) the claim is refused whatever the
p-value: a sample that small misses a failure on 1 question in 10 with probability above alpha, and
then looks as good as a truly equal prompt. Measured in that skewed world at a true -margin, the test
claimed in 0.18 / 0.11 of samples at 10 / 20 pairs and 0.058 / 0.042 at 30 / 44; flipping the sum
(before issue 61): 0.18 / 0.12 / 0.11 / 0.09 (``experiments/bench_compare_tests.py --errors``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from opro.errors import ConfigError
from opro.stats.skew import flip_p_value, min_pairs


def check_margin(margin: float, *, where: str = "--margin") -> float:
    if not math.isfinite(margin) or margin <= 0:
        raise ConfigError(f"{where} must be a positive number of judge points (e.g. 0.25), got {margin!r}")
    return float(margin)


def one_sided_sign_flip(differences: Sequence[float], *, n_resamples: int = 10_000, seed: int = 0,
                        exact_max_n: int = 16) -> tuple[float, bool]:
    """P(the skew-corrected studentized mean of randomly sign-flipped differences >= the observed one):
    exact over the ``2**n`` assignments up to ``exact_max_n`` pairs, else ``(1 + hits) / (1 +
    n_resamples)`` from seeded flips (:func:`opro.stats.skew.flip_p_value`). Returns the p-value and
    whether it is exact."""
    if len(differences) > exact_max_n and n_resamples < 100:
        raise ConfigError(f"n_resamples={n_resamples} is too few for a Monte Carlo p-value; use >= 1000")
    return flip_p_value(differences, alternative="greater", n_resamples=n_resamples, seed=seed,
                        exact_max_n=exact_max_n)


@dataclass(frozen=True)
class NonInferiority:
    """The one-sided test of "not worse than the baseline by more than ``margin``" on ``n`` pairs."""

    margin: float
    n: int
    p_value: float
    #: The p-value is exact (all flips enumerated) rather than estimated.
    exact: bool
    alpha: float
    #: Prompts tested against the baseline; ``p_adjusted`` is Holm-adjusted over them (None: one).
    n_comparisons: int = 1
    p_adjusted: float | None = None

    @property
    def p(self) -> float:
        return self.p_value if self.p_adjusted is None else self.p_adjusted

    @property
    def min_pairs(self) -> int:
        """The fewest pairs on which the claim holds its error rate where losses are rare and large."""
        return min_pairs(self.alpha)

    @property
    def too_few(self) -> bool:
        return 0 < self.n < self.min_pairs

    @property
    def passed(self) -> bool:
        return self.n > 0 and not self.too_few and self.p < self.alpha

    def as_dict(self) -> dict[str, Any]:
        return {"margin": self.margin, "n_pairs": self.n, "p": self.p_value, "exact": self.exact,
                "n_comparisons": self.n_comparisons, "p_holm": self.p_adjusted, "alpha": self.alpha,
                "passed": self.passed, "min_pairs": self.min_pairs}

    def text(self) -> str:
        holm = f", Holm over {self.n_comparisons}" if self.n_comparisons > 1 else ""
        if self.n == 0:
            return f"non-inferiority by {self.margin:g} not tested: no question was scored for both"
        if self.passed:
            return f"not worse by more than {self.margin:g} (p = {self.p:.2g}{holm})"
        if self.too_few:
            return (f"non-inferiority by {self.margin:g} not claimed on {self.n} pairs (p = {self.p:.2g}{holm}): "
                    f"it needs at least {self.min_pairs} at alpha {self.alpha:g}, since fewer miss a failure on 1 "
                    "question in 10 more often than alpha")
        return f"not shown to be within {self.margin:g} of the baseline (p = {self.p:.2g}{holm} >= alpha {self.alpha:g})"


def noninferiority(a: Sequence[float], b: Sequence[float], *, margin: float, alpha: float,
                        n_resamples: int = 10_000, seed: int = 0) -> NonInferiority:
    """``a`` against ``b`` paired by question (valid scores only)."""
    if len(a) != len(b):
        raise ValueError(f"paired scores differ in length: {len(a)} and {len(b)}")
    p, exact = one_sided_sign_flip([x - y + margin for x, y in zip(a, b, strict=True)],
                                   n_resamples=n_resamples, seed=seed)
    return NonInferiority(margin=margin, n=len(a), p_value=p, exact=exact, alpha=alpha)


def holm_noninferiority(tests: Sequence[NonInferiority]) -> list[NonInferiority]:
    """The tests with their p-values Holm-adjusted over the family (one baseline, k prompts)."""
    from opro.stats.paired import holm

    if len(tests) <= 1:
        return list(tests)
    adjusted = holm([t.p_value for t in tests])
    return [replace(t, n_comparisons=len(tests), p_adjusted=p) for t, p in zip(tests, adjusted, strict=True)]


__all__ = ["NonInferiority", "check_margin", "holm_noninferiority", "noninferiority", "one_sided_sign_flip"]
