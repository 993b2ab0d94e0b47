"""How many questions a validation stage asks: the selection and confirmation split of the validation
questions, the looks of the confirmation, and the most calls it can make (what ``opro plan`` and a call
budget count before the stage runs; :mod:`opro.search.validation` asks them)."""

from __future__ import annotations

from opro.config import OptimizerSection
from opro.stats.sequential import look_sizes


def split_sizes(settings: OptimizerSection, n_questions: int, n_finalists: int) -> tuple[int, int]:
    """(selection, confirmation) questions of a validation stage over ``n_questions`` with
    ``n_finalists`` finalists: selection only when there is a choice to make by quality, and at least
    2 questions left to confirm on. Under ``objective = "cost"`` the choice is made on the search
    questions (:func:`opro.search.finalists.chosen_finalist`), so every question confirms."""
    choice = n_finalists > 1 and settings.objective != "cost"
    n_sel = min(settings.selection_questions, max(0, n_questions - 2)) if choice else 0
    return n_sel, n_questions - n_sel


def confirmation_looks(settings: OptimizerSection, n_confirmation: int, n_extension: int = 0) -> tuple[int, ...]:
    """Paired questions seen at each look of a confirmation: ``validation_looks`` near-even batches
    of the ``n_confirmation`` questions of the validation split, then one look after up to
    ``n_extension`` more (``validation_extension`` caps them)."""
    if n_confirmation < 1:
        return ()
    sizes = look_sizes(n_confirmation, settings.validation_looks)
    extra = min(n_extension, settings.validation_extension)
    return (*sizes, n_confirmation + extra) if extra else sizes


def futility_confidence(*, objective: str, alpha: float) -> float | None:
    """The validation stage's futility rule (:func:`opro.stats.sequential.futile`): under ``objective =
    "cost"`` a look stops only once the finalist is clearly worse than the initial configuration by
    more than the margin (the one-sided ``1 - alpha`` upper bound of the shifted differences' mean <=
    0), as the cost race prunes; under ``"quality"`` once it is not ahead (None)."""
    return 1.0 - alpha if objective == "cost" else None


def max_calls(settings: OptimizerSection, n_questions: int, n_extension: int = 0) -> int:
    """The most task + judge calls a validation stage over ``n_questions`` (and up to ``n_extension``
    extension questions) can make (every finalist on the selection questions, both prompts on every
    confirmation question): what a call budget keeps back for it."""
    if not settings.finalists or not n_questions:
        return 0
    n_sel, n_conf = split_sizes(settings, n_questions, settings.finalists)
    sizes = confirmation_looks(settings, n_conf, n_extension)
    return 2 * (settings.finalists * n_sel + 2 * (sizes[-1] if sizes else 0))


__all__ = ["confirmation_looks", "futility_confidence", "max_calls", "split_sizes"]
