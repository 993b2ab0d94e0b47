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

Each answer's cost also has its own noise (sampling). The question's cost is gamma (mean 600, sd 240),
or with ``--sigma`` heavy-tailed: lognormal with that sigma, as context lengths are (issue 67, item 5;
the constant cut is then at most half a question's cost). Beside Fieller's interval: the bootstrap-t
interval of the log ratio, and opro's (:func:`opro.stats.ratio.saving_interval`: Fieller's, or the
bootstrap-t one where the sample's old costs are heavy-tailed, as the share of samples says). No LLM
is called.

    python experiments/bench_saving.py --sims 4000
    python experiments/bench_saving.py --sims 2000 --sigma 0.5 --sigma 1.2
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from opro.stats.ratio import bootstrap_t_ratio, ratio_interval, saving_caveat, saving_interval
from opro.testing.cost_worlds import costs, first_order, true_saving


def _share(ratio: Any) -> Any:
    def interval(new: np.ndarray, old: np.ndarray) -> tuple[float, float] | None:
        r = ratio(new, old)
        return None if r is None else (1.0 - r[1], 1.0 - r[0])
    return interval


METHODS = (("first order", first_order), ("Fieller", _share(ratio_interval)), ("bootstrap-t", _share(bootstrap_t_ratio)),
           ("opro", saving_interval))


def coverage(*, sims: int, sizes: tuple[int, ...] = (10, 20, 44, 64), seed: int = 0,
             sigmas: tuple[float | None, ...] = (None,)) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    rows = []
    for sigma in sigmas:
        for cut in ("constant", "proportional"):
            truth = true_saving(cut, sigma)  # type: ignore[arg-type]
            for n in sizes:
                new, old = costs(rng, sims=sims, n=n, cut=cut, sigma=sigma)  # type: ignore[arg-type]
                row: dict[str, Any] = {"sigma": sigma, "cut": cut, "n": n, "sims": sims, "truth": truth,
                                       "flagged": float(np.mean([bool(saving_caveat(y)) for y in old]))}
                for name, method in METHODS:
                    cis = [method(x, y) for x, y in zip(new, old, strict=True)]
                    row[name] = float(np.mean([ci is not None and ci[0] <= truth <= ci[1] for ci in cis]))
                    row[f"{name} width"] = float(np.mean([ci[1] - ci[0] for ci in cis if ci is not None]))
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sims", type=int, default=4000)
    ap.add_argument("--sigma", type=float, action="append",
                    help="heavy-tailed costs: lognormal with this sigma (repeatable; default: the gamma world)")
    args = ap.parse_args(argv)
    rows = coverage(sims=args.sims, sigmas=tuple(args.sigma or (None,)))
    print(f"coverage of 95% intervals of the share saved (mean width), {args.sims} samples per row; flagged: the "
          "share of samples whose old costs read as heavy-tailed (opro's interval is then the bootstrap-t one)")
    print("| costs | cut (true saving) | n | first order | Fieller | bootstrap-t | opro | flagged |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        world = "gamma (cv 0.4)" if r["sigma"] is None else f"lognormal sigma {r['sigma']:g}"
        cells = " | ".join(f"{r[m]:.3f} ({r[f'{m} width']:.3f})" for m, _ in METHODS[:-1])
        print(f"| {world} | {r['cut']} ({r['truth']:.0%}) | {r['n']} | {cells} | **{r['opro']:.3f}** "
              f"({r['opro width']:.3f}) | {r['flagged']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
