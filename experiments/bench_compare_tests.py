"""Which paired test should `opro compare` decide with? Power and error rate of the exact Wilcoxon
signed-rank test, the sign-flip permutation test, and "both below alpha" (the rule before issue 38),
two-sided, on judge-like scores: integer 1-5 scores (the reply judge) and continuous ones (the logit
judge's probability-weighted score), with a per-question level shared by both prompts.

    python experiments/bench_compare_tests.py --sims 400

No LLM is called; the tests are opro.stats' own.
"""

from __future__ import annotations

import argparse

import numpy as np

from opro.stats import permutation_test, wilcoxon_signed_rank


def scores(rng: np.random.Generator, n: int, effect: float, *, continuous: bool) -> tuple[np.ndarray, np.ndarray]:
    level = 3.0 + rng.normal(0, 0.6, n)
    a = level + effect + rng.normal(0, 0.9, n)
    b = level + rng.normal(0, 0.9, n)
    if continuous:  # an expected score: smooth, within 1..5
        return np.clip(a, 1, 5), np.clip(b, 1, 5)
    return np.clip(np.round(a), 1, 5), np.clip(np.round(b), 1, 5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--alpha", type=float, default=0.05)
    args = ap.parse_args(argv)
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
