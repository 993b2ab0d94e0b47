"""The pilot questions: the optimization split first (so the search's step 0 finds the probe's answers
in the call cache), then the questions in no split that a validation extension does not reserve; never
validation, held-out or exemplar ones. By default as many as keep the probe's calls within a fifth of
the plan's search calls (:data:`PROBE_SHARE`), never fewer than the two-sided betting test needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opro.errors import DataError
from opro.probe.proposer import N_PROPOSALS

if TYPE_CHECKING:
    from opro.experiment import Experiment
    from opro.probe.plan import Plan


#: The probe's calls, at most this share of the plan's search calls (search and expected validation).
PROBE_SHARE = 0.2
#: The fewest pilot questions whose paired sd the plan (and the probe's sizing) takes as measured:
#: from fewer it is too rough to plan by.
MIN_PILOT = 6


@dataclass(frozen=True)
class Pilot:
    """The pilot questions: how many, from where, and the probe's calls against the plan's."""

    n: int
    optimization: int
    unused: int
    #: Questions the pilot could take (the optimization split and the unreserved unused pool).
    available: int
    #: The plan's search calls (search and expected validation, every role) and the probe's.
    search_calls: float
    probe_calls: int
    note: str = ""
    #: The probe's task and judge calls that the search's step 0 asks again (the initial configuration
    #: and its first moves on the optimization questions: :func:`opro.probe.contrasts.step0_calls`).
    step0_calls: int = 0

    @property
    def share(self) -> float | None:
        return self.probe_calls / self.search_calls if self.search_calls else None

    def line(self) -> str:
        where = f"{self.optimization} from the optimization split" + (
            f", {self.unused} unused questions no validation extension reserves" if self.unused else "")
        share = "" if self.share is None else f" = {self.share:.0%} of the search's {self.search_calls:.0f}"
        reused = (f"; the search's step 0 asks {self.step0_calls} of them again (the initial configuration and its "
                  f"first moves on the {self.optimization} optimization questions): `opro optimize` finds them in the "
                  "call cache" if self.step0_calls else "")
        return (f"pilot: {self.n} questions ({where}; never validation or held-out); the probe asked "
                f"{self.probe_calls} calls{share}{reused}" + (f"; {self.note}" if self.note else ""))


def pilot_pool(experiment: Experiment) -> tuple[tuple[Any, ...], int]:
    """The questions a pilot may use, in order: the optimization split, then the questions in no split
    that the validation extension does not reserve; and how many come from the optimization split.
    Within each, questions that share a source passage stand together (:func:`opro.stats.clusters.together`:
    the order as it was where none does), so a pilot's end cuts at most one cluster."""
    from opro.stats.clusters import keys_of, together

    ds = experiment.dataset
    optimization = ds.examples_in("optimization")
    unused = ds.unused()[len(experiment.extension_set()):]
    return tuple(part[i] for part in (optimization, unused) for i in together(keys_of(part))), len(optimization)


def search_calls(plan: Plan) -> float:
    return sum(r.search_calls + r.validation_calls for r in plan.roles)


def questions_for(plan: Plan, *, contrasts: int, available: int, alpha: float) -> tuple[int, str]:
    """Pilot questions within :data:`PROBE_SHARE` of the plan's search calls (a question costs a task and
    a judge call per configuration; the optimizer's few calls come first), never fewer than the two-sided
    betting test needs to reach ``alpha`` at all, never more than ``available``; and what to say about it."""
    from opro.judges.parsing import SCORE_MAX, SCORE_MIN
    from opro.stats.betting import min_pairs

    budget = PROBE_SHARE * search_calls(plan) - (1 + N_PROPOSALS)
    n = int(budget // (2 * (1 + contrasts)))
    least = min_pairs(alpha=alpha / 2, scale=(SCORE_MIN, SCORE_MAX)) or available + 1
    notes = []
    if n < least:
        notes.append(f"{least} questions, the fewest with which a paired test can reach alpha {alpha:g}, cost more "
                     f"than {PROBE_SHARE:.0%} of this small search")
        n = least
    if n > available:
        notes.append(f"only {available} pilot questions exist (give the dataset more questions, or lower "
                     "[optimizer].validation_extension)" + ("" if available >= least else
                                                            f": fewer than the {least} a paired test needs, so "
                                                            "every effect stays undecided"))
        n = available
    return n, "; ".join(notes)


def pilot_size(plan: Plan, *, questions: int | None, contrasts: int, available: int, alpha: float) -> tuple[int, str]:
    """How many pilot questions, and a note where the count is not what was asked or planned."""
    if questions is None:
        return questions_for(plan, contrasts=contrasts, available=available, alpha=alpha)
    if questions < 1:
        raise DataError(f"--questions {questions}: give at least 1")
    note = f"only {available} pilot questions exist (asked for {questions})" if questions > available else ""
    return min(questions, available), note


__all__ = ["MIN_PILOT", "PROBE_SHARE", "Pilot", "pilot_pool", "pilot_size", "questions_for", "search_calls"]
