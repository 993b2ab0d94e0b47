"""What the probe changes of the initial configuration, one change at a time, and which of those
changes are the search's own first step.

The probe's contrasts of the open ``[search.space]`` dimensions are the extremes of each dimension
(its smallest and largest choice other than the initial value) and the search's *first moves*
(:meth:`opro.search.space.SearchSpace.first_moves`: each open dimension at the choice the plan
prices lowest under the cost objective, highest under quality, and all of them together).
Every one is configured as the search configures a candidate (:meth:`SearchSpace.configure` on the
initial template), so where a contrast is a first move its task and judge calls on the optimization
questions are the very calls step 0 makes: ``opro optimize`` finds them in the call cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opro.program.configurations import changed, settings_text
from opro.program.dimensions import Value, dimension

if TYPE_CHECKING:
    from opro.program.prompts import QATemplate
    from opro.search.space import SearchSpace

#: The dimension of the contrast that sets every first move at once (not a dimension to open or close).
TOGETHER = "together"
#: Its label in the probe's grid, by whether the objective's first moves go to the cheapest choices
#: (:meth:`opro.stats.objectives.Objective.first_move`; the grid is 80 columns: labels of at most 17).
TOGETHER_LABEL = {True: "cheapest together", False: "dearest together"}


@dataclass(frozen=True)
class Contrast:
    """One change of the initial configuration: ``dimension`` is ``wording`` (no instruction, another
    one), ``format`` (the format instruction), a ``[search.space]`` dimension at ``value``, or
    :data:`TOGETHER` (every first move at once; ``value`` names the settings). ``step0``: the
    configuration is one the search's step 0 evaluates (the initial instruction with a first move)."""

    label: str
    template: QATemplate
    dimension: str
    value: Value | None = None
    step0: bool = False


def dimension_contrasts(initial: QATemplate, space: SearchSpace | None) -> list[Contrast]:
    """The extremes of every open dimension of ``space`` (its smallest and largest choice other than the
    initial value; each other choice of a ``choice`` dimension), each as the search would configure it
    (:meth:`SearchSpace.configure`)."""
    if space is None:
        return []
    out = []
    for name, choices in space.choices.items():
        others = [v for v in choices if v != space.initial[name]]
        ends = {min(others), max(others)} if others and dimension(name).numeric else set(others)  # type: ignore[type-var]
        for value in sorted(ends):  # type: ignore[type-var]
            out.append(Contrast(f"{name} {value}", space.configure(initial, {name: value}), name, value))
    return out


def search_contrasts(initial: QATemplate, space: SearchSpace | None) -> list[Contrast]:
    """The probe's contrasts of the open dimensions: the extremes of each (:func:`dimension_contrasts`)
    and every first move of the search's step 0 that is not one of them (a dimension's move at a
    choice between its extremes; all the moves together), each marked ``step0`` where it is a first
    move. Configured alike, a contrast and the first move it equals are one set of calls."""
    out = dimension_contrasts(initial, space)
    if space is None:
        return out
    for move in space.first_moves():
        shown = changed(move, space.initial)
        template = space.configure(initial, move)
        at = next((i for i, c in enumerate(out) if c.template == template), None)
        if at is not None:
            c = out[at]
            out[at] = Contrast(c.label, c.template, c.dimension, c.value, step0=True)
        elif len(shown) == 1:
            ((name, value),) = shown.items()
            out.append(Contrast(f"{name} {value}", template, name, value, step0=True))
        else:
            out.append(Contrast(TOGETHER_LABEL[space.objective.first_move(0.0) < space.objective.first_move(1.0)], template, TOGETHER, settings_text(shown),
                                step0=True))
    return out


def step0_calls(contrasts: Sequence[Contrast], *, optimization: int) -> int:
    """The task and judge calls of the probe that the search's step 0 asks again (the initial
    configuration and each first move, a task and a judge call on each of the pilot's ``optimization``
    questions): what ``opro optimize`` then finds in the call cache."""
    return 2 * optimization * (1 + sum(c.step0 for c in contrasts))


__all__ = ["TOGETHER", "TOGETHER_LABEL", "Contrast", "dimension_contrasts", "search_contrasts", "step0_calls"]
