"""Judges both ways between opro and MLflow: opro's judges as MLflow GenAI scorers (:func:`judge_scorer`),
and MLflow's built-in correctness judge as an opro judge (:func:`mlflow_correctness_judge`, with the
prompt the installed MLflow uses: only tracking/ imports MLflow)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opro.redaction import redact_text

#: The expectation key MLflow's built-in Correctness judge reads the reference answer from.
EXPECTED_RESPONSE = "expected_response"

if TYPE_CHECKING:
    from opro.judges.metrics import Metric
    from opro.judges.mlflow_correctness import MlflowCorrectnessJudge
    from opro.llm import ChatClient


def _feedback(result: Any, *, name: str, source_id: str) -> Any:
    from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Feedback

    source = AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE, source_id=redact_text(source_id) or "opro")
    if result.invalid or result.score is None:
        return Feedback(name=name, source=source, rationale=redact_text(result.feedback) or None,
                        error=AssessmentError(error_code="INVALID_JUDGE_REPLY",
                                              error_message=redact_text(result.invalid_reason or "no score")))
    return Feedback(name=name, value=float(result.score), rationale=redact_text(result.feedback) or None,
                    source=source)


def _first_text(value: Any, keys: Sequence[str]) -> str:
    if isinstance(value, Mapping):
        for k in keys:
            if value.get(k) is not None:
                return str(value[k])
        texts = [v for v in value.values() if isinstance(v, str)]
        return texts[0] if len(texts) == 1 else json.dumps(value, default=str)
    return "" if value is None else str(value)


def _retrieved(trace: Any) -> list[str]:
    """The chunks of a trace's retriever spans (MLflow's Document dicts), in order."""
    out: list[str] = []
    for span in getattr(getattr(trace, "data", None), "spans", None) or []:
        if span.span_type == "RETRIEVER" and isinstance(span.outputs, list):
            out.extend(str(d.get("page_content", "")) for d in span.outputs if isinstance(d, Mapping))
    return out


def judge_scorer(judge: Metric, *, name: str | None = None) -> Any:
    """An opro :class:`~opro.judges.metrics.Metric` (judge or not) as an MLflow scorer:
    ``mlflow.genai.evaluate(data, scorers=[judge_scorer(judge)])``.

    Works with :class:`~opro.judges.CorrectnessJudge` (question, answer, ``expected_response``) and
    with the context judges (:class:`~opro.judges.FaithfulnessJudge`, :class:`~opro.judges.RelevancyJudge`),
    which read the retrieved chunks from the trace's retriever spans. The judge keeps its own client, so
    calls go through opro's call cache: scoring answers opro already judged makes no new LLM call.
    The question is read from ``inputs`` (``question`` or ``query``), the reference from
    ``expectations`` (``expected_response``).
    """
    from mlflow.genai.scorers import scorer

    label = name or str(getattr(judge, "name", type(judge).__name__))
    model = str(getattr(getattr(judge, "llm", None), "model", "") or "")

    def score(inputs: dict[str, Any], outputs: Any, expectations: dict[str, Any] | None = None,
              trace: Any = None) -> Any:
        query = _first_text(inputs, ("question", "query"))
        answer = _first_text(outputs, ("answer", "response", "content"))
        reference = _first_text(expectations or {}, (EXPECTED_RESPONSE, "reference", "reference_answer"))
        result = judge.measure(query=query, answer=answer, reference=reference or None, contexts=_retrieved(trace))
        return _feedback(result, name=label, source_id=model)

    return scorer(score, name=label)


def mlflow_correctness_judge(client: ChatClient) -> MlflowCorrectnessJudge:
    """MLflow's built-in correctness judge (:class:`opro.judges.MlflowCorrectnessJudge`) on ``client``,
    asking with the installed MLflow's own prompt text."""
    from opro.judges.factory import build_mlflow_correctness

    return build_mlflow_correctness(client, prompt=_mlflow_correctness_prompt)


def _mlflow_correctness_prompt(*, request: str, response: str, expected_response: str) -> str:
    from mlflow.genai.judges.prompts.correctness import get_prompt

    return str(get_prompt(request=request, response=response, expected_response=expected_response))


__all__ = ["EXPECTED_RESPONSE", "judge_scorer", "mlflow_correctness_judge"]
