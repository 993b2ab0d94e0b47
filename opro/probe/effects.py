"""The probe's measurement: the initial configuration and each contrast answered and judged on the same
pilot questions in one stream (:func:`measure_effects`, shared with ``experiments/bench_headroom.py``),
each contrast paired with the initial configuration by question: its paired difference with a 95%
interval of the betting confidence sequence (:mod:`opro.stats.betting`: valid whatever the differences'
shape on the judge's scale, so a pilot of tied pairs is not "inert" by a narrow interval), win/tie/loss,
its p-value, the answers' length and cost per answer, and with a cost model its saving
(:mod:`opro.probe.savings`). What a contrast's figures mean is :mod:`opro.probe.verdicts`'s concern.

The paired differences are read as the validation stage and ``opro compare`` read theirs: with
``[judge].paired = "side_by_side"`` from one side-by-side call per question and contrast
(:mod:`opro.judges.sidebyside`: identical answers skip the judge), and where the pilot's questions
record source passages the tests run on the means of complete clusters (:mod:`opro.stats.clusters`:
a passage counts once; a cluster the pilot's end cuts is not counted).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.probe.contrasts import Contrast
from opro.probe.savings import Saving
from opro.program.dimensions import Value
from opro.stats import betting
from opro.stats.clusters import cluster_means, complete, singletons
from opro.stats.paired import win_tie_loss

if TYPE_CHECKING:
    from opro.evaluation.rows import EvaluationReport, EvaluationRow, Judge, Program
    from opro.judges.sidebyside import SideBySideJudge
    from opro.program.cost import CostModel
    from opro.program.prompts import QATemplate


#: The level of the contrasts' tests (their intervals are 95%).
ALPHA = 0.05
#: The judge's scale and step, as ``opro compare`` makes its intervals.
SCALE = (SCORE_MIN, SCORE_MAX)
RESOLUTION = 1.0
VerdictKind = Literal["baseline", "moves", "hurts", "inert", "undecided", "identical"]


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    text: str
    #: For ``moves`` and ``hurts`` among several contrasts: the betting test's p adjusted by Holm over them
    #: (each interval is 95% on its own, so one of several may exclude 0 by chance).
    holm_p: float | None = None

    @property
    def may_be_chance(self) -> bool:
        return self.holm_p is not None and self.holm_p > ALPHA


@dataclass(frozen=True)
class Effect:
    """A configuration's scores on the questions, and against the initial configuration (``None`` for
    the initial configuration itself): paired difference with its 95% interval, W/T/L, the betting test's p."""

    label: str
    dimension: str
    value: Value | None
    instruction: str
    demos: int
    settings: Mapping[str, Value]
    n: int
    mean: float | None
    scores: tuple[float | None, ...]
    difference: float | None = None
    low: float | None = None
    high: float | None = None
    p: float | None = None
    win_tie_loss: str | None = None
    #: Standard deviation of the per-question differences (None below 2 pairs).
    sd: float | None = None
    #: Mean words per answer, and the share of answers that are one sentence.
    answer_words: float | None = None
    one_sentence: float | None = None
    #: Mean cost per answered question (:meth:`opro.program.cost.CostModel.summarize`) and its unit.
    cost: float | None = None
    cost_unit: str = "tokens"
    verdict: Verdict | None = None
    #: The same prompt and settings as the initial configuration (nothing to test: no difference shown).
    identical: bool = False
    #: Judge replies that could not be read, and calls that failed, on its questions; one reason given.
    unreadable: int = 0
    failed: int = 0
    unreadable_reason: str = ""
    #: Its cost per answer against the initial configuration's, paired (:mod:`opro.probe.savings`).
    saving: Saving | None = None
    #: The configuration is one the search's step 0 evaluates (a first move: :mod:`opro.probe.contrasts`).
    step0: bool = False
    #: Per pilot question, the paired difference the tests read (this configuration's score minus the
    #: initial one's: side by side where ``[judge].paired`` says so); None where a score is missing or its
    #: cluster is cut by the pilot's end. Empty: the tests read ``scores`` against the initial ones.
    differences: tuple[float | None, ...] = ()
    #: Per pilot question, its source passage (questions on one share the number); empty: one each.
    clusters: tuple[int, ...] = ()

    def tested(self) -> tuple[list[float], list[str] | None]:
        """The differences the tests read and, where questions share passages, their clusters."""
        keys = self.clusters or range(len(self.differences))
        kept = [(d, f"{k}") for d, k in zip(self.differences, keys, strict=True) if d is not None]
        clusters = [k for _, k in kept]
        return [d for d, _ in kept], None if singletons(clusters) else clusters

    @property
    def passages(self) -> int | None:
        """The source passages its tests count, where fewer than its questions (None: a question each)."""
        _, clusters = self.tested()
        return None if clusters is None else len(set(clusters))

    @property
    def all_tied(self) -> bool:
        """Every paired difference is 0: the interval around +0.00 is only the test's floor for a
        difference that never varied, so none is shown."""
        return self.n > 0 and self.difference == 0 and self.sd in (0, None) and self.win_tie_loss == f"0/{self.n}/0"

    @property
    def interval(self) -> str:
        if self.identical:
            return "(identical)"
        if self.difference is None or self.low is None or self.high is None:
            return ""
        if self.all_tied:
            return f"+0.00, {self.n} of {self.n} tied"
        return f"{_signed(self.difference)} [{_signed(self.low)}, {_signed(self.high)}]"


def _signed(x: float) -> str:
    """``+0.41``; a value that rounds to zero is ``+0.00``, never ``-0.00``."""
    return f"{round(x, 2) + 0.0:+.2f}"


_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")


def sentences(text: str) -> int:
    """Sentences in an answer (ends of sentence, at least one for a non-empty answer)."""
    stripped = text.strip()
    return max(1, len(_SENTENCE_END.findall(stripped))) if stripped else 0


def _effect(contrast: Contrast, report: EvaluationReport, base: Sequence[float | None], *,
            cost: CostModel | None, identical: bool = False, base_rows: Sequence[EvaluationRow] = (),
            paired: Sequence[tuple[float, float] | None] | None = None, keys: Sequence[str] = (),
            counted: Sequence[bool] = ()) -> Effect:
    scores = tuple(r.score if r.scored else None for r in report.rows)
    valid = [s for s in scores if s is not None]
    answered = [r for r in report.rows if r.error is None]
    summary = cost.summarize(report.rows) if cost is not None else None
    unreadable = [r for r in answered if not r.scored]
    t = contrast.template
    out = Effect(
        label=contrast.label, dimension=contrast.dimension, value=contrast.value, instruction=t.instruction,
        demos=len(t.demos), settings=t.settings, n=len(valid), mean=statistics.fmean(valid) if valid else None,
        scores=scores,
        answer_words=statistics.fmean(len(r.answer.split()) for r in answered) if answered else None,
        one_sentence=statistics.fmean(sentences(r.answer) <= 1 for r in answered) if answered else None,
        cost=None if summary is None else summary.cost, cost_unit="tokens" if summary is None else summary.unit,
        unreadable=len(unreadable), failed=len(report.rows) - len(answered),
        unreadable_reason=next((r.invalid_reason or r.feedback or "no score in the reply" for r in unreadable), "")[:200],
        step0=contrast.step0,
    )
    if contrast.dimension == "initial":
        return out
    if identical:
        return dataclasses.replace(out, identical=True)
    if cost is not None and base_rows:
        from opro.probe.savings import saving_of

        out = dataclasses.replace(out, saving=saving_of(report.rows, base_rows, model=cost))
    pairs = paired if paired is not None else [
        None if a is None or b is None else (a, b) for a, b in zip(scores, base, strict=True)]
    kept = [(i, p) for i, (p, ok) in enumerate(zip(pairs, counted or [True] * len(pairs), strict=True))
            if p is not None and ok]
    if not kept:
        return dataclasses.replace(out, n=0)
    diffs = [a - b for _, (a, b) in kept]
    differences: list[float | None] = [None] * len(pairs)
    for (i, _), d in zip(kept, diffs, strict=True):
        differences[i] = d
    numbered = {k: j for j, k in enumerate(dict.fromkeys(keys))}
    out = dataclasses.replace(out, differences=tuple(differences), clusters=tuple(numbered[k] for k in keys))
    tested, clusters = out.tested()
    units = tested if clusters is None else cluster_means(tested, clusters).tolist()
    c = betting.bound(units, scale=SCALE, alpha=ALPHA, planned=len(units))  # as opro compare makes it
    return dataclasses.replace(
        out, n=len(kept), difference=c.mean, low=c.low, high=c.high,
        p=c.p, win_tie_loss=str(win_tie_loss([a for _, (a, _) in kept], [b for _, (_, b) in kept])),
        sd=statistics.stdev(diffs) if len(diffs) >= 2 else None,
    )


def _side_by_side(judge: SideBySideJudge, reports: Sequence[EvaluationReport], tested: Sequence[int],
                  ) -> dict[int, list[tuple[float, float] | None]]:
    """Per contrast (its index in ``reports``, the initial configuration's first), its and the initial
    configuration's scores from one side-by-side call per question both were scored on (the tie level of
    identical answers: their pointwise mean), every contrast's calls in one concurrent batch."""
    base = reports[0].rows
    asked = [(c, i) for c in tested for i, (r, b) in enumerate(zip(reports[c].rows, base, strict=True))
             if r.scored and b.scored]
    verdicts = judge.judge_many([{"query": b.query, "reference": b.reference, "first": r.answer, "second": b.answer,
                                  "tie": (r.score + b.score) / 2}  # type: ignore[operator]
                                 for r, b in ((reports[c].rows[i], base[i]) for c, i in asked)])
    out: dict[int, list[tuple[float, float] | None]] = {c: [None] * len(base) for c in tested}
    for (c, i), v in zip(asked, verdicts, strict=True):
        if v.scores is not None and v.scores[0] is not None and v.scores[1] is not None:
            out[c][i] = (v.scores[0], v.scores[1])
    return out


def measure_effects(
    *,
    program: Program,
    judge: Judge,
    initial: QATemplate,
    contrasts: Sequence[Contrast],
    questions: Sequence[Any],
    cost: CostModel | None = None,
    progress: bool = True,
    paired: SideBySideJudge | None = None,
    pool: Sequence[Any] | None = None,
) -> tuple[Effect, ...]:
    """The initial configuration and each contrast on ``questions``, answered and judged in one stream
    (question-major: a question's prompts are decoded together), each contrast paired with the initial
    configuration by question. The first effect is the initial configuration's (no difference); a
    contrast whose prompt and settings are the initial configuration's is marked ``identical``, untested.
    ``paired``: the side-by-side judge whose scores the differences are (``[judge].paired``; None:
    the pointwise scores). ``pool``: the questions ``questions`` are the first of (the pilot's pool):
    where they record source passages, the tests count complete clusters (:mod:`opro.stats.clusters`)."""
    from opro.evaluation.batch import evaluate_templates
    from opro.stats.clusters import keys_of

    every = [Contrast("initial", initial, "initial"), *contrasts]
    reports = evaluate_templates(program=program, templates=[c.template for c in every], examples=questions,
                                 judge=judge, progress=progress)
    base = tuple(r.score if r.scored else None for r in reports[0].rows)
    same = [c.dimension != "initial" and c.template == initial for c in every]
    tested = [i for i in range(1, len(every)) if not same[i]]
    pairs = _side_by_side(paired, reports, tested) if paired is not None else {}
    planned = keys_of(pool if pool is not None else questions)
    keys = planned[:len(questions)]
    counted = complete(keys, planned)
    return tuple(_effect(c, r, base, cost=cost, identical=same[i], base_rows=reports[0].rows, paired=pairs.get(i),
                         keys=() if singletons(planned) else keys, counted=counted)
                 for i, (c, r) in enumerate(zip(every, reports, strict=True)))


def num(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


__all__ = ["ALPHA", "RESOLUTION", "SCALE", "Effect", "Verdict", "VerdictKind", "measure_effects", "num", "sentences"]
