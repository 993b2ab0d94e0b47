"""Does the instruction's place in the RAG prompt change answer quality, and what does it cost?

    PYTHONPATH=$PWD python experiments/bench_position.py experiments/history_of_alexnet.toml \
        [--prompt SPEC ...] [--out runs/bench_position]

``[rag].instruction_position = "after"`` puts the instruction after the retrieved context and the
query, so every candidate of a question shares the context as a KV prefix on llama.cpp (prefilled
once, not once per candidate); ``"before"`` (LlamaIndex's layout) puts it first. This runs
``compare_prompts`` on the config's held-out questions under each layout with the same prompts (default:
the config's initial instruction and a second, plainer one), the same models, judge and seed, each
layout in its own output folder with its own cold call cache. Printed: per prompt and pooled over the
prompts, the paired difference of judge scores after - before on the same questions (mean, 95%
bootstrap CI, two-sided Wilcoxon p, wins / ties / losses), and each layout's wall time. A JSON copy
goes to ``<out>/position.json``.

It is a measurement, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from opro.config import load_config
from opro.experiment import Experiment
from opro.heldout.compare import compare_prompts
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.stats.paired import compare_paired

SECOND = "text:Answer the question using only the context above. Be brief and factual."


def _run(config_path: Path, out: Path, position: str, prompts: list[str]) -> tuple[dict[str, list[float | None]], float]:
    config = load_config(config_path)
    out.mkdir(parents=True, exist_ok=False)
    experiment = dataclasses.replace(
        config.experiment, output_dir=str(out.resolve()), cache=True, cache_path=str((out / "calls.sqlite").resolve())
    )
    config = dataclasses.replace(config, experiment=experiment,
                                 rag=dataclasses.replace(config.rag, instruction_position=position))
    exp = Experiment(config, progress=False)
    try:
        started = time.perf_counter()
        report = compare_prompts(experiment=exp, prompts=prompts)
        wall = time.perf_counter() - started
    finally:
        exp.close()
    return {p.spec: list(p.scores) for p in report.prompts}, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("--prompt", action="append", default=None,
                        help=f"a prompt spec (repeatable; default: initial and {SECOND!r})")
    parser.add_argument("--out", type=Path, default=None, help="fresh folder (default runs/bench_position/<time>)")
    args = parser.parse_args()
    prompts = args.prompt or ["initial", SECOND]
    out = args.out or Path("runs/bench_position") / time.strftime("%Y%m%d-%H%M%S")
    load_before = os.getloadavg()
    scores: dict[str, dict[str, list[float | None]]] = {}
    walls: dict[str, float] = {}
    for position in ("before", "after"):
        scores[position], walls[position] = _run(args.config, out / position, position, prompts)
    load_after = os.getloadavg()

    def paired(specs: list[str]) -> tuple[list[float], list[float]]:
        a: list[float] = []
        b: list[float] = []
        for spec in specs:
            for x, y in zip(scores["after"][spec], scores["before"][spec], strict=True):
                if x is not None and y is not None:
                    a.append(x)
                    b.append(y)
        return a, b

    print(f"config {args.config} -> {out}; load average before {load_before[0]:.1f}, after {load_after[0]:.1f}")
    print(f"wall: before {walls['before']:.0f} s, after {walls['after']:.0f} s "
          f"({walls['before'] / walls['after']:.2f}x)")
    print()
    print("| prompt | pairs | before mean | after mean | after - before [95% CI] | Wilcoxon p | W / T / L |")
    print("|---|---|---|---|---|---|---|")
    rows: list[dict[str, Any]] = []
    for label, specs in [*[(spec, [spec]) for spec in scores["before"]], ("pooled", list(scores["before"]))]:
        a, b = paired(specs)
        c = compare_paired(a, b, scale=(SCORE_MIN, SCORE_MAX))
        d, wtl = c.difference, c.win_tie_loss
        rows.append({"prompt": label, "pairs": c.n, "before": c.mean_b, "after": c.mean_a, "difference": d.estimate,
                     "ci": [d.low, d.high], "p": c.wilcoxon.p_value, "wtl": [wtl.wins, wtl.ties, wtl.losses]})
        print(f"| {label[:60]} | {c.n} | {c.mean_b:.2f} | {c.mean_a:.2f} | {d.estimate:+.2f} [{d.low:+.2f}, "
              f"{d.high:+.2f}] | {c.wilcoxon.p_value:.2f} | {wtl.wins} / {wtl.ties} / {wtl.losses} |")
    (out / "position.json").write_text(json.dumps(
        {"config": str(args.config), "prompts": prompts, "walls": walls, "scores": scores, "rows": rows,
         "load_before": load_before, "load_after": load_after}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
