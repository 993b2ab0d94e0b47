"""The saving a cheaper configuration shows on the questions both answered: the validation stage's
cost claim (a lower cost per answer) and the share of the initial cost it saves."""

from __future__ import annotations

from collections.abc import Sequence

from opro.program.cost import CostUnit
from opro.search.results import CostSaving
from opro.stats.ratio import saving_caveat, saving_interval
from opro.stats.sequential import t_interval


def cost_saving(pick: Sequence[float | None], initial: Sequence[float | None], *, unit: CostUnit) -> CostSaving | None:
    """The chosen finalist's cost per answer against the initial configuration's, paired on the
    confirmation questions both answered: the mean difference with its t interval, and as a share of
    the initial mean with Fieller's interval of a ratio of paired means (both means estimated: the
    difference's interval over the initial mean, taken as known, covered 0.34-0.38 where the cut is
    about the same on every question, ``experiments/bench_saving.py``)."""
    pairs = [(x, y) for x, y in zip(pick, initial, strict=True) if x is not None and y is not None]
    if not pairs:
        return None
    diffs = [x - y for x, y in pairs]
    base = sum(y for _, y in pairs) / len(pairs)
    mean, ci = sum(diffs) / len(diffs), t_interval(diffs)
    return CostSaving(
        unit=unit, n_pairs=len(pairs), initial_cost=base, difference=mean, difference_ci=ci,
        relative=-mean / base if base else None,
        relative_ci=saving_interval([x for x, _ in pairs], [y for _, y in pairs]) if base else None,
        lower=ci is not None and ci[1] < 0, caveat=saving_caveat([y for _, y in pairs]),
    )


__all__ = ["cost_saving"]
