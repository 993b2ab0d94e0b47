"""The contract every proposer of the registry (:data:`opro.search.PROPOSERS`) keeps, on a scripted
optimizer whose replies repeat the history, come back empty or run over the length limit by the sample's
seed: usable new instructions, each rejected reply reported with its reason, the same proposal for the
same seed. A proposer registered in ``PROPOSERS`` (a plug-in's too) is covered by importing the tests::

    from opro.testing.proposer_contract import *  # noqa: F403
"""

from __future__ import annotations

from typing import Any

import pytest

from opro.config import OptimizerSection
from opro.experiment.settings import proposer_settings
from opro.llm import ChatClient, GenerationOptions, Message
from opro.llm.scripted import ScriptedLLM
from opro.search import PROPOSERS, CandidateScorer, make_proposer
from opro.search.metaprompt import Exemplar, normalize_instruction
from opro.search.proposers import Proposal, ProposalContext
from opro.search.results import CandidateRecord
from opro.testing.worlds import (
    EchoProgram,
    KeywordJudge,
    TextTemplate,
    keyword_judge_reply,
    keyword_task_reply,
)

INITIAL = "Answer the question."
MAX_CHARS = 200


def optimizer_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """By the sample's seed: a repeat of the history, an empty reply, one over the length limit, or a
    new instruction (the same one for the same seed and prompt)."""
    i = options.seed or 0
    if i % 5 == 0:
        return f"<INS>{INITIAL}</INS>"
    if i % 5 == 1:
        return ""
    if i % 5 == 2:
        return "<INS>" + "Be long. " * 60 + "</INS>"
    prompt = messages[-1].content
    return f"<INS>Use the context ({i}, {len(prompt) % 97}).</INS>"


def _history() -> list[CandidateRecord]:
    return [
        CandidateRecord(step=0, instruction=INITIAL, score=2.0, n_scored=2, n_invalid=0, n_errors=0,
                        status="complete", trial_number=0, scores=(2.0, 2.0)),
        CandidateRecord(step=0, instruction="Cite sources.", score=3.0, n_scored=2, n_invalid=0, n_errors=0,
                        status="complete", trial_number=1, scores=(3.0, 3.0), index=1),
    ]


def propose(name: str, *, seed: int = 0, k: int = 4) -> tuple[Proposal, list[str], Any]:
    settings = OptimizerSection(proposer=name, exemplars=2, max_instruction_chars=MAX_CHARS)
    optimizer = ScriptedLLM(default=optimizer_reply)
    proposer = make_proposer(settings=proposer_settings(settings), llm=ChatClient(optimizer, role="optimizer", seed=seed),
                             template_text="<INS>\nQuery: {query_str}", seed=seed)
    # The keyword world's judge is a double with what the scorer reads of a verdict (score, invalid).
    judge = KeywordJudge(ChatClient(ScriptedLLM(default=keyword_judge_reply), role="judge"))
    scorer = CandidateScorer(program=EchoProgram(ChatClient(ScriptedLLM(default=keyword_task_reply), role="task")),
                             judge=judge, template=TextTemplate(""))  # type: ignore[arg-type]
    prompts: list[str] = []
    context = ProposalContext(step=1, history=_history(), k=k, n_questions=2,
                              exemplars=[Exemplar(f"question {i}?", f"ref{i}") for i in range(4)],
                              scorer=scorer, sample=proposer.ask, on_prompt=prompts.append)
    return proposer.propose(context), prompts, optimizer


@pytest.fixture(params=sorted(PROPOSERS))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_proposer_returns_usable_new_instructions(name: str) -> None:
    proposal, prompts, optimizer = propose(name)
    assert proposal.accepted, proposal
    assert len(proposal.accepted) <= 4
    seen = {normalize_instruction(r.instruction) for r in _history()}
    normalized = [normalize_instruction(a) for a in proposal.accepted]
    assert len(set(normalized)) == len(normalized) and not set(normalized) & seen
    assert all(a.strip() and len(a) <= MAX_CHARS and "<INS>" not in a for a in proposal.accepted)
    # Every prompt sent to the optimizer was shown (the run directory keeps them), and only those.
    assert prompts and {messages[-1].content for messages, _ in optimizer.calls} <= set(prompts)


def test_a_proposer_reports_the_replies_it_rejected_with_a_reason(name: str) -> None:
    proposal, _, _ = propose(name)
    assert proposal.rejected, proposal
    assert all(set(r) >= {"instruction", "reason"} and r["reason"] for r in proposal.rejected)
    # The repeat of the history, the empty reply and the over-long one: three kinds of reason.
    assert len({r["reason"] for r in proposal.rejected}) >= 3, proposal.rejected


@pytest.mark.parametrize("seed", [0, 7])
def test_a_proposer_proposes_the_same_for_the_same_seed(name: str, seed: int) -> None:
    first, first_prompts, _ = propose(name, seed=seed)
    again, again_prompts, _ = propose(name, seed=seed)
    assert (first.accepted, first.rejected, first_prompts) == (again.accepted, again.rejected, again_prompts)


__all__ = [
    "name",
    "propose",
    "test_a_proposer_proposes_the_same_for_the_same_seed",
    "test_a_proposer_reports_the_replies_it_rejected_with_a_reason",
    "test_a_proposer_returns_usable_new_instructions",
]
