"""How many questions a validation stage asks: the selection and confirmation split of the validation
questions, the looks of the confirmation, and the most calls it can make (what ``opro plan`` and a call
budget count before the stage runs; :mod:`opro.search.validation` asks them)."""

from __future__ import annotations

from opro.search.settings import ValidationSettings
from opro.stats.sequential import look_sizes


def split_sizes(settings: ValidationSettings, n_questions: int, n_finalists: int) -> tuple[int, int]:
    """(selection, confirmation) questions of a validation stage over ``n_questions`` with
    ``n_finalists`` finalists: selection only when there is a choice to make, and at least 2 questions
    left to confirm on. Under a non-inferiority objective (cost) the initial configuration answers the selection
    questions too, so that the choice pairs each finalist with it on the search and selection questions
    (:func:`opro.search.finalists.chosen_finalist`)."""
    choice = n_finalists > 1
    n_sel = min(settings.selection_questions, max(0, n_questions - 2)) if choice else 0
    return n_sel, n_questions - n_sel


def selection_prompts(settings: ValidationSettings, n_finalists: int) -> int:
    """The prompts that answer the selection questions: the finalists, and under a non-inferiority
    objective (cost) the initial configuration too (the choice pairs each finalist with it)."""
    return n_finalists + (1 if settings.claim.objective.non_inferiority else 0)


def confirmation_looks(settings: ValidationSettings, n_confirmation: int, n_extension: int = 0) -> tuple[int, ...]:
    """Paired questions seen at each look of a confirmation: ``validation_looks`` near-even batches
    of the ``n_confirmation`` questions of the validation split, then one look after up to
    ``n_extension`` more (``validation_extension`` caps them)."""
    if n_confirmation < 1:
        return ()
    sizes = look_sizes(n_confirmation, settings.validation_looks)
    extra = min(n_extension, settings.validation_extension)
    return (*sizes, n_confirmation + extra) if extra else sizes


def max_calls(settings: ValidationSettings, n_questions: int, n_extension: int = 0) -> int:
    """The most task + judge calls a validation stage over ``n_questions`` (and up to ``n_extension``
    extension questions) can make (every finalist on the selection questions, both prompts on every
    confirmation question): what a call budget keeps back for it."""
    if not settings.finalists or not n_questions:
        return 0
    n_sel, n_conf = split_sizes(settings, n_questions, settings.finalists)
    sizes = confirmation_looks(settings, n_conf, n_extension)
    return 2 * (selection_prompts(settings, settings.finalists) * n_sel + 2 * (sizes[-1] if sizes else 0))


__all__ = ["confirmation_looks", "max_calls", "selection_prompts", "split_sizes"]
