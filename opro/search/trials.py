"""The search's Optuna trials, typed: one trial per candidate (or per part of a split candidate),
its attributes named here and nowhere else (:mod:`opro.search.study` names the study's).

Trial parameters: the candidate's values of the open search dimensions (``demos``, ``top_k``, ...).
Trial attributes: ``instruction step index worker host claim`` (the claim; ``candidate``: its name where
that is not its instruction, :mod:`opro.program.configurations`), ``part`` and ``parts``
(split candidates), ``part_scores`` and ``part_usage`` (a part's task calls: prompt and completion
tokens, seconds), ``scores`` (per question, as the racing pruner reads them; ``costs`` beside them with
the cost objective: each question's cost, what that race pairs on) and the result
``score n_scored n_invalid n_errors status cost`` (``cost``: :class:`opro.program.cost.CostSummary` as a dict,
means per answered question).
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

import optuna

from opro.program.cost import CallUsage, CostSummary
from opro.program.dimensions import Value
from opro.stats.objectives import COST_FIELD


class TrialKey:
    """The trial attributes' names (the module docstring lists them)."""

    INSTRUCTION: Final = "instruction"
    CANDIDATE: Final = "candidate"
    STEP: Final = "step"
    INDEX: Final = "index"
    WORKER: Final = "worker"
    HOST: Final = "host"
    CLAIM: Final = "claim"
    PART: Final = "part"
    PARTS: Final = "parts"
    PART_SCORES: Final = "part_scores"
    PART_USAGE: Final = "part_usage"
    SCORES: Final = "scores"
    COSTS: Final = "costs"
    SCORE: Final = "score"
    N_SCORED: Final = "n_scored"
    N_INVALID: Final = "n_invalid"
    N_ERRORS: Final = "n_errors"
    STATUS: Final = "status"
    COST: Final = COST_FIELD


@dataclass(frozen=True)
class CandidateTrial:
    """What the search stored on one trial, typed (a claim, a part, or a finished candidate)."""

    number: int
    state: optuna.trial.TrialState
    value: float | None
    intermediate_values: Mapping[int, float]
    instruction: str | None
    step: int
    index: int
    worker: int
    claim: str | None
    #: ``"<part>/<size>"`` on a part's trial (None on a candidate's).
    part: str | None
    #: Questions per part, on a candidate's claim when the candidate is split among the workers.
    parts: int
    part_scores: tuple[Any, ...]
    status: str | None
    score: float | None
    n_scored: int
    n_invalid: int
    n_errors: int
    scores: tuple[float | None, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    part_usage: tuple[CallUsage | None, ...] = ()
    cost: CostSummary | None = None
    #: Its name where that is not its instruction (None: the instruction names it).
    candidate: str | None = None
    #: Its cost per question so far (``costs``: what the cost objective's race pairs; None: not answered).
    costs: tuple[float | None, ...] = ()

    @property
    def name(self) -> str | None:
        """The candidate's name (:mod:`opro.program.configurations`): its instruction, with its settings
        where they differ from the initial configuration's."""
        return self.candidate or self.instruction

    @classmethod
    def of(cls, t: optuna.trial.FrozenTrial) -> CandidateTrial:
        a, k = t.user_attrs, TrialKey
        return cls(
            number=t.number, state=t.state, value=t.value,
            intermediate_values=t.intermediate_values,
            instruction=a.get(k.INSTRUCTION), step=int(a.get(k.STEP, 0)), index=int(a.get(k.INDEX, 0)),
            worker=int(a.get(k.WORKER, -1)), claim=a.get(k.CLAIM),
            part=None if a.get(k.PART) is None else str(a[k.PART]), parts=int(a.get(k.PARTS) or 0),
            part_scores=tuple(a.get(k.PART_SCORES) or ()), status=a.get(k.STATUS), score=a.get(k.SCORE),
            n_scored=int(a.get(k.N_SCORED, 0)), n_invalid=int(a.get(k.N_INVALID, 0)),
            n_errors=int(a.get(k.N_ERRORS, 0)), scores=tuple(a.get(k.SCORES) or ()),
            params=MappingProxyType(dict(t.params)),
            part_usage=tuple(None if u is None else CallUsage.from_list(u) for u in a.get(k.PART_USAGE) or ()),
            cost=CostSummary.from_dict(a[k.COST]) if isinstance(a.get(k.COST), Mapping) else None,
            candidate=a.get(k.CANDIDATE), costs=tuple(a.get(k.COSTS) or ()),
        )

    @property
    def is_candidate(self) -> bool:
        """A candidate's own trial (not a part of a split candidate, not a foreign trial)."""
        return self.instruction is not None and self.part is None


def claim_template(*, instruction: str, step: int, index: int, worker: int, token: str,
                   part: str | None, params: Mapping[str, Value] | None = None,
                   distributions: Mapping[str, optuna.distributions.BaseDistribution] | None = None,
                   name: str | None = None) -> optuna.trial.FrozenTrial:
    """A RUNNING trial that claims candidate ``index`` of ``step`` (or that part of it) for ``worker``,
    with the candidate's values of the open search dimensions as its parameters and its ``name``
    where that is not its instruction."""
    params = dict(params or {})
    return optuna.trial.FrozenTrial(
        number=-1,
        state=optuna.trial.TrialState.RUNNING,
        value=None,
        datetime_start=datetime.datetime.now(),
        datetime_complete=None,
        params=params,
        distributions={k: v for k, v in (distributions or {}).items() if k in params},
        user_attrs={
            TrialKey.INSTRUCTION: instruction, TrialKey.STEP: step, TrialKey.INDEX: index,
            TrialKey.WORKER: worker, TrialKey.HOST: socket.gethostname(), TrialKey.CLAIM: token,
            **({} if part is None else {TrialKey.PART: part}),
            **({} if name is None or name == instruction else {TrialKey.CANDIDATE: name}),
        },
        system_attrs={},
        intermediate_values={},
        trial_id=-1,
    )


@dataclass(frozen=True)
class NewTrial:
    """A trial just created: its storage id (what :class:`optuna.trial.Trial` opens) and its number
    in the study (what :class:`CandidateTrial` and ``Study.tell`` know it by)."""

    trial_id: int
    number: int


def create_trial(study: optuna.Study, template: optuna.trial.FrozenTrial) -> NewTrial:
    """Create ``template`` (a RUNNING claim with its attributes) in ``study`` in one storage transaction.

    The one use of Optuna's private API in opro (``Study._storage``, ``Study._study_id``), kept here and
    checked against the installed Optuna by tests/search/test_workers.py. Why it is needed: a claim must appear
    with its attributes at once, or another worker reading the trials in between takes it for a
    claim that lost (a RUNNING trial without a token), and two workers can both win the candidate.
    The public ``Study.ask()`` creates a bare trial and sets attributes one write at a time;
    ``Study.add_trial()`` writes it in one transaction but returns nothing to know the trial by
    (the claim compares its own trial with the first claim standing, and fails it when it lost)."""
    storage = study._storage
    trial_id = storage.create_new_trial(study._study_id, template_trial=template)
    return NewTrial(trial_id=trial_id, number=storage.get_trial(trial_id).number)


def complete_before(study: optuna.Study, step: int) -> list[CandidateTrial]:
    """Complete candidates of the steps before ``step``: what a pruning decision may compare with.

    Candidates of the same step are left out: which of them finished first depends on timing and on
    how many workers share the step, and a decision must not.
    """
    out = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        c = CandidateTrial.of(t)
        if t.value is not None and c.step < step:
            out.append(c)
    return out


__all__ = ["CandidateTrial", "NewTrial", "TrialKey", "claim_template", "complete_before", "create_trial"]
