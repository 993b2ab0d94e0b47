"""How far below the truth is a paired sd measured on a few pilot questions, and its upper bounds?

``opro plan`` takes a paired sd measured on fewer than 12 pairs at its one-sided chi-square upper bound
(:func:`opro.probe.plan.sd_upper_bound`). The bound assumes normal differences; judge differences have
heavy tails. This draws ``--draws`` samples of n differences in three worlds (integer differences with
rare large ones, a scaled t(3) of true sd 0.99, a normal of sd 0.99) and prints, per n, the median
estimate, how often the estimate falls below the true sd, and the same for the 80% and 90% bounds.

    python experiments/bench_sd_bound.py
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

import numpy as np

from opro.probe.plan import sd_upper_bound

Draw = Callable[[tuple[int, int]], np.ndarray]


def worlds(rng: np.random.Generator) -> Iterator[tuple[str, Draw, float]]:
    values, p = np.array([-3, -1, 0, 1, 3]), np.array([0.05, 0.15, 0.6, 0.15, 0.05])
    yield "integer, rare +-3", lambda size: rng.choice(values, p=p, size=size), float(np.sqrt((values**2 * p).sum()))
    yield "t(3) x 0.57", lambda size: rng.standard_t(3, size=size) * 0.57, 0.57 * float(np.sqrt(3))
    yield "normal", lambda size: rng.normal(0, 0.99, size=size), 0.99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name, draw, true in worlds(np.random.default_rng(args.seed)):
        for n in (6, 8, 11):
            sd = draw((args.draws, n)).std(axis=1, ddof=1)
            row = [f"{name:18} n={n:2} true {true:.2f}: estimate median {np.median(sd):.2f}, below {np.mean(sd < true):.2f}"]
            for level in (0.8, 0.9):
                factor = sd_upper_bound(1.0, n, level=level)  # the bound is the estimate times this
                row.append(f"{level:.0%} bound (x{factor:.2f}) median {np.median(sd * factor):.2f}, "
                           f"below {np.mean(sd * factor < true):.2f}")
            print("; ".join(row))


if __name__ == "__main__":
    main()
