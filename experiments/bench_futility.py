"""The cost objective's validation alone: which futility rule keeps the power for a truly equal, cheaper
configuration (issue 57)?

The confirmation of ``bench_selection.py --cost --space`` (looks at 16, 32, 48 and 68 pairs: 48
validation questions and an extension of 20; alpha 0.05, margin 0.25), run by the real
:func:`opro.stats.sequential.decide` on three kinds of paired differences, each shifted by the margin:
the settings-space world's truly equal setting (its measured judge, per-question effects), a setting
truly worse by 0.5, and the skewed world of issue 61 at exactly the margin (a claim there is an
error). Two futility rules: stop once the finalist is not ahead of ``-margin`` (before), or only once
its one-sided 95% upper bound is below it (:attr:`opro.stats.claim.Claim.futility_confidence`, now).

    python experiments/bench_futility.py --runs 400
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_cost_space import SPREAD, _pairs, calibrate
from bench_selection import MEASURED_SDS

from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.stats.sequential import decide
from opro.testing.score_worlds import skewed_pairs

SIZES = (16, 32, 48, 68)
MARGIN = 0.25


def run(d: np.ndarray, confidence: float | None, seed: int, *, draws: int) -> tuple[bool, int]:
    """(claimed, pairs asked) for one run's shifted differences."""
    looks: list = []
    for k, n in enumerate(SIZES, start=1):
        look = decide(list(d[:n]), seen=SIZES[:k], n_max=SIZES[-1], last=k == len(SIZES), earlier=looks,
                      alpha=0.05, scale=(SCORE_MIN, SCORE_MAX), shift=MARGIN, futility=True,
                      futility_confidence=confidence, seed=seed)
        looks.append(look)
        if look.decision != "continue":
            return look.decision == "success", n
    return False, SIZES[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--draws", type=int, default=5000, help="sign flips per look")
    args = ap.parse_args(argv)
    noise, shift = calibrate(float(np.median(MEASURED_SDS)))
    rng = np.random.default_rng(5)
    equal = [_pairs(rng, SIZES[-1], shift=0.0, noise_sd=noise, spread=SPREAD) + MARGIN for _ in range(args.runs)]
    worse = [_pairs(rng, SIZES[-1], shift=shift, noise_sd=noise, spread=SPREAD) + MARGIN for _ in range(args.runs)]
    a, b = skewed_pairs(np.random.default_rng(61), (args.runs, SIZES[-1]), effect=-MARGIN)
    at_margin = list(a - b + MARGIN)
    print(f"{args.runs} runs per cell; looks at {SIZES}; alpha 0.05, margin {MARGIN}")
    print("| futility | equal, 35% cheaper: shown | pairs asked | worse by 0.5: shown | pairs asked "
          "| skewed, at the margin: shown (the error) |")
    print("|---|---|---|---|---|---|")
    for name, confidence in (("not ahead (before)", None), ("clearly behind (now)", 0.95)):
        cells = []
        for world in (equal, worse, at_margin):
            got = [run(d, confidence, i, draws=args.draws) for i, d in enumerate(world)]
            cells.append((float(np.mean([x for x, _ in got])), float(np.mean([n for _, n in got]))))
        print(f"| {name} | {cells[0][0]:.3f} | {cells[0][1]:.1f} | {cells[1][0]:.3f} | {cells[1][1]:.1f} "
              f"| {cells[2][0]:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
