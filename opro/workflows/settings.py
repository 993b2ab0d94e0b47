"""The search's settings and the run's claim, built from ``[optimizer]``: the one place that reads
the configuration for the search (:mod:`opro.search.settings`) and decides the objective, alpha
and margin (:class:`~opro.stats.claim.Claim`) the validation stage, ``opro plan`` and the probe
share."""

from __future__ import annotations

from opro.config import OptimizerSection
from opro.search.settings import ProposerSettings, PrunerSettings, SearchSettings, ValidationSettings
from opro.stats.claim import Claim
from opro.stats.objectives import objective_named


def claim(optimizer: OptimizerSection) -> Claim:
    """What a validation decision claims and at which error rate."""
    return Claim(objective=objective_named(optimizer.objective), alpha=optimizer.alpha, margin=optimizer.margin)


def validation_settings(optimizer: OptimizerSection) -> ValidationSettings:
    o = optimizer
    return ValidationSettings(claim=claim(o), finalists=o.finalists, selection_questions=o.selection_questions,
                              validation_looks=o.validation_looks, futility=o.futility,
                              validation_extension=o.validation_extension, min_coverage=o.min_coverage,
                              seen_validation=o.seen_validation)


def search_settings(optimizer: OptimizerSection) -> SearchSettings:
    o = optimizer
    return SearchSettings(steps=o.steps, candidates_per_step=o.candidates_per_step, minibatch_size=o.minibatch_size,
                          patience=o.patience, max_calls=o.max_calls, max_tokens_budget=o.max_tokens_budget,
                          lookahead=o.lookahead, validation=validation_settings(o))


def pruner_settings(optimizer: OptimizerSection) -> PrunerSettings:
    o = optimizer
    return PrunerSettings(pruner=o.pruner, prune_margin=o.prune_margin,
                          prune_warmup_minibatches=o.prune_warmup_minibatches, race_confidence=o.race_confidence,
                          claim=claim(o))


def proposer_settings(optimizer: OptimizerSection) -> ProposerSettings:
    o = optimizer
    return ProposerSettings(proposer=o.proposer, temperature=o.temperature, max_tokens=o.max_tokens,
                            max_instruction_chars=o.max_instruction_chars, max_history=o.max_history,
                            min_history_score=o.min_history_score, score_scale=o.score_scale,
                            answer_format=o.answer_format, exemplars=o.exemplars,
                            exemplar_strategy=o.exemplar_strategy, show_length=objective_named(o.objective).non_inferiority)


__all__ = ["claim", "proposer_settings", "pruner_settings", "search_settings", "validation_settings"]
