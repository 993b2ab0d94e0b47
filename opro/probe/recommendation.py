"""One recommendation from the probe's verdicts (:func:`recommend`): which ``[search.space]``
dimensions to open, keep open for cost or keep closed, whether the wording can matter, whether a gain of
the plan's detectable size is plausible, how many pilot questions would decide an undecided contrast,
and what the cost objective can gain (:mod:`opro.probe.savings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opro.probe.contrasts import TOGETHER
from opro.probe.effects import SCALE, Effect
from opro.probe.savings import cheap_dimensions, cost_line, cost_lines
from opro.probe.verdicts import INERT_WITHIN
from opro.stats.objectives import Objective, as_objective
from opro.stats.paired import questions_for_half_width


@dataclass(frozen=True)
class Recommendation:
    #: Dimensions ("wording" or a [search.space] name) a contrast of which moves the score up.
    open: tuple[str, ...]
    #: Dimensions whose contrasts are all inert or harmful.
    closed: tuple[str, ...]
    undecided: tuple[str, ...]
    #: Whether a gain of the plan's detectable size is within some contrast's interval (None: the split
    #: sizes confirm no gain at all).
    quality_plausible: bool | None
    cost_objective: bool
    lines: tuple[str, ...]


def recommend(effects: Sequence[Effect], *, initial: Effect, detectable: float | None, objective: Objective | str,
              probed_space: bool, questions: int, noise: tuple[float, str] | None = None,
              available: int | None = None, band: float = INERT_WITHIN, margin: float | None = None,
              measure: str = "the cost measure") -> Recommendation:
    """One recommendation from the verdicts: which dimensions to open, whether a quality gain of the
    plan's detectable size is plausible, and when not, that the cost objective is where the gain is.
    ``noise``: the paired sd (and whose it is) at which to say how many pilot questions an undecided
    contrast needs; ``available``: how many pilot questions exist; ``band``: the verdicts' inert band;
    ``margin``: ``[optimizer].margin``, at which a cheaper contrast must pass a non-inferiority test on
    the pilot to be named "cheaper and not worse" (None: none is named). Under the cost objective
    (with a margin) it is about cost (:func:`opro.probe.savings.cost_lines`, in ``measure``): each
    cheaper contrast's saving, which are not worse at the margin, what the search will do; a dimension
    with a cheaper choice not shown to hurt is kept open, whatever its score does."""
    groups: dict[str, list[Effect]] = {}
    for e in effects:
        if e.dimension != TOGETHER:  # every first move at once: no dimension to open or close
            groups.setdefault("wording" if e.dimension in ("wording", "format") else e.dimension, []).append(e)
    kinds = {d: k for d, es in groups.items()
             if (k := {e.verdict.kind for e in es if e.verdict is not None and e.verdict.kind != "identical"})}
    objective = as_objective(objective)
    about_cost = objective.non_inferiority and margin is not None and initial.cost is not None
    cheap = cheap_dimensions(effects, initial=initial) if about_cost else set()
    opened = tuple(d for d, k in kinds.items() if "moves" in k)
    undecided = tuple(d for d, k in kinds.items() if d not in opened and "undecided" in k)
    closed = tuple(d for d in kinds if d not in opened and d not in undecided and d not in cheap)
    lines = _dimension_lines(groups, opened=opened, closed=closed, undecided=undecided, probed_space=probed_space,
                             kept=[d for d in kinds if d in cheap and d not in opened])
    if undecided:
        lines.append(f"undecided at {questions} questions: {', '.join(undecided)} ("
                     + _to_decide(noise, within=band, available=available) + ")")
    plausible, said = _quality(effects, initial=initial, detectable=detectable)
    lines.append(said)
    cost = plausible is False or (plausible is None and detectable is None)
    if about_cost:
        lines += cost_lines(effects, initial=initial, margin=margin, measure=measure)  # type: ignore[arg-type]
    elif cost and initial.mean is not None and initial.cost is not None:
        lines.append(cost_line(effects, initial=initial, objective=objective, margin=margin))
    return Recommendation(open=opened, closed=closed, undecided=undecided, quality_plausible=plausible,
                          cost_objective=cost, lines=tuple(lines))


def _dimension_lines(groups: Mapping[str, Sequence[Effect]], *, opened: Sequence[str], closed: Sequence[str],
                     undecided: Sequence[str], probed_space: bool, kept: Sequence[str]) -> list[str]:
    """Which dimensions to open (a contrast moves the score up), keep open for cost, or keep closed,
    and whether the wording can matter."""
    def moving(d: str) -> str:
        return "; ".join(f"{e.label} {e.interval}" + (", may be chance after Holm" if e.verdict.may_be_chance else "")
                         for e in groups[d] if e.verdict is not None and e.verdict.kind == "moves")

    lines: list[str] = []
    space_open = [d for d in opened if d != "wording"]
    if space_open:
        lines.append(f"open in [search.space]: {', '.join(space_open)} (moves the score up: "
                     f"{'; '.join(moving(d) for d in space_open)})")
    elif probed_space:
        lines.append("open in [search.space]: no probed dimension moves the score up")
    else:
        lines.append("open in [search.space]: nothing was probed (no dimension is open), only the wording")
    if kept:
        lines.append(f"keep open for cost: {', '.join(kept)} (a cheaper choice not shown to hurt: the cost "
                     "search looks there)")
    shut = [d for d in closed if d != "wording"]
    if shut:
        lines.append(f"keep closed: {', '.join(shut)} (inert or harmful here)")
    if "wording" in opened:
        lines.append(f"wording: moves the score ({moving('wording')}): the search's proposals can matter")
    elif "wording" in closed:
        lines.append("wording: inert here: a new instruction is unlikely to move the score")
    return lines


def _quality(effects: Sequence[Effect], *, initial: Effect, detectable: float | None) -> tuple[bool | None, str]:
    """Whether a gain of the plan's detectable size is plausible (None: the split sizes confirm none),
    and the line that says so."""
    base = initial.mean
    if detectable is None:
        return None, "quality: these split sizes confirm no gain at all (see `opro plan`): raise [data.split].validation"
    reaching = [e for e in effects if e.high is not None and e.high >= detectable]
    room = base is None or base + detectable <= SCALE[1]
    if reaching and room:
        return True, (f"quality: a gain of {detectable:+.2f} (the smallest the validation stage confirms) is "
                      f"plausible: within the interval of {', '.join(e.label for e in reaching)}")
    if not room:
        return False, (f"quality: a gain of {detectable:+.2f} is not plausible: the initial configuration "
                       f"already scores {base:.2f} of {SCALE[1]:g}")
    return False, (f"quality: a gain of {detectable:+.2f} (the smallest the validation stage confirms) is "
                   "not plausible: no contrast's interval reaches it")


def _to_decide(noise: tuple[float, str] | None, *, within: float, available: int | None) -> str:
    """How many pilot questions would decide a contrast whose difference is near 0 (its interval inside
    +-``within``, the inert band), at the paired sd ``noise``."""
    need = None if noise is None else questions_for_half_width(noise[0], within)
    if noise is None or need is None:
        return "`--questions` with more pilot questions can decide"
    at = f"an interval inside ±{within:.2f} takes about {need} questions at paired sd {noise[0]:.2f} ({noise[1]})"
    if available is not None and need > available:
        return f"{at}; only {available} pilot questions exist: the pilot cannot decide it"
    return f"`--questions {need}` can decide: {at}"


__all__ = ["Recommendation", "recommend"]
