"""The search's settings, one small frozen type per consumer: :class:`SearchSettings` for the loop
and its steps, :class:`ValidationSettings` for the validation stage (its sizes and its finalists),
:class:`PrunerSettings` for the pruner and :class:`ProposerSettings` for the proposers. Each holds
only the fields its consumer reads. The search never reads the configuration: the workflow layer
builds these from ``[optimizer]`` once (:mod:`opro.experiment.settings`, each field from the config's of
the same name) and passes them in. The configuration declares the defaults, once: a script gets them from
``validation_settings(OptimizerSection(...))`` and its siblings, never from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from opro.stats.claim import Claim
from opro.stats.objectives import Objective


@dataclass(frozen=True, kw_only=True)
class ValidationSettings:
    """How the validation stage confirms a finalist against the initial configuration."""

    #: What a winner must show and at which error rate (shared with ``opro plan`` and the probe).
    claim: Claim
    #: Finalists (best by search score) taken to the stage; 0 turns it off.
    finalists: int
    #: Validation questions that choose among several finalists (under cost the initial configuration
    #: answers them too: the choice is paired).
    selection_questions: int
    #: Looks of the group-sequential confirmation, and whether it stops for futility.
    validation_looks: int
    futility: bool
    #: Most questions in no split a last look may add when the split's looks did not decide.
    validation_extension: int
    #: Share of a candidate's questions that must be scored validly for it to count as complete.
    min_coverage: float
    #: ``refuse`` or ``label`` a run whose validation questions already decided another verdict.
    seen_validation: Literal["refuse", "label"]

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


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """The loop's budget and pace, with the validation stage it ends in."""

    steps: int
    candidates_per_step: int
    #: Questions a candidate is scored on between two pruning decisions.
    minibatch_size: int
    #: Steps without a gain before the search stops (0: never).
    patience: int
    #: Task + judge calls and tokens for the whole run (0: no limit).
    max_calls: int
    max_tokens_budget: int
    #: Answer a candidate's next minibatch while its pruning decision is pending.
    lookahead: bool
    validation: ValidationSettings

    @property
    def claim(self) -> Claim:
        return self.validation.claim

    @property
    def min_coverage(self) -> float:
        return self.validation.min_coverage


@dataclass(frozen=True, kw_only=True)
class PrunerSettings:
    """Which pruner stops weak candidates early, and how eagerly."""

    pruner: Literal["none", "median", "best", "race"]
    #: ``best``: judge points below the best at which a candidate stops.
    prune_margin: float
    prune_warmup_minibatches: int
    #: ``race``: one-sided confidence of the bound (higher: prunes less, later).
    race_confidence: float
    #: ``race`` asks the claim's objective, and under cost races on its margin.
    claim: Claim


@dataclass(frozen=True, kw_only=True)
class ProposerSettings:
    """How the proposer writes new instructions from the scored history."""

    #: A name in :data:`opro.search.proposers.PROPOSERS`.
    proposer: str
    temperature: float
    max_tokens: int
    max_instruction_chars: int
    #: Scored instructions shown in the meta-prompt, and the lowest score shown.
    max_history: int
    min_history_score: float
    score_scale: Literal["1-5", "0-100"]
    answer_format: Literal["ins", "brackets"]
    #: Exemplar questions shown, and how they are picked.
    exemplars: int
    exemplar_strategy: Literal["random", "hardest", "failures"]
    #: Show each instruction's length (the search optimizes cost).
    show_length: bool


__all__ = ["ProposerSettings", "PrunerSettings", "SearchSettings", "ValidationSettings"]
