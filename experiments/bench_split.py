"""Time of grouping related questions before a split (every `opro optimize` and `compare` start does it).

``related_groups`` joins questions that are the same after normalization or near-duplicates naming the
same numbers, so that related questions never straddle two splits. It compares every pair of
questions; this script times it on synthetic datasets of growing size (templated questions, many of
them near-duplicates, as generated datasets are) and on the shared AlexNet dataset when present.

    python experiments/bench_split.py --sizes 160,1000,2000

It is a benchmark, not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from opro.data.dataset import Example, load_dataset, related_groups

SHARED = Path(__file__).resolve().parents[2] / "shared/data/history_of_alexnet/rag_dataset.json"
WORDS = ["network", "layer", "image", "training", "dataset", "accuracy", "model", "convolution", "gpu", "paper",
         "author", "year", "result", "error", "top"]


def synthetic(n: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    return [
        Example(
            query=f"What {rng.choice(WORDS)} of the {rng.choice(WORDS)} {rng.choice(WORDS)} did "
                  f"{rng.choice(WORDS)} report in {1990 + i % 30}?",
            reference_answer="a",
        )
        for i in range(n)
    ]


def timed(examples: list[Example], repeats: int) -> tuple[float, int]:
    best, groups = float("inf"), 0
    for _ in range(repeats):
        started = time.perf_counter()
        groups = len(related_groups(examples))
        best = min(best, time.perf_counter() - started)
    return best, groups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="160,1000,2000", help="synthetic dataset sizes")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()
    print(f"| dataset | questions | groups | related_groups s (best of {args.repeats}) |")
    print("|---|---|---|---|")
    if SHARED.exists():
        examples = list(load_dataset(SHARED).examples)
        seconds, groups = timed(examples, args.repeats)
        print(f"| history_of_alexnet | {len(examples)} | {groups} | {seconds:.3f} |")
    for n in (int(s) for s in args.sizes.split(",") if s.strip()):
        seconds, groups = timed(synthetic(n, seed=0), args.repeats)
        print(f"| synthetic | {n} | {groups} | {seconds:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
