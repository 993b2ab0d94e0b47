"""LLM judges: answer correctness (1-5, the optimization objective), faithfulness and relevancy (YES/NO).

Templates (:class:`JudgeTemplate`) are data, kept apart from the parser that reads replies
(:func:`parse_score`). The parser never crashes and never invents a score: a reply it cannot read
gives an *invalid* :class:`~opro.metrics.MetricResult` with the reason, which evaluation reports
count and leave out of means.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from opro.errors import ConfigError, PromptError
from opro.llm import ChatClient, Completion, Message
from opro.metrics import MetricResult

SCORE_MIN = 1.0
SCORE_MAX = 5.0

OutputFormat = Literal["score_first", "result_tag", "score_label", "any"]

# --- built-in templates ----------------------------------------------------------------------------

# LlamaIndex's CorrectnessEvaluator prompt is the library's own object, read at run time (so it stays in
# sync with the installed llama-index-core); see _llamaindex_correctness().

# Absolute grading in the style of Prometheus 2 (feedback, then "[RESULT] N"), in our own words, with
# our correctness rubric. prometheus-eval is not a dependency: its prompt is not copied here.
_PROMETHEUS_SYSTEM = (
    "You are a fair, strict grader. You grade one response against a reference answer and a score rubric, "
    "and you apply the rubric the same way to every response."
)

_PROMETHEUS_USER = """Grade the response to the instruction below.
First write a short feedback that applies the score rubric to the response (not a general opinion), then
give an integer score from 1 to 5. Write the result as: "Feedback: <feedback> [RESULT] <score>".

Instruction: {query}

Response to grade: {generated_answer}

Reference answer (scores 5): {reference_answer}

Score rubric: is the response correct and factual compared with the reference answer?
Score 1: the response answers a different question, contradicts the reference, or gives no answer.
Score 2: the response is on topic but its key facts differ from the reference.
Score 3: the response is partly correct: some key facts of the reference are missing or wrong.
Score 4: the response agrees with the reference, with a minor omission or imprecision.
Score 5: the response states the key facts of the reference and nothing contradicts it.

Feedback: """

# Our short rubric: the two failures a small judge misses ("answers a different question",
# "contradicts the reference") are named as score 1, and the judge is told to compare facts, not
# fluency. Short on purpose: it is paid on every candidate and question.
_RUBRIC_SYSTEM = """You check an answer against the reference answer of a question. Compare facts, not wording or style.
Score from 1 to 5:
5 = states the key facts of the reference; nothing contradicts it.
4 = agrees with the reference but misses a detail or is vague.
3 = partly right: some key facts of the reference are missing or wrong.
2 = on topic, but its key facts differ from the reference.
1 = answers a different question, contradicts the reference, or gives no answer.
A fluent, true-sounding answer that does not answer this question with the reference's facts scores 1."""

_RUBRIC_USER = """Question: {query}

Reference answer: {reference_answer}

Answer to grade: {generated_answer}"""

# One short worked example per score: small judges need anchors (Databricks: GPT-3.5 became usable
# as a judge only with one example per score). Kept short because the embedded judge runs on CPU.
_FEWSHOT_SYSTEM = """You grade answers of a question answering chatbot against a reference answer.
Give an integer score from 1 to 5:
5 = correct and complete: states the key facts of the reference, no mistakes.
4 = correct, but misses a minor detail or is imprecise.
3 = partly correct: some key facts right, others missing or wrong.
2 = on topic but mostly wrong, or misses the key facts.
1 = irrelevant, no answer, or contradicts the reference.

Examples (question: "When was the Eiffel Tower completed and how tall is it?", reference: "It was completed in 1889 and is about 330 metres tall."):
Answer: "Finished in 1889, it stands about 330 m high." -> Score: 5
Answer: "It was completed in 1889 and is roughly 300 metres tall." -> Score: 4
Answer: "It was completed in 1889." -> Score: 3
Answer: "It was completed in 1925 and is 100 metres tall." -> Score: 2
Answer: "Paris is the capital of France." -> Score: 1

Reply with the score on the first line as "Score: N", then one sentence of reasoning."""

_FEWSHOT_USER = """Question: {query}

Reference answer: {reference_answer}

Answer to grade: {generated_answer}"""

PLACEHOLDERS = ("query", "reference_answer", "generated_answer")
_PLACEHOLDER_RE = re.compile(r"\{(query|reference_answer|generated_answer)\}")


def _fill(template: str, values: Mapping[str, str]) -> str:
    # Substitute only our placeholders so templates may contain other braces (JSON examples).
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], template)


@dataclass(frozen=True)
class JudgeTemplate:
    """A correctness-judge prompt: system text, user template, and how the reply is laid out.

    ``user`` uses the placeholders ``{query}``, ``{reference_answer}`` and ``{generated_answer}``.
    ``output_format`` is a parser hint: ``score_first`` (the score is the first line, as in
    LlamaIndex), ``result_tag`` (``[RESULT] N``), ``score_label`` (``Score: N``) or ``any``.
    """

    name: str
    system: str
    user: str
    output_format: OutputFormat = "any"

    def __post_init__(self) -> None:
        if "{generated_answer}" not in self.user and "{generated_answer}" not in self.system:
            raise PromptError(
                f"judge template {self.name!r} has no {{generated_answer}} placeholder: the judge would never "
                "see the answer. Use {query}, {reference_answer} and {generated_answer}."
            )
        if self.output_format not in ("score_first", "result_tag", "score_label", "any"):
            raise PromptError(
                f"judge template {self.name!r}: output_format {self.output_format!r} is not one of "
                "score_first, result_tag, score_label, any"
            )

    def render(
        self, *, query: str, answer: str, reference: str | None, json_instruction: str | None = None
    ) -> tuple[Message, ...]:
        values = {
            "query": query,
            "generated_answer": answer,
            "reference_answer": reference if reference else "(NO REFERENCE ANSWER SUPPLIED)",
        }
        user = _fill(self.user, values)
        if json_instruction:
            user = f"{user.rstrip()}\n\n{json_instruction}"
        messages: list[Message] = []
        if self.system.strip():
            messages.append(Message("system", _fill(self.system, values)))
        messages.append(Message("user", user))
        return tuple(messages)

    @classmethod
    def from_file(cls, path: str | Path) -> JudgeTemplate:
        """Load a template from TOML (keys ``system``, ``user``, optional ``name``, ``output_format``)
        or from a plain text file used as the user template (no system message)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read judge template file {p}: {exc}") from exc
        if p.suffix.lower() == ".toml":
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"judge template {p} is not valid TOML: {exc}") from exc
            unknown = set(data) - {"name", "system", "user", "output_format"}
            if unknown or "user" not in data:
                raise ConfigError(
                    f"judge template {p}: needs key 'user' (and optional 'system', 'name', 'output_format'); "
                    f"unknown keys: {sorted(unknown)}"
                )
            return cls(
                name=str(data.get("name", p.stem)),
                system=str(data.get("system", "")),
                user=str(data["user"]),
                output_format=data.get("output_format", "any"),
            )
        return cls(name=p.stem, system="", user=text, output_format="any")


def _llamaindex_correctness() -> JudgeTemplate:
    """LlamaIndex's CorrectnessEvaluator system and user templates, the library's own strings."""
    from llama_index.core.evaluation import correctness

    return JudgeTemplate(
        "llamaindex", correctness.DEFAULT_SYSTEM_TEMPLATE, correctness.DEFAULT_USER_TEMPLATE, "score_first"
    )


BUILTIN_TEMPLATES: dict[str, JudgeTemplate] = {
    "llamaindex": _llamaindex_correctness(),
    "prometheus": JudgeTemplate("prometheus", _PROMETHEUS_SYSTEM, _PROMETHEUS_USER, "result_tag"),
    "fewshot": JudgeTemplate("fewshot", _FEWSHOT_SYSTEM, _FEWSHOT_USER, "score_label"),
    "rubric": JudgeTemplate("rubric", _RUBRIC_SYSTEM, _RUBRIC_USER, "any"),
}


def get_template(template: str | Path | JudgeTemplate) -> JudgeTemplate:
    """A built-in template by name, a :class:`JudgeTemplate`, or a TOML / text file path."""
    if isinstance(template, JudgeTemplate):
        return template
    if isinstance(template, str) and template in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[template]
    path = Path(template)
    if path.is_file():
        return JudgeTemplate.from_file(path)
    raise ConfigError(
        f"unknown judge template {str(template)!r}: use one of {sorted(BUILTIN_TEMPLATES)} or a path to a "
        ".toml / .txt template file"
    )


# --- score parsing ---------------------------------------------------------------------------------


class ParsedScore(NamedTuple):
    """``score`` in 1..5 or None; ``reason``: the judge's reasoning when valid, why not when invalid."""

    score: float | None
    reason: str


_NUM = r"(\d+(?:\.\d+)?)"
_SCALE = r"(?:\s*(?:/|out\s+of)\s*(\d+(?:\.\d+)?))?"
_RESULT_RE = re.compile(r"\[\s*RESULT\s*\]\s*[:=]?\s*[\(\[]?\s*" + _NUM + _SCALE, re.I)
# "Score: 4", "**Score:** 4", "Final score = 4/5", "Rating: 3": only at a line start, so prose such as
# "a fully correct answer would get a score of 5" is never read as the verdict.
_LABEL_RE = re.compile(
    r"^[\s*_#>`-]*(?:(?:final|overall)\s+)?(?:score|rating|grade)\s*(?:\*\*|__)?\s*(?:[:=]|is)\s*"
    r"(?:\*\*|__)?\s*[\(\[]?\s*" + _NUM + _SCALE,
    re.I | re.M,
)
# A line holding only a number (optionally decorated): "4", "4.0", "**4**", "4/5", "(3)".
_BARE_LINE_RE = re.compile(r"^[\s*_#>`\[\(]*" + _NUM + _SCALE + r"[\s*_`\]\).]*$", re.M)
_JSON_SCORE_RE = re.compile(r"\"score\"\s*:\s*\"?\s*(-?\d+(?:\.\d+)?)")
_FENCE_RE = re.compile(r"^```(?:json)?\s*|\s*```$", re.I)


def _check(value: str, scale: str | None, where: str) -> tuple[float | None, str | None]:
    try:
        score = float(value)
    except ValueError:
        return None, f"score {value!r} ({where}) is not a number"
    if scale is not None and float(scale) != SCORE_MAX:
        return None, f"score {value}/{scale} ({where}) is on a different scale than 1..5"
    if not math.isfinite(score) or not SCORE_MIN <= score <= SCORE_MAX:
        return None, f"score {value} ({where}) is outside 1..5"
    return score, None


def _parse_json(text: str) -> tuple[ParsedScore | None, int]:
    body = _FENCE_RE.sub("", text.strip())
    data: Any = None
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            data = None
    if isinstance(data, dict) and "score" in data:
        reasoning = str(data.get("reasoning") or data.get("feedback") or "")
        raw = data["score"]
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            return ParsedScore(None, f"JSON score {raw!r} is not a number"), -1
        score, why = _check(str(raw).strip(), None, "JSON")
        return (ParsedScore(score, reasoning) if why is None else ParsedScore(None, why)), -1
    # Truncated or malformed JSON ("max_tokens" cut the reasoning): still read the score field. The
    # last key wins here only after _conflict has ruled out two different scores in the reply.
    keys = list(_JSON_SCORE_RE.finditer(text))
    if keys and not _LABEL_RE.search(text) and not _RESULT_RE.search(text):
        m = keys[-1]
        score, why = _check(m.group(1), None, "JSON")
        return (ParsedScore(score, text.strip()) if why is None else ParsedScore(None, why)), m.start(1)
    return None, -1


def _conflict(text: str) -> str | None:
    """Why the reply is invalid when its labelled / JSON-key candidates name two different scores."""
    found: set[float] = set()
    for regex in (_RESULT_RE, _LABEL_RE, _JSON_SCORE_RE):
        for m in regex.finditer(text):
            scale = m.group(2) if regex is not _JSON_SCORE_RE else None
            score, why = _check(m.group(1), scale, "candidate")
            if why is None and score is not None:
                found.add(score)
    if len(found) > 1:
        listed = ", ".join(f"{v:g}" for v in sorted(found))
        return f"reply names different scores ({listed}); not guessing which one is the verdict"
    return None


def _locate(text: str, output_format: OutputFormat = "any") -> tuple[ParsedScore, int]:
    if not text or not text.strip():
        return ParsedScore(None, "empty reply"), -1
    parsed, pos = _parse_json(text)
    if parsed is not None and pos == -1:
        return parsed, pos  # a whole JSON object: its one score field is the verdict
    conflict = _conflict(text)
    if conflict is not None:
        return ParsedScore(None, conflict), -1
    if parsed is not None:
        return parsed, pos
    # Tiers, strongest first; within a tier the last match is the final verdict (reasoning may come
    # before it), except a score-first template whose verdict is its first bare line.
    tiers: list[tuple[str, list[re.Match[str]]]] = [
        ("[RESULT]", list(_RESULT_RE.finditer(text))),
        ("score label", list(_LABEL_RE.finditer(text))),
        ("bare number line", list(_BARE_LINE_RE.finditer(text))),
    ]
    if output_format == "score_first":
        # The template asked for the score on the first line: trust that line over later mentions.
        bare = tiers.pop(2)
        tiers.insert(0, bare)
    for where, matches in tiers:
        if not matches:
            continue
        m = matches[0] if (where == "bare number line" and output_format == "score_first") else matches[-1]
        score, why = _check(m.group(1), m.group(2), where)
        if why is not None:
            return ParsedScore(None, why), m.start(1)
        reasoning = (
            (text[: m.start()] + text[m.end() :]).strip() if where == "bare number line" else text.strip()
        )
        return ParsedScore(score, reasoning), m.start(1)
    return ParsedScore(None, f"no score found in reply: {text.strip()[:160]!r}"), -1


def parse_score(text: str, *, output_format: OutputFormat = "any") -> ParsedScore:
    """Read a 1-5 score from a judge reply; never raises.

    Accepts JSON ``{"score": N, "reasoning": ...}``, ``[RESULT] N``, ``Score: N`` (also markdown
    bold, ``N/5``) at a line start, and a line holding only the number; decimals such as 4.5 are
    kept. Scores mentioned inside prose do not count; a reply whose labels / JSON keys name two
    different scores is invalid rather than guessed. Out-of-range values (0, 7, 8/10) and replies without a
    score give ``ParsedScore(None, reason)``: never a made-up score.
    """
    return _locate(text, output_format)[0]


# --- expected score from logprobs ------------------------------------------------------------------

_DIGITS = {str(i): float(i) for i in range(1, 6)}


def expected_score_from_logprobs(completion: Completion, score_char: int, score: float) -> float | None:
    """Sum of p(s)*s over s in 1..5 at the token that carries the score, renormalized over 1..5.

    The score token is found by rebuilding the reply from the most likely token at each step
    (temperature 0 makes it the emitted one); when that fails, the last step whose top token is
    the chosen score digit is used. Returns None when the backend gave no logprobs.
    """
    steps = completion.top_logprobs
    if not steps:
        return None
    target = str(int(score))
    index: int | None = None
    if score_char >= 0:
        offset = 0
        for i, alternatives in enumerate(steps):
            if not alternatives:
                break
            token = max(alternatives, key=lambda t: alternatives[t])
            if offset <= score_char < offset + len(token):
                index = i
                break
            offset += len(token)
    if index is None or not any(t.strip() in _DIGITS for t in steps[index]):
        candidates = [
            i for i, alt in enumerate(steps) if alt and max(alt, key=lambda t: alt[t]).strip() == target
        ]
        if not candidates:
            return None
        index = candidates[-1]
    probs: dict[float, float] = {}
    for token, logprob in steps[index].items():
        value = _DIGITS.get(token.strip())
        if value is not None:
            probs[value] = probs.get(value, 0.0) + math.exp(logprob)
    total = sum(probs.values())
    if total <= 0.0:
        return None
    return sum(v * p for v, p in probs.items()) / total


def score_distribution(completion: Completion) -> dict[int, float]:
    """``{score: probability}`` over 1..5 from a :meth:`~opro.llm.ChatClient.choose` completion
    (probabilities over the whole vocabulary: they sum to the mass the judge put on a score)."""
    steps = completion.top_logprobs or ()
    if not steps:
        return {}
    out: dict[int, float] = {}
    for token, logprob in steps[0].items():
        value = _DIGITS.get(token.strip())
        if value is not None:
            out[int(value)] = out.get(int(value), 0.0) + math.exp(logprob)
    return out


# --- correctness judge -----------------------------------------------------------------------------

_SCORE_ENUM = [1, 2, 3, 4, 5]
ScoreFrom = Literal["reply", "logits", "auto"]
SCORE_SOURCES: tuple[str, ...] = ("reply", "logits", "auto")
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
        if score_from not in SCORE_SOURCES:
            raise ConfigError(f"CorrectnessJudge score_from={score_from!r} is not one of {', '.join(SCORE_SOURCES)}")
        if score_from == "logits" and not llm.llm.supports_choice_logprobs:
            raise ConfigError(
                f"judge score_from='logits' needs a backend that reads next-token logits (llamacpp); "
                f"{llm.llm.provider} cannot: use score_from = 'auto' or 'reply'"
            )
        if not 0.0 < min_score_mass <= 1.0:
            raise ConfigError(f"CorrectnessJudge min_score_mass={min_score_mass} must lie in (0, 1]")
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
        """Uniform entry point used by :func:`opro.evaluation.evaluate_examples`."""
        return self.evaluate(query=query, answer=answer, reference=reference)


# --- YES/NO judges (faithfulness, relevancy) ----------------------------------------------------------

# LlamaIndex's FaithfulnessEvaluator / RelevancyEvaluator default templates: the library's own
# PromptTemplate texts, read at run time.
def _llamaindex_yes_no_templates() -> tuple[str, str, str, str]:
    from llama_index.core.evaluation import faithfulness, relevancy

    return (
        faithfulness.DEFAULT_EVAL_TEMPLATE.template,
        faithfulness.DEFAULT_REFINE_TEMPLATE.template,
        relevancy.DEFAULT_EVAL_TEMPLATE.template,
        relevancy.DEFAULT_REFINE_TEMPLATE.template,
    )


_FAITHFULNESS_EVAL, _FAITHFULNESS_REFINE, _RELEVANCY_EVAL, _RELEVANCY_REFINE = _llamaindex_yes_no_templates()

# A verdict word counts only where a verdict sits: after a label ("Verdict: NO because ..."), alone or
# followed by punctuation at a line start ("No, the context ..."), or closing a line ("... about it: YES").
# So "No doubt about it: YES" reads YES.
_DECOR = r"[\s*_#>`\"'-]*"
_YES_NO_RES = (
    re.compile(
        r"^" + _DECOR + r"(?:final\s+)?(?:answer|verdict|judge?ment)\s*[:=]" + _DECOR + r"(yes|no)\b",
        re.I | re.M,
    ),
    re.compile(r"^" + _DECOR + r"(yes|no)(?=[*_`\"']*\s*(?:[.,!:;)]|$))", re.I | re.M),
    re.compile(r"\b(yes|no)[*_`\"'.!)\s]*$", re.I | re.M),
)
_VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["YES", "NO"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


def parse_yes_no(text: str) -> bool | None:
    """The YES/NO verdict of a reply (JSON ``{"answer": "YES"}`` too); None when there is none.

    Only anchored verdict words count (see ``_YES_NO_RES``); a reply with both an anchored YES and an
    anchored NO is invalid (None), never guessed.
    """
    body = _FENCE_RE.sub("", text.strip())
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, dict):
            value = str(data.get("answer", data.get("verdict", ""))).strip().lower()
            if value in ("yes", "no"):
                return value == "yes"
    found = {m.group(1).lower() for regex in _YES_NO_RES for m in regex.finditer(text)}
    return None if len(found) != 1 else found == {"yes"}


def _fill_braces(template: str, values: Mapping[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template)


def pack_contexts(contexts: Sequence[str], *, max_chars: int) -> list[str]:
    """Join contexts into as few packs of at most ``max_chars`` as possible (LlamaIndex "compact")."""
    packs: list[str] = []
    current = ""
    for ctx in (c.strip() for c in contexts):
        if not ctx:
            continue
        if current and len(current) + 2 + len(ctx) > max_chars:
            packs.append(current)
            current = ctx
        else:
            current = f"{current}\n\n{ctx}" if current else ctx
    if current:
        packs.append(current)
    return packs


class _YesNoJudge:
    """Create-and-refine YES/NO verdict over the contexts, as LlamaIndex's evaluators do.

    Contexts are packed up to ``max_context_chars`` per call (LlamaIndex's compact mode). The
    first pack gets the evaluation template; each later pack refines the running answer. Once the
    answer is YES the refine template keeps it YES, so the remaining calls are skipped.
    """

    name = "yes_no"
    _eval_template = ""
    _refine_template = ""

    def __init__(
        self,
        llm: ChatClient,
        *,
        structured: bool = True,
        max_tokens: int = 16,
        max_context_chars: int = 6000,
        eval_template: str | None = None,
        refine_template: str | None = None,
    ) -> None:
        self.llm = llm
        self.structured = structured
        self.max_tokens = max_tokens
        self.max_context_chars = max_context_chars
        self.eval_template = eval_template or self._eval_template
        self.refine_template = refine_template or self._refine_template
        for label, tmpl in (("eval_template", self.eval_template), ("refine_template", self.refine_template)):
            if "{query_str}" not in tmpl:
                raise PromptError(f"{type(self).__name__} {label} needs a {{query_str}} placeholder")

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"temperature": 0.0, "max_tokens": self.max_tokens}
        if self.structured and self.llm.llm.supports_json_schema:
            options["json_schema"] = _VERDICT_SCHEMA
            options["max_tokens"] = max(self.max_tokens, 16)
        return options

    def _prompts(self, query_str: str, packs: Sequence[str], verdicts: Sequence[bool]) -> str:
        if not verdicts:
            return _fill_braces(self.eval_template, {"query_str": query_str, "context_str": packs[0]})
        return _fill_braces(
            self.refine_template,
            {
                "query_str": query_str,
                "existing_answer": "YES" if verdicts[-1] else "NO",
                "context_msg": packs[len(verdicts)],
            },
        )

    def _dialogue(self, query_str: str, contexts: Sequence[str]) -> Generator[Any, str, MetricResult]:
        """Create-and-refine as a generator: yields the messages of each call, receives its reply.

        One definition drives both the sync and the async path.
        """
        packs = pack_contexts(contexts, max_chars=self.max_context_chars)
        if not packs:
            return MetricResult.invalid_result(self.name, "no contexts to judge against")
        verdicts: list[bool] = []
        replies: list[str] = []
        for _ in packs:
            text = yield self._prompts(query_str, packs, verdicts)
            verdict = parse_yes_no(text)
            replies.append(text.strip())
            if verdict is None:
                return MetricResult.invalid_result(
                    self.name, f"no YES/NO in reply: {text.strip()[:120]!r}", feedback="\n".join(replies)
                )
            verdicts.append(verdict)
            if verdict:
                break
        passing = verdicts[-1]
        return MetricResult(self.name, 1.0 if passing else 0.0, passing, "\n".join(replies))

    def _judge(self, query_str: str, contexts: Sequence[str]) -> MetricResult:
        dialogue = self._dialogue(query_str, contexts)
        try:
            messages = next(dialogue)
            while True:
                messages = dialogue.send(self.llm.complete(messages, **self._options()).text)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _ajudge(self, query_str: str, contexts: Sequence[str]) -> MetricResult:
        dialogue = self._dialogue(query_str, contexts)
        try:
            messages = next(dialogue)
            while True:
                messages = dialogue.send((await self.llm.acomplete(messages, **self._options())).text)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


class FaithfulnessJudge(_YesNoJudge):
    """Is the answer supported by the retrieved contexts? Score 1.0 (YES) or 0.0 (NO)."""

    name = "faithfulness"
    _eval_template = _FAITHFULNESS_EVAL
    _refine_template = _FAITHFULNESS_REFINE

    def evaluate(self, *, answer: str, contexts: Sequence[str], query: str | None = None) -> MetricResult:
        return self._judge(answer, contexts)

    async def aevaluate(
        self, *, answer: str, contexts: Sequence[str], query: str | None = None
    ) -> MetricResult:
        return await self._ajudge(answer, contexts)

    def measure(
        self, *, query: str, answer: str, reference: str | None = None, contexts: Sequence[str] = ()
    ) -> MetricResult:
        return self.evaluate(answer=answer, contexts=contexts)


class RelevancyJudge(_YesNoJudge):
    """Are the answer and the contexts in line with the query? Score 1.0 (YES) or 0.0 (NO)."""

    name = "relevancy"
    _eval_template = _RELEVANCY_EVAL
    _refine_template = _RELEVANCY_REFINE

    def evaluate(self, *, query: str, answer: str, contexts: Sequence[str]) -> MetricResult:
        return self._judge(f"Question: {query}\nResponse: {answer}", contexts)

    async def aevaluate(self, *, query: str, answer: str, contexts: Sequence[str]) -> MetricResult:
        return await self._ajudge(f"Question: {query}\nResponse: {answer}", contexts)

    def measure(
        self, *, query: str, answer: str, reference: str | None = None, contexts: Sequence[str] = ()
    ) -> MetricResult:
        return self.evaluate(query=query, answer=answer, contexts=contexts)


__all__ = [
    "BUILTIN_TEMPLATES",
    "SCORE_SOURCES",
    "CorrectnessJudge",
    "FaithfulnessJudge",
    "JudgeTemplate",
    "ParsedScore",
    "RelevancyJudge",
    "correctness_schema",
    "expected_score_from_logprobs",
    "get_template",
    "pack_contexts",
    "parse_score",
    "parse_yes_no",
    "score_distribution",
]
