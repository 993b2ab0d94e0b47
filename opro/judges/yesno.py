"""YES/NO judges over the retrieved contexts (faithfulness, relevancy), create-and-refine as
LlamaIndex's evaluators do."""

from __future__ import annotations

import re
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from opro.errors import PromptError
from opro.judges.metrics import MetricResult
from opro.judges.parsing import parse_yes_no
from opro.judges.templates import FAITHFULNESS_EVAL, FAITHFULNESS_REFINE, RELEVANCY_EVAL, RELEVANCY_REFINE
from opro.llm import ChatClient

_VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["YES", "NO"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


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

    A reply without a YES/NO verdict gives an invalid result; LLM errors propagate (the batch
    runner isolates them per item), as they do from the correctness judge.
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
        messages = None
        try:
            messages = next(dialogue)
            while True:
                messages = dialogue.send(self.llm.complete(messages, **self._options()).text)
        except StopIteration as done:
            return self._settled(done.value, messages)

    async def _ajudge(self, query_str: str, contexts: Sequence[str]) -> MetricResult:
        dialogue = self._dialogue(query_str, contexts)
        messages = None
        try:
            messages = next(dialogue)
            while True:
                messages = dialogue.send((await self.llm.acomplete(messages, **self._options())).text)
        except StopIteration as done:
            return self._settled(done.value, messages)

    def _settled(self, result: MetricResult, last: Any) -> MetricResult:
        """An unreadable last reply leaves the call cache, as the correctness judge's does: a rerun
        (once the judge is mended) asks it again instead of showing the cached "n/a"."""
        if result.invalid and last is not None:
            self.llm.forget(last, **self._options())
        return result


class FaithfulnessJudge(_YesNoJudge):
    """Is the answer supported by the retrieved contexts? Score 1.0 (YES) or 0.0 (NO)."""

    name = "faithfulness"
    _eval_template = FAITHFULNESS_EVAL
    _refine_template = FAITHFULNESS_REFINE

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
    _eval_template = RELEVANCY_EVAL
    _refine_template = RELEVANCY_REFINE

    def evaluate(self, *, query: str, answer: str, contexts: Sequence[str]) -> MetricResult:
        return self._judge(f"Question: {query}\nResponse: {answer}", contexts)

    async def aevaluate(self, *, query: str, answer: str, contexts: Sequence[str]) -> MetricResult:
        return await self._ajudge(f"Question: {query}\nResponse: {answer}", contexts)

    def measure(
        self, *, query: str, answer: str, reference: str | None = None, contexts: Sequence[str] = ()
    ) -> MetricResult:
        return self.evaluate(query=query, answer=answer, contexts=contexts)



__all__ = ["FaithfulnessJudge", "RelevancyJudge", "pack_contexts"]
