"""Where is the headroom? Each search dimension alone, paired against the initial configuration on
held-out questions, on the real models.

A RAG prompt can only be optimized along a dimension that moves the judge's score. This bench scores,
on the same held-out questions, the initial configuration (the config's first initial instruction,
its retriever's top_k) and each change alone:

* ``none``: no instruction at all (the bare template of LlamaIndex's OPRO notebook);
* ``returned``: the configuration the config's last ``opro optimize`` returned (when it returned
  another one than the initial), whole (wording, demonstrations, settings), and ``returned wording``:
  its instruction alone;
* ``demos-K``: the initial instruction with K worked examples from the exemplar split (question, its
  reference context, else its retrieved one, cut to ``--demo-chars``, its reference answer), each in
  the template's own fields
  before the question (:class:`opro.program.prompts.Demo`), never pasted into the instruction;
* ``top_k-K``: the initial instruction with K retrieved chunks instead of the config's;
* ``chunk_size-N``: the initial instruction over the corpus chunked at N tokens (indexed once, kept);
* ``instruction-N``: the N-th ``--instruction`` in place of the initial one.

With ``[data].not_in_context`` (:mod:`opro.judges.withheld`) a share of the questions cannot be answered
from the corpus: their reference says so and the judge scores them by that requirement's rule.

Held-out questions: the config's held-out split, then the questions in no split that a validation
extension does not reserve (``[optimizer].validation_extension``), up to ``--heldout``: none of them
was seen by a search, chose a demo or was an exemplar. Each change is paired with the initial
configuration by question: mean difference with its 95% interval (Student t on the 1-5 scale, as
``opro compare`` and ``opro probe`` make it), win/tie/loss and the two-sided sign-flip permutation
p-value (the test ``opro compare`` decides by). The measurement is ``opro probe``'s own
(:func:`opro.probe.effects.measure_effects`); this script chooses the questions (held-out, not the probe's
pilot) and the changes.

    python experiments/bench_headroom.py experiments/history_of_alexnet.toml --heldout 40
    python experiments/bench_headroom.py experiments/history_of_alexnet.toml --heldout 40 --task-model qwen2.5-coder-1.5b-instruct

Every call goes through the config's call cache, so a rerun (or a second task model beside the
first) asks only what is new. ``--out FILE`` keeps the rows as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opro.config import OproConfig, load_config
from opro.data.dataset import Example, GoldenDataset
from opro.experiment import Experiment
from opro.judges.withheld import NOT_IN_CONTEXT
from opro.llm.pool import ModelPool
from opro.probe.contrasts import Contrast
from opro.probe.effects import measure_effects
from opro.program.prompts import Demo, QATemplate
from opro.program.retrieval import Retriever
from opro.search.space import reference_demos


def heldout_questions(dataset: GoldenDataset, *, config: OproConfig, n: int) -> tuple[Example, ...]:
    """The held-out split, then the unused questions a validation extension does not reserve."""
    reserved = config.optimizer.validation_extension if config.optimizer.finalists else 0
    return (dataset.examples_in("heldout") + dataset.unused()[reserved:])[:n]


def demos_from(examples: Sequence[Example], *, k: int, chars: int, retriever: Retriever) -> tuple[Demo, ...]:
    """K demonstrations from exemplar questions, as ``[search.space] demo_source = "references"`` draws
    them (:func:`opro.search.space.reference_demos`)."""
    pool = reference_demos(examples, chars=chars, retrieve=lambda q: [c.text for c in retriever.retrieve(q)])
    if len(pool) < k:
        raise SystemExit(f"only {len(pool)} exemplar questions can be demonstrations; asked for {k}: "
                         "give [data.split].exemplar more questions")
    return pool[:k]


def configurations(exp: Experiment, *, demos: Sequence[int], top_ks: Sequence[int], demo_chars: int,
                   instructions: Sequence[str] = (), chunk_sizes: Sequence[int] = ()) -> list[tuple[str, QATemplate]]:
    """(label, template) of the initial configuration and of each change alone (a template carries its
    demonstrations and its settings, as a searched configuration does)."""
    initial = exp.template(exp.config.rag.initial_instructions[0])
    out: list[tuple[str, QATemplate]] = [("initial", initial), ("none", initial.with_instruction(""))]
    out += [(f"instruction-{i + 1}", initial.with_instruction(text)) for i, text in enumerate(instructions)]
    summary = exp.run_dir.summary
    if summary.is_file():
        data = json.loads(summary.read_text(encoding="utf-8"))
        returned = data.get("best_instruction", "")
        if data.get("best_configuration"):
            # The search's returned configuration whole (wording, demonstrations, settings) and its wording alone.
            whole = QATemplate.from_json(data["best_configuration"])
            if whole != initial:
                out.append(("returned", whole))
            if whole.instruction != initial.instruction and (whole.demos or whole.settings):
                out.append(("returned wording", initial.with_instruction(whole.instruction)))
        elif returned and returned.strip() != initial.instruction:
            out.append(("returned", initial.with_instruction(returned)))
    exemplars = exp.dataset.examples_in("exemplar")
    for k in demos:
        shown = demos_from(exemplars, k=k, chars=demo_chars, retriever=exp.retriever)
        out.append((f"demos-{k}", initial.with_demos(shown)))
    out += [(f"top_k-{k}", initial.with_settings(top_k=k)) for k in top_ks if k != exp.config.rag.top_k]
    out += [(f"chunk_size-{n}", initial.with_settings(chunk_size=n)) for n in chunk_sizes if n != exp.config.rag.chunk_size]
    return out


def run(config: OproConfig, *, heldout: int, demos: Sequence[int], top_ks: Sequence[int], demo_chars: int,
        progress: bool, pool: ModelPool | None = None, instructions: Sequence[str] = (),
        chunk_sizes: Sequence[int] = ()) -> dict[str, Any]:
    exp = Experiment(config, pool=pool, progress=progress)
    try:
        questions = heldout_questions(exp.dataset, config=config, n=heldout)
        configs = configurations(exp, demos=demos, top_ks=top_ks, demo_chars=demo_chars, instructions=instructions,
                                 chunk_sizes=chunk_sizes)
        started = time.perf_counter()
        # The probe's own measurement (opro.probe.headroom): one stream, question-major, each change paired with
        # the initial configuration.
        (_, initial), *changes = configs
        effects = measure_effects(program=exp.program, judge=exp.judge, initial=initial, questions=questions,
                                  contrasts=[Contrast(label, t, "bench") for label, t in changes], progress=progress)
        wall_s = time.perf_counter() - started
        unanswerable = [e.reference_answer == NOT_IN_CONTEXT for e in questions]
        rows = []
        for effect in effects:
            scores = list(effect.scores)
            rows.append({
                "configuration": effect.label,
                "instruction": effect.instruction,
                "demos": effect.demos,
                "mean": effect.mean,
                "n": sum(s is not None for s in scores),
                "difference": effect.difference,
                "ci": None if effect.difference is None else [effect.low, effect.high],
                "win_tie_loss": effect.win_tie_loss,
                "p": effect.p,
                "scores": scores,
                # With [data].not_in_context: the mean on the questions the corpus cannot answer, and on the rest.
                **({"mean_not_in_context": _mean([s for s, u in zip(scores, unanswerable, strict=True) if u]),
                    "mean_answerable": _mean([s for s, u in zip(scores, unanswerable, strict=True) if not u])}
                   if any(unanswerable) else {}),
            })
        return {"config": str(config.source), "task_model": config.models.task.model,
                "judge_model": config.models.judge.model, "heldout": len(questions), "wall_s": wall_s,
                "not_in_context": sum(e.reference_answer == NOT_IN_CONTEXT for e in questions),
                "instructions": list(instructions),
                "usage": exp.usage.as_dict(), "rows": rows}
    finally:
        exp.close()


def _mean(scores: Sequence[float | None]) -> float | None:
    valid = [s for s in scores if s is not None]
    return sum(valid) / len(valid) if valid else None


def print_table(result: dict[str, Any]) -> None:
    unanswerable = f" ({result['not_in_context']} not answerable from the corpus)" if result.get("not_in_context") else ""
    print(f"{result['config']}: task {result['task_model']}, judge {result['judge_model']}, "
          f"{result['heldout']} held-out questions{unanswerable}, {result['wall_s'] / 60:.0f} min")
    for i, text in enumerate(result.get("instructions") or (), start=1):
        print(f"instruction-{i}: {text}")
    split = result.get("not_in_context")
    if split:
        print(f"| configuration | mean on the {split} not answerable | mean on the {result['heldout'] - split} answerable |")
        print("|---|---|---|")
        for r in result["rows"]:
            cells = ["n/a" if r.get(k) is None else f"{r[k]:.2f}" for k in ("mean_not_in_context", "mean_answerable")]
            print(f"| {r['configuration']} | {cells[0]} | {cells[1]} |")
        print()
    print("| configuration | held-out mean | difference vs initial, 95% CI | W / T / L | p (sign-flip) |")
    print("|---|---|---|---|---|")
    for r in result["rows"]:
        mean = "n/a" if r["mean"] is None else f"{r['mean']:.2f}"
        if r["difference"] is None:
            print(f"| **{r['configuration']}** | {mean} | (baseline) | | |")
            continue
        lo, hi = r["ci"]
        print(f"| {r['configuration']} | {mean} | {r['difference']:+.2f} [{lo:+.2f}, {hi:+.2f}] "
              f"| {r['win_tie_loss']} | {r['p']:.3g} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--heldout", type=int, default=40, help="held-out questions to score on")
    ap.add_argument("--demos", default="1,2,3", help="numbers of demonstrations, comma-separated ('' for none)")
    ap.add_argument("--top-k", default="1,4", help="retrieved chunks to try, comma-separated ('' for none)")
    ap.add_argument("--chunk-size", default="", help="chunk sizes to try, comma-separated ('' for none)")
    ap.add_argument("--demo-chars", type=int, default=600, help="a demonstration's context is cut to this many characters")
    ap.add_argument("--instruction", action="append", default=[],
                    help="another instruction to score alone (repeatable): instruction-1, instruction-2, ...")
    ap.add_argument("--task-model", help="another task model (e.g. qwen2.5-coder-1.5b-instruct)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    config = load_config(args.config)
    if args.task_model:
        task = dataclasses.replace(config.models.task, model=args.task_model)
        config = dataclasses.replace(config, models=dataclasses.replace(config.models, task=task))
    result = run(config, heldout=args.heldout, demos=[int(k) for k in args.demos.split(",") if k],
                 top_ks=[int(k) for k in args.top_k.split(",") if k], demo_chars=args.demo_chars,
                 progress=not args.no_progress, instructions=args.instruction,
                 chunk_sizes=[int(n) for n in args.chunk_size.split(",") if n])
    print_table(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
