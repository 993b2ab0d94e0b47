"""A task where the prompt matters: questions whose answer the corpus does not hold.

Real RAG prompts are tuned for requirements, and the first of them is to answer only from the
context and say so when it lacks the answer. ``[data].not_in_context = f`` makes a dataset carry
such cases: questions are drawn (seeded) and every chunk that holds their reference context is taken
out of the corpus; each question whose reference context is then no longer in the corpus, drawn or
not, gets :data:`NOT_IN_CONTEXT` as its reference answer, until about ``f`` of the questions have it.
The correctness judge scores those questions by a rule (:func:`requirement_score`): saying that the
context lacks the answer scores 5, answering anyway scores 1. An instruction that makes the model
say so, or a demonstration that shows it, can then make a measurable difference.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from opro.judges.metrics import MetricResult

#: The reference answer of a question the corpus cannot answer.
NOT_IN_CONTEXT = "The context does not contain the answer."

_SHINGLE = 4
#: A chunk holds a reference context when this share of the shorter one's word 4-grams is in both.
_HOLDS = 0.3
#: A 4-gram in more chunks than this is boilerplate, not evidence of where an answer is.
_COMMON = 3
#: A question keeps its answer while this share of its reference context's 4-grams is still in the corpus.
_KEPT = 0.5
_ABSTAIN = re.compile(
    r"\b(?:not (?:contain|mention|provide|include|specif|state|say|give|found|available|present|stated|mentioned|"
    r"provided|included|specified|given|in the context|enough)\w*"
    r"|no (?:information|mention|details?|data|answer)\b"
    r"|(?:cannot|can't|can not|could not|couldn't|unable to) (?:be )?(?:determine|answer|find|tell|say|know|"
    r"provide|determined|answered|found)\w*"
    r"|(?:do|does|did)(?: not|n't) (?:know|contain|mention|provide|include|specify|state|say|give)\w*"
    r"|unknown\b|not known\b)",
    re.I,
)
#: Longer than this, an answer that says the context lacks the answer also says something else.
_SHORT_WORDS = 30


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + _SHINGLE]) for i in range(max(1, len(words) - _SHINGLE + 1))} if words else set()


def _distinctive(chunks: Sequence[Any]) -> tuple[dict[str, set[tuple[str, ...]]], Counter[tuple[str, ...]]]:
    """Each chunk's distinctive 4-grams (in at most :data:`_COMMON` chunks: running headers and
    boilerplate would tie every chunk to every question), and every 4-gram's chunk count."""
    chunk_sh = {c.id: _shingles(c.text) for c in chunks}
    df: Counter[tuple[str, ...]] = Counter(s for sh in chunk_sh.values() for s in sh)
    return {cid: {s for s in sh if df[s] <= _COMMON} for cid, sh in chunk_sh.items()}, df


def _held(texts: Iterable[str], df: Counter[tuple[str, ...]]) -> set[tuple[str, ...]]:
    """The distinctive 4-grams of ``texts`` that the corpus (its 4-gram counts ``df``) holds at all:
    a reference context is compared by those only, since text extraction differs."""
    return {s for t in texts for s in _shingles(t) if 0 < df[s] <= _COMMON}


def _holds(chunk: set[tuple[str, ...]], context: set[tuple[str, ...]]) -> bool:
    if not chunk or not context:
        return False
    return len(chunk & context) >= _HOLDS * min(len(chunk), len(context))


@dataclass(frozen=True)
class Withheld:
    """What a corpus withholds: the chunks taken out, and the questions it can no longer answer."""

    chunk_ids: tuple[str, ...]
    queries: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"reference_answer": NOT_IN_CONTEXT, "chunk_ids": list(self.chunk_ids), "queries": list(self.queries)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Withheld:
        return cls(chunk_ids=tuple(data["chunk_ids"]), queries=tuple(data["queries"]))


def withhold(examples: Sequence[Any], chunks: Sequence[Any], *, fraction: float, seed: int) -> Withheld:
    """Draw questions (seeded) and take their reference contexts out of ``chunks`` until about
    ``fraction`` of the questions with a reference context can no longer be answered from the rest.

    Texts are compared by their word 4-grams that are distinctive in the corpus (:func:`_distinctive`),
    and a context by those of its 4-grams the corpus holds at all (text extraction differs)."""
    chunk_sh, df = _distinctive(chunks)
    eligible = [e for e in examples if e.reference_contexts]
    contexts = {e.query: _held(e.reference_contexts, df) for e in eligible}
    eligible = [e for e in eligible if contexts[e.query]]
    target = round(fraction * len(eligible))
    order = list(eligible)
    random.Random(seed).shuffle(order)
    removed: set[str] = set()
    lost: list[str] = []
    for e in order:
        if len(lost) >= target:
            break
        if e.query in lost:
            continue
        removed |= {cid for cid, sh in chunk_sh.items() if _holds(sh, contexts[e.query])}
        left: set[tuple[str, ...]] = set().union(*(sh for cid, sh in chunk_sh.items() if cid not in removed))
        lost = [q.query for q in eligible if len(contexts[q.query] & left) < _KEPT * len(contexts[q.query])]
    return Withheld(chunk_ids=tuple(c.id for c in chunks if c.id in removed), queries=tuple(lost))


def withheld_at(chunks: Sequence[Any], *, removed: Sequence[str], contexts: Sequence[str]) -> tuple[str, ...]:
    """The chunks of another chunking of the same corpus (``[search.space].chunk_size``) that the
    withholding takes out: each mostly made of the ``removed`` chunks' text or holding a withheld
    question's reference context (``contexts``), then, while a context keeps :data:`_KEPT` of its
    distinctive 4-grams in the rest, the chunk that holds most of it. The same questions stay
    unanswerable whatever the chunking."""
    chunk_sh, df = _distinctive(chunks)
    gone_text = {s for t in removed for s in _shingles(t)}
    ctx = [sh for c in contexts if (sh := _held([c], df))]
    out = {cid for cid, sh in chunk_sh.items()
           if sh and (len(sh & gone_text) >= _HOLDS * len(sh) or any(_holds(sh, c) for c in ctx))}
    for c in ctx:
        while True:
            rest = {cid: len(sh & c) for cid, sh in chunk_sh.items() if cid not in out and sh & c}
            if sum(rest.values()) < _KEPT * len(c):  # a bound on what the rest holds of it
                break
            out.add(max(rest, key=lambda cid: rest[cid]))
    return tuple(c.id for c in chunks if c.id in out)


def apply_withheld(dataset: Any, withheld: Withheld) -> Any:
    """The dataset with :data:`NOT_IN_CONTEXT` as the reference answer of every withheld question. Its
    reference contexts stay: they say where the answer was, and keep questions about one passage in
    one split."""
    lost = set(withheld.queries)
    examples = [dataclasses.replace(e, reference_answer=NOT_IN_CONTEXT) if e.query in lost else e
                for e in dataset.examples]
    return dataclasses.replace(dataset, examples=tuple(examples))


def says_not_in_context(answer: str) -> bool:
    """Whether the answer says the context does not hold what was asked."""
    return bool(_ABSTAIN.search(answer))


def requirement_score(answer: str, *, name: str, threshold: float) -> MetricResult:
    """The rule for a question the corpus cannot answer: saying so scores 5 (3 when the answer goes on
    at length, adding what the context does not hold), answering anyway scores 1."""
    if not says_not_in_context(answer):
        return MetricResult(name, 1.0, False, "the context lacks the answer, and the answer did not say so")
    if len(answer.split()) > _SHORT_WORDS:
        return MetricResult(name, 3.0, threshold <= 3.0,
                            "says the context lacks the answer, but goes on with more than it holds")
    return MetricResult(name, 5.0, threshold <= 5.0, "says the context lacks the answer")


__all__ = ["NOT_IN_CONTEXT", "Withheld", "apply_withheld", "requirement_score", "says_not_in_context", "withheld_at", "withhold"]
