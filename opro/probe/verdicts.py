"""What one contrast's interval says (:func:`verdict_of`): it moves the score, hurts, is inert within a
stated band, is undecided at this many questions, or is the initial configuration itself; and every
contrast's verdict with its betting p Holm-adjusted over the probe's contrasts (:func:`with_verdicts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from opro.probe.effects import ALPHA, Effect, Verdict
from opro.stats.paired import holm

#: A contrast whose whole 95% interval lies within +-this is inert.
INERT_WITHIN = 0.2


def verdict_of(effect: Effect, *, inert_within: float = INERT_WITHIN, detectable: float | None = None,
               holm: tuple[float, int] | None = None) -> Verdict:
    """What a contrast's interval says (``holm``: its betting p adjusted over the probe's contrasts,
    and how many there are; a ``moves`` or ``hurts`` that does not hold after it says it may be chance):

    - ``moves``: the 95% interval lies above 0 ("moves the score: +0.41 [+0.12, +0.70]"; where it lies
      below ``detectable``, the smallest gain the validation stage confirms, it says so);
    - ``hurts``: it lies below 0;
    - ``inert``: it lies within the stated band, +-``inert_within`` (0.2, or the margin under the cost
      objective), on both sides ("inert here");
    - ``undecided``: none of these (the interval is too wide at this many questions). An interval that
      reaches below ``-inert_within`` is never inert, however little a search could confirm: a harm the
      pilot cannot rule out is not "no effect";
    - ``identical``: the contrast is the initial configuration itself (nothing to test).

    Where every pair is tied the text shows "+0.00, n of n tied", not the interval (its width is only
    the test's floor for a difference that never varied); the kind still follows that interval.
    """
    if effect.dimension == "initial":
        return Verdict("baseline", "the initial configuration")
    if effect.identical:
        return Verdict("identical", "identical to the initial configuration (the same prompt and settings): "
                                    "nothing to test")
    if effect.difference is None or effect.low is None or effect.high is None or effect.n < 2:
        return Verdict("undecided", f"undecided: {effect.n} scored pair(s)")
    lo, hi, shown = effect.low, effect.high, effect.interval
    chance = "" if holm is None or holm[0] <= ALPHA else (
        f"; may be chance: p {holm[0]:.2g} after Holm over the {holm[1]} contrasts")
    if lo > 0:
        small = detectable is not None and hi < detectable
        return Verdict("moves", f"moves the score: {shown}"
                       + (f", less than the search can confirm ({detectable:+.2f})" if small else "") + chance,
                       holm_p=None if holm is None else holm[0])
    if hi < 0:
        return Verdict("hurts", f"hurts: {shown}{chance}", holm_p=None if holm is None else holm[0])
    if -inert_within <= lo and hi <= inert_within:
        return Verdict("inert", f"inert here: within ±{inert_within:g} ({shown})")
    on = "" if effect.passages is None else f" ({effect.passages} source passages)"
    return Verdict("undecided", f"undecided at {effect.n} questions{on}: {shown}")


def with_verdicts(contrasted: Sequence[Effect], *, band: float, detectable: float | None) -> tuple[Effect, ...]:
    """Each contrast with its verdict, its betting p Holm-adjusted over the contrasts that have one
    (one alone needs no adjustment)."""
    p_values = {i: e.p for i, e in enumerate(contrasted) if e.p is not None}
    adjusted = dict(zip(p_values, holm(list(p_values.values())), strict=True)) if len(p_values) > 1 else {}
    return tuple(dataclasses.replace(e, verdict=verdict_of(
        e, inert_within=band, detectable=detectable, holm=(adjusted[i], len(p_values)) if i in adjusted else None))
        for i, e in enumerate(contrasted))


__all__ = ["INERT_WITHIN", "verdict_of", "with_verdicts"]
