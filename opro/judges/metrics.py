"""Metric results and the non-LLM metrics (token F1, exact match, embedding cosine similarity).

Every metric in opro, LLM judge or not, returns one :class:`MetricResult` so evaluation tables,
reports and the optimizer treat them alike. An *invalid* result (the judge's reply could not be
read) carries ``score=None`` and a reason: it is counted and excluded from means, never read as 0.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from opro.errors import ConfigError


@dataclass(frozen=True)
class MetricResult:
    """The outcome of one metric on one item."""

    name: str
    score: float | None
    passing: bool | None
    feedback: str = ""
    invalid: bool = False
    invalid_reason: str | None = None
    #: Probability-weighted score from the judge's score-token logprobs, when asked and available.
    expected_score: float | None = None

    @classmethod
    def invalid_result(cls, name: str, reason: str, *, feedback: str = "") -> MetricResult:
        return cls(
            name=name, score=None, passing=None, feedback=feedback, invalid=True, invalid_reason=reason
        )


@runtime_checkable
class Metric(Protocol):
    """What every metric is, LLM judge or not: a ``name`` and :meth:`measure`.

    The judges (:mod:`opro.judges`), the reference metrics below and the extra metrics of
    :func:`opro.evaluation.batch.evaluate_examples` all measure one answer through this one call.
    """

    name: str

    def measure(
        self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()
    ) -> MetricResult: ...


class ReferenceMetric(Metric):
    """A metric of the answer against the reference only: ``metric(answer=..., reference=...)``.

    Subclasses set ``name`` and implement :meth:`__call__`; :meth:`measure` calls it.
    """

    name: str = "metric"

    def __call__(self, *, answer: str, reference: str) -> MetricResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def measure(
        self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()
    ) -> MetricResult:
        return self(answer=answer, reference=reference or "")


class FunctionMetric(ReferenceMetric):
    """A plain function ``fn(*, answer, reference) -> MetricResult`` (such as :func:`token_f1`) as a metric."""

    def __init__(self, fn: Callable[..., MetricResult], *, name: str | None = None) -> None:
        self.fn = fn
        self.name = name or str(getattr(fn, "__name__", type(fn).__name__))

    def __call__(self, *, answer: str, reference: str) -> MetricResult:
        return self.fn(answer=answer, reference=reference)


def as_metric(metric: Metric | Callable[..., MetricResult]) -> Metric:
    """``metric`` itself when it has :meth:`Metric.measure`, else the function wrapped as one."""
    if callable(getattr(metric, "measure", None)):
        return metric  # type: ignore[return-value]
    if callable(metric):
        return FunctionMetric(metric)
    raise ConfigError(f"{metric!r:.80} is not a metric: give an object with measure(...) or a function of answer, reference")


def metric_name(metric: object) -> str:
    """The name a metric's scores are reported under: its ``name``, else a function's ``__name__``."""
    return str(getattr(metric, "name", None) or getattr(metric, "__name__", type(metric).__name__))


# --- SQuAD normalization ---------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalization: lowercase, drop punctuation and articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _f1(prediction: str, reference: str) -> float:
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(reference).split()
    if not pred or not ref:
        # SQuAD convention: two empty answers agree, one empty answer scores 0.
        return float(pred == ref)
    common = Counter(pred) & Counter(ref)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred)
    recall = overlap / len(ref)
    return 2 * precision * recall / (precision + recall)


def token_f1(*, answer: str, reference: str, threshold: float = 0.5) -> MetricResult:
    """F1 over the multiset of normalized tokens shared by ``answer`` and ``reference`` (SQuAD)."""
    score = _f1(answer, reference)
    return MetricResult(
        name=TokenF1.name, score=score, passing=score >= threshold, feedback=f"token F1 {score:.3f}"
    )


def exact_match(*, answer: str, reference: str) -> MetricResult:
    """1.0 when the normalized answer equals the normalized reference, else 0.0."""
    score = float(normalize_answer(answer) == normalize_answer(reference))
    return MetricResult(name=ExactMatch.name, score=score, passing=bool(score), feedback="")


def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine of the angle between two vectors; raises ConfigError on a length mismatch or a zero vector."""
    if len(a) != len(b):
        raise ConfigError(
            f"cosine_similarity: vectors differ in length ({len(a)} vs {len(b)}); use one embedder"
        )
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if na == 0.0 or nb == 0.0:
        raise ConfigError("cosine_similarity: a zero vector has no direction; check the embedder's output")
    return dot / (na * nb)


class TokenF1(ReferenceMetric):
    name = "token_f1"

    def __init__(self, *, threshold: float = 0.5) -> None:
        self.threshold = threshold

    def __call__(self, *, answer: str, reference: str) -> MetricResult:
        return token_f1(answer=answer, reference=reference, threshold=self.threshold)


class ExactMatch(ReferenceMetric):
    name = "exact_match"

    def __call__(self, *, answer: str, reference: str) -> MetricResult:
        return exact_match(answer=answer, reference=reference)


Embedder = Callable[[Sequence[str]], Sequence[Sequence[float]]]


class EmbeddingSimilarity(ReferenceMetric):
    """Cosine similarity of answer and reference embeddings.

    ``embedder`` maps a list of texts to a list of vectors (for example a LlamaIndex embedding
    model's ``get_text_embedding_batch``).
    """

    name = "embedding_similarity"

    def __init__(self, embedder: Embedder, *, threshold: float = 0.8) -> None:
        if not callable(embedder):
            raise ConfigError(
                "EmbeddingSimilarity needs an embedder: a callable from a list of texts to vectors"
            )
        self.embedder = embedder
        self.threshold = threshold

    def __call__(self, *, answer: str, reference: str) -> MetricResult:
        if not answer.strip() or not reference.strip():
            return MetricResult.invalid_result(self.name, "empty answer or reference: nothing to embed")
        vectors = list(self.embedder([answer, reference]))
        if len(vectors) != 2:
            raise ConfigError(
                f"EmbeddingSimilarity: the embedder returned {len(vectors)} vectors for 2 texts"
            )
        score = cosine_similarity(vectors[0], vectors[1])
        return MetricResult(
            name=self.name, score=score, passing=score >= self.threshold, feedback=f"cosine {score:.3f}"
        )


__all__ = [
    "Embedder",
    "EmbeddingSimilarity",
    "ExactMatch",
    "FunctionMetric",
    "Metric",
    "MetricResult",
    "ReferenceMetric",
    "TokenF1",
    "as_metric",
    "cosine_similarity",
    "exact_match",
    "metric_name",
    "normalize_answer",
    "token_f1",
]
