"""Which paired test should `opro compare` decide with? Power and error rate of the exact Wilcoxon
signed-rank test, the betting test opro decides with, and "both below alpha", two-sided, on
judge-like scores: integer 1-5 scores (the reply judge) and continuous ones (the logit judge's
probability-weighted score), with a per-question level shared by both prompts.

    python experiments/bench_compare_tests.py --sims 400

``--coverage``: how often compare's 95% intervals cover the truth at 6, 10, 20 and 44 held-out
questions, with their mean width, in the worlds of :data:`WORLDS` and ``rare`` (scores 5 with a 1 on
one question in 10): each prompt's mean (the t interval, beside the one before issue 61) and the
paired difference (the betting interval, beside the t interval with its Wilson fallback before it):

    python experiments/bench_compare_tests.py --coverage --sims 4000

``--errors``: the error rate and power of compare's gain test (two-sided) and of ``--margin 0.25``
(one-sided non-inferiority) at 6, 10, 20, 30 and 44 pairs in the worlds of :data:`WORLDS`, the betting
test beside the tests before it (flipping the skew-corrected studentized mean, non-inferiority refused
below 29 pairs: ``hall_flips.py``), on the same samples:

    python experiments/bench_compare_tests.py --errors --sims 2000 --before-sims 500

In the clustered world (clusters of 2-6 questions sharing a source passage) the betting test also runs
on the clusters' means, as compare does where the dataset records each question's source passage.

``--world`` (repeatable) keeps the named worlds only.

No LLM is called; the tests and intervals are opro.stats' own.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np
from hall_flips import flip_p_value
from hall_flips import min_pairs as hall_min_pairs

from opro.heldout.report import RESOLUTION, SCALE
from opro.stats.betting import log_capital, lower_bounds, upper_bounds
from opro.stats.paired import betting_test, t_mean_ci, wilcoxon_signed_rank
from opro.testing.score_worlds import (
    WORLDS,
    World,
    cluster_layout,
    effect_for,
    paired_scores,
    scores,
    truth,
)


def t_before(values: np.ndarray, *, bounds: tuple[float, float], level: float = 0.95) -> tuple[float, float]:
    """compare's interval of a mean before issue 61: the spread as if one more value lay a step (1) from
    the mean, ``(sum of squares + 1) / n`` (narrower than Student's where the variance exceeds 1), and
    the t interval clipped to ``bounds``, whatever it reached."""
    from scipy.stats import t as student

    n, m = len(values), float(values.mean())
    sd = np.sqrt((float(np.sum((values - m) ** 2)) + RESOLUTION**2) / n)
    h = float(student.ppf(0.5 + level / 2, n - 1)) * sd / np.sqrt(n)
    return max(m - h, bounds[0]), min(m + h, bounds[1])


def coverage(*, sims: int, sizes: tuple[int, ...] = (6, 10, 20, 44), level: float = 0.95,
             worlds: tuple[World, ...] = (*WORLDS, "rare"), effects: tuple[float, ...] = (0.0, 0.5),
             seed: int = 0) -> list[dict[str, Any]]:
    """Coverage and mean width of compare's intervals per world, effect (``rare``: 0 only) and number of
    questions: a prompt's mean (the t interval, beside the one before issue 61) and the paired difference
    (the betting interval, beside the t interval with its Wilson fallback it replaced)."""
    rng = np.random.default_rng(seed)
    width = (SCALE[1] - SCALE[0], SCALE[1] - SCALE[0])
    rows = []
    for world in worlds:
        for effect in effects if world != "rare" else (0.0,):
            mean_a, diff = truth(effect, world)
            for n in sizes:
                a, b = paired_scores(rng, sims=sims, n=n, effect=effect, world=world)
                row: dict[str, Any] = {"world": world, "effect": effect, "n": n, "sims": sims, "true_mean": mean_a,
                                       "true_difference": diff, "ties": float(np.mean(a == b))}
                for what, values, truth_, bounds in (("mean", a, mean_a, SCALE), ("difference", a - b, diff,
                                                                                   (-width[0], width[1]))):
                    if what == "mean":  # a prompt's mean: the t interval now, before issue 61 beside it
                        now = [(c.low, c.high) for c in (t_mean_ci(x, level=level, bounds=bounds, resolution=RESOLUTION)
                                                         for x in values)]
                        before = [t_before(x, bounds=bounds, level=level) for x in values]
                    else:  # the paired difference: the betting interval now, the t interval (with Wilson) before
                        low = lower_bounds(values, scale=SCALE, alpha=(1 - level) / 2, planned=n)
                        high = upper_bounds(values, scale=SCALE, alpha=(1 - level) / 2, planned=n)
                        now = list(zip(low, high, strict=True))
                        before = [(c.low, c.high) for c in (t_mean_ci(x, level=level, bounds=bounds, resolution=RESOLUTION)
                                                            for x in values)]
                    row[f"{what} now"] = float(np.mean([lo <= truth_ <= hi for lo, hi in now]))
                    row[f"{what} now width"] = float(np.mean([hi - lo for lo, hi in now]))
                    row[f"{what} before"] = float(np.mean([lo <= truth_ <= hi for lo, hi in before]))
                    row[f"{what} before width"] = float(np.mean([hi - lo for lo, hi in before]))
                rows.append(row)
    return rows


def print_coverage(rows: list[dict[str, Any]]) -> None:
    print("coverage of compare's 95% intervals (mean width): a prompt's mean before issue 61 and now (t); the "
          "difference before (t, Wilson fallback) and now (betting)")
    print("| world | effect (mean-score gain) | n | ties | mean: before | mean: now | difference: before "
          "| difference: now | draws |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[f'{w} {when}']:.3f} ({r[f'{w} {when} width']:.2f})" for w in ("mean", "difference")
                 for when in ("before", "now")]
        cells[1], cells[3] = f"**{cells[1]}**", f"**{cells[3]}**"
        print(f"| {r['world']} | +{r['effect']:.1f} ({r['true_difference']:+.2f}) | {r['n']} | {r['ties']:.2f} | "
              + " | ".join(cells) + f" | {r['sims']} |")
    worst = min(r["mean now"] for r in rows if r["n"] >= 10)
    print(f"lowest coverage of a prompt's mean at 10 questions or more, now: {worst:.3f}")


#: compare's worlds of ``--errors``: (test, world, true mean difference); the gain test two-sided at a
#: null of 0 and non-inferiority at ``MARGIN`` (and -0.4 in the tied world), the error rates in every
#: world and the power in the symmetric ones (gains as the validation stage's power rows: +0.5 before
#: rounding in the integer worlds; +0.5 in the realistic world) and for a truly equal configuration.
MARGIN = 0.25
SYMMETRIC: tuple[World, ...] = ("rounded", "realistic", "measured", "t3")
GAINS = {"rounded": 0.47, "realistic": 0.35, "measured": 0.25, "t3": 0.25}
ERROR_ROWS = ([("gain", w, 0.0) for w in WORLDS] + [("margin", w, -MARGIN) for w in WORLDS] + [("margin", "tied", -0.4)]
              + [("gain", w, GAINS[w]) for w in SYMMETRIC] + [("gain", "realistic", 0.5)]
              + [("margin", w, 0.0) for w in (*SYMMETRIC, "tied", "clustered")] + [("gain", "clustered", 0.5)])


def _cluster_means(d: np.ndarray) -> np.ndarray:
    """Per sample, the mean of each cluster of the clustered world's layout (every cluster complete)."""
    labels = cluster_layout(d.shape[1])
    member = (labels[:, None] == np.arange(int(labels.max()) + 1)[None, :]).astype(float)
    return d @ (member / member.sum(0))


def _claims(d: np.ndarray, *, test: str, alpha: float) -> np.ndarray:
    """Per sample (row of differences): whether compare's betting test claims (``gain``: two-sided)."""
    n = d.shape[1]
    if test == "gain":  # two-sided: either one-sided bound at alpha / 2 excludes 0
        return ((log_capital(d, scale=SCALE, alpha=alpha / 2, planned=n) >= math.log(2 / alpha))
                | (log_capital(-d, scale=SCALE, alpha=alpha / 2, planned=n) >= math.log(2 / alpha)))
    return log_capital(d, scale=SCALE, alpha=alpha, above=-MARGIN, planned=n) >= math.log(1 / alpha)


def compare_errors(*, sims: int, sizes: tuple[int, ...] = (6, 10, 20, 30, 44), alpha: float = 0.05,
                   n_resamples: int = 2000, seed: int = 0, worlds: tuple[World, ...] = WORLDS,
                   before_sims: int | None = None) -> list[dict[str, Any]]:
    """P(claim) of compare's tests before (flips of Hall's statistic, non-inferiority refused below 29
    pairs) and now (the betting test) on the same samples, per row of :data:`ERROR_ROWS` and number of
    pairs. The betting test runs every sample at once; the flips one at a time, on the first
    ``before_sims`` samples (default: all)."""
    rows = []
    k = sims if before_sims is None else min(sims, before_sims)
    for test, world, difference in (r for r in ERROR_ROWS if r[1] in worlds):
        for n in sizes:
            rng = np.random.default_rng([seed, WORLDS.index(world), round(1000 * difference) + 1000, n])
            a, b = paired_scores(rng, sims=sims, n=n, effect=effect_for(difference, world), world=world)
            d = a - b
            now = _claims(d, test=test, alpha=alpha)
            clustered = _claims(_cluster_means(d), test=test, alpha=alpha) if world == "clustered" else None
            if test == "gain":
                p_before = [flip_p_value(list(x), alternative="two-sided", n_resamples=n_resamples, seed=i)[0]
                            for i, x in enumerate(d[:k])]
                before = np.array(p_before) < alpha
            else:
                p_before = [flip_p_value(list(x + MARGIN), alternative="greater", n_resamples=n_resamples, seed=i)[0]
                            for i, x in enumerate(d[:k])]
                before = (np.array(p_before) < alpha) & (n >= hall_min_pairs(alpha))
            rows.append({"test": test, "world": world, "difference": difference, "n": n, "sims": sims,
                         "before_sims": k, "before": float(np.mean(before)) if k else math.nan,
                         "p_before": float(np.mean(np.array(p_before) < alpha)) if k else math.nan,
                         "now": float(np.mean(now)),
                         "clusters": math.nan if clustered is None else float(np.mean(clustered))})
    return rows


def print_errors(rows: list[dict[str, Any]], *, alpha: float = 0.05) -> None:
    print(f"opro compare's tests at alpha {alpha:g}: P(claim) before (flipping Hall's statistic; --margin {MARGIN:g} "
          f"claimed only from {hall_min_pairs(alpha)} pairs, p < alpha beside it) and now (the betting test), each ± its "
          "binomial standard error")
    print("| test | world | true mean difference | n | before (p < alpha) | now | now, by cluster | samples (before) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        beside = f" ({r['p_before']:.3f})" if r["test"] == "margin" and r["p_before"] != r["before"] else ""
        se = [math.sqrt(max(p * (1 - p), 1e-12) / max(k, 1)) for p, k in ((r["before"], r["before_sims"]),
                                                                         (r["now"], r["sims"]))]
        print(f"| {'gain, two-sided' if r['test'] == 'gain' else f'margin {MARGIN:g}'} | {r['world']} "
              f"| {r['difference']:+.2f} | {r['n']} | {r['before']:.3f} ± {se[0]:.3f}{beside} "
              f"| **{r['now']:.3f}** ± {se[1]:.3f} | {_by_cluster(r)} | {r['sims']} ({r['before_sims']}) |")


def _by_cluster(row: dict[str, Any]) -> str:
    c = row.get("clusters", math.nan)
    return "-" if math.isnan(c) else f"**{c:.3f}** ± {math.sqrt(max(c * (1 - c), 1e-12) / row['sims']):.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--coverage", action="store_true", help="the intervals' coverage instead of the tests' power")
    ap.add_argument("--errors", action="store_true", help="compare's tests in the worlds of issue 61")
    ap.add_argument("--before-sims", type=int, help="--errors: run the flips (the tests before) on this many "
                    "samples per cell only (default: all)")
    ap.add_argument("--world", choices=(*WORLDS, "rare"), action="append",
                    help="--errors, --coverage: this world only (repeatable; default: every world)")
    args = ap.parse_args(argv)
    worlds: tuple[World, ...] = tuple(args.world or ())
    if args.errors:
        if "rare" in worlds:
            ap.error("--world rare is a world of --coverage (intervals only)")
        print_errors(compare_errors(sims=args.sims, alpha=args.alpha, worlds=worlds or WORLDS,
                                    before_sims=args.before_sims))
        return 0
    if args.coverage:
        print_coverage(coverage(sims=args.sims, worlds=worlds or (*WORLDS, "rare")))
        return 0
    rng = np.random.default_rng(0)
    print(f"{args.sims} simulations per cell, two-sided at {args.alpha:g}; P(reject)")
    print("| scores | n | effect | Wilcoxon | betting | both |")
    print("|---|---|---|---|---|---|")
    for continuous in (False, True):
        for n in (6, 10, 20):
            for effect in (0.0, 0.5, 1.0):
                w = p = both = 0
                for _ in range(args.sims):
                    a, b = scores(rng, n, effect, continuous=continuous)
                    pw = wilcoxon_signed_rank(a, b).p_value
                    pp = betting_test(a, b, scale=SCALE, alpha=args.alpha).p_value
                    w += pw < args.alpha
                    p += pp < args.alpha
                    both += max(pw, pp) < args.alpha
                k = args.sims
                print(f"| {'continuous' if continuous else 'integer'} | {n} | +{effect:.1f} | {w / k:.3f} | "
                      f"{p / k:.3f} | {both / k:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
