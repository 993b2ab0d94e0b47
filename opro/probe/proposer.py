"""The proposer's limits: whether the optimizer LLM writes usable instructions. Three samples of the
search's own meta-prompt, each checked as the search checks a candidate and more (:func:`check_proposal`:
at least three words, not a near copy of the initial instruction, about no single question), and the
one markedly different instruction the probe contrasts (:func:`ask_contrast`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from opro.probe.effects import Effect

if TYPE_CHECKING:
    from opro.experiment import Experiment


#: Proposals asked of the optimizer LLM; at least this share unusable flags it.
N_PROPOSALS = 3
GARBAGE_SHARE = 0.5
CONTRAST_PROMPT = """\
A question-answering assistant answers questions from retrieved context. Its current instruction is:

{initial}

Write one instruction for the same task that is markedly different from the current one: for example, \
it asks for answers of another length or style, or to use the context in another way. Keep it to one or \
two sentences. {answer_format}"""
_ANSWER_FORMATS = {
    "ins": "Reply with the new instruction only, between <INS> and </INS>.",
    "brackets": "Write only the new instruction between square brackets, like [your instruction].",
}


@dataclass(frozen=True)
class ProposalCheck:
    """One reply of the optimizer LLM: the instruction read from it, and whether it is usable."""

    instruction: str
    usable: bool
    reason: str = ""


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'’-]*|\d[\d.,]*\d|\d")
#: A number is specific to a question from two digits on ("2012", "60"); "1" or "3" is anyone's.
_SPECIFIC_NUMBER = re.compile(r"\d[\d.,]*\d")


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _specifics(questions: Sequence[str], *, known: str) -> dict[str, str]:
    """Names and numbers that belong to one question only (capitalized words past a question's first
    word, and numbers), not in ``known`` (the initial instruction and the template): specific -> question."""
    known_words = {w.casefold() for w in _words(known)}
    seen: dict[str, set[int]] = {}
    for i, q in enumerate(questions):
        for j, w in enumerate(_words(q)):
            specific = _SPECIFIC_NUMBER.fullmatch(w) if w[0].isdigit() else j > 0 and w[0].isupper()
            if specific and w.casefold() not in known_words:
                seen.setdefault(w, set()).add(i)
    return {w: questions[next(iter(idx))] for w, idx in seen.items() if len(idx) == 1}


def _copied(instruction: str, questions: Sequence[str], *, n: int = 5) -> str | None:
    """A run of ``n`` words of a question that the instruction repeats, or None."""
    words = [w.casefold() for w in _words(instruction)]
    grams = {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}
    for q in questions:
        qw = [w.casefold() for w in _words(q)]
        for i in range(len(qw) - n + 1):
            if tuple(qw[i:i + n]) in grams:
                return " ".join(_words(q)[i:i + n])
    return None


def check_proposal(reply: str, *, initial: str, questions: Sequence[str], template_text: str = "",
                   max_chars: int = 400, answer_format: Literal["ins", "brackets"] = "ins") -> ProposalCheck:
    """Whether an optimizer reply gives a usable instruction: the search's own checks (one instruction,
    no chat, no template variable, within ``max_chars``, not the initial one), at least three words, not a
    near copy of the initial instruction, and on the task: no name or number that belongs to one of
    ``questions`` and no five words copied from one."""
    from opro.search.metaprompt import check_candidate, extract_candidate, normalize_instruction

    instruction = extract_candidate(reply, answer_format=answer_format)
    verdict = check_candidate(instruction, seen={normalize_instruction(initial)}, max_chars=max_chars)
    if not verdict.accepted:
        reason = "the initial instruction again" if verdict.reason == "duplicate" else verdict.reason
        return ProposalCheck(instruction[:200], False, reason)
    words = _words(instruction)
    if len(words) < 3:
        return ProposalCheck(instruction, False, "fewer than three words: not an instruction")
    a, b = {w.casefold() for w in words}, {w.casefold() for w in _words(initial)}
    if b and len(a & b) / len(a | b) >= 0.9:
        return ProposalCheck(instruction, False, "a near copy of the initial instruction")
    specific = _specifics(questions, known=f"{initial} {template_text}")
    named = next((w for w in words if w in specific), None)
    if named is not None:
        return ProposalCheck(instruction, False, f"about one question: {named!r} is from {specific[named][:80]!r}")
    copied = _copied(instruction, questions)
    if copied is not None:
        return ProposalCheck(instruction, False, f"about one question: it copies {copied!r}")
    return ProposalCheck(instruction, True)


@dataclass(frozen=True)
class ProposerLimits:
    model: str
    proposals: tuple[ProposalCheck, ...]
    unusable_share: float
    #: At least :data:`GARBAGE_SHARE` of the proposals unusable.
    flagged: bool

    def line(self) -> str:
        bad = sum(not p.usable for p in self.proposals)
        head = (f"proposer ({self.model}): {bad} of {len(self.proposals)} proposals unusable "
                f"({self.unusable_share:.0%})")
        if self.flagged:
            return (head + ": this optimizer LLM writes unusable instructions, so a search with it proposes "
                    "little; use a stronger [models.optimizer]")
        return head


def ask_contrast(ask: Callable[[str, Sequence[int]], list[str]], *, initial: str, check: Callable[[str], ProposalCheck],
                  answer_format: str) -> tuple[str | None, list[ProposalCheck]]:
    """A markedly different instruction from the optimizer LLM: up to three samples, the first usable one."""
    prompt = CONTRAST_PROMPT.format(initial=initial or "(no instruction)", answer_format=_ANSWER_FORMATS[answer_format])
    tried = []
    for i in range(3):
        (reply,) = ask(prompt, [900 + i])
        verdict = check(reply)
        tried.append(verdict)
        if verdict.usable:
            return verdict.instruction, tried
    return None, tried


def proposer_limits(exp: Experiment, *, proposer: Any, base: Effect, check: Callable[[str], ProposalCheck],
                     initial_text: str) -> ProposerLimits:
    """Three samples of the search's own meta-prompt (the initial instruction scored on the pilot), checked."""
    from opro.search.metaprompt import Exemplar, ScoredInstruction, draw_exemplars

    cfg = exp.config
    history = [ScoredInstruction(initial_text, base.mean)] if base.mean is not None else []
    exemplars = draw_exemplars([Exemplar(e.query, e.reference_answer) for e in exp.dataset.examples_in("exemplar")],
                               k=cfg.optimizer.exemplars, step=1, seed=cfg.experiment.seed)
    meta = proposer.builder.render(history=history, exemplars=exemplars)
    proposals = tuple(check(r) for r in proposer.ask(meta, list(range(N_PROPOSALS))))
    unusable = sum(not p.usable for p in proposals) / len(proposals)
    return ProposerLimits(model=cfg.models.optimizer.model, proposals=proposals, unusable_share=unusable,
                          flagged=unusable >= GARBAGE_SHARE)


__all__ = ["CONTRAST_PROMPT", "GARBAGE_SHARE", "N_PROPOSALS", "ProposalCheck", "ProposerLimits", "ask_contrast", "check_proposal", "proposer_limits"]
