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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opro.errors import ConfigError, DataError, LLMError
from opro.metrics import MetricResult
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


class Judge(Protocol):
    def evaluate(self, *, query: str, answer: str, reference: str | None) -> MetricResult: ...


# An extra metric: an object with ``measure(*, query, answer, reference, contexts)`` (the judges in
# opro.judges), a metric ``__call__(*, answer, reference)`` (opro.metrics), or such a plain callable.
ExtraMetric = Any


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


def _metric_name(metric: ExtraMetric) -> str:
    return str(getattr(metric, "name", None) or getattr(metric, "__name__", type(metric).__name__))


def _run_metric(
    metric: ExtraMetric, *, query: str, answer: str, reference: str, contexts: Sequence[str]
) -> MetricResult:
    measure = getattr(metric, "measure", None)
    if callable(measure):
        result = measure(query=query, answer=answer, reference=reference, contexts=contexts)
    else:
        result = metric(answer=answer, reference=reference)
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

    Runs up to ``min(workers, backend max_concurrency)`` examples at once (an in-process model
    reports 1). An :class:`~opro.errors.LLMError` on one example becomes an error row; more than
    ``max_errors`` such rows (``None``: no limit) stop the run with an LLMError, as does every
    example failing.
    """
    if max_errors is not None and max_errors < 0:
        raise ConfigError(f"max_errors={max_errors} must be >= 0 (or None for no limit)")
    items = list(examples)
    judge_name = _metric_name(judge)
    n_workers = _concurrency(workers, program, judge, *extra_metrics)
    started = time.perf_counter()

    def run(example: Any) -> EvaluationRow:
        query = _field(example, "query")
        reference = _field(example, "reference_answer", "reference")
        try:
            answer = program.answer(query, template=template)
            text = str(answer.text)
            contexts = tuple(_context_text(c) for c in getattr(answer, "contexts", ()))
            completion = getattr(answer, "completion", None)
            verdict = judge.evaluate(query=query, answer=text, reference=reference)
            metrics = {
                _metric_name(m): _run_metric(
                    m, query=query, answer=text, reference=reference, contexts=contexts
                ).score
                for m in extra_metrics
            }
        except LLMError as exc:
            if exc.permanent:
                raise  # a bad key or request fails every example the same way: stop at the first
            return EvaluationRow(query=query, reference=reference, error=f"{type(exc).__name__}: {exc}")
        return EvaluationRow(
            query=query,
            reference=reference,
            answer=text,
            contexts=contexts,
            score=verdict.score,
            passing=verdict.passing,
            invalid=verdict.invalid,
            invalid_reason=verdict.invalid_reason,
            feedback=verdict.feedback,
            expected_score=verdict.expected_score,
            metrics=metrics,
            prompt_tokens=int(getattr(completion, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(completion, "completion_tokens", 0) or 0),
            latency_s=float(getattr(completion, "latency_s", 0.0) or 0.0),
        )

    rows: list[EvaluationRow | None] = [None] * len(items)
    errors = 0
    lock = threading.Lock()

    def record(index: int, row: EvaluationRow) -> None:
        nonlocal errors
        with lock:
            rows[index] = row
            if row.error is not None:
                errors += 1
                if max_errors is not None and errors > max_errors:
                    raise LLMError(
                        f"evaluation stopped: {errors} examples failed, more than max_errors={max_errors}; "
                        f"last error on {row.query[:80]!r}: {row.error}"
                    )

    with progress_bar(f"evaluating ({judge_name})", total=len(items), enabled=progress) as bar:
        if n_workers == 1:
            for i, ex in enumerate(items):
                record(i, run(ex))
                bar.advance()
        else:
            _run_pool(items, run, record, bar.advance, n_workers)

    done = tuple(r for r in rows if r is not None)
    if done and all(r.error is not None for r in done):
        raise LLMError(f"evaluation failed: all {len(done)} examples failed; first error: {done[0].error}")
    return EvaluationReport(rows=done, judge=judge_name, wall_s=time.perf_counter() - started)


def _run_pool(
    items: Sequence[Any],
    run: Callable[[Any], EvaluationRow],
    record: Callable[[int, EvaluationRow], None],
    advance: Callable[[], None],
    n_workers: int,
) -> None:
    # Submit lazily (at most n_workers in flight) so a max_errors stop does not leave a queue behind.
    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        pending: dict[Future[EvaluationRow], int] = {}
        next_index = 0
        try:
            while next_index < len(items) or pending:
                while next_index < len(items) and len(pending) < n_workers:
                    pending[pool.submit(run, items[next_index])] = next_index
                    next_index += 1
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    index = pending.pop(fut)
                    record(index, fut.result())
                    advance()
        finally:
            for fut in pending:
                fut.cancel()


def mean_or_nan(report: EvaluationReport) -> float:
    """The report mean, NaN when nothing was scored (for optimizers that need a float)."""
    return report.mean if report.mean is not None else math.nan


__all__ = ["EvaluationReport", "EvaluationRow", "evaluate_examples", "mean_or_nan"]
