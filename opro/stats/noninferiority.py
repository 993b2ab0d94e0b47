"""Non-inferiority of a prompt against a baseline on the same questions (``opro compare --margin``).

H0: mean(prompt - baseline) <= -margin, tested one-sided with the paired sign-flip permutation test
that compare already uses, on the differences shifted by +margin. Under H0 the shifted differences
are taken as symmetric about a mean <= 0 (a location shift of a symmetric law); the validation
stage makes the same assumption and its error rate is measured in experiments/bench_selection.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from opro.errors import ConfigError

# Rows of random sign flips drawn at once (memory stays small for long held-out sets).
_BLOCK = 1000


def check_margin(margin: float, *, where: str = "--margin") -> float:
    if not math.isfinite(margin) or margin <= 0:
        raise ConfigError(f"{where} must be a positive number of judge points (e.g. 0.25), got {margin!r}")
    return float(margin)


def one_sided_sign_flip(differences: Sequence[float], *, n_resamples: int = 10_000, seed: int = 0,
                        exact_max_n: int = 16) -> tuple[float, bool]:
    """P(mean of randomly sign-flipped differences >= observed mean): exact over the ``2**n``
    assignments up to ``exact_max_n`` pairs, else ``(1 + hits) / (1 + n_resamples)`` from seeded flips.
    Returns the p-value and whether it is exact."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n == 0:
        return 1.0, True
    observed = float(d.mean())
    # Sums of the same floats in another order differ in the last bits.
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if n <= exact_max_n:
        signs = 1.0 - 2.0 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
        return float(np.mean(signs @ d / n >= observed - tol)), True
    if n_resamples < 100:
        raise ConfigError(f"n_resamples={n_resamples} is too few for a Monte Carlo p-value; use >= 1000")
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_resamples, _BLOCK):
        signs = rng.choice((-1.0, 1.0), size=(min(_BLOCK, n_resamples - start), n))
        hits += int(np.sum(signs @ d / n >= observed - tol))
    return (1 + hits) / (1 + n_resamples), False


@dataclass(frozen=True)
class NonInferiority:
    """The one-sided test of "not worse than the baseline by more than ``margin``" on ``n`` pairs."""

    margin: float
    n: int
    p_value: float
    exact: bool
    alpha: float
    #: Prompts tested against the baseline; ``p_adjusted`` is Holm-adjusted over them (None: one).
    n_comparisons: int = 1
    p_adjusted: float | None = None

    @property
    def p(self) -> float:
        return self.p_value if self.p_adjusted is None else self.p_adjusted

    @property
    def passed(self) -> bool:
        return self.n > 0 and self.p < self.alpha

    def as_dict(self) -> dict[str, Any]:
        return {"margin": self.margin, "n_pairs": self.n, "p": self.p_value, "exact": self.exact,
                "n_comparisons": self.n_comparisons, "p_holm": self.p_adjusted, "alpha": self.alpha,
                "passed": self.passed}

    def text(self) -> str:
        holm = f", Holm over {self.n_comparisons}" if self.n_comparisons > 1 else ""
        if self.n == 0:
            return f"non-inferiority by {self.margin:g} not tested: no question was scored for both"
        if self.passed:
            return f"not worse by more than {self.margin:g} (p = {self.p:.2g}{holm})"
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
