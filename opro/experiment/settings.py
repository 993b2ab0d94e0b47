"""The search's settings and the run's claim, built from ``[optimizer]``: the one place that reads
the configuration for the search (:mod:`opro.search.settings`) and decides the objective, alpha
and margin (:class:`~opro.stats.claim.Claim`) the validation stage, ``opro plan`` and the probe
share. An adapter only: each setting is declared once, its default and its check in the config and its
consumer's field in :mod:`opro.search.settings`, and carried by name."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from opro.config import OptimizerSection
from opro.search.settings import ProposerSettings, PrunerSettings, SearchSettings, ValidationSettings
from opro.stats.claim import Claim
from opro.stats.objectives import objective_named

_S = TypeVar("_S")


def claim(optimizer: OptimizerSection) -> Claim:
    """What a validation decision claims and at which error rate."""
    return Claim(objective=objective_named(optimizer.objective), alpha=optimizer.alpha, margin=optimizer.margin)


def _carried(kind: type[_S], optimizer: OptimizerSection, **derived: Any) -> _S:
    """A ``kind`` with each of its fields taken from ``[optimizer]``'s field of the same name, but the
    ``derived`` ones: the settings types and the section declare each setting once, and nothing here
    restates them."""
    names = [f.name for f in dataclasses.fields(kind) if f.name not in derived]  # type: ignore[arg-type]
    return kind(**{name: getattr(optimizer, name) for name in names}, **derived)


def validation_settings(optimizer: OptimizerSection) -> ValidationSettings:
    return _carried(ValidationSettings, optimizer, claim=claim(optimizer))


def search_settings(optimizer: OptimizerSection) -> SearchSettings:
    return _carried(SearchSettings, optimizer, validation=validation_settings(optimizer))


def pruner_settings(optimizer: OptimizerSection) -> PrunerSettings:
    return _carried(PrunerSettings, optimizer, claim=claim(optimizer))


def proposer_settings(optimizer: OptimizerSection) -> ProposerSettings:
    return _carried(ProposerSettings, optimizer, show_length=objective_named(optimizer.objective).non_inferiority)


__all__ = ["claim", "proposer_settings", "pruner_settings", "search_settings", "validation_settings"]
