"""The proposer seam: what a proposal strategy reads and what it returns.

A proposer reads the search so far (every candidate with its scores) and can ask for per-question
answers with the judge's feedback (through the scorer; calls the search made come from the cache);
it returns candidate instructions. The OPRO meta-prompt is one proposer; others plug in beside it
(as GEPA's ``instruction_proposer`` does in DSPy): subclass :class:`SamplingProposer`, write
``propose``, and add one line to the registry in :mod:`opro.search.proposers`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from opro.evaluation.batch import QAExample
from opro.llm.client import ChatClient, Request
from opro.search.metaprompt import Exemplar, check_candidate, extract_candidate, normalize_instruction
from opro.search.results import CandidateRecord
from opro.search.scoring import CandidateScorer

#: Asks for one sample of ``prompt`` per index, shared with the other workers of the study; texts in order.
Sample = Callable[[str, Sequence[int]], list[str]]


@dataclass(frozen=True)
class ProposalContext:
    """What a proposer may read at one step."""

    step: int
    #: Every finished candidate so far, in (step, proposal index) order.
    history: Sequence[CandidateRecord]
    #: How many candidates the step wants.
    k: int
    #: Questions each candidate is scored on (the optimization split's size).
    n_questions: int
    #: The exemplar split: the only questions a proposer may show the optimizer LLM.
    exemplars: Sequence[Exemplar]
    #: Answers and judges questions under an instruction (cached), for feedback.
    scorer: CandidateScorer
    #: The step's first samples, dealt among the live workers.
    sample: Sample
    #: Called with every prompt sent to the optimizer LLM (the run directory keeps them).
    on_prompt: Callable[[str], None] = lambda text: None

    def best(self) -> CandidateRecord | None:
        """The best complete candidate so far (ties to the earlier step, then the lower index)."""
        complete = [r for r in self.history if r.status == "complete" and r.score is not None]
        return max(complete, key=lambda r: (r.score, -r.step, -r.index)) if complete else None

    def exemplar_examples(self) -> list[QAExample]:
        return [_Question(e.query, e.answer) for e in self.exemplars]


@dataclass(frozen=True)
class _Question:
    query: str
    reference_answer: str


@dataclass(frozen=True)
class Proposal:
    """A step's candidate instructions, and the samples rejected (repeats, invalid) with reasons."""

    accepted: list[str]
    rejected: list[dict[str, str]] = field(default_factory=list)


class Proposer(Protocol):
    """A proposal strategy. ``ask`` is its sampler (the other workers call it with the lead's prompt)."""

    def ask(self, prompt: str, indices: Sequence[int]) -> list[str]: ...

    def propose(self, context: ProposalContext) -> Proposal: ...


class SamplingProposer:
    """A proposer that samples an optimizer LLM: the sampler and the accept / reject loop they share."""

    def __init__(
        self,
        *,
        llm: ChatClient,
        temperature: float = 1.0,
        max_tokens: int = 300,
        max_instruction_chars: int = 1000,
        answer_format: Literal["ins", "brackets"] = "ins",
    ) -> None:
        self.llm = llm
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_instruction_chars = max_instruction_chars
        self.answer_format = answer_format

    def ask(self, prompt: str, indices: Sequence[int]) -> list[str]:
        """The optimizer's replies to ``prompt`` for these sample indices, asked concurrently."""
        return [c.text for c in self.llm.map([
            Request(prompt, temperature=self.temperature, max_tokens=self.max_tokens, sample_index=i)
            for i in indices
        ])]

    def collect(self, context: ProposalContext, prompt: str) -> Proposal:
        """k samples of ``prompt`` at once, then as many more as were rejected, read in index order:
        the same indices and the same accepted candidates as asking one at a time. A few extra
        samples make up for rejected candidates; bounded so a bad optimizer cannot loop."""
        # A repeat is a wording seen before, whatever the settings it was scored with: a proposer writes
        # wordings, the sampler the settings beside them (the initial instruction with other settings
        # is another candidate, the first moves of step 0, never a proposal).
        seen = {normalize_instruction(r.instruction) for r in context.history}
        accepted: list[str] = []
        rejected: list[dict[str, str]] = []
        k = context.k
        asked = 0
        while len(accepted) < k and asked < 3 * k:
            want = min(k - len(accepted), 3 * k - asked)
            indices = [context.step * 1000 + asked + j for j in range(want)]
            # The first samples are shared with the waiting workers; the few top-ups: this worker alone.
            replies = context.sample(prompt, indices) if asked == 0 else self.ask(prompt, indices)
            asked += want
            for reply in replies:
                verdict = check_candidate(
                    extract_candidate(reply, answer_format=self.answer_format),
                    seen=seen,
                    max_chars=self.max_instruction_chars,
                )
                if verdict.accepted:
                    accepted.append(verdict.instruction)
                    seen.add(normalize_instruction(verdict.instruction))
                else:
                    rejected.append({"instruction": verdict.instruction[:200], "reason": verdict.reason})
        return Proposal(accepted, rejected)


__all__ = ["Proposal", "ProposalContext", "Proposer", "Sample", "SamplingProposer"]
