"""Does the interval of a relative saving cover the true saving? (issue 57, item 5)

The validation stage (``objective = "cost"``) and ``opro compare`` report how much cheaper a
configuration is per answer as a share of the initial one's cost, paired on the same questions. The
interval they printed divided the t interval of the mean difference by the initial configuration's
mean cost, taken as known. This script measures its coverage against Fieller's interval for a ratio
of paired means (:func:`opro.stats.ratio.saving_interval`) in two worlds of per-answer costs that vary
by question (the context retrieved, the answer's length):

- ``constant``: the cheaper configuration saves about the same number of tokens on every question
  (a shorter instruction, one passage fewer of a fixed size);
- ``proportional``: it saves about the same share of each question's cost (shorter answers).

Each answer's cost also has its own noise (sampling). No LLM is called.

    python experiments/bench_saving.py --sims 4000
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from opro.stats.ratio import saving_interval
from opro.testing.cost_worlds import costs, first_order, true_saving


def coverage(*, sims: int, sizes: tuple[int, ...] = (10, 20, 44, 64), seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    rows = []
    for cut in ("constant", "proportional"):
        truth = true_saving(cut)  # type: ignore[arg-type]
        for n in sizes:
            new, old = costs(rng, sims=sims, n=n, cut=cut)  # type: ignore[arg-type]
            row: dict[str, Any] = {"cut": cut, "n": n, "sims": sims, "truth": truth}
            for name, method in (("first order", first_order), ("Fieller", saving_interval)):
                cis = [method(x, y) for x, y in zip(new, old, strict=True)]
                row[name] = float(np.mean([ci is not None and ci[0] <= truth <= ci[1] for ci in cis]))
                row[f"{name} width"] = float(np.mean([ci[1] - ci[0] for ci in cis if ci is not None]))
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sims", type=int, default=4000)
    args = ap.parse_args(argv)
    rows = coverage(sims=args.sims)
    print(f"coverage of 95% intervals of the share saved, {args.sims} samples per row")
    print("| cut (true saving) | n | first order: covers | width | Fieller: covers | width |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cut']} ({r['truth']:.0%}) | {r['n']} | {r['first order']:.3f} | {r['first order width']:.3f} "
              f"| **{r['Fieller']:.3f}** | {r['Fieller width']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
