"""The validation stage's test alone, in the worlds of issue 61: its error rate and power, today's test
(flipping the sum of the paired differences, as before issue 61) beside the one opro runs (flipping the
skew-corrected studentized mean, :mod:`opro.stats.skew`), on the same differences and the same flips.

Each run draws the paired differences (finalist - initial) of the confirmation questions of the
default design (48 validation questions, 4 of them selection, 20 unused to extend into: looks at 15,
30 and 44 pairs, the extension's at 64) from a world of ``bench_compare_tests`` at a fixed true mean
difference, shifts them by the margin under the cost objective, and runs every look of both tests
(``opro.stats.sequential.decide`` for today's test's successor; :func:`sum_look` is today's, kept
here). A claim is a success at a look the run reached (futility stops a run at a look before the last
where the mean is not above 0). Every run flips with seed 0, as a validation stage does by default:
each look's 20,000 flips are drawn once and shared by the runs (their Monte Carlo error, about 0.002
in a boundary's level, is then common to the runs; the runs' own error is the ± shown). Run by
``bench_selection.py --errors``:

    python experiments/bench_selection.py --errors --runs 2000
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import opro.stats.sequential
from opro.config import OptimizerSection
from opro.stats.sequential import Look, decide, spent
from opro.stats.skew import flip_signs as draw_signs
from opro.testing.score_worlds import WORLDS, World, effect_for, paired_scores
from opro.workflows.settings import validation_settings

_SIGNS: dict[tuple[int, int, int, int], np.ndarray] = {}


def flip_signs(n: int, *, draws: int, seed: int, exact_max_n: int = 16) -> np.ndarray:
    """:func:`opro.stats.skew.flip_signs`, each look's drawn once (read-only: every run flips the same)."""
    key = (n, draws, seed, exact_max_n)
    if key not in _SIGNS:
        _SIGNS[key] = draw_signs(n, draws=draws, seed=seed, exact_max_n=exact_max_n)
        _SIGNS[key].setflags(write=False)
    return _SIGNS[key]

_EPS = 1e-9
#: (objective, world, true mean difference): the rows of the table. Under the cost objective the
#: differences are shifted by the margin, and the null is a finalist worse by exactly the margin.
MARGIN = 0.25
NULLS = [("quality", w, 0.0) for w in WORLDS] + [("cost", w, -MARGIN) for w in WORLDS]
SYMMETRIC: tuple[World, ...] = ("rounded", "realistic", "measured", "t3")
#: Power: a gain in the symmetric worlds (+0.5 judge points before rounding in the integer ones, as
#: the power table of docs/statistics.md; +0.25 in the continuous ones) and an equal finalist under
#: the cost objective.
GAINS = {"rounded": 0.47, "realistic": 0.35, "measured": 0.25, "t3": 0.25}
POWERS = [("quality", w, GAINS[w]) for w in SYMMETRIC] + [("cost", w, 0.0) for w in SYMMETRIC]


def design_sizes() -> tuple[int, ...]:
    """The confirmation looks of the default settings (48 validation questions, 20 unused)."""
    from opro.search.validation_sizes import confirmation_looks, split_sizes

    settings = validation_settings(OptimizerSection())
    _, n_conf = split_sizes(settings, 48, settings.finalists)
    return confirmation_looks(settings, n_conf, 20)


def sum_look(d: Sequence[float], *, seen: Sequence[int], n_max: int, last: bool, earlier: Sequence[float],
             alpha: float, draws: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """Today's look before issue 61 (``decide`` as it was): (the sum, its boundary), the boundary from
    the flips of the sum, among those that crossed no earlier boundary."""
    n = seen[-1]
    budget = alpha if last else spent(alpha, n / n_max)
    sums = (flip_signs(n, draws=draws, seed=seed + len(seen)) * np.abs(np.asarray(d, dtype=float))).cumsum(axis=1)
    alive = np.ones(len(sums), dtype=bool)
    for size, c in zip(seen[:-1], earlier, strict=True):
        alive &= sums[:, size - 1] < c - _EPS
    crossed = float(np.mean(~alive))
    allowed = math.floor((budget - crossed) * len(sums) + _EPS) if budget > crossed else 0
    last_sums = sums[alive, n - 1]
    boundary = math.inf
    if allowed >= 1 and len(last_sums):
        values, counts = np.unique(-last_sums, return_counts=True)
        ok = np.nonzero(np.cumsum(counts) <= allowed)[0]
        boundary = math.inf if not len(ok) else float(-values[ok[-1]])
    return float(sum(d)), boundary


def run_both(d: np.ndarray, sizes: Sequence[int], *, alpha: float, seed: int) -> tuple[bool, bool]:
    """(today's test claims, the new test claims) on one run's differences, futility from the first look."""
    looks: list[Look] = []
    bounds: list[float] = []
    old = new = None
    for k, n in enumerate(sizes, start=1):
        last = k == len(sizes)
        if old is None:
            s, c = sum_look(list(d[:n]), seen=sizes[:k], n_max=sizes[-1], last=last, earlier=bounds, alpha=alpha,
                            seed=seed)
            bounds.append(c)
            old = True if s >= c - _EPS else (False if last or s <= 0 else None)
        if new is None:
            look = decide(list(d[:n]), seen=sizes[:k], n_max=sizes[-1], last=last, earlier=looks, alpha=alpha,
                          seed=seed)
            looks.append(look)
            new = {"success": True, "continue": None}.get(look.decision, False)
        if old is not None and new is not None:
            break
    return bool(old), bool(new)


def errors(*, runs: int, rows: Sequence[tuple[str, World, float]], alpha: float = 0.05,
           seed: int = 0) -> list[dict[str, Any]]:
    """P(claim) of both tests per (objective, world, true mean difference), on ``runs`` runs each."""
    sizes = design_sizes()
    out = []
    for objective, world, difference in rows:
        started = time.perf_counter()
        rng = np.random.default_rng([seed, WORLDS.index(world), round(1000 * difference) + 1000])
        a, b = paired_scores(rng, sims=runs, n=sizes[-1], effect=effect_for(difference, world), world=world)
        d = a - b + (MARGIN if objective == "cost" else 0.0)
        opro.stats.sequential.flip_signs = flip_signs  # type: ignore[assignment]  # the cache above, in this process
        claims = np.array([run_both(row, sizes, alpha=alpha, seed=0) for row in d])
        old, new = claims.mean(axis=0)
        out.append({"objective": objective, "world": world, "difference": difference, "runs": runs, "sizes": sizes,
                    "today": float(old), "new": float(new), "seconds": time.perf_counter() - started})
    return out


def print_errors(rows: list[dict[str, Any]], *, alpha: float = 0.05) -> None:
    sizes = rows[0]["sizes"] if rows else ()
    print(f"the validation stage's test alone: looks at {', '.join(map(str, sizes))} paired questions, alpha "
          f"{alpha:g}, margin {MARGIN:g} under the cost objective; P(claim), ± its standard error")
    print("| objective | world | true mean difference | runs | today: flips of the sum | new: flips of Hall's "
          "statistic | seconds |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        se = [math.sqrt(max(p * (1 - p), 1e-12) / r["runs"]) for p in (r["today"], r["new"])]
        print(f"| {r['objective']} | {r['world']} | {r['difference']:+.2f} | {r['runs']} | {r['today']:.3f} ± {se[0]:.3f} "
              f"| **{r['new']:.3f}** ± {se[1]:.3f} | {r['seconds']:.0f} |")
