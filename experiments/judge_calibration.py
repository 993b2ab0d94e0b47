"""Judge calibration benchmark: several judge variants on the same questions and answers, side by side.

Each variant is one `opro judge calibrate` (library: :func:`opro.calibration.calibrate.calibrate_experiment`)
on the experiment config with its [judge] table overridden: reference answers vs wrong answers
(another question's reference) vs the task model's RAG answers, AUC, separation, invalid rate,
seconds per uncached call and test-retest. Then the agreement of every variant with the first one on
the same answers (exact, within 1, quadratic weighted kappa), as `opro judge agreement` computes it.

    python experiments/judge_calibration.py experiments/history_of_alexnet.toml --n 40 \\
        --variants "llamaindex:reply:64,llamaindex:logits,rubric:logits" --out /tmp/judge_calibration

A variant is TEMPLATE:SCORE_FROM[:MAX_TOKENS]. Calls go through the config's call cache (set
OPRO_CACHE_DIR for a private one): a warm rerun is free, and then its seconds per call are the
retest repeats' only. Task answers are shared by all variants (same task model and prompt).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from opro.calibration.agreement import agreement
from opro.calibration.calibrate import calibrate_experiment, write_calibration
from opro.config import JudgeSection, load_config
from opro.experiment import Experiment


def _variant(text: str) -> dict[str, object]:
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[1] not in ("reply", "logits", "auto"):
        raise SystemExit(f"variant {text!r}: use TEMPLATE:reply|logits|auto[:MAX_TOKENS]")
    out: dict[str, object] = {"template": parts[0], "score_from": parts[1]}
    if len(parts) == 3:
        out["max_tokens"] = int(parts[2])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="llamaindex:reply:64,llamaindex:logits,rubric:logits")
    ap.add_argument("--conditions", default="reference,wrong,task")
    ap.add_argument("--retest", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/judge_calibration"))
    args = ap.parse_args(argv)

    base = load_config(args.config)
    if not base.data.dataset:
        print(f"{args.config}: calibration needs a labelled [data].dataset", file=sys.stderr)
        return 2
    console = Console(width=160)
    rows = []
    scores: dict[str, dict[tuple[str, int], float | None]] = {}
    for text in [v for v in args.variants.split(",") if v]:
        overrides = _variant(text)
        cfg = dataclasses.replace(
            base,
            judge=JudgeSection(**{**dataclasses.asdict(base.judge), **overrides}),  # type: ignore[arg-type]
            experiment=dataclasses.replace(base.experiment, output_dir=str(args.out / text.replace(":", "-"))),
        )
        exp = Experiment(cfg)
        try:
            report, verdicts = calibrate_experiment(
                exp, n=args.n, seed=args.seed, conditions=args.conditions.split(","), retest=args.retest
            )
        finally:
            exp.close()
        write_calibration(report, verdicts, output_dir=cfg.output_dir)
        scores[text] = {(v.item.condition, v.item.question): v.score for v in verdicts if v.repeat == 0}
        rows.append((text, report))
        console.print(f"{text}: {report.summary()}")

    table = Table(title=f"judge calibration: {args.n} questions of {base.data.dataset} (seed {args.seed})")
    for col in ("variant", "ref mean", "wrong mean", "task mean", "AUC", "sep", "invalid", "s/call",
                "retest sd", "exact vs first", "within-1", "kappa"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    first = rows[0][0]
    summary = []
    for text, report in rows:
        keys = sorted(scores[first])
        agree = agreement([scores[first][k] for k in keys], [scores[text].get(k) for k in keys])

        def f(x: float | None, spec: str = ".2f") -> str:
            return "-" if x is None else format(x, spec)

        means = {c.condition: c.mean for c in report.conditions}
        table.add_row(
            text, f(means.get("reference")), f(means.get("wrong")), f(means.get("task")), f(report.auc, ".3f"),
            f(report.separation), f(report.invalid_rate, ".1%"), f(report.s_per_call),
            f(report.retest.sd if report.retest else None, ".3f"),
            f(agree.exact, ".2f"), f(agree.within_1, ".2f"), f(agree.kappa, ".2f"),
        )
        summary.append({"variant": text, "report": report.to_dict(),
                        "agreement_with_first": dataclasses.asdict(agree)})
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "variants.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    console.print(f"wrote {args.out / 'variants.json'} and one folder per variant")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
