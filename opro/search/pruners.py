"""Pruners of the search: stop a candidate early once it cannot be what the objective looks for.

Each is an Optuna pruner whose decision reads only the candidate and the complete candidates of
earlier steps (never the same step's, whose finishing order depends on timing and workers), so the
search decides in-process and Optuna's ``prune`` gives the same answer from the study.

The objective decides (:meth:`opro.stats.objectives.Objective.prunes`, on the bounds the race gives).
Under quality the race stops a candidate confidently worse than the incumbent (the
best complete candidate of an earlier step). Under cost the objective looks for a configuration
cheaper than the initial one and not worse than it by more than the margin, so being worse than the
best is no reason to stop: the race stops a candidate only when its quality is confidently more than
the margin below the initial configuration's, or when a complete candidate at most as dear is
confidently better (it is dominated: never on the quality-cost front). ``best`` and ``median`` know no
cost: they prune on quality alone under either objective.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna

from opro.search.settings import PrunerSettings
from opro.search.trials import CandidateTrial, complete_before
from opro.stats.objectives import QUALITY, Objective, as_objective
from opro.stats.paired import paired_valid


@dataclass(frozen=True)
class RunningCandidate:
    """What a pruning decision reads of a candidate being evaluated: its running means by minibatch,
    its per-question scores so far (None: not validly scored) and, under an objective that lowers an
    amount per answer (the cost objective), its per-question costs (None: the call failed)."""

    intermediate_values: Mapping[int, float]
    scores: Sequence[float | None]
    costs: Sequence[float | None] = ()

    @property
    def last_step(self) -> int | None:
        return max(self.intermediate_values) if self.intermediate_values else None

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> RunningCandidate:
        c = CandidateTrial.of(trial)
        return cls(dict(c.intermediate_values), list(c.scores), list(c.costs))


class EarlierStepsPruner(optuna.pruners.BasePruner):
    """A pruner whose decision reads only the candidate and the complete candidates of earlier steps.

    So the optimizer decides in-process (:meth:`decide`, with the earlier steps read once per step)
    and writes the reports to the study beside the requests; Optuna's ``prune`` gives the same answer
    from the study.
    """

    def decide(self, candidate: RunningCandidate, earlier: Sequence[CandidateTrial]) -> bool:
        raise NotImplementedError

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return self.decide(RunningCandidate.of(trial), complete_before(study, CandidateTrial.of(trial).step))


def _rank(t: CandidateTrial) -> tuple[float, int, int]:
    """Best first by value, ties to the earlier step, then the lower proposal index (not trial number)."""
    return (float(t.value or 0.0), -t.step, -t.index)


class BestSoFarPruner(EarlierStepsPruner):
    """Prune a candidate whose running mean is ``margin`` below the best candidate of earlier steps.

    ``warmup`` minibatches are always run, so one unlucky question cannot end a candidate.
    """

    def __init__(self, *, margin: float = 0.5, warmup: int = 1) -> None:
        self.margin = margin
        self.warmup = warmup

    def decide(self, candidate: RunningCandidate, earlier: Sequence[CandidateTrial]) -> bool:
        step = candidate.last_step
        if step is None or step + 1 < self.warmup:
            return False
        finished = [float(t.value) for t in earlier if t.value is not None]
        if not finished:
            return False
        return candidate.intermediate_values[step] < max(finished) - self.margin


class EarlierStepsMedianPruner(EarlierStepsPruner):
    """Optuna's median rule over the candidates of earlier steps: prune when the best running mean so
    far is below the median of their running means after the same minibatch."""

    def __init__(self, *, warmup: int = 1) -> None:
        self.warmup = warmup

    def decide(self, candidate: RunningCandidate, earlier: Sequence[CandidateTrial]) -> bool:
        step = candidate.last_step
        if step is None or step + 1 < self.warmup:
            return False
        others = [t.intermediate_values[step] for t in earlier if step in t.intermediate_values]
        others = [v for v in others if not math.isnan(v)]
        if not others:
            return False
        import numpy as np

        best = max(v for k, v in candidate.intermediate_values.items() if k <= step)
        return bool(best < float(np.median(others)))


class RacingPruner(EarlierStepsPruner):
    """Stop a candidate once it cannot be what the objective looks for, on the same questions.

    After ``warmup`` minibatches and at least ``min_pairs`` paired questions, the one-sided
    ``confidence`` upper bound of a mean paired difference (Student t, with the spread floored at
    ``noise_floor`` because a few equal differences would otherwise give zero width) decides:

    * quality: stopped when its bound against the incumbent (the best complete
      candidate of an *earlier* step, so a decision never depends on which candidate of the same step,
      or which worker, finished first) is below zero;
    * cost: stopped when its bound against the initial configuration (candidate 0 of
      step 0) is below ``-margin`` (it cannot be within the margin), or when a complete candidate of an
      earlier step is no dearer per answer on the questions both answered and its bound against that
      one is below zero (dominated). A cheaper candidate that only looks worse goes on to every
      question, so the validation stage can test it.

    The objective (:meth:`opro.stats.objectives.Objective.prunes`) decides on these bounds. The
    per-question scores (and costs) are read from the trials' ``scores`` (and ``costs``) attributes.
    """

    def __init__(
        self, *, confidence: float = 0.95, warmup: int = 1, min_pairs: int = 3, noise_floor: float = 0.5,
        objective: Objective | str = QUALITY, margin: float = 0.25,
    ) -> None:
        self.confidence = confidence
        self.warmup = warmup
        self.min_pairs = min_pairs
        self.noise_floor = noise_floor
        self.objective = as_objective(objective)
        self.margin = margin

    def upper_bound(self, differences: Sequence[float]) -> float:
        from scipy.stats import t

        n = len(differences)
        mean = sum(differences) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1)) if n > 1 else 0.0
        return mean + float(t.ppf(self.confidence, n - 1)) * max(sd, self.noise_floor) / math.sqrt(n)

    def _bound_against(self, candidate: RunningCandidate, other: CandidateTrial) -> float | None:
        """The upper bound of (candidate - other) on the questions both scored; None below ``min_pairs``."""
        a, b = paired_valid(candidate.scores, other.scores)
        if len(a) < max(2, self.min_pairs):
            return None
        return self.upper_bound([x - y for x, y in zip(a, b, strict=True)])

    def decide(self, candidate: RunningCandidate, earlier: Sequence[CandidateTrial]) -> bool:
        step = candidate.last_step
        if step is None or step + 1 < self.warmup:
            return False
        if not earlier:
            return False
        return self.objective.prunes(_Race(self, candidate, earlier), margin=self.margin)


@dataclass(frozen=True)
class _Race:
    """The bounds a :class:`RacingPruner` gives the objective for one decision, computed when asked."""

    pruner: RacingPruner
    candidate: RunningCandidate
    earlier: Sequence[CandidateTrial]

    def against_incumbent(self) -> float | None:
        return self.pruner._bound_against(self.candidate, max(self.earlier, key=_rank))

    def against_initial(self) -> float | None:
        initial = next((t for t in self.earlier if t.step == 0 and t.index == 0), None)
        return None if initial is None else self.pruner._bound_against(self.candidate, initial)

    def dominated(self) -> bool:
        for other in self.earlier:
            if _no_cheaper(self.candidate, other, self.pruner.objective):
                bound = self.pruner._bound_against(self.candidate, other)
                if bound is not None and bound < 0.0:
                    return True
        return False


def _no_cheaper(candidate: RunningCandidate, other: CandidateTrial, objective: Objective) -> bool:
    """Whether ``candidate`` costs at least as much per answer as ``other`` (the objective's amount):
    paired on the questions both answered where their per-question costs are known, else its mean so
    far against other's."""
    pairs = [(x, y) for x, y in zip(candidate.costs, other.costs, strict=False) if x is not None and y is not None]
    if pairs:
        return sum(x - y for x, y in pairs) >= 0.0
    mine = [x for x in candidate.costs if x is not None]
    theirs = objective.amount(other.cost)
    if not mine or theirs is None:
        return False  # unknown: never a reason to stop
    return sum(mine) / len(mine) >= theirs


def make_pruner(settings: PrunerSettings) -> EarlierStepsPruner | optuna.pruners.NopPruner:
    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    if settings.pruner == "median":
        return EarlierStepsMedianPruner(warmup=settings.prune_warmup_minibatches)
    if settings.pruner == "best":
        return BestSoFarPruner(margin=settings.prune_margin, warmup=settings.prune_warmup_minibatches)
    return RacingPruner(confidence=settings.race_confidence, warmup=settings.prune_warmup_minibatches,
                        objective=settings.claim.objective, margin=settings.claim.margin)




__all__ = [
    "BestSoFarPruner",
    "EarlierStepsMedianPruner",
    "EarlierStepsPruner",
    "RacingPruner",
    "RunningCandidate",
    "make_pruner",
]
