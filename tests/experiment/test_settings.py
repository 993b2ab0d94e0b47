"""The search's settings built from ``[optimizer]`` (opro/experiment/settings.py)."""

from __future__ import annotations

import dataclasses

from opro.config import OptimizerSection
from opro.experiment.settings import (
    claim,
    proposer_settings,
    pruner_settings,
    search_settings,
    validation_settings,
)
from opro.search.settings import ProposerSettings, PrunerSettings, SearchSettings, ValidationSettings
from opro.stats.claim import Claim


def test_the_config_declares_the_defaults_once_and_the_settings_types_none() -> None:
    """Each setting's default is declared once, in ``[optimizer]``: a script gets the settings of an empty
    section from the adapter, and a settings type restates no default."""
    for kind in (SearchSettings, ValidationSettings, PrunerSettings, ProposerSettings):
        restated = [f.name for f in dataclasses.fields(kind)
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
        assert not restated, (kind.__name__, restated)
    o = OptimizerSection()
    assert (search_settings(o).steps, pruner_settings(o).pruner, proposer_settings(o).proposer) == (o.steps, o.pruner, o.proposer)
    assert claim(o) == Claim()


def test_each_setting_is_carried_from_the_config_under_its_name() -> None:
    o = OptimizerSection(objective="cost", alpha=0.1, margin=0.5, finalists=3, selection_questions=6,
                         validation_looks=2, futility=False, validation_extension=7, min_coverage=0.8,
                         seen_validation="label", steps=4, candidates_per_step=5, minibatch_size=3, patience=2,
                         max_calls=900, max_tokens_budget=10_000, lookahead=False, pruner="best", prune_margin=0.3,
                         prune_warmup_minibatches=2, race_confidence=0.9, proposer="reflect", temperature=0.5,
                         max_tokens=99, max_instruction_chars=300, max_history=7, min_history_score=1.0,
                         score_scale="0-100", answer_format="brackets", exemplars=2, exemplar_strategy="hardest")
    rule = Claim(objective="cost", alpha=0.1, margin=0.5)
    assert claim(o) == rule and validation_settings(o).claim == rule and pruner_settings(o).claim == rule
    built = [search_settings(o), validation_settings(o), pruner_settings(o), proposer_settings(o)]
    for settings in built:
        for f in dataclasses.fields(settings):
            if hasattr(o, f.name):
                assert getattr(settings, f.name) == getattr(o, f.name), f.name
    assert search_settings(o).validation == validation_settings(o)
    assert proposer_settings(o).show_length and not proposer_settings(OptimizerSection()).show_length
    v = validation_settings(o)
    assert (v.objective.name, v.alpha, v.margin) == ("cost", 0.1, 0.5)
    assert isinstance(v, ValidationSettings)
