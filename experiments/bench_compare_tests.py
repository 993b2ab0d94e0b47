"""Which paired test should `opro compare` decide with? Power and error rate of the exact Wilcoxon
signed-rank test, the sign-flip permutation test, and "both below alpha" (the rule before issue 38),
two-sided, on judge-like scores: integer 1-5 scores (the reply judge) and continuous ones (the logit
judge's probability-weighted score), with a per-question level shared by both prompts.

    python experiments/bench_compare_tests.py --sims 400

``--coverage``: how often compare's 95% intervals (each prompt's mean, the paired difference) cover
the truth at 6, 10 and 20 held-out questions, against the percentile bootstrap they replaced, in two
worlds of integer 1-5 scores: ``rounded`` (the one above) and ``realistic`` (bimodal scores: half the
questions hard, half easy; 30% of questions answered identically by both prompts, so tied; the
effect differs per question, helping some and hurting others, with mean ``effect``):

    python experiments/bench_compare_tests.py --coverage --sims 4000

No LLM is called; the tests and intervals are opro.stats.paired' own.
"""

from __future__ import annotations

import argparse
from typing import Any, Literal

import numpy as np

from opro.heldout.report import RESOLUTION, SCALE
from opro.stats.paired import (
    bootstrap_mean_ci,
    paired_t_ci,
    permutation_test,
    t_mean_ci,
    wilcoxon_signed_rank,
)

World = Literal["rounded", "realistic"]
#: The realistic world (bench_selection's uses the same numbers): a question is hard (level 1.7) or
#: easy (4.3), so scores are mostly 1-2 or 4-5; judge noise per call; a share of questions where
#: both prompts give the same answer (the same score); per-question effects of sd SPREAD around the
#: mean effect, so a better prompt still loses some questions.
HARD_SHARE, HARD_LEVEL, EASY_LEVEL, LEVEL_SD = 0.5, 1.7, 4.3, 0.5
REAL_NOISE_SD = 0.7
IDENTICAL_SHARE = 0.3
SPREAD = 1.0


def scores(rng: np.random.Generator, n: int, effect: float, *, continuous: bool) -> tuple[np.ndarray, np.ndarray]:
    level = 3.0 + rng.normal(0, 0.6, n)
    a = level + effect + rng.normal(0, 0.9, n)
    b = level + rng.normal(0, 0.9, n)
    if continuous:  # an expected score: smooth, within 1..5
        return np.clip(a, 1, 5), np.clip(b, 1, 5)
    return np.clip(np.round(a), 1, 5), np.clip(np.round(b), 1, 5)


def paired_scores(rng: np.random.Generator, *, sims: int, n: int, effect: float,
                  world: World) -> tuple[np.ndarray, np.ndarray]:
    """``sims`` x ``n`` integer 1-5 scores of prompt A (better by ``effect`` judge points before
    rounding, on average over questions) and prompt B on the same questions."""
    if world == "rounded":
        level = 3.0 + rng.normal(0, 0.6, (sims, n))
        a = level + effect + rng.normal(0, 0.9, (sims, n))
        b = level + rng.normal(0, 0.9, (sims, n))
        return np.clip(np.round(a), 1, 5), np.clip(np.round(b), 1, 5)
    hard = rng.random((sims, n)) < HARD_SHARE
    level = np.where(hard, HARD_LEVEL, EASY_LEVEL) + rng.normal(0, LEVEL_SD, (sims, n))
    same = rng.random((sims, n)) < IDENTICAL_SHARE
    # On the questions answered differently the shift is larger, so that its mean over all is ``effect``.
    shift = effect / (1 - IDENTICAL_SHARE) + SPREAD * rng.normal(size=(sims, n))
    b = np.clip(np.round(level + rng.normal(0, REAL_NOISE_SD, (sims, n))), 1, 5)
    a = np.clip(np.round(level + shift + rng.normal(0, REAL_NOISE_SD, (sims, n))), 1, 5)
    return np.where(same, b, a), b


def truth(effect: float, world: World) -> tuple[float, float]:
    """Prompt A's expected score and the expected difference A - B (400,000 questions)."""
    a, b = paired_scores(np.random.default_rng(99), sims=1, n=400_000, effect=effect, world=world)
    return float(a.mean()), float((a - b).mean())


def coverage(*, sims: int, sizes: tuple[int, ...] = (6, 10, 20), effects: tuple[float, ...] = (0.0, 0.5, 1.0),
             worlds: tuple[World, ...] = ("rounded", "realistic"), level: float = 0.95,
             bootstrap_sims: int = 500, seed: int = 0) -> list[dict[str, Any]]:
    """Coverage of compare's intervals and of the percentile bootstrap (on the first ``bootstrap_sims``
    draws, 2,000 resamples) per world, effect and number of questions."""
    rng = np.random.default_rng(seed)
    rows = []
    for world in worlds:
        for effect in effects:
            mean_a, diff = truth(effect, world)
            for n in sizes:
                a, b = paired_scores(rng, sims=sims, n=n, effect=effect, world=world)
                t_mean = [t_mean_ci(x, level=level, bounds=SCALE, resolution=RESOLUTION).contains(mean_a) for x in a]
                t_diff = [paired_t_ci(x, y, level=level, scale=SCALE, resolution=RESOLUTION).contains(diff)
                          for x, y in zip(a, b, strict=True)]
                k = min(sims, bootstrap_sims)
                boot_mean = [bootstrap_mean_ci(x, level=level, n_resamples=2000, seed=i).contains(mean_a)
                             for i, x in enumerate(a[:k])]
                boot_diff = [bootstrap_mean_ci(x - y, level=level, n_resamples=2000, seed=i).contains(diff)
                             for i, (x, y) in enumerate(zip(a[:k], b[:k], strict=True))]
                rows.append({"world": world, "effect": effect, "n": n, "sims": sims, "bootstrap_sims": k,
                             "true_difference": diff, "ties": float(np.mean(a == b)),
                             "scores_1_2_or_4_5": float(np.mean((b <= 2) | (b >= 4))),
                             "t_mean": float(np.mean(t_mean)), "t_difference": float(np.mean(t_diff)),
                             "bootstrap_mean": float(np.mean(boot_mean)),
                             "bootstrap_difference": float(np.mean(boot_diff))})
    return rows


def print_coverage(rows: list[dict[str, Any]]) -> None:
    print("coverage of 95% intervals (compare's t with the judge's step, clipped; the percentile bootstrap)")
    print("| world | effect (mean-score gain) | ties | scores 1-2 or 4-5 | n | mean: t | mean: bootstrap "
          "| difference: t | difference: bootstrap | draws (bootstrap) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['world']} | +{r['effect']:.1f} ({r['true_difference']:+.2f}) | {r['ties']:.2f} "
              f"| {r['scores_1_2_or_4_5']:.2f} | {r['n']} | **{r['t_mean']:.3f}** | {r['bootstrap_mean']:.3f} "
              f"| **{r['t_difference']:.3f}** | {r['bootstrap_difference']:.3f} | {r['sims']} ({r['bootstrap_sims']}) |")
    worst = min(min(r["t_mean"], r["t_difference"]) for r in rows)
    print(f"lowest coverage of compare's intervals: {worst:.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--coverage", action="store_true", help="the intervals' coverage instead of the tests' power")
    args = ap.parse_args(argv)
    if args.coverage:
        print_coverage(coverage(sims=args.sims))
        return 0
    rng = np.random.default_rng(0)
    print(f"{args.sims} simulations per cell, two-sided at {args.alpha:g}; P(reject)")
    print("| scores | n | effect | Wilcoxon | permutation | both |")
    print("|---|---|---|---|---|---|")
    for continuous in (False, True):
        for n in (6, 10, 20):
            for effect in (0.0, 0.5, 1.0):
                w = p = both = 0
                for s in range(args.sims):
                    a, b = scores(rng, n, effect, continuous=continuous)
                    pw = wilcoxon_signed_rank(a, b).p_value
                    pp = permutation_test(a, b, n_resamples=2000, seed=s).p_value
                    w += pw < args.alpha
                    p += pp < args.alpha
                    both += max(pw, pp) < args.alpha
                k = args.sims
                print(f"| {'continuous' if continuous else 'integer'} | {n} | +{effect:.1f} | {w / k:.3f} | "
                      f"{p / k:.3f} | {both / k:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
