"""Batch evaluation: answer every example with a RAG program and a prompt template, then judge.

One row per example (query, reference, answer, contexts, judge score, feedback, extra metrics,
tokens, error). An LLM failure on one example becomes an error row instead of ending the run,
up to ``max_errors``. Invalid judge replies are counted and left out of the mean.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opro.errors import ConfigError, DataError, LLMError
from opro.metrics import Metric, MetricResult, as_metric
from opro.progress import progress_bar

if TYPE_CHECKING:
    from opro.prompts import QATemplate


class _Answer(Protocol):
    query: str
    text: str
    contexts: Sequence[Any]
    completion: Any


class Program(Protocol):
    """What the runner needs from a RAG program (:class:`opro.rag.RAGProgram`)."""

    def answer(self, query: str, *, template: QATemplate) -> Any: ...


#: The judge whose score the search maximizes and every evaluation reports: a :class:`~opro.metrics.Metric`
#: like any other (the engine calls its ``measure``).
Judge = Metric


class QAExample(Protocol):
    """What the search and the evaluation read from an example (:class:`opro.dataset.Example`)."""

    @property
    def query(self) -> str: ...
    @property
    def reference_answer(self) -> str: ...


# An extra metric: a :class:`~opro.metrics.Metric` (the judges, opro.metrics), or a plain function
# ``fn(*, answer, reference) -> MetricResult`` (see :func:`opro.metrics.as_metric`).
ExtraMetric = Metric | Callable[..., MetricResult]


@dataclass(frozen=True)
class EvaluationRow:
    query: str
    reference: str
    answer: str = ""
    contexts: tuple[str, ...] = ()
    score: float | None = None
    passing: bool | None = None
    invalid: bool = False
    invalid_reason: str | None = None
    feedback: str = ""
    expected_score: float | None = None
    #: Extra metric scores by metric name (None when that metric's result was invalid).
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None

    @property
    def scored(self) -> bool:
        return self.error is None and not self.invalid and self.score is not None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


@dataclass(frozen=True)
class EvaluationReport:
    rows: tuple[EvaluationRow, ...]
    judge: str = ""
    wall_s: float = 0.0

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def scores(self) -> list[float]:
        return [r.score for r in self.rows if r.scored and r.score is not None]

    @property
    def n_scored(self) -> int:
        return len(self.scores)

    @property
    def n_invalid(self) -> int:
        return sum(1 for r in self.rows if r.error is None and r.invalid)

    @property
    def n_errors(self) -> int:
        return sum(1 for r in self.rows if r.error is not None)

    @property
    def mean(self) -> float | None:
        """Mean judge score over valid scores only (invalid and error rows excluded)."""
        return _mean(self.scores)

    @property
    def mean_expected(self) -> float | None:
        return _mean([r.expected_score for r in self.rows if r.scored and r.expected_score is not None])

    @property
    def pass_rate(self) -> float | None:
        """Share of scored rows that pass the judge threshold."""
        scored = [r for r in self.rows if r.scored]
        return sum(1 for r in scored if r.passing) / len(scored) if scored else None

    def metric_means(self) -> dict[str, float | None]:
        names: list[str] = []
        for r in self.rows:
            names.extend(k for k in r.metrics if k not in names)
        return {
            name: _mean([v for r in self.rows if r.error is None and (v := r.metrics.get(name)) is not None])
            for name in names
        }

    def summary(self) -> str:
        def fmt(x: float | None, digits: int = 3) -> str:
            return "n/a" if x is None else f"{x:.{digits}f}"

        parts = [
            f"mean {fmt(self.mean)} over {self.n_scored}/{self.n} scored",
            f"pass rate {fmt(self.pass_rate)}",
            f"invalid {self.n_invalid}",
            f"errors {self.n_errors}",
        ]
        if self.mean_expected is not None:
            parts.insert(1, f"expected {fmt(self.mean_expected)}")
        parts.extend(f"{name} {fmt(value)}" for name, value in self.metric_means().items())
        return ", ".join(parts)

    def _records(self) -> list[dict[str, Any]]:
        records = []
        for r in self.rows:
            rec = asdict(r)
            rec["contexts"] = list(r.contexts)
            metrics = rec.pop("metrics")
            rec.update({f"metric_{k}": v for k, v in metrics.items()})
            records.append(rec)
        return records

    def to_json(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "judge": self.judge,
            "summary": {
                "n": self.n,
                "n_scored": self.n_scored,
                "n_invalid": self.n_invalid,
                "n_errors": self.n_errors,
                "mean": self.mean,
                "mean_expected": self.mean_expected,
                "pass_rate": self.pass_rate,
                "metric_means": self.metric_means(),
                "wall_s": self.wall_s,
            },
            "rows": self._records(),
        }
        out.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        return out

    def to_csv(self, path: str | Path) -> Path:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        records = self._records()
        fields: list[str] = [f for f in EvaluationRow.__dataclass_fields__ if f != "metrics"]
        for rec in records:
            fields.extend(k for k in rec if k not in fields)
        with out.open("w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            for rec in records:
                rec["contexts"] = json.dumps(rec["contexts"], ensure_ascii=False)
                writer.writerow(rec)
        return out


def _field(example: Any, *names: str) -> str:
    for name in names:
        value = example.get(name) if isinstance(example, Mapping) else getattr(example, name, None)
        if value is not None:
            return str(value)
    raise DataError(f"evaluation example {example!r:.120} has none of the fields {names}")


def _context_text(ctx: Any) -> str:
    return ctx if isinstance(ctx, str) else str(getattr(ctx, "text", ctx))


def _metric_name(metric: Any) -> str:
    return str(getattr(metric, "name", None) or getattr(metric, "__name__", type(metric).__name__))


def _run_metric(
    metric: ExtraMetric, *, query: str, answer: str, reference: str, contexts: Sequence[str]
) -> MetricResult:
    result = as_metric(metric).measure(query=query, answer=answer, reference=reference, contexts=contexts)
    if not isinstance(result, MetricResult):
        raise ConfigError(
            f"extra metric {_metric_name(metric)!r} returned {type(result).__name__}, not MetricResult"
        )
    return result


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
) -> list[EvaluationReport]:
    """:func:`evaluate_examples` for several templates on the same examples, all pairs in one stream
    (question-major, so consecutive answers share their retrieved context); one report per template.
    ``max_errors`` counts per template."""
    from opro.engine import EvaluationEngine, Pair, Scored, role_limit

    if max_errors is not None and max_errors < 0:
        raise ConfigError(f"max_errors={max_errors} must be >= 0 (or None for no limit)")
    items = list(examples)
    judge_name = _metric_name(judge)
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
            program=program, judge=judge, metrics=extra_metrics, task_slots=task_slots, judge_slots=judge_slots
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


def mean_or_nan(report: EvaluationReport) -> float:
    """The report mean, NaN when nothing was scored (for optimizers that need a float)."""
    return report.mean if report.mean is not None else math.nan


__all__ = ["EvaluationReport", "EvaluationRow", "evaluate_examples", "evaluate_templates", "mean_or_nan"]
