"""The search: proposers, the scorer, pruners, validation, workers and the study, behind
:class:`Search`. Everything here is plain data and collaborators passed in; nothing names a file,
MLflow, or the CLI's wording."""

from opro.search.loop import Search
from opro.search.proposers import PROPOSERS, Proposal, ProposalContext, Proposer, make_proposer
from opro.search.pruners import (
    BestSoFarPruner,
    EarlierStepsMedianPruner,
    EarlierStepsPruner,
    RacingPruner,
    RunningCandidate,
    make_pruner,
)
from opro.search.records import Recorder
from opro.search.results import (
    CandidateRecord,
    FinalistRecord,
    OptimizationResult,
    ValidationResult,
    merge_usage,
    optimism_points,
)
from opro.search.scoring import CandidateScorer, QuestionFeedback, Template
from opro.search.settings import ProposerSettings, PrunerSettings, SearchSettings, ValidationSettings
from opro.search.storage import open_storage
from opro.search.study import FingerprintMismatch, SearchStudy
from opro.search.validation import validation_prompts
from opro.search.workers import WorkerPlan, WorkerSpecError, check_worker_spec

__all__ = [
    "PROPOSERS",
    "BestSoFarPruner",
    "CandidateRecord",
    "CandidateScorer",
    "EarlierStepsMedianPruner",
    "EarlierStepsPruner",
    "FinalistRecord",
    "FingerprintMismatch",
    "OptimizationResult",
    "Proposal",
    "ProposalContext",
    "Proposer",
    "ProposerSettings",
    "PrunerSettings",
    "QuestionFeedback",
    "RacingPruner",
    "Recorder",
    "RunningCandidate",
    "Search",
    "SearchSettings",
    "SearchStudy",
    "Template",
    "ValidationResult",
    "ValidationSettings",
    "WorkerPlan",
    "WorkerSpecError",
    "check_worker_spec",
    "make_proposer",
    "make_pruner",
    "merge_usage",
    "open_storage",
    "optimism_points",
    "validation_prompts",
]
