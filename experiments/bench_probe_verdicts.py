"""How often does the probe call a harmful contrast inert, or name it "cheaper and not worse"?

Seeded pilots of a cheaper contrast truly worse than the initial configuration by ``--true`` (default
-0.4) on integer judge scores: the initial configuration scores 3 or 4 per question, the contrast that
plus a difference of -2, -1, 0 or +1 (probabilities 0.1, 0.3, 0.5, 0.1: mean -0.4, paired sd 0.8, on
the scale without clipping; ``--true`` shifts the weights of -1 and 0 to reach another mean). Each
pilot goes through opro's own code: the difference's interval as the probe makes it (the betting
interval, :func:`opro.stats.betting.bound`), :func:`opro.probe.verdicts.verdict_of` at the band and
:func:`opro.probe.recommendation.recommend` at the margin, with a validation stage that confirms only
``--detectable`` (the case where "inert at the search's resolution", removed by issue 61, accepted
an interval inside the confirmable gain).

    python experiments/bench_probe_verdicts.py --pilots 500
    python experiments/bench_probe_verdicts.py --pilots 500 --true -0.25
    python experiments/bench_probe_verdicts.py --pilots 2000 --true -0.25 --questions 12 --world tied

``--world tied``: the pilots of :mod:`opro.testing.score_worlds`'s tied world instead (identical scores
on most questions, 2-3 points lower on a share of them so that the mean is ``--true``).

On the code before issue 61 (``git checkout a16dfea -- opro``, this script kept) it measures the
earlier rules: inert within the confirmable gain, and "cheaper and not worse" for any cheaper contrast
called inert.

Prints the verdicts' counts and how many pilots the recommendation named the contrast "cheaper and
not worse" in (under issue 61: only where the pilot's non-inferiority test at the margin passes).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import random
import statistics

import numpy as np

from opro.probe.effects import ALPHA, SCALE, Effect
from opro.probe.recommendation import recommend
from opro.probe.verdicts import verdict_of
from opro.stats.betting import bound
from opro.testing.score_worlds import tied_pairs


def pilot(seed: int, *, n: int, true: float) -> tuple[list[float], list[float]]:
    """The initial configuration's and the contrast's scores on ``n`` questions (``true``: the mean difference)."""
    rng = random.Random(seed)
    # -2: 0.1, +1: 0.1, then -1 and 0 share 0.8 so that the mean is ``true``: -0.2 - p(-1) + 0.1 = true.
    minus_one = min(0.8, max(0.0, -0.1 - true))
    base = [rng.choice((3.0, 4.0)) for _ in range(n)]
    d = rng.choices((-2, -1, 0, 1), weights=(0.1, minus_one, 0.8 - minus_one, 0.1), k=n)
    return base, [b + x for b, x in zip(base, d, strict=True)]


def tied_pilot(seed: int, *, n: int, true: float) -> tuple[list[float], list[float]]:
    """A pilot of the tied world: (the initial configuration's scores, the contrast's)."""
    worse, base = tied_pairs(np.random.default_rng(seed), (n,), effect=true)
    return base.tolist(), worse.tolist()


def judged(seed: int, *, n: int, true: float, band: float, margin: float, detectable: float,
           world: str = "steps") -> tuple[str, bool]:
    """One pilot's verdict of the contrast, and whether the recommendation named it cheaper and not worse."""
    base, worse = (tied_pilot if world == "tied" else pilot)(seed, n=n, true=true)
    c = bound([x - y for x, y in zip(worse, base, strict=True)], scale=SCALE, alpha=ALPHA, planned=n)
    e = Effect(label="cheaper", dimension="top_k", value=1, instruction="", demos=0, settings={}, n=n,
               mean=statistics.fmean(worse), scores=tuple(worse), difference=c.mean,
               low=c.low, high=c.high, p=c.p, cost=60.0)
    e = dataclasses.replace(e, verdict=verdict_of(e, inert_within=band, detectable=detectable))
    initial = Effect(label="initial", dimension="initial", value=None, instruction="", demos=0, settings={}, n=n,
                     mean=statistics.fmean(base), scores=tuple(base), cost=100.0)
    # The earlier recommend (before issue 61) took neither: run on it, this measures the earlier rule.
    tested = {"band": band, "margin": margin} if "margin" in inspect.signature(recommend).parameters else {}
    rec = recommend([e], initial=initial, detectable=detectable, objective="cost", probed_space=True, questions=n,
                    **tested)
    return e.verdict.kind, any("cheaper and not worse" in line for line in rec.lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pilots", type=int, default=500)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--true", type=float, default=-0.4)
    parser.add_argument("--margin", type=float, default=0.25, help="the inert band and the non-inferiority margin")
    parser.add_argument("--detectable", type=float, default=0.6, help="the gain the validation stage confirms")
    parser.add_argument("--world", choices=("steps", "tied"), default="steps",
                        help="steps: differences of -2, -1, 0, +1 (above); tied: the tied world")
    args = parser.parse_args()
    kinds: dict[str, int] = {}
    named = 0
    for seed in range(args.pilots):
        kind, cheaper = judged(seed, n=args.questions, true=args.true, band=args.margin, margin=args.margin,
                               detectable=args.detectable, world=args.world)
        kinds[kind] = kinds.get(kind, 0) + 1
        named += cheaper
    shown = ", ".join(f"{k} {v} ({v / args.pilots:.3f})" for k, v in sorted(kinds.items()))
    print(f"{args.pilots} pilots of {args.questions} questions ({args.world} world), true difference {args.true:+.2f}, band and margin "
          f"{args.margin:g}, detectable {args.detectable:+.2f}: {shown}; named cheaper and not worse in {named} "
          f"({named / args.pilots:.3f})")


if __name__ == "__main__":
    main()
