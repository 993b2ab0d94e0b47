"""The claim a validation decision tests, decided once for a run: what a winner must show (a gain
in quality, or a cost saving not worse in quality by more than a margin) and at which error rate.
The search's validation stage, ``opro plan`` and the probe all read this one value, built from
``[optimizer]`` by :func:`opro.workflows.settings.claim`, so they never disagree on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Claim:
    """The decision rule of a validation stage."""

    #: ``quality``: a finalist wins only by beating the initial configuration (a superiority test).
    #: ``cost``: a finalist cheaper per answer and not worse than the initial one by more than
    #: :attr:`margin` judge points (a non-inferiority test).
    objective: Literal["quality", "cost"] = "quality"
    #: Significance level of the decision (one-sided, over all the looks of a confirmation).
    alpha: float = 0.05
    #: Judge points a cheaper configuration may lose under ``objective = "cost"`` (the configuration
    #: refuses 0 there: the claim would then be a gain, which ``quality`` tests).
    margin: float = 0.25

    @property
    def by_cost(self) -> bool:
        """Whether the winner is chosen by cost (non-inferiority) rather than by quality."""
        return self.objective == "cost"

    @property
    def futility_confidence(self) -> float | None:
        """The validation's futility rule (:func:`opro.stats.sequential.futile`): by cost a look stops
        only once the finalist is clearly worse by more than the margin (the one-sided ``1 - alpha``
        upper bound of the shifted differences' mean <= 0), as the cost race prunes; by quality once
        it is not ahead (None)."""
        return 1.0 - self.alpha if self.by_cost else None


__all__ = ["Claim"]
