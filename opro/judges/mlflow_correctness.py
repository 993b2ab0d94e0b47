"""MLflow's built-in correctness judge (``mlflow.genai.judges.is_correct``) as an opro judge.

The judge is MLflow's prompt and its yes / no verdict, asked through an opro client. The prompt text
is MLflow's own: whoever builds the judge hands over the function that writes it
(:func:`opro.tracking.scorers.mlflow_correctness_judge` passes the installed MLflow's), so this module
never imports MLflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from opro.judges.metrics import MetricResult
from opro.judges.parsing import parse_yes_no_verdict
from opro.llm import ChatClient, Message


class CorrectnessPrompt(Protocol):
    """Writes MLflow's correctness prompt (``mlflow.genai.judges.prompts.correctness.get_prompt``)."""

    def __call__(self, *, request: str, response: str, expected_response: str) -> str: ...


_MLFLOW_VERDICT_SCHEMA: dict[str, Any] = {
    "additionalProperties": False,
    "properties": {"rationale": {"type": "string"}, "result": {"enum": ["yes", "no"], "type": "string"}},
    "required": ["rationale", "result"],
    "type": "object",
}


class MlflowCorrectnessJudge:
    """MLflow's built-in correctness judge (``mlflow.genai.judges.is_correct``) as an opro judge.

    Its prompt (MLflow's own text, written by ``prompt``) asks whether the reference answer's
    facts are supported by the answer, and the verdict is yes / no with a rationale. opro reads it as
    5 (yes) or 1 (no) on its 1-5 scale, ``passing`` = yes, so ``opro judge agreement`` can set it
    beside opro's correctness judge (compare pass / fail agreement; a binary judge cannot agree
    exactly with a 1-5 one on 2, 3 or 4).

    The call goes through an opro :class:`~opro.llm.ChatClient` (any configured OpenAI-compatible
    endpoint or embedded model, with opro's cache, retries and key handling) rather than MLflow's
    LiteLLM path, which takes no base URL for a self-hosted server and would reach the network.
    """

    name = "mlflow_correctness"

    def __init__(self, llm: ChatClient, *, prompt: CorrectnessPrompt, max_tokens: int = 256,
                 structured: bool = True) -> None:
        self.llm = llm
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.structured = structured

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"temperature": 0.0, "max_tokens": self.max_tokens}
        if self.structured and self.llm.llm.supports_json_schema:
            options["json_schema"] = _MLFLOW_VERDICT_SCHEMA
        return options

    def messages(self, *, query: str, answer: str, reference: str | None) -> tuple[Message, ...]:
        return (Message("user", self.prompt(request=query, response=answer, expected_response=reference or "")),)

    def evaluate(self, *, query: str, answer: str, reference: str | None) -> MetricResult:
        messages = self.messages(query=query, answer=answer, reference=reference)
        completion = self.llm.complete(messages, **self._options())
        verdict, rationale = parse_yes_no_verdict(completion.text)
        if verdict is None:
            self.llm.forget(messages, **self._options())  # an unreadable reply is asked again on rerun
            return MetricResult.invalid_result(self.name, f"no yes/no result in reply: {completion.text.strip()[:160]!r}",
                                               feedback=completion.text.strip())
        return MetricResult(self.name, 5.0 if verdict else 1.0, verdict, rationale)

    def measure(self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()) -> MetricResult:
        """The :class:`~opro.judges.metrics.Metric` entry point (contexts are not part of MLflow's correctness prompt)."""
        return self.evaluate(query=query, answer=answer, reference=reference)


__all__ = ["CorrectnessPrompt", "MlflowCorrectnessJudge"]
