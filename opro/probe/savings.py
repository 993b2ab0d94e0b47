"""The probe's cost side: what each contrast saves per answer, in the cost measure ``opro optimize``
uses, and what the cost objective's search will do about it.

A contrast's saving is its cost per answer minus the initial configuration's, paired by pilot
question (:func:`opro.program.cost.paired_difference`: money where the task model has prices, else
task tokens with completions weighted, :class:`opro.program.cost.CostModel`), with its 95% t
interval. The share of the initial cost is shown as a point figure beside it: the interval is the
difference's, which covers as a mean difference does, not a ratio's.

A cheaper contrast is named "cheaper and not worse" only where it is cheaper on the pilot (the
saving's interval below 0, or its mean below the initial one's where no interval exists) and a
non-inferiority test at ``[optimizer].margin`` passes on the pilot (the paired one-sided test of
``opro compare --margin``, Holm over the cheaper contrasts, on the differences the contrast's interval
reads: side by side under ``[judge].paired``, cluster means where questions share a passage): an interval that merely holds 0 is not
evidence of "not worse". Under the cost objective each verdict carries its saving and that test,
and the recommendation says what the search does next: step 0 evaluates the first moves (the probe's
answers to them on the optimization questions come from the call cache), the race stops a cheaper
candidate only when it cannot be within the margin, and only the validation stage claims a saving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opro.stats.objectives import COST, Objective

if TYPE_CHECKING:
    from opro.evaluation.rows import EvaluationRow
    from opro.program.cost import CostModel
    from opro.stats.noninferiority import NonInferiority

#: The level of the non-inferiority tests (as the probe's intervals: 95%).
ALPHA = 0.05


@dataclass(frozen=True)
class Saving:
    """A contrast's cost per answer against the initial configuration's, paired on the pilot questions
    both answered: the mean difference (contrast - initial; below 0 is a saving) with its 95% t
    interval (None below 2 pairs), in ``unit`` (``usd`` or weighted ``tokens``)."""

    unit: str
    n: int
    initial_cost: float
    difference: float
    low: float | None = None
    high: float | None = None

    @property
    def relative(self) -> float | None:
        """The change as a share of the initial cost (-0.38: 38% cheaper); None where it is 0."""
        return self.difference / self.initial_cost if self.initial_cost else None

    @property
    def lower(self) -> bool:
        """Cheaper on the pilot: the interval lies below 0 (the mean, where there is no interval)."""
        return self.high < 0 if self.high is not None else self.difference < 0

    def text(self) -> str:
        """``-38% per answer (-604 [-650, -560])``; ``the same per answer`` where nothing changed."""
        if self.difference == 0 and self.low in (0, None) and self.high in (0, None):
            return "the same per answer"
        share = "" if self.relative is None else f"{self.relative:+.0%} "
        ci = "" if self.low is None or self.high is None else f" [{_amount(self.low, self.unit)}, {_amount(self.high, self.unit)}]"
        return f"{share}per answer ({_amount(self.difference, self.unit)}{ci})"


def _amount(x: float, unit: str) -> str:
    return f"{x:+.3g}" if unit in ("usd", "seconds") else f"{round(x) + 0:+d}"


def saving_of(rows: Sequence[EvaluationRow], base: Sequence[EvaluationRow], *, model: CostModel) -> Saving | None:
    """``rows``' cost per answer against ``base``'s, question by question (None: no question both answered)."""
    from opro.program.cost import paired_difference

    d = paired_difference(rows, base, model=model)
    if d is None:
        return None
    ci = d.cost.ci
    return Saving(unit=model.unit, n=d.cost.n, initial_cost=d.baseline_cost, difference=d.cost.estimate,
                  low=None if ci is None else ci[0], high=None if ci is None else ci[1])


def saving_from(data: Mapping[str, Any] | None) -> Saving | None:
    """A :class:`Saving` as ``probe.json`` keeps it (None: none kept)."""
    return None if data is None else Saving(**data)


class _Verdict(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> str: ...


class Measured(Protocol):
    """What the cost side reads of a probe's effect (:class:`opro.probe.effects.Effect`)."""

    @property
    def label(self) -> str: ...
    @property
    def dimension(self) -> str: ...
    @property
    def scores(self) -> tuple[float | None, ...]: ...
    @property
    def cost(self) -> float | None: ...
    @property
    def saving(self) -> Saving | None: ...
    @property
    def step0(self) -> bool: ...
    @property
    def high(self) -> float | None: ...
    @property
    def verdict(self) -> _Verdict | None: ...
    @property
    def differences(self) -> tuple[float | None, ...]: ...
    def tested(self) -> tuple[list[float], list[str] | None]: ...


E = TypeVar("E", bound=Measured)


def cheaper(e: Measured, *, initial: Measured) -> bool:
    """``e`` is cheaper per answer than the initial configuration on the pilot (its paired saving, else
    its mean cost) and not shown to hurt."""
    if e.verdict is None or e.verdict.kind in ("hurts", "identical", "baseline"):
        return False
    if e.saving is not None:
        return e.saving.lower
    return e.cost is not None and initial.cost is not None and e.cost < initial.cost


def noninferiority_tests(effects: Sequence[E], *, initial: Measured, margin: float) -> list[tuple[E, NonInferiority]]:
    """Each cheaper contrast (:func:`cheaper`) with its non-inferiority test at ``margin`` on the pilot
    (:func:`opro.stats.noninferiority.noninferiority`, Holm over the cheaper contrasts, alpha :data:`ALPHA`):
    on the differences its interval reads (side by side, cluster means: ``tested()``), else paired on the
    questions both scored."""
    from opro.judges.parsing import SCORE_MAX, SCORE_MIN
    from opro.stats.noninferiority import holm_noninferiority, noninferiority
    from opro.stats.paired import paired_valid

    def test(e: Measured) -> NonInferiority:
        if not e.differences:
            return noninferiority(*paired_valid(list(e.scores), list(initial.scores)), margin=margin, alpha=ALPHA,
                                  scale=(SCORE_MIN, SCORE_MAX))
        d, clusters = e.tested()
        return noninferiority(d, [0.0] * len(d), margin=margin, alpha=ALPHA, scale=(SCORE_MIN, SCORE_MAX),
                              clusters=clusters)

    found = [e for e in effects if cheaper(e, initial=initial)]
    return list(zip(found, holm_noninferiority([test(e) for e in found]), strict=True))


def cheaper_not_worse(effects: Sequence[E], *, initial: Measured, margin: float) -> list[tuple[E, NonInferiority]]:
    """The cheaper contrasts whose non-inferiority at ``margin`` holds on the pilot, each with its test."""
    return [(e, t) for e, t in noninferiority_tests(effects, initial=initial, margin=margin) if t.passed]


def with_costs(effects: Sequence[E], *, initial: Measured, margin: float) -> tuple[E, ...]:
    """Under the cost objective: each verdict with its saving and, for a cheaper contrast, its
    non-inferiority test at ``margin`` ("cheaper and not worse by more than 0.25 (p 0.01)" or "not
    shown within 0.25 (p 0.31)")."""
    tested = {id(e): t for e, t in noninferiority_tests(effects, initial=initial, margin=margin)}
    out = []
    for e in effects:
        v = e.verdict
        if v is None or v.kind == "identical" or e.saving is None:
            out.append(e)
            continue
        text = f"{v.text}; cost {e.saving.text()}"
        t = tested.get(id(e))
        if t is not None:
            holm = f", Holm over {t.n_comparisons}" if t.n_comparisons > 1 else ""
            if t.passed:
                text += f"; cheaper and not worse by more than {margin:g} (betting test on {t.n} pairs, p {t.p:.2g}{holm})"
            elif t.too_few:  # no sample of this few pairs can show it (opro.stats.betting.min_pairs)
                text += (f"; not decided within {margin:g}: {t.n} pilot pairs, the betting test needs at least "
                         f"{t.min_pairs} (p {t.p:.2g}{holm})")
            else:
                text += f"; not shown within {margin:g} (betting test on {t.n} pairs, p {t.p:.2g}{holm})"
        out.append(dataclasses.replace(e, verdict=dataclasses.replace(v, text=text)))  # type: ignore[type-var]
    return tuple(out)


def cost_line(effects: Sequence[Measured], *, initial: Measured, objective: Objective, margin: float | None) -> str:
    """The recommendation's cost line where a quality gain is not plausible under the quality
    objective: set the cost objective, naming the cheaper contrasts shown not worse on the pilot."""
    shown = [] if margin is None else cheaper_not_worse(effects, initial=initial, margin=margin)
    setting = f'[optimizer].objective = "{COST.name}"'
    head = (f"cost: the gain is in cost; {setting} is set" if objective == COST else
            f"cost: the gain is in cost: set {setting}")
    if not shown:
        return head + " and open the dimensions that make an answer cheaper (top_k, answer_max_tokens, demos)"
    named = ", ".join(f"{e.label} (p {t.p:.2g})" for e, t in shown)
    family = f", Holm over {shown[0][1].n_comparisons}" if shown[0][1].n_comparisons > 1 else ""
    return (f"{head} (cheaper and not worse here: {named}; non-inferiority at margin {margin:g} on the pilot, "
            f"alpha {ALPHA:g}{family})")


def cheap_dimensions(effects: Sequence[Measured], *, initial: Measured) -> set[str]:
    """The ``[search.space]`` dimensions with a cheaper contrast that is not shown to hurt: what the cost
    search looks along (the wording is searched whatever the probe says)."""
    from opro.probe.contrasts import TOGETHER

    return {e.dimension for e in effects if cheaper(e, initial=initial)} - {"wording", "format", TOGETHER}


def _cheaper_by_mean(e: Measured, *, initial: Measured) -> bool:
    if e.verdict is None or e.verdict.kind in ("identical", "baseline"):
        return False
    if e.saving is not None:
        return e.saving.difference < 0
    return e.cost is not None and initial.cost is not None and e.cost < initial.cost


def _saving_text(e: Measured, *, initial: Measured) -> str:
    if e.saving is not None:
        return e.saving.text()
    return f"{e.cost / initial.cost - 1:+.0%} per answer" if e.cost is not None and initial.cost else "n/a"


def cost_lines(effects: Sequence[Measured], *, initial: Measured, margin: float, measure: str) -> list[str]:
    """The recommendation under the cost objective: each cheaper contrast's saving, which are
    cheaper and not worse at the margin on the pilot, and what the search will do about them."""
    cheap = [e for e in effects if _cheaper_by_mean(e, initial=initial)]
    if not cheap:
        return [f"cost (objective \"{COST.name}\", margin {margin:g}): no contrast is cheaper per answer than the initial "
                "configuration: open the dimensions that make an answer cheaper (top_k, answer_max_tokens, demos)",
                _what_the_search_does(effects, margin=margin)]
    out = [f"cost (objective \"{COST.name}\", margin {margin:g}; per answer, in {measure}): "
           + "; ".join(f"{e.label} {_saving_text(e, initial=initial)}" for e in cheap)]
    tests = noninferiority_tests(effects, initial=initial, margin=margin)
    passed = [(e, t) for e, t in tests if t.passed]
    family = f", Holm over {len(tests)}" if len(tests) > 1 else ""
    if passed:
        out.append("cheaper and not worse here: " + ", ".join(f"{e.label} (p {t.p:.2g})" for e, t in passed)
                   + f" (non-inferiority at margin {margin:g} on the pilot, alpha {ALPHA:g}{family})")
    elif tests:
        out.append(f"not shown on the pilot: no cheaper contrast passes non-inferiority at margin {margin:g} "
                   f"(p {min(t.p for _, t in tests):.2g} at best{family})")
    else:
        out.append("not shown on the pilot: no contrast is cheaper there without being shown to hurt")
    out.append(_what_the_search_does(effects, margin=margin))
    return out


def _what_the_search_does(effects: Sequence[Measured], *, margin: float) -> str:
    """Step 0's first moves (their answers on the optimization questions already in the call cache),
    the race that stops only what cannot be within the margin, and the validation stage's claim."""
    moves = [e.label for e in effects if e.step0]
    worse = [e.label for e in effects if e.step0 and e.high is not None and e.high < -margin]
    said = ("the search: step 0 tries " + ", ".join(moves) + " with the initial instruction (the probe's answers on "
            "the optimization questions come from the call cache)" if moves else
            "the search: no first move to try (no open dimension has a cheaper choice)")
    said += (f"; its race stops a cheaper candidate only when it cannot be within {margin:g} of the initial "
             "configuration")
    if worse:
        said += f" (on the pilot: {', '.join(worse)})"
    return (said + f"; a saving is claimed only where the validation stage shows it not worse by more than "
            f"{margin:g} and cheaper, on questions the probe never saw")


__all__ = ["ALPHA", "Measured", "Saving", "cheap_dimensions", "cheaper", "cheaper_not_worse", "cost_line", "cost_lines",
           "noninferiority_tests", "saving_from", "saving_of", "with_costs"]
