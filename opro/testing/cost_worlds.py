"""Simulated worlds of per-answer costs with a known saving (issue 57, item 5): a constant cut and a
proportional one, in which the interval of a relative saving is measured (``experiments/bench_saving.py``
and the package's tests share this one definition). No LLM is called.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import numpy as np

from opro.stats.sequential import t_interval

Cut = Literal["constant", "proportional"]
#: The initial configuration's cost per answer (weighted tokens): mean 600, sd 240 across questions.
COST_MEAN, COST_SD = 600.0, 240.0
#: Each answer's own noise (tokens), the constant cut and the proportional one.
ANSWER_SD, CONSTANT_CUT, SHARE_KEPT = 10.0, 150.0, 0.7


def costs(rng: np.random.Generator, *, sims: int, n: int, cut: Cut,
          sigma: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``sims`` x ``n`` (new, old) costs per answer on the same questions. ``sigma``: heavy-tailed costs,
    lognormal with that sigma (and mean COST_MEAN), as context lengths are; the constant cut is then at
    most half a question's cost (one passage fewer of a short context cannot cut more than it holds)."""
    if sigma is None:
        shape, scale = (COST_MEAN / COST_SD) ** 2, COST_SD**2 / COST_MEAN  # gamma: positive, right-skewed
        question = rng.gamma(shape, scale, (sims, n))
    else:
        question = rng.lognormal(math.log(COST_MEAN) - sigma**2 / 2, sigma, (sims, n))
    old = question + rng.normal(0, ANSWER_SD, (sims, n))
    cut_by = CONSTANT_CUT if sigma is None else np.minimum(CONSTANT_CUT, question / 2)
    kept = question - cut_by if cut == "constant" else SHARE_KEPT * question
    new = kept + rng.normal(0, ANSWER_SD, (sims, n))
    if sigma is not None:  # an answer costs at least a token (the gamma world rarely comes near 0)
        new, old = np.maximum(new, 1.0), np.maximum(old, 1.0)
    return new, old


@functools.cache
def true_saving(cut: Cut, sigma: float | None = None) -> float:
    """The share saved in expectation (with ``sigma``, over 4,000,000 questions)."""
    if sigma is None:
        return CONSTANT_CUT / COST_MEAN if cut == "constant" else 1.0 - SHARE_KEPT
    new, old = costs(np.random.default_rng(1), sims=1, n=4_000_000, cut=cut, sigma=sigma)
    return float(1.0 - new.mean() / old.mean())


def first_order(new: np.ndarray, old: np.ndarray) -> tuple[float, float] | None:
    """The interval opro printed before: the difference's t interval over the old mean, taken as known."""
    ci = t_interval(list(new - old))
    base = float(old.mean())
    return None if ci is None else (-ci[1] / base, -ci[0] / base)
