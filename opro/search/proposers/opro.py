"""OPRO's proposer (Yang et al.): a meta-prompt of past instructions with their scores and exemplar
questions; the optimizer LLM writes new instructions."""

from __future__ import annotations

from typing import Literal

from opro.llm.client import ChatClient
from opro.search.exemplars import ExemplarPicker, ExemplarStrategy
from opro.search.metaprompt import MetaPromptBuilder, ScoredInstruction
from opro.search.proposers.base import Proposal, ProposalContext, SamplingProposer
from opro.search.settings import ProposerSettings


class OproProposer(SamplingProposer):
    """The meta-prompt (``builder``) over the history and the exemplars ``picker`` chooses."""

    def __init__(self, *, llm: ChatClient, builder: MetaPromptBuilder, picker: ExemplarPicker, temperature: float = 1.0,
                 max_tokens: int = 300, max_instruction_chars: int = 1000,
                 answer_format: Literal["ins", "brackets"] = "ins") -> None:
        super().__init__(llm=llm, temperature=temperature, max_tokens=max_tokens,
                         max_instruction_chars=max_instruction_chars, answer_format=answer_format)
        self.builder = builder
        self.picker = picker

    def propose(self, context: ProposalContext) -> Proposal:
        # Pruned candidates stay visible with their running mean, marked partial.
        scored = [
            ScoredInstruction(r.instruction, r.score, partial=r.partial, n_scored=len(r.scores),
                              n_total=context.n_questions,
                              answer_tokens=None if r.cost is None else r.cost.completion_tokens)
            for r in context.history
            if r.score is not None and r.status in ("complete", "pruned")
        ]
        best = context.best()
        exemplars = self.picker.pick(
            context.exemplars, step=context.step, best_instruction=None if best is None else best.name,
            scorer=context.scorer.exemplar_outcome,
        )
        meta_prompt = self.builder.render(history=scored, exemplars=exemplars)
        context.on_prompt(meta_prompt)
        return self.collect(context, meta_prompt)


def build(*, llm: ChatClient, settings: ProposerSettings, template_text: str, seed: int) -> OproProposer:
    strategy: ExemplarStrategy = settings.exemplar_strategy
    return OproProposer(
        llm=llm,
        builder=MetaPromptBuilder(template_text=template_text, max_history=settings.max_history,
                                  min_score=settings.min_history_score, score_scale=settings.score_scale,
                                  answer_format=settings.answer_format, show_length=settings.show_length),
        picker=ExemplarPicker(strategy=strategy, k=settings.exemplars, seed=seed),
        temperature=settings.temperature, max_tokens=settings.max_tokens,
        max_instruction_chars=settings.max_instruction_chars, answer_format=settings.answer_format,
    )


__all__ = ["OproProposer", "build"]
