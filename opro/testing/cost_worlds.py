"""Simulated worlds of per-answer costs with a known saving (issue 57, item 5): a constant cut and a
proportional one, in which the interval of a relative saving is measured (``experiments/bench_saving.py``
and the package's tests share this one definition). No LLM is called.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from opro.stats.sequential import t_interval

Cut = Literal["constant", "proportional"]
#: The initial configuration's cost per answer (weighted tokens): mean 600, sd 240 across questions.
COST_MEAN, COST_SD = 600.0, 240.0
#: Each answer's own noise (tokens), the constant cut and the proportional one.
ANSWER_SD, CONSTANT_CUT, SHARE_KEPT = 10.0, 150.0, 0.7


def costs(rng: np.random.Generator, *, sims: int, n: int, cut: Cut) -> tuple[np.ndarray, np.ndarray]:
    """``sims`` x ``n`` (new, old) costs per answer on the same questions."""
    shape, scale = (COST_MEAN / COST_SD) ** 2, COST_SD**2 / COST_MEAN  # gamma: positive, right-skewed
    question = rng.gamma(shape, scale, (sims, n))
    old = question + rng.normal(0, ANSWER_SD, (sims, n))
    kept = question - CONSTANT_CUT if cut == "constant" else SHARE_KEPT * question
    return kept + rng.normal(0, ANSWER_SD, (sims, n)), old


def true_saving(cut: Cut) -> float:
    return CONSTANT_CUT / COST_MEAN if cut == "constant" else 1.0 - SHARE_KEPT


def first_order(new: np.ndarray, old: np.ndarray) -> tuple[float, float] | None:
    """The interval opro printed before: the difference's t interval over the old mean, taken as known."""
    ci = t_interval(list(new - old))
    base = float(old.mean())
    return None if ci is None else (-ci[1] / base, -ci[0] / base)
