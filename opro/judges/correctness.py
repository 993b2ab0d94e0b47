"""The correctness judge: scores an answer 1-5 against the reference (the optimization objective).

Its prompt is a :class:`~opro.judges.templates.JudgeTemplate`; its reply is read by
:func:`~opro.judges.parsing.parse_score` (or from the score token's logits). A reply it cannot read
gives an *invalid* :class:`~opro.judges.metrics.MetricResult` with the reason, which evaluation reports
count and leave out of means.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast, get_args

from opro.errors import ConfigError
from opro.judges.metrics import MetricResult
from opro.judges.parsing import (
    SCORE_MAX,
    SCORE_MIN,
    _locate,
    expected_score_from_logprobs,
    score_distribution,
)
from opro.judges.templates import JudgeTemplate, get_template
from opro.judges.withheld import NOT_IN_CONTEXT, requirement_score
from opro.llm import ChatClient, Completion, Message

#: Where the correctness judge reads its score (``[judge].score_from``, ``--score-from``): the one list;
#: :data:`SCORE_SOURCES` and :func:`check_score_from` are read from it.
ScoreFrom = Literal["reply", "logits", "auto"]
SCORE_SOURCES: tuple[ScoreFrom, ...] = get_args(ScoreFrom)


def check_score_from(value: str, *, where: str = "score_from") -> ScoreFrom:
    """``value`` if it is a score source, else :class:`~opro.errors.ConfigError` naming ``where`` (the
    table key or the command-line option): ``--score-from must be reply, logits or auto, got 'x'``."""
    if value not in SCORE_SOURCES:
        choices = f"{', '.join(SCORE_SOURCES[:-1])} or {SCORE_SOURCES[-1]}"
        raise ConfigError(f"{where} must be {choices}, got {value!r}")
    return cast(ScoreFrom, value)


# --- correctness judge -----------------------------------------------------------------------------

_SCORE_ENUM = [1, 2, 3, 4, 5]
#: The logit judge reads the next token after this assistant prefix: the reply the JSON instruction
#: asks for, up to its score (Qwen's tokenizer splits digits, so " 4" is a space then "4").
SCORE_PREFIX = '{"score": '
SCORE_CHOICES: tuple[str, ...] = ("1", "2", "3", "4", "5")
_SCORE_FIRST_INSTRUCTION = (
    'Respond only with a JSON object {"score": <integer 1-5>, "reasoning": "<one or two sentences>"}.'
)


def correctness_schema(*, reasoning_first: bool) -> dict[str, Any]:
    """The JSON schema of a structured correctness verdict.

    Property order is the generation order on grammar-constrained backends, so it matters: the
    score first (fast, survives truncation) or the reasoning first (the score conditioned on it).
    """
    props: dict[str, Any] = {
        "reasoning": {"type": "string"},
        "score": {"enum": _SCORE_ENUM, "type": "integer"},
    }
    order = ["reasoning", "score"] if reasoning_first else ["score", "reasoning"]
    return {
        "additionalProperties": False,
        "properties": {k: props[k] for k in order},
        "required": order,
        "type": "object",
    }


def _not_in_context(reference: str | None) -> bool:
    """A question the corpus cannot answer (:mod:`opro.judges.withheld`): scored by its rule, not by a judge
    call (a small judge cannot be trusted to tell "says so" from "answers anyway")."""
    return reference is not None and reference.strip() == NOT_IN_CONTEXT


def check_scoring(llm: ChatClient, *, score_from: ScoreFrom, min_score_mass: float, where: str) -> None:
    """A judge's ``score_from`` and ``min_score_mass``, checked against its backend (``where``: the judge)."""
    check_score_from(score_from, where=f"{where} score_from")
    if score_from == "logits" and not llm.llm.supports_choice_logprobs:
        raise ConfigError(
            f"judge score_from='logits' needs a backend that reads next-token logits (llamacpp); "
            f"{llm.llm.provider} cannot: use score_from = 'auto' or 'reply'"
        )
    if not 0.0 < min_score_mass <= 1.0:
        raise ConfigError(f"{where} min_score_mass={min_score_mass} must lie in (0, 1]")


class CorrectnessJudge:
    """Scores a generated answer 1-5 against a reference answer; ``passing`` at ``threshold``.

    With ``structured=True`` and a backend that supports JSON schemas, the reply is constrained
    to ``{"score": 1..5, "reasoning": str}`` so it is always parseable. The score comes first by
    default: on the embedded 1.5B judge it separated right from wrong answers as well as
    reasoning-first did, is faster, and a reply cut off by ``max_tokens`` still holds its score
    (see experiments/judge_calibration.py). ``expected_score=True`` asks for the top logprobs of the
    score token and reports the probability-weighted score beside the discrete one.
    """

    name = "correctness"

    def __init__(
        self,
        llm: ChatClient,
        *,
        template: str | Path | JudgeTemplate = "llamaindex",
        threshold: float = 4.0,
        structured: bool = True,
        reasoning_first: bool = False,
        expected_score: bool = False,
        max_tokens: int = 256,
        temperature: float = 0.0,
        score_from: ScoreFrom = "reply",
        min_score_mass: float = 0.5,
    ) -> None:
        if not SCORE_MIN <= threshold <= SCORE_MAX:
            raise ConfigError(f"CorrectnessJudge threshold={threshold} must lie in 1..5 (default 4.0)")
        if max_tokens < 8:
            raise ConfigError(
                f"CorrectnessJudge max_tokens={max_tokens} is too small to hold a verdict; use >= 8"
            )
        self.llm = llm
        self.template = get_template(template)
        self.threshold = threshold
        self.structured = structured
        self.reasoning_first = reasoning_first
        self.expected_score = expected_score
        self.max_tokens = max_tokens
        self.temperature = temperature
        check_scoring(llm, score_from=score_from, min_score_mass=min_score_mass, where="CorrectnessJudge")
        self.score_from = score_from
        self.min_score_mass = min_score_mass

    @property
    def uses_json_schema(self) -> bool:
        return self.structured and self.llm.llm.supports_json_schema

    @property
    def uses_logits(self) -> bool:
        """Whether the score is read from the logits at the score position (no decoding)."""
        return self.score_from == "logits" or (
            self.score_from == "auto" and self.llm.llm.supports_choice_logprobs
        )

    @property
    def method(self) -> str:
        """A short description of how this judge scores, for reports and calibration records."""
        if self.uses_logits:
            return f"{self.template.name}, expected score from logits"
        how = "JSON reply" if self.uses_json_schema else "text reply"
        return f"{self.template.name}, {how}, max_tokens {self.max_tokens}"

    def _json_instruction(self) -> str | None:
        if self.uses_logits:
            return _SCORE_FIRST_INSTRUCTION
        if not self.uses_json_schema:
            return None
        if self.reasoning_first:
            return 'Respond only with a JSON object {"reasoning": "<one or two sentences>", "score": <integer 1-5>}.'
        return _SCORE_FIRST_INSTRUCTION

    def messages(self, *, query: str, answer: str, reference: str | None) -> tuple[Message, ...]:
        """The exact messages sent to the judge (useful to inspect or to cache-warm)."""
        return self.template.render(
            query=query, answer=answer, reference=reference, json_instruction=self._json_instruction()
        )

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.uses_json_schema:
            options["json_schema"] = correctness_schema(reasoning_first=self.reasoning_first)
        if self.expected_score:
            options["top_logprobs"] = 5
        return options

    def _result(self, completion: Completion) -> MetricResult:
        parsed, pos = _locate(completion.text, self.template.output_format)
        if parsed.score is None:
            reason = parsed.reason
            if completion.finish_reason == "length":
                reason += f" (the reply was cut at max_tokens={self.max_tokens})"
            return MetricResult.invalid_result(self.name, reason, feedback=completion.text.strip())
        expected = None
        if self.expected_score:
            expected = expected_score_from_logprobs(completion, pos, parsed.score)
        return MetricResult(
            name=self.name,
            score=parsed.score,
            passing=parsed.score >= self.threshold,
            feedback=parsed.reason,
            invalid=False,
            invalid_reason=None,
            expected_score=expected,
        )

    def _logit_result(self, completion: Completion) -> MetricResult:
        dist = score_distribution(completion)
        mass = sum(dist.values())
        if mass < self.min_score_mass:
            return MetricResult.invalid_result(
                self.name,
                f"the judge put only {mass:.0%} of its next-token probability on the scores 1..5 "
                f"(min_score_mass {self.min_score_mass:.0%})",
            )
        expected = sum(s * p for s, p in dist.items()) / mass
        best = max(dist, key=lambda s: dist[s])
        shown = ", ".join(f"{s}: {p / mass:.2f}" for s, p in sorted(dist.items()))
        return MetricResult(
            name=self.name,
            score=round(expected, 4),
            passing=expected >= self.threshold,
            feedback=f"score read from logits: most likely {best}, expected {expected:.2f} (p {shown})",
            invalid=False,
            invalid_reason=None,
            expected_score=round(expected, 4),
        )

    def _choose_args(self, query: str, answer: str, reference: str | None) -> tuple[tuple[Message, ...], str]:
        return self.messages(query=query, answer=answer, reference=reference), SCORE_PREFIX

    def evaluate(self, *, query: str, answer: str, reference: str | None) -> MetricResult:
        """Judge one answer. LLM errors propagate (the batch runner isolates them per item)."""
        return self.evaluate_with_completion(query=query, answer=answer, reference=reference)[0]

    def evaluate_with_completion(
        self, *, query: str, answer: str, reference: str | None
    ) -> tuple[MetricResult, Completion | None]:
        """Like :meth:`evaluate`, also returning the judge's completion (tokens, latency, cached);
        None when no call was needed."""
        if not answer.strip():
            # Nothing to judge: an empty answer is wrong, not unreadable.
            return MetricResult(self.name, SCORE_MIN, False, "empty answer"), None
        if _not_in_context(reference):
            return requirement_score(answer, name=self.name, threshold=self.threshold), None
        if self.uses_logits:
            messages, prefix = self._choose_args(query, answer, reference)
            completion = self.llm.choose(messages, prefix=prefix, choices=SCORE_CHOICES)
            return self._logit_result(completion), completion
        messages = self.messages(query=query, answer=answer, reference=reference)
        completion = self.llm.complete(messages, **self._options())
        result = self._result(completion)
        if result.invalid:
            self.llm.forget(messages, **self._options())  # an unreadable reply is asked again on rerun
        return result, completion

    async def aevaluate(self, *, query: str, answer: str, reference: str | None) -> MetricResult:
        if not answer.strip():
            return MetricResult(self.name, SCORE_MIN, False, "empty answer")
        if _not_in_context(reference):
            return requirement_score(answer, name=self.name, threshold=self.threshold)
        if self.uses_logits:
            messages, prefix = self._choose_args(query, answer, reference)
            return self._logit_result(await self.llm.achoose(messages, prefix=prefix, choices=SCORE_CHOICES))
        messages = self.messages(query=query, answer=answer, reference=reference)
        completion = await self.llm.acomplete(messages, **self._options())
        result = self._result(completion)
        if result.invalid:
            self.llm.forget(messages, **self._options())
        return result

    def measure(
        self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()
    ) -> MetricResult:
        """Uniform entry point used by :func:`opro.evaluation.batch.evaluate_examples`."""
        return self.evaluate(query=query, answer=answer, reference=reference)



__all__ = ["SCORE_CHOICES", "SCORE_PREFIX", "SCORE_SOURCES", "CorrectnessJudge", "ScoreFrom", "check_score_from", "check_scoring",
           "correctness_schema"]
