"""The search's settings, one small frozen type per consumer: :class:`SearchSettings` for the loop
and its steps, :class:`ValidationSettings` for the validation stage (its sizes and its finalists),
:class:`PrunerSettings` for the pruner and :class:`ProposerSettings` for the proposers. Each holds
only the fields its consumer reads. The search never reads the configuration: the workflow layer
builds these from ``[optimizer]`` once (:mod:`opro.workflows.settings`) and passes them in. The
defaults are the configuration's, for scripts and tests that build them by hand."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from opro.stats.claim import Claim
from opro.stats.objectives import Objective


@dataclass(frozen=True)
class ValidationSettings:
    """How the validation stage confirms a finalist against the initial configuration."""

    #: What a winner must show and at which error rate (shared with ``opro plan`` and the probe).
    claim: Claim = field(default_factory=Claim)
    #: Finalists (best by search score) taken to the stage; 0 turns it off.
    finalists: int = 2
    #: Validation questions that choose among several finalists (under cost the initial configuration
    #: answers them too: the choice is paired).
    selection_questions: int = 4
    #: Looks of the group-sequential confirmation, and whether it stops for futility.
    validation_looks: int = 3
    futility: bool = True
    #: Most questions in no split a last look may add when the split's looks did not decide.
    validation_extension: int = 20
    #: Share of a candidate's questions that must be scored validly for it to count as complete.
    min_coverage: float = 0.9
    #: ``refuse`` or ``label`` a run whose validation questions already decided another verdict.
    seen_validation: Literal["refuse", "label"] = "refuse"

    # The claim's fields, read where the finalists are chosen and the verdict decided.
    @property
    def objective(self) -> Objective:
        return self.claim.objective

    @property
    def alpha(self) -> float:
        return self.claim.alpha

    @property
    def margin(self) -> float:
        return self.claim.margin


@dataclass(frozen=True)
class SearchSettings:
    """The loop's budget and pace, with the validation stage it ends in."""

    steps: int = 2
    candidates_per_step: int = 3
    #: Questions a candidate is scored on between two pruning decisions.
    minibatch_size: int = 2
    #: Steps without a gain before the search stops (0: never).
    patience: int = 0
    #: Task + judge calls and tokens for the whole run (0: no limit).
    max_calls: int = 0
    max_tokens_budget: int = 0
    #: Answer a candidate's next minibatch while its pruning decision is pending.
    lookahead: bool = True
    validation: ValidationSettings = field(default_factory=ValidationSettings)

    @property
    def claim(self) -> Claim:
        return self.validation.claim

    @property
    def min_coverage(self) -> float:
        return self.validation.min_coverage


@dataclass(frozen=True)
class PrunerSettings:
    """Which pruner stops weak candidates early, and how eagerly."""

    pruner: Literal["none", "median", "best", "race"] = "race"
    #: ``best``: judge points below the best at which a candidate stops.
    prune_margin: float = 0.5
    prune_warmup_minibatches: int = 1
    #: ``race``: one-sided confidence of the bound (higher: prunes less, later).
    race_confidence: float = 0.95
    #: ``race`` asks the claim's objective, and under cost races on its margin.
    claim: Claim = field(default_factory=Claim)


@dataclass(frozen=True)
class ProposerSettings:
    """How the proposer writes new instructions from the scored history."""

    #: A name in :data:`opro.search.proposers.PROPOSERS`.
    proposer: str = "opro"
    temperature: float = 1.0
    max_tokens: int = 200
    max_instruction_chars: int = 400
    #: Scored instructions shown in the meta-prompt, and the lowest score shown.
    max_history: int = 20
    min_history_score: float = 0.0
    score_scale: Literal["1-5", "0-100"] = "1-5"
    answer_format: Literal["ins", "brackets"] = "ins"
    #: Exemplar questions shown, and how they are picked.
    exemplars: int = 3
    exemplar_strategy: Literal["random", "hardest", "failures"] = "random"
    #: Show each instruction's length (the search optimizes cost).
    show_length: bool = False


__all__ = ["ProposerSettings", "PrunerSettings", "SearchSettings", "ValidationSettings"]
