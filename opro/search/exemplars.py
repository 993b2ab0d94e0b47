"""Which exemplar questions the meta-prompt shows at each step (``[optimizer].exemplar_strategy``).

- ``random``: a seeded draw, without replacement across steps while the pool lasts.
- ``failures``: the same draw, and each drawn question is answered with the best instruction so far
  and judged; those it gets wrong (judge score below the threshold) are shown with the task model's
  answer and the judge's one-line reason, so the optimizer sees *what went wrong* (the signal GEPA
  reads as feedback). Costs up to 2 x ``exemplars`` task + judge calls per step (cached).
- ``hardest``: the whole pool is answered with the best instruction so far and judged (cached), and
  the ``exemplars`` lowest-scored questions are shown, ties broken by the step's draw; no details.
  Costs 2 x pool size calls each time the best instruction changes.

Only the exemplar split is ever scored here: never optimization, validation or held-out questions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from opro.search.metaprompt import Exemplar, draw_exemplars

logger = logging.getLogger(__name__)

ExemplarStrategy = Literal["random", "hardest", "failures"]
EXEMPLAR_STRATEGIES: tuple[str, ...] = ("random", "hardest", "failures")


@dataclass(frozen=True)
class ExemplarOutcome:
    """One exemplar answered with an instruction and judged."""

    answer: str
    score: float | None
    passing: bool | None
    reason: str = ""


#: Answers ``exemplar`` with ``instruction`` and judges it; an invalid judgment has ``score=None``.
ExemplarScorer = Callable[[str, Exemplar], ExemplarOutcome]


@dataclass(frozen=True)
class ExemplarPicker:
    """Picks the exemplars of one step. Settings here; pool, step and best instruction per call."""

    strategy: ExemplarStrategy = "random"
    k: int = 3
    seed: int = 0

    def pick(
        self,
        pool: Sequence[Exemplar],
        *,
        step: int,
        best_instruction: str | None = None,
        scorer: ExemplarScorer | None = None,
    ) -> list[Exemplar]:
        drawn = draw_exemplars(pool, k=self.k, step=step, seed=self.seed)
        if self.strategy == "random" or best_instruction is None or scorer is None or not drawn:
            return drawn
        if self.strategy == "failures":
            return [self._with_failure(ex, scorer(best_instruction, ex)) for ex in drawn]
        # hardest: every pool question scored with the best instruction; lowest first, ties by the draw.
        order = {id(ex): i for i, ex in enumerate(draw_exemplars(pool, k=len(pool), step=step, seed=self.seed))}
        scored = [(scorer(best_instruction, ex).score, ex) for ex in pool]
        ranked = sorted(
            ((s, ex) for s, ex in scored if s is not None), key=lambda p: (p[0], order.get(id(p[1]), 0))
        )
        return [ex for _, ex in ranked[: self.k]] or drawn

    @staticmethod
    def _with_failure(ex: Exemplar, outcome: ExemplarOutcome) -> Exemplar:
        if outcome.score is None or outcome.passing is not False:
            return ex  # answered right, or the judgment was unreadable: shown as a plain exemplar
        # One line: the judge's first sentence line is the part a meta-prompt has room for.
        reason = " ".join(next((line for line in outcome.reason.splitlines() if line.strip()), "").split())
        return replace(ex, model_answer=outcome.answer.strip(), score=outcome.score, reason=reason)


__all__ = ["EXEMPLAR_STRATEGIES", "ExemplarOutcome", "ExemplarPicker", "ExemplarScorer", "ExemplarStrategy"]
