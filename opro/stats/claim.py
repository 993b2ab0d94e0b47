"""The claim a validation decision tests, decided once for a run: what a winner must show (a gain
in quality, or a cost saving not worse in quality by more than a margin) and at which error rate.
The search's validation stage, ``opro plan`` and the probe all read this one value, built from
``[optimizer]`` by :func:`opro.experiment.settings.claim`, so they never disagree on it."""

from __future__ import annotations

from dataclasses import dataclass

from opro.stats.objectives import QUALITY, Objective, as_objective


@dataclass(frozen=True)
class Claim:
    """The decision rule of a validation stage."""

    #: What a finalist must show (:mod:`opro.stats.objectives`): a gain in quality (a superiority test),
    #: or a lower cost per answer and a quality not worse than the initial one by more than
    #: :attr:`margin` judge points (a non-inferiority test). Its name is accepted and stands for it.
    objective: Objective = QUALITY
    #: Significance level of the decision (one-sided, over all the looks of a confirmation).
    alpha: float = 0.05
    #: Judge points a cheaper configuration may lose under a non-inferiority objective (the configuration
    #: refuses 0 there: the claim would then be a gain, which the quality objective tests).
    margin: float = 0.25

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", as_objective(self.objective))

    @property
    def futility_confidence(self) -> float | None:
        """The validation's futility rule (:meth:`opro.stats.objectives.Objective.futility_confidence`)."""
        return self.objective.futility_confidence(self.alpha)


__all__ = ["Claim"]
