"""The validation stage's test alone, in the worlds of :mod:`opro.testing.score_worlds`: its error rate
and power, the test opro ran before (sign flips of Hall's skew-corrected studentized mean, O'Brien-
Fleming-type alpha spending; :func:`hall_look` keeps it here) beside the one it runs (the betting
confidence sequence, :mod:`opro.stats.betting`), on the same differences.

Each run draws the paired differences (finalist - initial) of the confirmation questions of the
default design (48 validation questions, 4 of them selection, 20 unused to extend into: looks at 15,
30 and 44 pairs, the extension's at 64) from a world at a fixed true mean difference, shifts them by
the margin under the cost objective, and runs every look of both tests. A claim is a success at a look
the run reached; futility stops a run at a look before the last as the product does (quality: the
mean is not above 0; cost: the one-sided 95% t upper bound of the shifted mean is below 0). The flips
use seed 0, as a validation stage did by default: each look's 20,000 flips are drawn once and shared
by the runs. The betting test runs all runs at once (numpy); the flips one run at a time, so
``--today-runs`` may run them on fewer. In the clustered world the betting test also runs as the
product runs it where the dataset records each question's source passage: on the means of the complete
clusters at each look (:mod:`opro.stats.clusters`), beside the per-question test that ignores them.
Run by ``bench_selection.py --errors``:

    python experiments/bench_selection.py --errors --runs 2000
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from hall_flips import flip_signs as draw_signs
from hall_flips import flipped, spent, statistic

from opro.config import OptimizerSection
from opro.experiment.settings import validation_settings
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.stats.betting import claims
from opro.stats.sequential import futile
from opro.testing.score_worlds import WORLDS, World, cluster_layout, effect_for, paired_scores

SCALE = (SCORE_MIN, SCORE_MAX)
_SIGNS: dict[tuple[int, int, int, int], np.ndarray] = {}


def flip_signs(n: int, *, draws: int, seed: int, exact_max_n: int = 16) -> np.ndarray:
    """:func:`hall_flips.flip_signs`, each look's drawn once (read-only: every run flips the same)."""
    key = (n, draws, seed, exact_max_n)
    if key not in _SIGNS:
        _SIGNS[key] = draw_signs(n, draws=draws, seed=seed, exact_max_n=exact_max_n)
        _SIGNS[key].setflags(write=False)
    return _SIGNS[key]

_EPS = 1e-9
#: (objective, world, true mean difference): the rows of the table. Under the cost objective the
#: differences are shifted by the margin, and the null is a finalist worse by exactly the margin.
MARGIN = 0.25
NULLS = ([("quality", w, 0.0) for w in WORLDS] + [("cost", w, -MARGIN) for w in WORLDS]
         + [("cost", "tied", -0.4)])
SYMMETRIC: tuple[World, ...] = ("rounded", "realistic", "measured", "t3")
#: Power: a gain in the symmetric worlds (+0.5 judge points before rounding in the integer ones, as
#: the power table of docs/statistics.md; +0.25 in the continuous ones; +0.5 in the realistic world)
#: and an equal finalist under the cost objective (in the tied world: every pair tied).
GAINS = {"rounded": 0.47, "realistic": 0.35, "measured": 0.25, "t3": 0.25}
POWERS = ([("quality", w, GAINS[w]) for w in SYMMETRIC] + [("quality", "realistic", 0.5)]
          + [("cost", w, 0.0) for w in (*SYMMETRIC, "tied", "clustered")] + [("quality", "clustered", 0.5)])


def design_sizes() -> tuple[int, ...]:
    """The confirmation looks of the default settings (48 validation questions, 20 unused)."""
    from opro.search.validation_sizes import confirmation_looks, split_sizes

    settings = validation_settings(OptimizerSection())
    _, n_conf = split_sizes(settings, 48, settings.finalists)
    return confirmation_looks(settings, n_conf, 20)


def _alive(paths: np.ndarray, earlier: Sequence[float]) -> np.ndarray:
    alive = np.ones(len(paths), dtype=bool)
    for j, c in enumerate(earlier):
        alive &= paths[:, j] < c - _EPS
    return alive


def _boundary(paths: np.ndarray, alive: np.ndarray, spend: float) -> float:
    last = paths[alive, -1]
    allowed = math.floor(spend * len(paths) + _EPS)
    if allowed < 1 or not len(last):
        return math.inf
    values, counts = np.unique(-last, return_counts=True)
    ok = np.nonzero(np.cumsum(counts) <= allowed)[0]
    return math.inf if not len(ok) else float(-values[ok[-1]])


def hall_look(d: Sequence[float], *, seen: Sequence[int], n_max: int, last: bool, earlier: Sequence[float],
              alpha: float, draws: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """The look of the test opro ran before the betting test (``opro.stats.sequential.decide`` as it
    was, kept here for the side-by-side): (Hall's statistic, its boundary), the boundary from the sign
    flips of the statistic among those that crossed no earlier boundary, O'Brien-Fleming-type spending."""
    n = seen[-1]
    budget = alpha if last else spent(alpha, n / n_max)
    paths = flipped(list(d), flip_signs(n, draws=draws, seed=seed + len(seen)), seen)
    alive = _alive(paths, earlier)
    crossed = float(np.mean(~alive))
    c = _boundary(paths, alive, budget - crossed) if budget > crossed else math.inf
    return statistic(list(d)), c


def run_both(d: np.ndarray, sizes: Sequence[int], *, alpha: float, seed: int,
             futility_confidence: float | None) -> bool:
    """Whether the flips of Hall's statistic claim on one run's (shifted) differences, futility from the first look."""
    bounds: list[float] = []
    for k, n in enumerate(sizes, start=1):
        last = k == len(sizes)
        s, c = hall_look(list(d[:n]), seen=sizes[:k], n_max=sizes[-1], last=last, earlier=bounds, alpha=alpha,
                         seed=seed)
        bounds.append(c)
        if s >= c - _EPS * max(1.0, abs(c)):
            return True
        if last or bool(futile(d[:n], confidence=futility_confidence)[0]):
            return False
    return False


def complete_means(d: np.ndarray, labels: np.ndarray, n: int) -> np.ndarray:
    """Per run, the mean of each cluster whose questions all lie in the first ``n`` (clusters one after
    the other, as the validation stage asks them): what a look counts under clusters."""
    last = np.array([np.nonzero(labels == c)[0].max() for c in range(int(labels.max()) + 1)])
    done = np.nonzero(last < n)[0]
    member = (labels[:, None] == done[None, :]).astype(float)
    return d @ (member / member.sum(0))


def betting_claims(d: np.ndarray, sizes: Sequence[int], *, alpha: float, shift: float,
                   futility_confidence: float | None, labels: np.ndarray | None = None) -> np.ndarray:
    """Per run (row of shifted differences): whether the betting test (``decide``) claims, all runs at
    once; ``labels`` (a cluster per question): on the complete clusters' means, as ``decide`` with clusters."""
    runs = len(d)
    claimed = np.zeros(runs, dtype=bool)
    done = np.zeros(runs, dtype=bool)
    planned = sizes[-1] if labels is None else int(labels[:sizes[-1]].max()) + 1
    for k, n in enumerate(sizes):
        x = d[:, :n] if labels is None else complete_means(d, labels[:sizes[-1]], n)
        if x.shape[1] == 0:
            continue
        hit = ~done & claims(x - shift, scale=SCALE, alpha=alpha, above=-shift, planned=planned)
        claimed |= hit
        done |= hit
        if k < len(sizes) - 1:
            done |= futile(x, confidence=futility_confidence)
    return claimed


def errors(*, runs: int, rows: Sequence[tuple[str, World, float]], alpha: float = 0.05, seed: int = 0,
           today_runs: int | None = None) -> list[dict[str, Any]]:
    """P(claim) of both tests per (objective, world, true mean difference), on ``runs`` runs each (the flips
    of Hall's statistic on the first ``today_runs`` of them: they take seconds per hundred runs)."""
    sizes = design_sizes()
    out = []
    for objective, world, difference in rows:
        started = time.perf_counter()
        rng = np.random.default_rng([seed, WORLDS.index(world), round(1000 * difference) + 1000])
        a, b = paired_scores(rng, sims=runs, n=sizes[-1], effect=effect_for(difference, world), world=world)
        shift = MARGIN if objective == "cost" else 0.0
        confidence = 1 - alpha if objective == "cost" else None  # the product's futility rule per objective
        d = a - b + shift
        new = betting_claims(d, sizes, alpha=alpha, shift=shift, futility_confidence=confidence)
        clustered = (betting_claims(d, sizes, alpha=alpha, shift=shift, futility_confidence=confidence,
                                    labels=cluster_layout(sizes[-1])) if world == "clustered" else None)
        k = runs if today_runs is None else min(runs, today_runs)
        old = np.array([run_both(row, sizes, alpha=alpha, seed=0, futility_confidence=confidence) for row in d[:k]])
        out.append({"objective": objective, "world": world, "difference": difference, "runs": runs, "today_runs": k,
                    "sizes": sizes, "today": float(old.mean()) if k else math.nan, "new": float(new.mean()),
                    "clusters": math.nan if clustered is None else float(clustered.mean()),
                    "seconds": time.perf_counter() - started})
    return out


def print_errors(rows: list[dict[str, Any]], *, alpha: float = 0.05) -> None:
    sizes = rows[0]["sizes"] if rows else ()
    print(f"the validation stage's test alone: looks at {', '.join(map(str, sizes))} paired questions, alpha "
          f"{alpha:g}, margin {MARGIN:g} under the cost objective; P(claim), ± its binomial standard error")
    print("| objective | world | true mean difference | runs (flips) | before: flips of Hall's statistic "
          "| now: betting | betting by cluster | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        se = [math.sqrt(max(p * (1 - p), 1e-12) / max(n, 1)) for p, n in ((r["today"], r["today_runs"]), (r["new"], r["runs"]))]
        today = f"{r['today']:.3f} ± {se[0]:.3f}" if r["today_runs"] else "-"
        c = r.get("clusters", math.nan)
        by = "-" if math.isnan(c) else f"**{c:.3f}** ± {math.sqrt(max(c * (1 - c), 1e-12) / r['runs']):.3f}"
        print(f"| {r['objective']} | {r['world']} | {r['difference']:+.2f} | {r['runs']} ({r['today_runs']}) | {today} "
              f"| {'**' * math.isnan(c)}{r['new']:.3f}{'**' * math.isnan(c)} ± {se[1]:.3f} | {by} | {r['seconds']:.0f} |")
