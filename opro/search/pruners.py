"""Pruners of the search: stop a candidate early once it is clearly worse than earlier ones.

Each is an Optuna pruner whose decision reads only the candidate and the complete candidates of
earlier steps (never the same step's, whose finishing order depends on timing and workers), so the
search decides in-process and Optuna's ``prune`` gives the same answer from the study.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna

from opro.config import OptimizerSection
from opro.search.study import CandidateTrial, complete_before
from opro.stats.paired import paired_valid


@dataclass(frozen=True)
class RunningCandidate:
    """What a pruning decision reads of a candidate being evaluated: its running means by minibatch
    and its per-question scores so far (None: not validly scored)."""

    intermediate_values: Mapping[int, float]
    scores: Sequence[float | None]

    @property
    def last_step(self) -> int | None:
        return max(self.intermediate_values) if self.intermediate_values else None

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> RunningCandidate:
        c = CandidateTrial.of(trial)
        return cls(dict(c.intermediate_values), list(c.scores))


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
    """Stop a candidate once it is confidently worse than the incumbent on the same questions.

    The incumbent is the best complete candidate of an *earlier* step, so a decision never depends
    on which candidate of the same step (or which worker) finished first. After ``warmup``
    minibatches and at least ``min_pairs`` paired questions, the candidate is stopped when the
    one-sided ``confidence`` upper bound of the mean paired difference (Student t, with the spread
    floored at ``noise_floor`` because a few equal differences would otherwise give zero width) is
    below zero. The per-question scores are read from the trials' ``scores`` attribute.
    """

    def __init__(
        self, *, confidence: float = 0.95, warmup: int = 1, min_pairs: int = 3, noise_floor: float = 0.5
    ) -> None:
        self.confidence = confidence
        self.warmup = warmup
        self.min_pairs = min_pairs
        self.noise_floor = noise_floor

    def upper_bound(self, differences: Sequence[float]) -> float:
        from scipy.stats import t

        n = len(differences)
        mean = sum(differences) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1)) if n > 1 else 0.0
        return mean + float(t.ppf(self.confidence, n - 1)) * max(sd, self.noise_floor) / math.sqrt(n)

    def decide(self, candidate: RunningCandidate, earlier: Sequence[CandidateTrial]) -> bool:
        step = candidate.last_step
        if step is None or step + 1 < self.warmup:
            return False
        if not earlier:
            return False
        incumbent = max(earlier, key=_rank)
        a, b = paired_valid(candidate.scores, incumbent.scores)
        if len(a) < max(2, self.min_pairs):
            return False
        return self.upper_bound([x - y for x, y in zip(a, b, strict=True)]) < 0.0


def make_pruner(settings: OptimizerSection) -> EarlierStepsPruner | optuna.pruners.NopPruner:
    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    if settings.pruner == "median":
        return EarlierStepsMedianPruner(warmup=settings.prune_warmup_minibatches)
    if settings.pruner == "best":
        return BestSoFarPruner(margin=settings.prune_margin, warmup=settings.prune_warmup_minibatches)
    return RacingPruner(confidence=settings.race_confidence, warmup=settings.prune_warmup_minibatches)




__all__ = [
    "BestSoFarPruner",
    "EarlierStepsMedianPruner",
    "EarlierStepsPruner",
    "RacingPruner",
    "RunningCandidate",
    "make_pruner",
]
