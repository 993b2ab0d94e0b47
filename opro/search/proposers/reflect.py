"""A reflective proposer: rewrite the best instruction from the judge's reasons on the questions it fails.

In the spirit of GEPA's reflective mutation: the best instruction so far answers the exemplar
questions (the only split a proposer may show; the calls are cached), and the ones it scores lowest,
with its answer, the reference and the judge's reason, go to the optimizer LLM, which rewrites the
instruction to fix them. Where the best instruction fails none, the prompt says so and asks for a
variant that keeps what works.
"""

from __future__ import annotations

from typing import Literal

from opro.llm.client import ChatClient
from opro.search.proposers.base import Proposal, ProposalContext, SamplingProposer
from opro.search.scoring import QuestionFeedback
from opro.search.settings import ProposerSettings

PROMPT = """You improve the instruction that a question-answering assistant follows when it answers a
question from retrieved context. Its answers are graded from 1 (wrong) to 5 (fully correct) against
a reference answer.

The current instruction{score}:
{open}{instruction}{close}

{failures}
Write one improved instruction that fixes the causes of these failures for questions like them,
without naming these particular questions or answers. Keep it short and general.
Return only the new instruction, between {open} and {close}."""


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ReflectiveProposer(SamplingProposer):
    """``k`` failing exemplar questions of the best instruction, with the judge's reasons, rewritten from."""

    def __init__(self, *, llm: ChatClient, k: int = 3, temperature: float = 1.0, max_tokens: int = 300,
                 max_instruction_chars: int = 1000, answer_format: Literal["ins", "brackets"] = "ins") -> None:
        super().__init__(llm=llm, temperature=temperature, max_tokens=max_tokens,
                         max_instruction_chars=max_instruction_chars, answer_format=answer_format)
        self.k = max(1, k)

    def failures(self, context: ProposalContext, name: str) -> list[QuestionFeedback]:
        """The exemplar questions the candidate ``name`` scores lowest (below 5), lowest first, ties by order."""
        got = context.scorer.feedback(name, context.exemplar_examples())
        ranked = sorted((f for f in got if f.score is not None and f.score < 5), key=lambda f: f.score or 0.0)
        return ranked[: self.k]

    def render(self, *, instruction: str, score: float | None, failures: list[QuestionFeedback]) -> str:
        opening, closing = ("<INS>", "</INS>") if self.answer_format == "ins" else ("[", "]")
        if failures:
            shown = "\n\n".join(
                f"Question: {_clip(f.query, 300)}\nAssistant's answer: {_clip(f.answer, 300)}\n"
                f"Reference answer: {_clip(f.reference, 300)}\nGrade: {f.score:g}. Grader's reason: {_clip(f.reason, 300)}"
                for f in failures
            )
            text = f"Questions it answered poorly:\n\n{shown}\n"
        else:
            text = "It answered every example question well; write a variant that keeps what works.\n"
        return PROMPT.format(score="" if score is None else f" (mean grade {score:.2f})", open=opening,
                             close=closing, instruction=instruction, failures=text)

    def propose(self, context: ProposalContext) -> Proposal:
        best = context.best()
        if best is None:
            return Proposal([])
        prompt = self.render(instruction=best.instruction, score=best.score,
                             failures=self.failures(context, best.name))
        context.on_prompt(prompt)
        return self.collect(context, prompt)


def build(*, llm: ChatClient, settings: ProposerSettings, template_text: str, seed: int) -> ReflectiveProposer:
    return ReflectiveProposer(llm=llm, k=settings.exemplars, temperature=settings.temperature,
                              max_tokens=settings.max_tokens, max_instruction_chars=settings.max_instruction_chars,
                              answer_format=settings.answer_format)


__all__ = ["PROMPT", "ReflectiveProposer", "build"]
