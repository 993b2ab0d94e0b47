"""Side-by-side judge against pointwise on the same pairs of two real configurations (issue 67, item 2).

The task model answers ``--n`` seeded questions of the experiment's dataset with its first initial
instruction at top_k 1 and at top_k 2; the experiment's judge scores every answer pointwise, and the
side-by-side judge (:mod:`opro.judges.sidebyside`, scores read as ``[judge].score_from`` says) scores
each question's two answers in one call, in the seeded order and again swapped. Then the references
against their near misses (:mod:`opro.calibration.nearmiss`, as ``opro judge calibrate`` makes them),
pointwise and side by side (the seeded order only: a near miss is one more pair). Printed and written:

- the paired sd of the differences (top_k 1 minus top_k 2): pointwise, side by side in the seeded
  order, and side by side averaged over both orders;
- order agreement: the share of questions whose preferred configuration (or tie) is the same in both
  orders, and the sd of the order difference (the seeded order's difference minus the swapped one's);
- the near misses' AUC (P(reference scores above its near miss), ties half) in both modes, over all
  pairs (Mann-Whitney, as ``opro judge calibrate`` reports it) and within each question (paired).

    OPRO_CACHE_DIR=/tmp/cache-sbs python experiments/judge_side_by_side.py experiments/history_of_alexnet.toml --n 40

Per question it writes ``experiments/results/side_by_side_alexnet.json`` ({"questions": [{"query",
"reference_contexts", "pointwise": [top_k 1, top_k 2], "side_by_side": [...], "side_by_side_swapped":
[...]}]}) and the summary beside it. Every call goes through the call cache: a warm rerun makes none.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opro.calibration.calibrate import auc
from opro.calibration.nearmiss import NEAR_MISSES, near_misses
from opro.config import load_config
from opro.data.dataset import Example
from opro.experiment import Experiment
from opro.judges import CorrectnessJudge, SideBySideJudge


def _sd(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def _paired_auc(pairs: Sequence[tuple[float, float]]) -> float | None:
    return sum((a > b) + 0.5 * (a == b) for a, b in pairs) / len(pairs) if pairs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/side_by_side_alexnet.json"))
    ap.add_argument("--batch", type=int, default=8, help="questions answered and judged per batch")
    ap.add_argument("--no-near-miss", action="store_true", help="skip the near-miss AUCs")
    args = ap.parse_args(argv)

    config = load_config(args.config)
    if not config.data.dataset:
        print(f"{args.config}: needs a labelled [data].dataset", file=sys.stderr)
        return 2
    exp = Experiment(config)
    try:
        examples = list(exp.dataset.examples)
        order = list(range(len(examples)))
        random.Random(args.seed).shuffle(order)  # a smaller --n is a prefix of a larger one: cached calls reused
        chosen = [examples[i] for i in order[: args.n]]
        misses = near_misses([e.reference_answer for e in chosen], pool=[e.reference_answer for e in examples],
                             seed=args.seed)
        base = exp.template(config.rag.initial_instructions[0])
        pointwise = exp.judge
        sbs = SideBySideJudge(exp.client("judge"), seed=args.seed, both_orders=True, score_from=config.judge.score_from)
        single = SideBySideJudge(exp.client("judge"), seed=args.seed, score_from=config.judge.score_from)
        rows: list[dict[str, Any]] = []
        nm: dict[str, dict[str, list[tuple[float, float]]]] = {k: {"pointwise": [], "side_by_side": []} for k in NEAR_MISSES}
        # In batches, the results written after each: a run cut short leaves its figures so far.
        for start in range(0, len(chosen), args.batch):
            batch = chosen[start : start + args.batch]
            queries = [e.query for e in batch]
            answers = {
                k: [a.text for a in exp.program.answer_many(queries, template=base.with_settings(**{**base.settings, "top_k": k}))]
                for k in (1, 2)
            }
            for i, e in enumerate(batch):
                rows.append(_pair_row(e, (answers[1][i], answers[2][i]), pointwise=pointwise, sbs=sbs))
                print(f"{len(rows)}/{len(chosen)} pointwise {rows[-1]['pointwise']} side by side "
                      f"{rows[-1]['side_by_side']} swapped {rows[-1]['side_by_side_swapped']}", flush=True)
                if not args.no_near_miss:
                    _near_misses(e, misses[start + i], pointwise=pointwise, sbs=single, into=nm)
            summary = _summary(rows, nm, config=str(args.config), judge=pointwise.method, sbs=sbs.method)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"summary": summary, "questions": rows}, indent=1) + "\n", encoding="utf-8")
            args.out.with_name(args.out.stem + "_summary.json").write_text(json.dumps(summary, indent=1) + "\n",
                                                                             encoding="utf-8")
    finally:
        exp.close()
    for key, value in summary.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


def _pair_row(e: Example, answers: tuple[str, str], *, pointwise: CorrectnessJudge, sbs: SideBySideJudge) -> dict[str, Any]:
    p = [pointwise.evaluate(query=e.query, answer=a, reference=e.reference_answer).score for a in answers]
    valid = [s for s in p if s is not None]
    v = sbs.judge(query=e.query, reference=e.reference_answer, first=answers[0], second=answers[1],
                  tie=sum(valid) / len(valid) if valid else None)
    one = list(v.readings[0]) if v.readings else (list(v.scores) if v.identical and v.scores else None)
    two = list(v.readings[1]) if len(v.readings) > 1 else (list(v.scores) if v.identical and v.scores else None)
    return {
        "query": e.query,
        "reference_contexts": list(e.reference_contexts),
        "answers": list(answers),
        "pointwise": p,
        "identical": v.identical,
        "first_shown": "top_k 1" if v.first_as_a else "top_k 2",
        "side_by_side": one,
        "side_by_side_swapped": two,
        "side_by_side_invalid": v.invalid_reason,
        "order_agrees": v.order_agrees,
    }


def _near_misses(e: Example, made: Mapping[str, str], *, pointwise: CorrectnessJudge, sbs: SideBySideJudge,
                 into: dict[str, dict[str, list[tuple[float, float]]]]) -> None:
    """The reference against each of its near misses, pointwise and side by side (seeded order)."""
    ref = pointwise.evaluate(query=e.query, answer=e.reference_answer, reference=e.reference_answer).score
    for kind, text in made.items():
        bad = pointwise.evaluate(query=e.query, answer=text, reference=e.reference_answer).score
        if ref is not None and bad is not None:
            into[kind]["pointwise"].append((ref, bad))
        v = sbs.judge(query=e.query, reference=e.reference_answer, first=e.reference_answer, second=text)
        if v.scores is not None and v.scores[0] is not None and v.scores[1] is not None:
            into[kind]["side_by_side"].append((v.scores[0], v.scores[1]))


def _summary(rows: Sequence[Mapping[str, Any]], nm: Mapping[str, Mapping[str, list[tuple[float, float]]]], *,
             config: str, judge: str, sbs: str) -> dict[str, Any]:
    def diffs(key: str) -> list[float]:
        return [r[key][0] - r[key][1] for r in rows if r[key] is not None and None not in r[key]]

    both = [r for r in rows if r["side_by_side"] is not None and r["side_by_side_swapped"] is not None
            and None not in r["pointwise"] and None not in r["side_by_side"] and None not in r["side_by_side_swapped"]]
    averaged = [((r["side_by_side"][0] + r["side_by_side_swapped"][0])
                 - (r["side_by_side"][1] + r["side_by_side_swapped"][1])) / 2 for r in both]
    order_diff = [(r["side_by_side"][0] - r["side_by_side"][1]) - (r["side_by_side_swapped"][0] - r["side_by_side_swapped"][1])
                  for r in both if not r["identical"]]
    agree = [r["order_agrees"] for r in rows if r["order_agrees"] is not None]
    out: dict[str, Any] = {
        "config": config,
        "n_questions": len(rows),
        "judge": judge,
        "side_by_side": sbs,
        "identical_answers": sum(bool(r["identical"]) for r in rows),
        "pointwise_invalid": sum(None in r["pointwise"] for r in rows),
        "side_by_side_invalid": sum(r["side_by_side_invalid"] is not None for r in rows),
        "pairs_all_valid": len(both),
        "mean_difference_pointwise": statistics.fmean(diffs("pointwise")) if diffs("pointwise") else None,
        "mean_difference_side_by_side": statistics.fmean(averaged) if averaged else None,
        "paired_sd_pointwise": _sd(diffs("pointwise")),
        "paired_sd_pointwise_same_pairs": _sd([r["pointwise"][0] - r["pointwise"][1] for r in both]),
        "paired_sd_side_by_side_one_order": _sd(diffs("side_by_side")),
        "paired_sd_side_by_side_both_orders": _sd(averaged),
        "order_agreement": sum(agree) / len(agree) if agree else None,
        "order_pairs": len(agree),
        "order_difference_sd": _sd(order_diff),
    }
    for kind, modes in nm.items():
        for mode, pairs in modes.items():
            out[f"near_miss_{kind}_{mode}_pairs"] = len(pairs)
            out[f"near_miss_{kind}_{mode}_auc"] = auc([a for a, _ in pairs], [b for _, b in pairs])
            out[f"near_miss_{kind}_{mode}_paired_auc"] = _paired_auc(pairs)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
