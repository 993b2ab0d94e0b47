"""Which candidates the validation stage may choose (its finalists), and which one it confirms.

Choosing claims nothing: the confirmation (:mod:`opro.search.validation`) tests the one chosen on
questions the choice never saw. What the choice decides is how often a saving or a gain that is
there gets confirmed. Under the quality objective the finalist with the best mean over its search
and selection questions is chosen. Under a non-inferiority objective (cost: what
:attr:`opro.stats.objectives.Objective.non_inferiority` says, on its amount per answer) the finalist with the largest
*expected confirmed saving*: its share saved times the chance that the confirmation shows it within
the margin, that chance estimated from its paired differences to the initial configuration on the
search questions and the selection questions (which the initial configuration answers too under
cost), one finalist per setting. The rule it replaced, "the cheapest finalist whose mean is within the
margin of the initial configuration's", compared means over different questions (the finalist's
search and selection ones against the initial one's search ones, issue 61), and even paired it
chose a cheaper, truly worse finalist whenever a few questions put it within the margin, which the
confirmation then refused (``experiments/bench_selection.py --cost --space``, docs/statistics.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

from opro.program.configurations import settings_text
from opro.search.metaprompt import normalize_instruction
from opro.search.results import CandidateRecord, quality_cost_front
from opro.search.settings import ValidationSettings
from opro.stats.objectives import COST, Objective
from opro.stats.paired import paired_valid
from opro.stats.sequential import t_interval


def _amount(r: CandidateRecord, objective: Objective) -> float:
    """What ``r`` spends per answer by the objective's measure (a record without one: infinite)."""
    amount = objective.amount(r.cost)
    return math.inf if amount is None else amount


def _cheaper(history: Sequence[CandidateRecord], *, initial: str, margin: float,
             objective: Objective = COST) -> tuple[CandidateRecord | None, list[CandidateRecord]]:
    """The initial configuration's search record, and the complete candidates cheaper per answer than it
    (the objective's amount) and not clearly worse (:func:`cost_finalists`)."""
    key = normalize_instruction(initial)
    done = [r for r in history if r.status == "complete" and r.score is not None and objective.amount(r.cost) is not None]
    base = next((r for r in done if normalize_instruction(r.name) == key), None)
    if base is None:
        return None, []

    def not_clearly_worse(r: CandidateRecord) -> bool:
        a, b = paired_valid(list(r.scores), list(base.scores))
        ci = t_interval([x - y for x, y in zip(a, b, strict=True)])
        if ci is None:
            return (r.score or 0.0) >= (base.score or 0.0) - margin
        return ci[1] > -margin

    return base, [r for r in done if normalize_instruction(r.name) != key
                  and _amount(r, objective) < _amount(base, objective) and not_clearly_worse(r)]


def cost_finalists(history: Sequence[CandidateRecord], *, initial: str, margin: float) -> list[CandidateRecord]:
    """The search's quality-cost front of the cost objective, cheapest first: the complete candidates
    cheaper per answer than the initial configuration (the candidate named ``initial``: the initial
    instruction with the initial configuration's values; the same instruction with other values is
    another candidate) and not clearly worse, kept only where no other such candidate is both as cheap
    and as good and better in one. Not clearly worse: the upper end of the paired 95% t interval of its
    search scores minus the initial one's (question by question) is above ``-margin``; with fewer than 2
    pairs, its mean is. A handful of search questions cannot show that a cheaper candidate is as good,
    only that it is clearly worse, so this only chooses what the confirmation tests; it claims nothing."""
    return quality_cost_front(_cheaper(history, initial=initial, margin=margin)[1])


def choose_finalists(history: Sequence[CandidateRecord], *, initial: str, settings: ValidationSettings,
                     n_confirmation: int) -> list[CandidateRecord]:
    """The candidates the validation stage may choose, the initial configuration (by name) left out: by
    quality the best complete candidates by search score; by cost (cheapest first) the cheaper, not
    clearly worse candidates (:func:`cost_finalists`) with the largest :func:`expected_saving` at
    ``n_confirmation`` pairs, one per setting (its values of the open dimensions). The front alone
    dropped a truly equal setting whenever a cheaper, worse one scored as well on the search's few
    questions, or one as cheap scored better (8 of 60 runs of ``bench_selection.py --cost --space``); a
    dominated candidate still ranks below what dominates it."""
    objective = settings.objective
    if objective.non_inferiority:
        base, cheaper = _cheaper(history, initial=initial, margin=settings.margin, objective=objective)
        if base is None:
            return []
        expected = {id(r): expected_saving(r, base, margin=settings.margin, alpha=settings.alpha,
                                           n_confirmation=n_confirmation, objective=objective) or 0.0 for r in cheaper}
        ranked = sorted(cheaper, key=lambda r: (-expected[id(r)], _amount(r, objective), r.step, r.index))
        # One finalist per setting: a setting's cost is what the choice weighs, and its wordings have competed
        # in the search already. Two wordings of one cheaper, worse setting that 6 search questions put level
        # took both places and left the equal setting out (5 of 60 runs of bench_selection.py --cost --space).
        # (Without a settings space every candidate is its own: wordings are all there is to choose.)
        distinct: dict[object, CandidateRecord] = {}
        for r in ranked:
            distinct.setdefault(settings_text(r.params) if r.params else id(r), r)
        finalists = list(distinct.values())[: settings.finalists]
        return sorted(finalists, key=lambda r: (_amount(r, objective), r.step, r.index))
    initial_key = normalize_instruction(initial)
    return sorted(
        (r for r in history if r.status == "complete" and r.score is not None
         and normalize_instruction(r.name) != initial_key),
        key=lambda r: (-(r.score or 0.0), r.step, r.index),
    )[: settings.finalists]


def chosen_finalist(finalists: Sequence[CandidateRecord], selection_scores: Mapping[str, Sequence[float | None]], *,
                    initial: str, n_confirmation: int, settings: ValidationSettings,
                    history: Sequence[CandidateRecord]) -> int:
    """The index of the finalist to confirm. By quality: the best mean over its search and selection
    questions (ties to the better search rank). By cost (finalists cheapest first): the largest
    :func:`expected_saving` against the initial configuration on the search questions and the selection
    questions (``selection_scores`` of the initial instruction too: pairs only where both answered;
    ties to the cheaper);
    the quality choice where there is no such record or no finalist has one."""
    def pooled(k: int) -> tuple[float, int]:
        f = finalists[k]
        valid = [x for x in selection_scores.get(f.instruction, ()) if x is not None]
        total = (f.score or 0.0) * f.n_scored + sum(valid)
        return (total / max(1, f.n_scored + len(valid)), -k)  # ties to the better search rank

    best = max(range(len(finalists)), key=pooled)
    objective = settings.objective
    if not objective.non_inferiority:
        return best
    key = normalize_instruction(initial)
    base = next((r for r in history if r.status == "complete" and objective.amount(r.cost) is not None
                 and normalize_instruction(r.instruction) == key), None)
    if base is None or _amount(base, objective) <= 0:
        return best
    initial_selection = list(selection_scores.get(initial, ()))  # keyed as the stage asked it
    expected = [expected_saving(f, base, margin=settings.margin, alpha=settings.alpha, n_confirmation=n_confirmation,
                                objective=objective, selection=(list(selection_scores.get(f.instruction, ())), initial_selection))
                for f in finalists]
    if all(e is None for e in expected):
        return best
    return max(range(len(finalists)), key=lambda k: (expected[k] if expected[k] is not None else -math.inf, -k))


def expected_saving(finalist: CandidateRecord, initial: CandidateRecord, *, margin: float, alpha: float,
                    n_confirmation: int, objective: Objective = COST,
                    selection: tuple[Sequence[float | None], Sequence[float | None]] = ((), ())) -> float | None:
    """The finalist's share saved per answer (its search cost against the initial one's) times the chance
    (the objective's amount) that a test of ``n_confirmation`` pairs at ``alpha`` shows it within ``margin``: the one-sided normal
    power at its mean paired difference to the initial configuration on the search questions both
    scored and on the selection questions (``selection``: the finalist's scores and the initial
    configuration's, position by position), with their sd. None without a cost or a pair. An estimate
    that only orders the finalists: it claims nothing (the confirmation tests the one chosen on other
    questions)."""
    mine, theirs = objective.amount(finalist.cost), objective.amount(initial.cost)
    if mine is None or theirs is None or theirs <= 0:
        return None
    d = [x - y for pair in ((finalist.scores, initial.scores), selection)
         for x, y in zip(*paired_valid(list(pair[0]), list(pair[1])), strict=True)]
    if not d:
        return None
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else 0.0
    if sd <= 1e-12:  # every difference the same: shown within the margin or not
        power = 1.0 if mean + margin > 0 else 0.0
    else:
        z = NormalDist()
        power = z.cdf((mean + margin) * math.sqrt(max(1, n_confirmation)) / sd - z.inv_cdf(1 - alpha))
    return (1.0 - mine / theirs) * power


__all__ = ["choose_finalists", "chosen_finalist", "cost_finalists", "expected_saving"]
