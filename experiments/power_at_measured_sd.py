"""The validation stage's power at the paired sd measured on history_of_alexnet, per judge mode.

For each paired sd (the plan's default, and what ``experiments/judge_side_by_side.py`` measured on
history_of_alexnet: pointwise, side by side in one order, side by side with both orders averaged) it
simulates the betting design ``opro plan`` simulates (:func:`opro.stats.sequential.claim_rate`,
normal paired differences, the default validation settings: 4 selection questions, 3 looks, futility):

- the power to show a truly equal configuration not worse by 0.25 (``objective = "cost"``);
- the power to claim a true gain of +0.5 (``objective = "quality"``);

at 52 validation questions (the history_of_alexnet experiments' split: 4 selection, 48 confirmation),
at 100, and the fewest validation questions that reach 80% power (bisected, as ``opro plan`` does).

    python experiments/power_at_measured_sd.py [--summary experiments/results/side_by_side_alexnet_summary.json]
    python experiments/power_at_measured_sd.py --only-given --sd "side by side, the cost search's 116 pairs=0.60"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from opro.config import OptimizerSection
from opro.experiment.settings import validation_settings
from opro.probe.plan import DEFAULT_DIFFERENCE_SDS
from opro.probe.sizes import QUALITY_GAIN, questions_needed
from opro.search.settings import ValidationSettings
from opro.search.validation_sizes import confirmation_looks
from opro.stats.sequential import claim_rate

SCALE = (1.0, 5.0)
MARGIN = 0.25


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summary", type=Path, default=Path("experiments/results/side_by_side_alexnet_summary.json"))
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--sizes", default="52,100", help="validation questions (4 of them select)")
    ap.add_argument("--sd", action="append", default=[], metavar="LABEL=SD",
                    help="a paired sd measured elsewhere, e.g. a run's validation stage (repeatable)")
    ap.add_argument("--only-given", action="store_true", help="only the --sd values, not the summary's")
    args = ap.parse_args(argv)
    sds: list[tuple[str, float]] = []
    if not args.only_given:
        measured = json.loads(args.summary.read_text(encoding="utf-8"))
        n_q = measured["n_questions"]
        sds = [
            ("plan default (pointwise)", DEFAULT_DIFFERENCE_SDS["pointwise"]),
            (f"pointwise, measured ({n_q} questions)", measured["paired_sd_pointwise"]),
            (f"side by side, one order, measured ({n_q})", measured["paired_sd_side_by_side_one_order"]),
            (f"side by side, both orders, measured ({n_q})", measured["paired_sd_side_by_side_both_orders"]),
        ]
    for given in args.sd:
        label, _, value = given.rpartition("=")
        try:
            sds.append((label or "given", float(value)))
        except ValueError:
            ap.error(f"--sd {given!r}: give LABEL=SD, the sd a number (e.g. 'validation stage=0.60')")
    sizes = [int(s) for s in args.sizes.split(",")]
    header = ["paired sd", "claim"] + [f"power at {n}" for n in sizes] + ["questions for 0.8"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, sd in sds:
        for objective, claim, gain in (("cost", "cost: equal, margin 0.25", MARGIN),
                                       ("quality", "quality: +0.5", QUALITY_GAIN)):
            design = validation_settings(OptimizerSection(objective=objective, margin=MARGIN))
            rule, selection = design.claim, design.selection_questions

            def looks_of(n: int, design: ValidationSettings = design) -> tuple[int, ...]:
                return confirmation_looks(design, n)

            common = dict(gain=gain, alpha=rule.alpha, sd=sd, scale=SCALE, futility=design.futility,
                          futility_confidence=rule.futility_confidence)
            powers = [claim_rate(looks_of(n - selection), draws=args.draws, **common) for n in sizes]  # type: ignore[arg-type]
            need = questions_needed(looks_of, fewest=1, draws=args.draws, **common)  # type: ignore[arg-type]
            cells = [f"{label} {sd:.2f}", claim, *(f"{p:.3f}" for p in powers),
                     "more than 2,000" if need is None else str(need + selection)]
            print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
