"""Non-inferiority of a prompt against a baseline on the same questions (``opro compare --margin``, the
probe's "cheaper and not worse").

H0: mean(prompt - baseline) <= -margin, decided by the one-sided betting test of
:mod:`opro.stats.betting` on the judge's scale: the error rate holds whatever the differences' shape
(ties, a cheaper prompt that fails badly on a few questions and gains a little on the rest) and on any
number of pairs. On few pairs it simply cannot claim: :attr:`NonInferiority.min_pairs` is the fewest
on which *any* sample can (derived from alpha, the scale and the margin, 5 at alpha 0.05 and margin
0.25 on 1-5), and a sample of tied pairs needs far more (about 60 at margin 0.25: a tie is evidence
of no difference only as strong as the scale lets a rare failure hide behind it).

The bets are tuned to the number of pairs (a fixed-size test; valid however they are tuned), in the
order the questions come; the p-value is ``1 / (the capital's peak)``, valid for Holm's adjustment.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from opro.errors import ConfigError
from opro.stats import betting
from opro.stats.clusters import cluster_means, singletons


def check_margin(margin: float, *, where: str = "--margin") -> float:
    if not math.isfinite(margin) or margin <= 0:
        raise ConfigError(f"{where} must be a positive number of judge points (e.g. 0.25), got {margin!r}")
    return float(margin)


@dataclass(frozen=True)
class NonInferiority:
    """The one-sided test of "not worse than the baseline by more than ``margin``" on ``n`` pairs."""

    margin: float
    n: int
    #: ``1 / `` the betting capital's peak against "mean <= -margin" (at most ``alpha`` exactly when shown).
    p_value: float
    alpha: float
    #: The one-sided ``1 - alpha`` lower bound of the mean difference (above ``-margin`` exactly when shown).
    lower: float
    #: The fewest pairs on which any sample could show it (None: none within 10,000).
    min_pairs: int | None
    #: Prompts tested against the baseline; ``p_adjusted`` is Holm-adjusted over them (None: one).
    n_comparisons: int = 1
    p_adjusted: float | None = None

    @property
    def p(self) -> float:
        return self.p_value if self.p_adjusted is None else self.p_adjusted

    @property
    def too_few(self) -> bool:
        """Fewer pairs than any sample needs to show it: the test could not have claimed, whatever the scores."""
        return self.n > 0 and (self.min_pairs is None or self.n < self.min_pairs)

    @property
    def passed(self) -> bool:
        return self.n > 0 and self.p <= self.alpha

    def as_dict(self) -> dict[str, Any]:
        return {"margin": self.margin, "n_pairs": self.n, "p": self.p_value, "test": betting.METHOD,
                "lower_bound": self.lower, "n_comparisons": self.n_comparisons, "p_holm": self.p_adjusted,
                "alpha": self.alpha, "passed": self.passed, "min_pairs": self.min_pairs}

    def text(self) -> str:
        holm = f", Holm over {self.n_comparisons}" if self.n_comparisons > 1 else ""
        if self.n == 0:
            return f"non-inferiority by {self.margin:g} not tested: no question was scored for both"
        if self.passed:
            return f"not worse by more than {self.margin:g} (betting test on {self.n} pairs, p = {self.p:.2g}{holm})"
        if self.too_few:
            return (f"non-inferiority by {self.margin:g} cannot be shown on {self.n} pairs: the betting test needs "
                    f"at least {self.min_pairs} at alpha {self.alpha:g}, whatever the scores")
        return (f"not shown to be within {self.margin:g} of the baseline (betting test on {self.n} pairs, "
                f"p = {self.p:.2g}{holm} > alpha {self.alpha:g})")


def noninferiority(a: Sequence[float], b: Sequence[float], *, margin: float, alpha: float,
                   scale: tuple[float, float], clusters: Sequence[str] | None = None) -> NonInferiority:
    """``a`` against ``b`` paired by question (valid scores on the judge's ``scale``, in the questions' order).
    ``clusters`` (a key per pair, :mod:`opro.stats.clusters`): the test is of the cluster means."""
    if len(a) != len(b):
        raise ValueError(f"paired scores differ in length: {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b, strict=True)]
    n = len(d)
    if clusters is not None and not singletons(clusters):
        d = cluster_means(d, clusters).tolist()
    units = len(d)
    least = betting.min_pairs(alpha=alpha, scale=scale, above=-margin, planned=max(units, 1))
    if not n:
        return NonInferiority(margin=margin, n=0, p_value=1.0, alpha=alpha, lower=-betting.width(scale),
                              min_pairs=least)
    import numpy as np

    x = np.asarray(d, dtype=float)
    peak = float(betting.log_capital(x, scale=scale, alpha=alpha, above=-margin, planned=units)[0])
    lower = float(betting.lower_bounds(x, scale=scale, alpha=alpha, planned=units)[0])
    return NonInferiority(margin=margin, n=n, p_value=min(1.0, math.exp(-peak)), alpha=alpha, lower=lower,
                          min_pairs=least)


def holm_noninferiority(tests: Sequence[NonInferiority]) -> list[NonInferiority]:
    """The tests with their p-values Holm-adjusted over the family (one baseline, k prompts)."""
    from opro.stats.paired import holm

    if len(tests) <= 1:
        return list(tests)
    adjusted = holm([t.p_value for t in tests])
    return [replace(t, n_comparisons=len(tests), p_adjusted=p) for t, p in zip(tests, adjusted, strict=True)]


__all__ = ["NonInferiority", "check_margin", "holm_noninferiority", "noninferiority"]
