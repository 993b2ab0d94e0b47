"""Batch evaluation: answer every example with a RAG program and a prompt template, then judge.

One row per example (query, reference, answer, contexts, judge score, feedback, extra metrics,
tokens, error). An LLM failure on one example becomes an error row instead of ending the run,
up to ``max_errors``. Invalid judge replies are counted and left out of the mean.

The rows, the report and the protocols of what is evaluated live in :mod:`opro.evaluation.rows`
(below :mod:`opro.evaluation.engine`, which produces the rows) and are re-exported here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opro.errors import ConfigError, LLMError
from opro.evaluation.engine import EvaluationEngine, Pair, Scored, role_limit
from opro.evaluation.rows import (
    EvaluationReport,
    EvaluationRow,
    ExtraMetric,
    Judge,
    Program,
    QAExample,
)
from opro.judges.metrics import metric_name
from opro.progress import progress_bar

if TYPE_CHECKING:
    from opro.program.prompts import QATemplate


def _concurrency(workers: int | None, *parts: Any) -> int:
    limits = []
    for part in parts:
        client = getattr(part, "llm", None)
        backend = getattr(client, "llm", None)
        limit = getattr(backend, "max_concurrency", None)
        if isinstance(limit, int) and limit > 0:
            limits.append(limit)
    cap = min(limits) if limits else 1
    return max(1, min(workers, cap) if workers else cap)


def evaluate_examples(
    *,
    program: Program,
    template: QATemplate,
    examples: Sequence[Any],
    judge: Judge,
    extra_metrics: Sequence[ExtraMetric] = (),
    workers: int | None = None,
    max_errors: int | None = None,
    progress: bool = True,
) -> EvaluationReport:
    """Answer each example with ``program`` under ``template``, then judge the answer.

    Answers up to ``min(workers, task backend max_concurrency)`` examples at once and judges up to
    ``min(workers, judge backend max_concurrency)`` (an in-process model reports 1), a judgment
    starting as soon as its answer exists. An :class:`~opro.errors.LLMError` on one example becomes
    an error row; more than ``max_errors`` such rows (``None``: no limit) stop the run with an
    LLMError, as does every example failing.
    """
    return evaluate_templates(
        program=program, templates=[template], examples=examples, judge=judge, extra_metrics=extra_metrics,
        workers=workers, max_errors=max_errors, progress=progress,
    )[0]


def evaluate_templates(
    *,
    program: Program,
    templates: Sequence[QATemplate],
    examples: Sequence[Any],
    judge: Judge,
    extra_metrics: Sequence[ExtraMetric] = (),
    workers: int | None = None,
    max_errors: int | None = None,
    progress: bool = True,
    batch: bool = True,
) -> list[EvaluationReport]:
    """:func:`evaluate_examples` for several templates on the same examples, all pairs in one stream
    (question-major, so consecutive answers share their retrieved context); one report per template.
    ``max_errors`` counts per template. ``batch=False``: no answer is decoded in a batch with another
    template's (an embedded model's batched sums differ slightly, and a long greedy answer can part
    from the lone one), so each template's answers do not depend on the templates beside it."""
    if max_errors is not None and max_errors < 0:
        raise ConfigError(f"max_errors={max_errors} must be >= 0 (or None for no limit)")
    items = list(examples)
    judge_name = metric_name(judge)
    metric_cap = min((role_limit(m, default=10**9) for m in extra_metrics), default=10**9)
    task_slots = _concurrency(workers, program)
    judge_slots = min(_concurrency(workers, judge), metric_cap)
    started = time.perf_counter()
    rows: list[list[EvaluationRow | None]] = [[None] * len(items) for _ in templates]
    errors = [0] * len(templates)
    pairs = [Pair(key=t, index=i, template=tpl, example=ex) for i, ex in enumerate(items) for t, tpl in enumerate(templates)]

    with progress_bar(f"evaluating ({judge_name})", total=len(pairs), enabled=progress) as bar:

        def record(scored: Scored) -> None:
            t, row = int(scored.pair.key), scored.row  # type: ignore[call-overload]
            rows[t][scored.pair.index] = row
            bar.advance()
            if row.error is not None:
                errors[t] += 1
                if max_errors is not None and errors[t] > max_errors:
                    raise LLMError(
                        f"evaluation stopped: {errors[t]} examples failed, more than max_errors={max_errors}; "
                        f"last error on {row.query[:80]!r}: {row.error}"
                    )

        with EvaluationEngine(
            program=program, judge=judge, metrics=extra_metrics, task_slots=task_slots, judge_slots=judge_slots,
            batch=batch,
        ) as engine:
            engine.run(pairs, on_scored=record)

    wall_s = time.perf_counter() - started
    reports = []
    for per_template in rows:
        done = tuple(r for r in per_template if r is not None)
        if done and all(r.error is not None for r in done):
            raise LLMError(f"evaluation failed: all {len(done)} examples failed; first error: {done[0].error}")
        reports.append(EvaluationReport(rows=done, judge=judge_name, wall_s=wall_s))
    return reports


__all__ = [
    "EvaluationReport",
    "EvaluationRow",
    "ExtraMetric",
    "Judge",
    "Program",
    "QAExample",
    "evaluate_examples",
    "evaluate_templates",
]
