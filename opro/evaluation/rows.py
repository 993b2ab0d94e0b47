"""What an evaluation reads and writes: the protocols of the program, judge and examples it is given,
one :class:`EvaluationRow` per answered question and the :class:`EvaluationReport` over them.

Below both :mod:`opro.evaluation.engine` (which produces the rows) and :mod:`opro.evaluation.batch` (which runs a batch
and returns reports), so that evaluation imports the engine and never the reverse. The names are
re-exported from :mod:`opro.evaluation.batch`, where users import them.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opro.judges.metrics import Metric, MetricResult

if TYPE_CHECKING:
    from opro.program.prompts import QATemplate


class Program(Protocol):
    """What the runner needs from a RAG program (:class:`opro.program.rag.RAGProgram`)."""

    def answer(self, query: str, *, template: QATemplate) -> Any: ...


#: The judge whose score the search maximizes and every evaluation reports: a :class:`~opro.judges.metrics.Metric`
#: like any other (the engine calls its ``measure``).
Judge = Metric


class QAExample(Protocol):
    """What the search and the evaluation read from an example (:class:`opro.data.dataset.Example`)."""

    @property
    def query(self) -> str: ...
    @property
    def reference_answer(self) -> str: ...


# An extra metric: a :class:`~opro.judges.metrics.Metric` (the judges, opro.judges.metrics), or a plain function
# ``fn(*, answer, reference) -> MetricResult`` (see :func:`opro.judges.metrics.as_metric`).
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
    #: The task model that answered (its name as the backend gives it): what prices the answer
    #: (:mod:`opro.program.cost`) where several models answer.
    model: str | None = None

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

    @property
    def metric_names(self) -> list[str]:
        """The extra metrics of the rows, in the order they first appear."""
        return list(dict.fromkeys(k for r in self.rows for k in r.metrics))

    def metric_means(self) -> dict[str, float | None]:
        return {
            name: _mean([v for r in self.rows if r.error is None and (v := r.metrics.get(name)) is not None])
            for name in self.metric_names
        }

    def metric_invalid(self) -> dict[str, int]:
        """Per extra metric, the answered rows whose verdict could not be read (no score)."""
        return {name: sum(1 for r in self.rows if r.error is None and r.metrics.get(name) is None)
                for name in self.metric_names}

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


__all__ = ["EvaluationReport", "EvaluationRow", "ExtraMetric", "Judge", "Program", "QAExample"]
