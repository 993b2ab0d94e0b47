"""The objective of a run: what the search looks for and what a winner must show. ``[optimizer].objective``
names one (:func:`objective_named`); :class:`opro.stats.claim.Claim` carries it, and the search, the
validation stage, ``opro plan`` and the probe ask it rather than compare its name:

* what the sampler optimizes (:attr:`Objective.directions`, :meth:`Objective.values`) and which first
  moves step 0 tries (:meth:`Objective.first_move`);
* how the race prunes (:meth:`Objective.prunes`, on the bounds a :class:`Race` gives);
* what a finalist must show (:attr:`Objective.non_inferiority`, :meth:`Objective.shift`), the futility
  rule (:meth:`Objective.futility_confidence`) and the target the plan's sizes use
  (:meth:`Objective.target`);
* what the verdict says when there is nothing to validate (:meth:`Objective.nothing_to_validate`).

A third objective is one more class with these members (``tests/stats/test_objectives.py`` runs a toy
one through the search's parts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, Protocol

from opro.errors import ConfigError

Direction = Literal["maximize", "minimize"]
#: What the plan's sizes are computed for: a margin of non-inferiority, or a gain.
Target = Literal["margin", "gain"]


class Measured(Protocol):
    """What an objective reads of a configuration's measured means per answered question
    (:class:`opro.program.cost.CostSummary`): the task call's tokens, seconds and cost."""

    @property
    def prompt_tokens(self) -> float: ...

    @property
    def completion_tokens(self) -> float: ...

    @property
    def seconds(self) -> float: ...

    @property
    def cost(self) -> float: ...


class Race(Protocol):
    """What the racing pruner tells an objective of a running candidate: the one-sided upper bound of
    its mean paired score difference to another candidate (None: too few pairs yet)."""

    def against_incumbent(self) -> float | None:
        """Against the best complete candidate of an earlier step."""

    def against_initial(self) -> float | None:
        """Against the initial configuration (candidate 0 of step 0); None also where it is not complete."""

    def dominated(self) -> bool:
        """Whether a complete candidate of an earlier step is no dearer per answer (the objective's
        amount, question by question) and confidently better."""


class Objective(Protocol):
    """What a run optimizes; frozen and comparable, named by :attr:`name` in records and output."""

    @property
    def name(self) -> str:
        """Its name in ``[optimizer].objective``, the records (summary.json, the study) and the output."""

    @property
    def non_inferiority(self) -> bool:
        """What a finalist must show: a lower amount per answer (:meth:`amount`, kept per question,
        the initial configuration answering the selection questions too) and a quality not worse than
        the initial one by more than the margin (True); or a gain in quality (False)."""

    @property
    def directions(self) -> tuple[Direction, ...]:
        """The sampler's Optuna study: one direction per value of :meth:`values`."""

    def amount(self, cost: Measured | None) -> float | None:
        """The amount per answer a winner lowers (None: none, or not measured)."""

    def values(self, score: float, cost: Measured | None) -> list[float] | None:
        """What a complete candidate tells the sampler (None: it tells it nothing)."""

    def first_move(self, price: float) -> float:
        """Step 0's first moves take, per dimension, the choice with the lowest of these (``price``:
        an answer's estimated cost under it)."""

    def prunes(self, race: Race, *, margin: float) -> bool:
        """Whether the race stops a running candidate."""

    def shift(self, margin: float) -> float:
        """Added to each paired difference (finalist - initial) before the confirmation's test."""

    def futility_confidence(self, alpha: float) -> float | None:
        """The validation's futility rule (:func:`opro.stats.sequential.futile`): a look stops once the
        one-sided bound at this confidence of the shifted differences' mean is <= 0; None: once the
        finalist is not ahead."""

    def target(self, *, margin: float, gain: float) -> tuple[Target, float]:
        """What the plan's sizes are for: the margin, or the ``gain`` a quality claim is sized for."""

    def nothing_to_validate(self, *, margin: float) -> str:
        """The verdict when no candidate could be a finalist."""


@dataclass(frozen=True)
class QualityObjective:
    """A finalist wins only by beating the initial configuration (a superiority test); the race stops a
    candidate confidently worse than the incumbent; the sampler maximizes the score."""

    name: str = "quality"
    non_inferiority: bool = False
    directions: tuple[Direction, ...] = ("maximize",)

    def amount(self, cost: Measured | None) -> float | None:
        return None

    def values(self, score: float, cost: Measured | None) -> list[float] | None:
        return [score]

    def first_move(self, price: float) -> float:
        # The plan knows what a choice costs, not what it is worth: the moves that give the model more
        # to work with (more context, more demonstrations, room to answer) are tried first.
        return -price

    def prunes(self, race: Race, *, margin: float) -> bool:
        bound = race.against_incumbent()
        return bound is not None and bound < 0.0

    def shift(self, margin: float) -> float:
        return 0.0

    def futility_confidence(self, alpha: float) -> float | None:
        return None

    def target(self, *, margin: float, gain: float) -> tuple[Target, float]:
        return "gain", gain

    def nothing_to_validate(self, *, margin: float) -> str:
        return "no candidate besides the initial instruction completed the search: nothing to validate"


@dataclass(frozen=True)
class CostObjective:
    """A finalist cheaper per answer and not worse than the initial configuration by more than the
    margin (a non-inferiority test); the race stops a candidate clearly worse by more than the margin or
    dominated; the sampler's study has two objectives (maximize the score, minimize the cost per
    answer), so it proposes values from the quality-cost front."""

    name: str = "cost"
    non_inferiority: bool = True
    directions: tuple[Direction, ...] = ("maximize", "minimize")

    def amount(self, cost: Measured | None) -> float | None:
        return None if cost is None else cost.cost

    def values(self, score: float, cost: Measured | None) -> list[float] | None:
        return None if cost is None else [score, cost.cost]

    def first_move(self, price: float) -> float:
        return price

    def prunes(self, race: Race, *, margin: float) -> bool:
        # Being worse than the best is no reason to stop: only being unable to be within the margin, or
        # never on the quality-cost front. A cheaper candidate that only looks worse goes on.
        bound = race.against_initial()
        return (bound is not None and bound < -margin) or race.dominated()

    def shift(self, margin: float) -> float:
        return margin

    def futility_confidence(self, alpha: float) -> float | None:
        # Stop only once the finalist is clearly worse by more than the margin, as the cost race prunes.
        return 1.0 - alpha

    def target(self, *, margin: float, gain: float) -> tuple[Target, float]:
        return "margin", margin

    def nothing_to_validate(self, *, margin: float) -> str:
        return (f"no candidate of the search was cheaper per answer than the initial configuration without being "
                f"clearly worse than it by more than {margin:g} on the search questions: nothing to validate")


#: The name opro's outputs give a configuration's cost per answer, the amount the cost objective minimizes
#: (summary.json, report.json, export provenance, compare's table, the study's trial attributes, the plan):
#: writers and readers share it.
COST_FIELD: Final = "cost"

QUALITY: Final = QualityObjective()
COST: Final = CostObjective()
#: The objectives ``[optimizer].objective`` may name.
OBJECTIVES: Final[dict[str, Objective]] = {o.name: o for o in (QUALITY, COST)}


def objective_named(name: str) -> Objective:
    """The objective called ``name`` in ``[optimizer].objective``."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ConfigError(f"[optimizer].objective must be one of {', '.join(map(repr, OBJECTIVES))}, "
                          f"got {name!r}") from None


def as_objective(objective: Objective | str) -> Objective:
    """``objective`` itself, or the one it names (scripts and tests may pass the name)."""
    return objective_named(objective) if isinstance(objective, str) else objective


__all__ = ["COST", "COST_FIELD", "OBJECTIVES", "QUALITY", "CostObjective", "Direction", "Objective", "QualityObjective", "Race",
           "Target", "as_objective", "objective_named"]
