"""What a search returns: plain, frozen data (no tables, no tracking ids).

``OptimizationResult.summary()`` is the record of the search; the composition root adds where it
was recorded (run directory, MLflow run) beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, cast

from opro.llm.client import UsageByRole, UsageRecord
from opro.program.cost import CostSummary, CostUnit
from opro.program.dimensions import Value
from opro.search.design import ValidationDesign
from opro.stats.objectives import COST_FIELD, QUALITY, Objective
from opro.stats.sequential import Look

CandidateStatus = Literal["complete", "pruned", "budget", "failed", "incomplete"]


@dataclass(frozen=True)
class CandidateRecord:
    """One evaluated candidate: a configuration (its instruction and its values of the open dimensions)."""

    step: int
    instruction: str
    score: float | None
    n_scored: int
    n_invalid: int
    n_errors: int
    status: CandidateStatus
    trial_number: int
    scores: tuple[float | None, ...] = ()
    #: Position among the step's proposals: the order of the history and the tie-breaker, whichever
    #: worker evaluated the candidate and whatever its trial number.
    index: int = 0
    #: Its values of the open search dimensions (``[search.space]``; empty when only wording is searched).
    params: Mapping[str, Value] = field(default_factory=dict)
    #: Means per answered question of its task calls: tokens, seconds, cost (None: nothing answered).
    cost: CostSummary | None = None
    #: Its name, what the search keys it by (:mod:`opro.program.configurations`): the instruction, then
    #: in braces the values that differ from the initial configuration's ("" when made: the instruction).
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.instruction)

    @property
    def pruned(self) -> bool:
        return self.status != "complete"

    @property
    def partial(self) -> bool:
        """Stopped by the pruner: ``score`` is a running mean over the questions it was asked."""
        return self.status == "pruned"


@dataclass(frozen=True)
class FinalistRecord:
    """A finalist of the search in the validation stage. Only the *chosen* one is tested against the
    initial instruction; its scores, difference and p-value are on the confirmation questions."""

    #: The finalist's candidate name (:mod:`opro.program.configurations`): its instruction, and in braces
    #: its settings where they differ from the initial configuration's (the instruction alone without
    #: ``[search.space]``).
    instruction: str
    trial_number: int
    search_score: float
    #: The chosen finalist's mean on the confirmation questions (None for the others).
    validation_score: float | None
    validation_ci: tuple[float, float] | None
    #: (finalist - initial) over the confirmation questions both scored validly: for a claimed
    #: winner adjusted for having been claimed (:func:`opro.stats.sequential.conditional_estimate`,
    #: conditionally median-unbiased, with a conditional interval); otherwise their mean and Student
    #: t interval.
    difference: float | None
    difference_ci: tuple[float, float] | None
    n_pairs: int
    #: The group-sequential test's one-sided p-value (stagewise ordering; one hypothesis, so
    #: ``p_adjusted`` is the same number). None for a finalist that was not chosen.
    p_value: float | None
    p_adjusted: float | None
    significant: bool
    scores: tuple[float | None, ...] = ()
    chosen: bool = False
    #: Mean on the selection questions (None without a selection part).
    selection_score: float | None = None
    #: The plain mean of the differences (what ``difference`` is before the claim's adjustment).
    difference_raw: float | None = None


@dataclass(frozen=True)
class CostSaving:
    """Under the cost objective: the chosen finalist's cost per answer against the initial
    configuration's, paired on the confirmation questions both answered."""

    #: :attr:`opro.program.cost.CostModel.unit`: USD, or task tokens with completions weighted.
    unit: CostUnit
    n_pairs: int
    #: The initial configuration's mean cost per answer on those questions.
    initial_cost: float
    #: Mean (finalist - initial) cost per answer and its t interval (None below 2 pairs).
    difference: float
    difference_ci: tuple[float, float] | None
    #: The share of the initial cost saved, and its interval (Fieller's, of a ratio of paired means:
    #: :func:`opro.stats.ratio.saving_interval`); None where the initial cost is 0 (the interval also
    #: where it is not estimable).
    relative: float | None
    relative_ci: tuple[float, float] | None
    #: The interval is below 0: the finalist is cheaper on these questions.
    lower: bool
    #: Where the costs are heavy-tailed, what the share's interval is worth (:func:`opro.stats.ratio.saving_caveat`).
    caveat: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The form summary.json has always shown (intervals as lists), and a caveat where there is one."""
        return {
            "unit": self.unit, "n_pairs": self.n_pairs, "initial_cost": self.initial_cost,
            "difference": self.difference,
            "difference_ci": None if self.difference_ci is None else list(self.difference_ci),
            "relative": self.relative, "relative_ci": None if self.relative_ci is None else list(self.relative_ci),
            "lower": self.lower, **({"caveat": self.caveat} if self.caveat else {}),
        }


@dataclass(frozen=True)
class ValidationResult:
    """The validation stage: finalists chosen on the selection questions, the chosen one and the
    initial instruction on the confirmation questions, one look after each batch."""

    n_questions: int
    alpha: float
    #: The initial instruction on the confirmation questions asked (the same as the chosen finalist).
    initial_score: float | None
    initial_ci: tuple[float, float] | None
    initial_scores: tuple[float | None, ...]
    finalists: tuple[FinalistRecord, ...]
    winner: FinalistRecord | None
    verdict: str
    #: Every look of the sequential test, in order.
    looks: tuple[Look, ...] = ()
    #: The design the decision was made under (alpha, looks, futility, selection questions, procedure;
    #: summary.json shows :meth:`~opro.search.design.ValidationDesign.summary_json`); None when nothing
    #: was validated.
    design: ValidationDesign | None = None
    selection_questions: int = 0
    #: Made on questions whose verdict an earlier decision had drawn (``[optimizer].seen_validation =
    #: "label"``): an exploration, labelled so in ``verdict``; ``winner`` is None whatever the test said.
    re_decided: bool = False
    #: ``[optimizer].objective`` (its name in the record); under cost, ``margin`` and ``saving``: the chosen finalist's cost per
    #: answer against the initial configuration's on the confirmation questions.
    objective: Objective = QUALITY
    margin: float | None = None
    saving: CostSaving | None = None
    #: Of the paired questions the decision was shown on, how many came from the dataset's labelled pool
    #: (:mod:`opro.data.pool`; 0: the split and its unused questions only, absent from summary.json).
    pool_questions: int = 0

    def summary(self) -> dict[str, Any]:
        """The stage as plain data, in the form summary.json has always had: the looks, design and
        saving in their stored forms (not :func:`dataclasses.asdict`'s), the finalists' records and
        the winner's instruction."""
        # A quality decision's record stays as it was before objectives existed.
        left_out = {"finalists", "winner", "design", *(("objective", "margin", "saving")
                                                       if self.objective == QUALITY else ()),
                    *(("pool_questions",) if not self.pool_questions else ())}  # absent: no pool question
        written = {"looks": tuple(x.as_dict() for x in self.looks),  # a tuple, as asdict gave it
                   "objective": self.objective.name,
                   "saving": None if self.saving is None else self.saving.as_dict()}
        return {
            **{f.name: written[f.name] if f.name in written else getattr(self, f.name)
               for f in fields(self) if f.name not in left_out},
            "design": {} if self.design is None else self.design.summary_json(),
            "finalists": [asdict(f) for f in self.finalists],
            "winner": None if self.winner is None else self.winner.instruction,
        }


@dataclass(frozen=True)
class OptimizationResult:
    """What a search returns. ``best_score`` is measured on ``score_basis`` data (see ``score_label``).

    With a validation stage, ``best_instruction`` is a finalist only if it beat the initial
    instruction on validation questions by a group-sequential paired test, and ``gain`` is measured
    on questions that did not choose it; otherwise it is the initial instruction and ``gain`` is ``None``.
    """

    best_instruction: str
    best_template: str
    best_score: float
    initial_instruction: str
    initial_score: float | None
    history: tuple[CandidateRecord, ...]
    #: Calls, cache hits, tokens and wall time per role (the search's and its validation's).
    usage: UsageByRole
    stopped_reason: str
    study_name: str
    wall_s: float
    #: "validation": held out from the search; "search": the in-sample mean the search maximized.
    score_basis: Literal["validation", "search"] = "search"
    best_score_ci: tuple[float, float] | None = None
    #: The returned instruction's mean on the optimization questions (in-sample, optimistic).
    best_search_score: float | None = None
    #: Paired validation difference to the initial instruction, only when it is significant,
    #: adjusted for having been claimed (``best_score`` is the initial instruction's confirmation
    #: mean plus it); the unadjusted one is the winner's ``difference_raw``.
    #: With the cost objective it is the plain mean quality difference of a finalist shown not worse by
    #: more than the margin and cheaper (it may be below 0; the claim and the saving are in ``validation``).
    gain: float | None = None
    gain_ci: tuple[float, float] | None = None
    validation: ValidationResult | None = None
    rejected: tuple[dict[str, str], ...] = ()
    #: The returned configuration whole (:meth:`opro.program.prompts.QATemplate.to_json`: wording, frame,
    #: demonstrations, settings); what ``best`` resolves to and exports carry.
    best_configuration: Mapping[str, Any] = field(default_factory=dict)
    #: Its values of the open search dimensions (empty when only wording was searched).
    best_params: Mapping[str, Value] = field(default_factory=dict)
    #: ``[optimizer].objective``: under one that lowers an amount per answer (cost) the summary keeps
    #: the search's quality-cost front.
    objective: Objective = QUALITY
    #: The returned candidate's name (:attr:`CandidateRecord.name`; "" when made: ``best_instruction``).
    best_name: str = ""

    def __post_init__(self) -> None:
        if not self.best_name:
            object.__setattr__(self, "best_name", self.best_instruction)

    @property
    def validated(self) -> bool:
        return self.gain is not None

    @property
    def returned_is_initial(self) -> bool:
        """Whether the returned configuration is the initial one (no finalist confirmed, or none beat it)."""
        v = self.validation
        return (v.winner is None) if v is not None else self.best_instruction == self.initial_instruction

    @property
    def score_label(self) -> str:
        if self.score_basis == "validation" and self.validation is not None:
            return f"validation score ({self.validation.n_questions} questions not used by the search)"
        return "search score (in-sample: the questions the search selected on; optimistic)"

    def cost_of(self, name: str) -> CostSummary | None:
        """A candidate's cost per answer on the search questions (its latest record), by its name."""
        found = [r.cost for r in self.history if r.name == name and r.cost is not None]
        return found[-1] if found else None

    def headline(self) -> str:
        """One honest sentence: what was returned, on which data, and whether a gain is supported."""
        ci = ""
        if self.best_score_ci:
            lo, hi = self.best_score_ci
            ci = f" [below {hi:.2f}]" if math.isinf(lo) else f" [{lo:.2f}, {hi:.2f}]"
        score = f"{self.best_score:.2f}{ci} ({self.score_label})"
        if self.validation is None:
            return f"best instruction by search score {score}; no validation stage, so no gain is claimed"
        return f"{self.validation.verdict}; returned instruction: {score}"

    def scores_by_basis(self) -> dict[str, Any]:
        """The returned and the initial configuration's scores side by side on each basis, so that two
        numbers of one instruction never look like a contradiction (``best_score`` is a validation score
        where there is a validation stage, ``initial_score`` always a search score). ``search``: the mean
        on the optimization questions (in-sample: the search chose by it); ``validation``: on validation
        questions the search never used (the returned one's is ``best_score``, for a claimed gain adjusted
        for having been claimed). Where the initial configuration is returned both rows are the same."""
        v = self.validation
        validation = v.initial_score if v is not None else None
        return {
            "returned": {"search": self.best_search_score,
                         "validation": self.best_score if self.score_basis == "validation" else None},
            "initial": {"search": self.initial_score, "validation": validation},
            "returned_is_initial": self.returned_is_initial,
            "search": "mean on the optimization questions (in-sample: the search selected on them; optimistic)",
            "validation": ("mean on the validation questions the search never used"
                           + (f" ({v.n_questions})" if v is not None else ": no validation stage")),
        }

    def summary(self) -> dict[str, Any]:
        """The result as plain data for summary.json and the study; an interval open below (a claimed
        gain too rare to simulate lower: :func:`opro.stats.sequential.conditional_estimate`) has its lower
        end as None, never an infinity that strict JSON readers refuse."""
        return _open_ends(self._summary())

    def _summary(self) -> dict[str, Any]:
        v = self.validation
        return {
            "best_instruction": self.best_instruction,
            "best_template": self.best_template,
            "best_configuration": dict(self.best_configuration),
            "best_params": dict(self.best_params),
            "best_score": self.best_score,
            "score_basis": self.score_basis,
            "score_label": self.score_label,
            "best_score_ci": list(self.best_score_ci) if self.best_score_ci else None,
            "best_search_score": self.best_search_score,
            "gain": self.gain,
            "gain_ci": list(self.gain_ci) if self.gain_ci else None,
            "validated": self.validated,
            "headline": self.headline(),
            "initial_instruction": self.initial_instruction,
            "initial_score": self.initial_score,
            # initial_score is the search's (in-sample); the validation stage's is validation.initial_score.
            "initial_score_basis": "search",
            "scores_by_basis": self.scores_by_basis(),
            # Means per answered search question of the task calls (tokens, seconds, cost: opro.program.cost).
            COST_FIELD: {name: None if c is None else c.as_dict() for name, c in (
                ("returned", self.cost_of(self.best_name)), ("initial", self.cost_of(self.initial_instruction)))},
            "validation": None if v is None else v.summary(),
            **({"pareto_front": [
                {"instruction": r.instruction, "step": r.step, "index": r.index, "score": r.score,
                 COST_FIELD: r.cost.cost if r.cost else None, "params": dict(r.params)}
                for r in quality_cost_front(self.history)]} if self.objective.non_inferiority else {}),
            "n_candidates": len(self.history),
            "n_pruned": sum(1 for r in self.history if r.status == "pruned"),
            "rejected": list(self.rejected),
            "stopped_reason": self.stopped_reason,
            "study_name": self.study_name,
            "usage": self.usage,
            "wall_s": round(self.wall_s, 2),
        }


def _open_ends(value: Any) -> Any:
    """``value`` with every infinite float replaced by None (an open end of an interval)."""
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, dict):
        return {k: _open_ends(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_open_ends(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_open_ends(v) for v in value)
    return value


def quality_cost_front(records: Sequence[CandidateRecord]) -> list[CandidateRecord]:
    """The complete candidates no other beats on both score and cost per answer (at least as good on
    both, better on one): the search's quality-cost (Pareto) front, cheapest first."""
    done = [r for r in records if r.status == "complete" and r.score is not None and r.cost is not None]

    def point(r: CandidateRecord) -> tuple[float, float]:
        return (r.score or 0.0, r.cost.cost if r.cost is not None else math.inf)

    def dominated(r: CandidateRecord) -> bool:
        (s, c) = point(r)
        return any(os >= s and oc <= c and (os > s or oc < c) for os, oc in map(point, done))

    return sorted((r for r in done if not dominated(r)), key=lambda r: (point(r)[1], -point(r)[0], r.step, r.index))


def merge_usage(a: Mapping[str, UsageRecord], b: Mapping[str, UsageRecord]) -> UsageByRole:
    """Per-role usage of ``a`` and ``b`` added up (``cost_usd`` stays ``None`` where both are unknown)."""
    out: dict[str, dict[str, Any]] = {role: dict(u) for role, u in a.items()}
    for role, u in b.items():
        if role not in out:
            out[role] = dict(u)
            continue
        for k, v in u.items():
            if isinstance(v, int | float) or out[role].get(k) is None:
                prev = out[role].get(k)
                out[role][k] = v if prev is None else (prev + v if v is not None else prev)
    return cast(UsageByRole, out)


def optimism_points(result: OptimizationResult) -> list[dict[str, Any]]:
    """Search vs validation score of the initial instruction and every finalist, for the optimism plot."""
    v = result.validation
    if v is None:
        return []
    points = [{
        "label": "initial", "search": result.initial_score, "validation": v.initial_score,
        "returned": not result.validated,
    }]
    for i, f in enumerate(v.finalists, start=1):
        points.append({
            "label": f"finalist {i}", "search": f.search_score, "validation": f.validation_score,
            "returned": v.winner is not None and f.instruction == v.winner.instruction,
        })
    return points


__all__ = [
    "CandidateRecord",
    "CandidateStatus",
    "CostSaving",
    "FinalistRecord",
    "OptimizationResult",
    "ValidationResult",
    "merge_usage",
    "optimism_points",
    "quality_cost_front",
]
