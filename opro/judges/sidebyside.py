"""The side-by-side judge: one call scores two configurations' answers to the same question.

Where two configurations answer the same questions (the validation stage, ``opro compare``), what
decides is the paired difference of their scores. Two separate pointwise calls each carry the
judge's own drift of scale; one call that sees the question, the reference and both answers scores
them on one scale, so that drift cancels in the difference.

- The order the answers are shown in is drawn per question from the run seed and the question (a
  hash: the messages, and so the call cache, are the same on every run), so a judge that favours
  the first position favours neither configuration on average.
- ``both_orders=True`` asks again with the answers swapped and averages the two; the verdict says
  whether both orders preferred the same configuration (a position check).
- Answers that are identical after normalization (white space, case) are not judged: their scores
  are equal (the difference exactly 0) and no call is made.
- A reply it cannot read is invalid (both scores None) with the reason, and kept out of the call
  cache so a rerun asks again, as the pointwise judge does. With ``score_from`` reading logits (the
  llamacpp backend), each score is the expected score at its position, as the pointwise logit judge's.
"""

from __future__ import annotations

import hashlib
import typing
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from opro.errors import ConfigError
from opro.judges.correctness import SCORE_CHOICES, ScoreFrom, check_scoring
from opro.judges.parsing import SCORE_MIN, parse_pair_scores, score_distribution
from opro.judges.templates import SIDE_BY_SIDE_SYSTEM, SIDE_BY_SIDE_USER
from opro.judges.withheld import NOT_IN_CONTEXT, requirement_score
from opro.llm import ChatClient, Completion, Message

#: ``[judge].paired``: a judge call per answer, or one call for both answers of a question.
PairedMode = Literal["pointwise", "side_by_side"]
PAIRED_MODES: tuple[PairedMode, ...] = typing.get_args(PairedMode)
_NO_ANSWER = "(no answer)"


def pair_schema() -> dict[str, Any]:
    """The JSON schema of a side-by-side verdict: both scores, A first (the order they are shown in)."""
    score = {"enum": [1, 2, 3, 4, 5], "type": "integer"}
    return {
        "additionalProperties": False,
        "properties": {"score_a": score, "score_b": score},
        "required": ["score_a", "score_b"],
        "type": "object",
    }


def normalized(answer: str) -> str:
    """An answer as compared for identity: white space collapsed, case folded."""
    return " ".join(answer.split()).casefold()


def first_shown(*, seed: int, query: str) -> bool:
    """Whether the first configuration's answer is shown as answer A for ``query`` under ``seed``:
    a hash, so the same on every run and platform (no hash randomization)."""
    digest = hashlib.sha256(f"{seed}\x1f{query}".encode()).digest()
    return digest[0] % 2 == 0


@dataclass(frozen=True)
class PairVerdict:
    """Two configurations' scores on one question, in the caller's order (``first``, ``second``).

    ``scores`` is None when the judge's reply was unreadable (``invalid_reason`` says why); for
    identical answers it is ``(tie, tie)`` with the level the caller gave (None without one), and
    :attr:`difference` is exactly 0. ``readings``: each order's scores, in the caller's order (the
    seeded order first, then the swapped one with ``both_orders``), which ``scores`` averages.
    ``calls``: judge calls made (none for an answer from the call cache)."""

    scores: tuple[float | None, float | None] | None
    identical: bool = False
    first_as_a: bool = True
    readings: tuple[tuple[float, float], ...] = ()
    invalid_reason: str | None = None
    calls: int = 0

    @property
    def invalid(self) -> bool:
        return self.scores is None

    @property
    def difference(self) -> float | None:
        """first minus second; 0 for identical answers, None when unreadable."""
        if self.identical:
            return 0.0
        if self.scores is None or self.scores[0] is None or self.scores[1] is None:
            return None
        return self.scores[0] - self.scores[1]

    @property
    def order_agrees(self) -> bool | None:
        """With both orders read: whether they prefer the same configuration (a tie is a preference of
        its own); None when only one order was read."""
        if len(self.readings) < 2:
            return None
        (a1, b1), (a2, b2) = self.readings[:2]
        return (a1 > b1) - (a1 < b1) == (a2 > b2) - (a2 < b2)


class SideBySideJudge:
    """Scores two answers to one question 1-5 each in one call (see the module docstring).

    ``seed`` draws the order per question; ``both_orders`` asks both orders and averages them.
    ``score_from`` as :class:`~opro.judges.correctness.CorrectnessJudge`'s: ``logits`` (or ``auto`` on a
    backend that reads them) reads each score's expected value from the next-token logits (two
    calls per order: answer B's score after answer A's most likely one); ``reply`` parses a JSON
    reply (constrained by a schema where the backend can).
    """

    name = "side_by_side"

    def __init__(
        self,
        llm: ChatClient,
        *,
        seed: int = 0,
        both_orders: bool = False,
        structured: bool = True,
        max_tokens: int = 64,
        temperature: float = 0.0,
        score_from: ScoreFrom = "reply",
        min_score_mass: float = 0.5,
    ) -> None:
        if max_tokens < 16:
            raise ConfigError(f"SideBySideJudge max_tokens={max_tokens} is too small to hold two scores; use >= 16")
        check_scoring(llm, score_from=score_from, min_score_mass=min_score_mass, where="SideBySideJudge")
        self.llm = llm
        self.seed = seed
        self.both_orders = both_orders
        self.structured = structured
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.score_from = score_from
        self.min_score_mass = min_score_mass

    @property
    def uses_logits(self) -> bool:
        return self.score_from == "logits" or (self.score_from == "auto" and self.llm.llm.supports_choice_logprobs)

    @property
    def method(self) -> str:
        how = "expected scores from logits" if self.uses_logits else "JSON reply"
        return f"side by side, {how}" + (", both orders" if self.both_orders else "")

    def messages(self, *, query: str, reference: str | None, answer_a: str, answer_b: str) -> tuple[Message, ...]:
        """The exact messages of one call, answer A shown first."""
        user = SIDE_BY_SIDE_USER.format(
            query=query,
            reference_answer=reference if reference else "(NO REFERENCE ANSWER SUPPLIED)",
            answer_a=answer_a.strip() or _NO_ANSWER,
            answer_b=answer_b.strip() or _NO_ANSWER,
        )
        return (Message("system", SIDE_BY_SIDE_SYSTEM), Message("user", user))

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.structured:
            options["json_schema"] = pair_schema()
        return options

    def _expected(self, completion: Completion) -> tuple[float | None, int, str]:
        dist = score_distribution(completion)
        mass = sum(dist.values())
        if mass < self.min_score_mass:
            return None, 0, (f"the judge put only {mass:.0%} of its next-token probability on the scores 1..5 "
                             f"(min_score_mass {self.min_score_mass:.0%})")
        best = max(dist, key=lambda s: dist[s])
        return round(sum(s * p for s, p in dist.items()) / mass, 4), best, ""

    def _read(self, messages: tuple[Message, ...]) -> tuple[tuple[float, float] | None, str, int]:
        """(score of A, score of B) of one order, or None and why; and the calls made."""
        if self.uses_logits:
            first = self.llm.choose(messages, prefix='{"score_a": ', choices=SCORE_CHOICES)
            a, best, why = self._expected(first)
            if a is None:
                return None, why, int(not first.cached)
            second = self.llm.choose(messages, prefix=f'{{"score_a": {best}, "score_b": ', choices=SCORE_CHOICES)
            b, _, why = self._expected(second)
            calls = int(not first.cached) + int(not second.cached)
            return (None, why, calls) if b is None else ((a, b), "", calls)
        completion = self.llm.complete(messages, **self._options())
        parsed = parse_pair_scores(completion.text)
        if parsed.scores is None:
            self.llm.forget(messages, **self._options())  # an unreadable reply is asked again on rerun
            reason = parsed.reason
            if completion.finish_reason == "length":
                reason += f" (the reply was cut at max_tokens={self.max_tokens})"
            return None, reason, int(not completion.cached)
        return parsed.scores, "", int(not completion.cached)

    def _order(self, query: str, reference: str | None, shown: tuple[str, str]) -> tuple[tuple[float, float] | None, str, int]:
        return self._read(self.messages(query=query, reference=reference, answer_a=shown[0], answer_b=shown[1]))

    def judge(
        self, *, query: str, reference: str | None, first: str, second: str, tie: float | None = None
    ) -> PairVerdict:
        """The scores of ``first`` and ``second`` (two configurations' answers to ``query``), in that
        order. ``tie``: the level both get when the answers are identical (no call is made then).
        LLM errors propagate, as the pointwise judge's do."""
        if normalized(first) == normalized(second):
            return PairVerdict(scores=(tie, tie), identical=True)
        if reference is not None and reference.strip() == NOT_IN_CONTEXT:
            # the requirement's rule, as the pointwise judge scores these questions: no call
            rule = [requirement_score(a, name=self.name, threshold=SCORE_MIN).score for a in (first, second)]
            return PairVerdict(scores=(rule[0], rule[1]))
        first_as_a = first_shown(seed=self.seed, query=query)
        shown = (first, second) if first_as_a else (second, first)
        got, why, calls = self._order(query, reference, shown)
        if got is None:
            return PairVerdict(scores=None, first_as_a=first_as_a, invalid_reason=why, calls=calls)
        mine = got if first_as_a else (got[1], got[0])  # back to the caller's order
        readings = [mine]
        if self.both_orders:
            again, why, more = self._order(query, reference, (shown[1], shown[0]))
            calls += more
            if again is None:
                return PairVerdict(scores=None, first_as_a=first_as_a, invalid_reason=f"{why} (answers swapped)",
                                   calls=calls)
            readings.append((again[1], again[0]) if first_as_a else again)
            mine = ((mine[0] + readings[1][0]) / 2, (mine[1] + readings[1][1]) / 2)
        # an empty answer is wrong whatever the judge reads into "(no answer)", as the pointwise judge's rule
        scores = tuple(SCORE_MIN if not a.strip() else s for a, s in zip((first, second), mine, strict=True))
        return PairVerdict(scores=(scores[0], scores[1]), first_as_a=first_as_a,
                           readings=tuple(readings), calls=calls)

    def judge_many(self, pairs: Sequence[Mapping[str, Any]]) -> list[PairVerdict]:
        """:meth:`judge` of each of ``pairs`` (its keyword arguments), in order, as many in flight as the
        judge's backend takes (its ``max_concurrency``; the backend's own semaphore holds the limit)."""
        workers = min(len(pairs), max(1, int(getattr(self.llm.llm, "max_concurrency", 1) or 1)))
        if workers <= 1:
            return [self.judge(**p) for p in pairs]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opro-side-by-side") as pool:
            return list(pool.map(lambda p: self.judge(**p), pairs))


__all__ = ["PAIRED_MODES", "PairVerdict", "PairedMode", "SideBySideJudge", "first_shown", "normalized", "pair_schema"]
