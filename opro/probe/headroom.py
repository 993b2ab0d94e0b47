"""Where is the headroom? ``opro probe``: before a search, each dimension alone, paired against the
initial configuration on a small pilot, and what limits the task, the judge and the proposer.

A search can only find a gain along a dimension that moves the judge's score, on a task that is not
already at the ceiling, with a judge that can see the difference and an optimizer LLM that writes
usable instructions. The probe measures each of them, in a fraction of a search's calls:

- **Effects** (:func:`measure_effects`, shared with ``experiments/bench_headroom.py``): the initial
  configuration and each change alone on the same questions: no instruction; one markedly different
  instruction from the optimizer LLM; one format instruction ("Answer in one sentence.", appended),
  whose effect on the answers' length says whether the task model follows instructions; the extremes
  of every open ``[search.space]`` dimension. Each has its paired mean difference with a 95% interval
  (Student t, as ``opro compare`` makes them), win/tie/loss, the sign-flip p-value, the answers' mean
  length and cost.
- **The task**: the initial configuration's scores on the pilot (share at the ceiling, >= 4.5, and at
  the floor, <= 1.5), and retrieval recall@k against the reference contexts where the dataset has them.
- **The judge**: ``opro judge calibrate``'s stored conditions, if it ran; the paired noise on the pilot;
  the smallest difference the plan's split sizes confirm.
- **The proposer**: three proposals from the optimizer LLM, each checked for being usable.
- **A verdict** per contrast and one recommendation (:func:`verdict_of`, :func:`recommend`).

Pilot questions: the optimization split, then the questions in no split that a validation extension
does not reserve; never validation, held-out or exemplar ones. By default as many as keep the probe's
calls within a fifth of the plan's search calls (:data:`PROBE_SHARE`), and never fewer than a
two-sided sign-flip test needs to reach alpha. Every call goes through the experiment's call cache,
so a rerun asks nothing and a later search reuses the initial configuration's answers on the
optimization questions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from opro.errors import DataError
from opro.program.dimensions import Value, dimension
from opro.records import CommandRecord, CommandRecorder, Recorded, finite_metrics, record_all
from opro.rundir import RunDir
from opro.stats.paired import compare_paired, holm, questions_for_half_width

if TYPE_CHECKING:
    from opro.config import OproConfig
    from opro.data.dataset import Example
    from opro.evaluation.rows import EvaluationReport, Judge, Program
    from opro.experiment import Experiment
    from opro.probe.plan import MeasuredNoise, Plan
    from opro.program.cost import CostModel
    from opro.program.prompts import QATemplate
    from opro.search.space import SearchSpace
    from opro.stats.noninferiority import NonInferiority

#: The probe's calls, at most this share of the plan's search calls (search and expected validation).
PROBE_SHARE = 0.2
#: A score at or above this is at the ceiling of the 1-5 judge; at or below FLOOR, at its floor.
CEILING = 4.5
FLOOR = 1.5
#: A contrast whose whole 95% interval lies within +-this is inert.
INERT_WITHIN = 0.2
#: The level of the contrasts' tests (their intervals are 95%).
ALPHA = 0.05
#: The fewest pilot questions whose paired sd the plan (and the probe's sizing) takes as measured:
#: from fewer it is too rough to plan by.
MIN_PILOT = 6
#: The format instruction, appended to the initial one: does the answer length follow it?
FORMAT_INSTRUCTION = "Answer in one sentence."
#: Proposals asked of the optimizer LLM; at least this share unusable flags it.
N_PROPOSALS = 3
GARBAGE_SHARE = 0.5
#: The judge's scale and step, as ``opro compare`` makes its intervals.
SCALE = (1.0, 5.0)
RESOLUTION = 1.0

CONTRAST_PROMPT = """\
A question-answering assistant answers questions from retrieved context. Its current instruction is:

{initial}

Write one instruction for the same task that is markedly different from the current one: for example, \
it asks for answers of another length or style, or to use the context in another way. Keep it to one or \
two sentences. {answer_format}"""

_ANSWER_FORMATS = {
    "ins": "Reply with the new instruction only, between <INS> and </INS>.",
    "brackets": "Write only the new instruction between square brackets, like [your instruction].",
}

VerdictKind = Literal["baseline", "moves", "hurts", "inert", "undecided", "identical"]


# -- what is contrasted, and its effect -----------------------------------------------------------


@dataclass(frozen=True)
class Contrast:
    """One change of the initial configuration: ``dimension`` is ``wording`` (no instruction, another
    one), ``format`` (the format instruction) or a ``[search.space]`` dimension, at ``value``."""

    label: str
    template: QATemplate
    dimension: str
    value: Value | None = None


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    text: str
    #: For ``moves`` and ``hurts`` among several contrasts: the sign-flip p adjusted by Holm over them
    #: (each interval is 95% on its own, so one of several may exclude 0 by chance).
    holm_p: float | None = None

    @property
    def may_be_chance(self) -> bool:
        return self.holm_p is not None and self.holm_p > ALPHA


@dataclass(frozen=True)
class Effect:
    """A configuration's scores on the questions, and against the initial configuration (``None`` for
    the initial configuration itself): paired difference with its 95% interval, W/T/L, sign-flip p."""

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


_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")


def sentences(text: str) -> int:
    """Sentences in an answer (ends of sentence, at least one for a non-empty answer)."""
    stripped = text.strip()
    return max(1, len(_SENTENCE_END.findall(stripped))) if stripped else 0


def _effect(contrast: Contrast, report: EvaluationReport, base: Sequence[float | None], *,
            cost: CostModel | None, identical: bool = False) -> Effect:
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
    )
    if contrast.dimension == "initial":
        return out
    if identical:
        return dataclasses.replace(out, identical=True)
    pairs = [(a, b) for a, b in zip(scores, base, strict=True) if a is not None and b is not None]
    if not pairs:
        return dataclasses.replace(out, n=0)
    c = compare_paired([a for a, _ in pairs], [b for _, b in pairs], scale=SCALE, resolution=RESOLUTION)
    diffs = [a - b for a, b in pairs]
    return dataclasses.replace(
        out, n=len(pairs), difference=c.difference.estimate, low=c.difference.low, high=c.difference.high,
        p=c.permutation.p_value, win_tie_loss=str(c.win_tie_loss),
        sd=statistics.stdev(diffs) if len(diffs) >= 2 else None,
    )


def measure_effects(
    *,
    program: Program,
    judge: Judge,
    initial: QATemplate,
    contrasts: Sequence[Contrast],
    questions: Sequence[Any],
    cost: CostModel | None = None,
    progress: bool = True,
) -> tuple[Effect, ...]:
    """The initial configuration and each contrast on ``questions``, answered and judged in one stream
    (question-major: a question's prompts are decoded together), each contrast paired with the initial
    configuration by question. The first effect is the initial configuration's (no difference); a
    contrast whose prompt and settings are the initial configuration's is marked ``identical``, untested."""
    from opro.evaluation.batch import evaluate_templates

    every = [Contrast("initial", initial, "initial"), *contrasts]
    reports = evaluate_templates(program=program, templates=[c.template for c in every], examples=questions,
                                 judge=judge, progress=progress)
    base = tuple(r.score if r.scored else None for r in reports[0].rows)
    return tuple(_effect(c, r, base, cost=cost, identical=c.dimension != "initial" and c.template == initial)
                 for c, r in zip(every, reports, strict=True))


def verdict_of(effect: Effect, *, inert_within: float = INERT_WITHIN, detectable: float | None = None,
               holm: tuple[float, int] | None = None) -> Verdict:
    """What a contrast's interval says (``holm``: its sign-flip p adjusted over the probe's contrasts,
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
    return Verdict("undecided", f"undecided at {effect.n} questions: {shown}")


# -- the proposer's limits ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProposalCheck:
    """One reply of the optimizer LLM: the instruction read from it, and whether it is usable."""

    instruction: str
    usable: bool
    reason: str = ""


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'’-]*|\d[\d.,]*\d|\d")
#: A number is specific to a question from two digits on ("2012", "60"); "1" or "3" is anyone's.
_SPECIFIC_NUMBER = re.compile(r"\d[\d.,]*\d")


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _specifics(questions: Sequence[str], *, known: str) -> dict[str, str]:
    """Names and numbers that belong to one question only (capitalized words past a question's first
    word, and numbers), not in ``known`` (the initial instruction and the template): specific -> question."""
    known_words = {w.casefold() for w in _words(known)}
    seen: dict[str, set[int]] = {}
    for i, q in enumerate(questions):
        for j, w in enumerate(_words(q)):
            specific = _SPECIFIC_NUMBER.fullmatch(w) if w[0].isdigit() else j > 0 and w[0].isupper()
            if specific and w.casefold() not in known_words:
                seen.setdefault(w, set()).add(i)
    return {w: questions[next(iter(idx))] for w, idx in seen.items() if len(idx) == 1}


def _copied(instruction: str, questions: Sequence[str], *, n: int = 5) -> str | None:
    """A run of ``n`` words of a question that the instruction repeats, or None."""
    words = [w.casefold() for w in _words(instruction)]
    grams = {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}
    for q in questions:
        qw = [w.casefold() for w in _words(q)]
        for i in range(len(qw) - n + 1):
            if tuple(qw[i:i + n]) in grams:
                return " ".join(_words(q)[i:i + n])
    return None


def check_proposal(reply: str, *, initial: str, questions: Sequence[str], template_text: str = "",
                   max_chars: int = 400, answer_format: Literal["ins", "brackets"] = "ins") -> ProposalCheck:
    """Whether an optimizer reply gives a usable instruction: the search's own checks (one instruction,
    no chat, no template variable, within ``max_chars``, not the initial one), at least three words, not a
    near copy of the initial instruction, and on the task: no name or number that belongs to one of
    ``questions`` and no five words copied from one."""
    from opro.search.metaprompt import check_candidate, extract_candidate, normalize_instruction

    instruction = extract_candidate(reply, answer_format=answer_format)
    verdict = check_candidate(instruction, seen={normalize_instruction(initial)}, max_chars=max_chars)
    if not verdict.accepted:
        reason = "the initial instruction again" if verdict.reason == "duplicate" else verdict.reason
        return ProposalCheck(instruction[:200], False, reason)
    words = _words(instruction)
    if len(words) < 3:
        return ProposalCheck(instruction, False, "fewer than three words: not an instruction")
    a, b = {w.casefold() for w in words}, {w.casefold() for w in _words(initial)}
    if b and len(a & b) / len(a | b) >= 0.9:
        return ProposalCheck(instruction, False, "a near copy of the initial instruction")
    specific = _specifics(questions, known=f"{initial} {template_text}")
    named = next((w for w in words if w in specific), None)
    if named is not None:
        return ProposalCheck(instruction, False, f"about one question: {named!r} is from {specific[named][:80]!r}")
    copied = _copied(instruction, questions)
    if copied is not None:
        return ProposalCheck(instruction, False, f"about one question: it copies {copied!r}")
    return ProposalCheck(instruction, True)


@dataclass(frozen=True)
class ProposerLimits:
    model: str
    proposals: tuple[ProposalCheck, ...]
    unusable_share: float
    #: At least :data:`GARBAGE_SHARE` of the proposals unusable.
    flagged: bool

    def line(self) -> str:
        bad = sum(not p.usable for p in self.proposals)
        head = (f"proposer ({self.model}): {bad} of {len(self.proposals)} proposals unusable "
                f"({self.unusable_share:.0%})")
        if self.flagged:
            return (head + ": this optimizer LLM writes unusable instructions, so a search with it proposes "
                    "little; use a stronger [models.optimizer]")
        return head


# -- the task's and the judge's limits ------------------------------------------------------------


@dataclass(frozen=True)
class TaskLimits:
    mean: float | None
    n: int
    ceiling_share: float | None
    floor_share: float | None
    #: recall@k of the reference contexts, by k (empty: the pilot questions have none).
    recall: Mapping[int, float]
    recall_n: int
    #: The initial configuration's mean where its retrieved chunks hold the reference context, and where not.
    mean_retrieved: float | None
    mean_missed: float | None
    #: Whether the task model follows the format instruction (None: cannot tell).
    follows: bool | None
    following: str

    def lines(self, *, top_k: int) -> list[str]:
        f = _num
        out = [f"task: the initial configuration scores {f(self.mean)} on {self.n} pilot questions; "
               f"{f(self.ceiling_share, '.0%')} at the ceiling (>= {CEILING:g}), {f(self.floor_share, '.0%')} at the "
               f"floor (<= {FLOOR:g})"]
        if self.recall:
            at = ", ".join(f"@{k} {v:.2f}" for k, v in sorted(self.recall.items()))
            line = f"retrieval: recall of the reference contexts on {self.recall_n} questions: {at}"
            if self.mean_retrieved is not None or self.mean_missed is not None:
                line += (f"; mean score {f(self.mean_retrieved)} where the top {top_k} hold it, "
                         f"{f(self.mean_missed)} where not (wording cannot fix a passage never retrieved)")
            out.append(line)
        else:
            out.append("retrieval: the pilot questions have no reference contexts, so recall@k is not measured")
        out.append(f"instruction following: {self.following}")
        return out


@dataclass(frozen=True)
class JudgeLimits:
    calibrated: bool
    #: What ``opro judge calibrate`` stored (or why there is nothing), one line each.
    calibration: tuple[str, ...]
    #: Median over the contrasts of the sd of per-question differences from the initial configuration.
    pilot_sd: float | None
    plan_sd: float
    plan_sd_basis: str
    #: The plan's smallest gain the validation stage confirms (80% power), and the same at the pilot's sd.
    detectable: float | None
    detectable_at_pilot_sd: float | None
    heldout_detectable: float | None

    def lines(self) -> list[str]:
        out = [f"judge: {line}" for line in self.calibration]
        det = "no gain can be confirmed" if self.detectable is None else f"{self.detectable:+.2f}"
        line = (f"detectable: the validation stage confirms {det} (80% power; paired sd {self.plan_sd:.2f}: "
                f"{self.plan_sd_basis})")
        if self.pilot_sd is not None:
            line += f"; paired noise on the pilot: sd {self.pilot_sd:.2f} (median over the contrasts)"
            if self.detectable_at_pilot_sd is not None:
                line += f", at which it confirms {self.detectable_at_pilot_sd:+.2f}"
        out.append(line)
        return out


def _short(label: str) -> str:
    """A label as the 80-column grid shows it (``answer_max_tokens 48`` as ``max_tokens 48``)."""
    return label.replace("answer_max_tokens", "max_tokens")


def _num(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def calibration_lines(config: Any, *, judge_seconds: float, task_seconds: float) -> tuple[bool, tuple[str, ...]]:
    """What the stored judge calibration says (every condition it holds, with whatever it measured of
    it), or that there is none and how long ``opro judge calibrate`` takes."""
    from opro.calibration.calibrate import judge_signature, load_calibration

    try:
        report = load_calibration(config.output_dir)
    except DataError as exc:
        return False, (f"calibration unreadable ({exc})",)
    # The defaults of `opro judge calibrate`: 40 questions, reference / wrong / task and the near misses
    # (about 2 of the 3 apply to a question), 5 retests each of the first three.
    minutes = ((40 * 5 + 15) * judge_seconds + 40 * task_seconds) / 60
    took = "under a minute" if minutes < 1 else f"about {round(minutes)} min"
    how = f"`opro judge calibrate {config.source}` takes {took}"
    if report is None:
        return False, (f"not calibrated: {how}",)
    if report.signature and report.signature != judge_signature(config):
        return False, (f"the stored calibration ({report.created}) is for other judge settings: {how}",)
    out = [f"calibrated ({report.method}, {report.n_questions} questions): AUC right vs wrong {_num(report.auc, '.2f')}, "
           f"separation {_num(report.separation)}"
           + (f", test-retest sd {_num(report.retest.sd)}" if report.retest and report.retest.sd is not None else "")]
    for c in report.conditions:
        # Against the reference (near misses above all: what separates two good prompts): AUC, how often
        # the reference scored higher on the same question, and by how much.
        vs = report.contrast(c.condition)
        shown = "" if vs is None or not vs.pairs else (
            f"; against the reference: AUC {_num(vs.auc, '.2f')}, reference higher in {vs.wins} of {vs.pairs}"
            + (f" ({vs.ties} tied)" if vs.ties else "") + f", mean drop {_num(vs.mean_drop)}")
        out.append(f"  {c.condition}: mean {_num(c.mean)} on {c.n}{shown}")
    return True, tuple(out)


# -- the recommendation ---------------------------------------------------------------------------


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


def recommend(effects: Sequence[Effect], *, initial: Effect, detectable: float | None, objective: str,
              probed_space: bool, questions: int, noise: tuple[float, str] | None = None,
              available: int | None = None, band: float = INERT_WITHIN,
              margin: float | None = None) -> Recommendation:
    """One recommendation from the verdicts: which dimensions to open, whether a quality gain of the
    plan's detectable size is plausible, and when not, that the cost objective is where the gain is.
    ``noise``: the paired sd (and whose it is) at which to say how many pilot questions an undecided
    contrast needs; ``available``: how many pilot questions exist; ``band``: the verdicts' inert band;
    ``margin``: ``[optimizer].margin``, at which a cheaper contrast must pass a non-inferiority test on
    the pilot to be named "cheaper and not worse" (None: none is named)."""
    groups: dict[str, list[Effect]] = {}
    for e in effects:
        groups.setdefault("wording" if e.dimension in ("wording", "format") else e.dimension, []).append(e)
    kinds = {d: k for d, es in groups.items()
             if (k := {e.verdict.kind for e in es if e.verdict is not None and e.verdict.kind != "identical"})}
    opened = tuple(d for d, k in kinds.items() if "moves" in k)
    undecided = tuple(d for d, k in kinds.items() if d not in opened and "undecided" in k)
    closed = tuple(d for d in kinds if d not in opened and d not in undecided)

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
    shut = [d for d in closed if d != "wording"]
    if shut:
        lines.append(f"keep closed: {', '.join(shut)} (inert or harmful here)")
    if "wording" in opened:
        lines.append(f"wording: moves the score ({moving('wording')}): the search's proposals can matter")
    elif "wording" in closed:
        lines.append("wording: inert here: a new instruction is unlikely to move the score")
    if undecided:
        lines.append(f"undecided at {questions} questions: {', '.join(undecided)} ("
                     + _to_decide(noise, within=band, available=available) + ")")
    plausible: bool | None
    base = initial.mean
    if detectable is None:
        plausible = None
        lines.append("quality: these split sizes confirm no gain at all (see `opro plan`): raise "
                     "[data.split].validation")
    else:
        reaching = [e for e in effects if e.high is not None and e.high >= detectable]
        room = base is None or base + detectable <= SCALE[1]
        plausible = bool(reaching) and room
        if plausible:
            lines.append(f"quality: a gain of {detectable:+.2f} (the smallest the validation stage confirms) is "
                         f"plausible: within the interval of {', '.join(e.label for e in reaching)}")
        elif not room:
            lines.append(f"quality: a gain of {detectable:+.2f} is not plausible: the initial configuration "
                         f"already scores {base:.2f} of {SCALE[1]:g}")
        else:
            lines.append(f"quality: a gain of {detectable:+.2f} (the smallest the validation stage confirms) is "
                         "not plausible: no contrast's interval reaches it")
    cost = plausible is False or (plausible is None and detectable is None)
    if cost and base is not None and initial.cost is not None:
        lines.append(_cost_line(effects, initial=initial, objective=objective, margin=margin))
    return Recommendation(open=opened, closed=closed, undecided=undecided, quality_plausible=plausible,
                          cost_objective=cost, lines=tuple(lines))


def cheaper_not_worse(effects: Sequence[Effect], *, initial: Effect,
                      margin: float) -> list[tuple[Effect, NonInferiority]]:
    """The contrasts cheaper per answer than the initial configuration, not shown to hurt, whose
    non-inferiority at ``margin`` holds on the pilot (the paired one-sided test of
    :func:`opro.stats.noninferiority.noninferiority`, Holm over the cheaper contrasts at :data:`ALPHA`),
    each with its test. An interval that merely holds 0 is not evidence of "not worse"."""
    from opro.stats.noninferiority import holm_noninferiority, noninferiority
    from opro.stats.paired import paired_valid

    if initial.cost is None:
        return []
    cheaper = [e for e in effects if e.cost is not None and e.cost < initial.cost
               and e.verdict is not None and e.verdict.kind != "hurts"]
    tests = holm_noninferiority([noninferiority(*paired_valid(e.scores, initial.scores), margin=margin, alpha=ALPHA)
                                 for e in cheaper])
    return [(e, t) for e, t in zip(cheaper, tests, strict=True) if t.passed]


def _cost_line(effects: Sequence[Effect], *, initial: Effect, objective: str, margin: float | None) -> str:
    """The recommendation's cost line: the cheaper contrasts shown not worse on the pilot, if any."""
    shown = [] if margin is None else cheaper_not_worse(effects, initial=initial, margin=margin)
    head = ("cost: the gain is in cost; [optimizer].objective = \"cost\" is set" if objective == "cost" else
            "cost: the gain is in cost: set [optimizer].objective = \"cost\"")
    if not shown:
        return head + " and open the dimensions that make an answer cheaper (top_k, answer_max_tokens, demos)"
    named = ", ".join(f"{e.label} (p {t.p:.2g})" for e, t in shown)
    family = f", Holm over {shown[0][1].n_comparisons}" if shown[0][1].n_comparisons > 1 else ""
    return (f"{head} (cheaper and not worse here: {named}; non-inferiority at margin {margin:g} on the pilot, "
            f"alpha {ALPHA:g}{family})")


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


# -- the result -----------------------------------------------------------------------------------


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

    @property
    def share(self) -> float | None:
        return self.probe_calls / self.search_calls if self.search_calls else None

    def line(self) -> str:
        where = f"{self.optimization} from the optimization split" + (
            f", {self.unused} unused questions no validation extension reserves" if self.unused else "")
        share = "" if self.share is None else f" = {self.share:.0%} of the search's {self.search_calls:.0f}"
        return (f"pilot: {self.n} questions ({where}; never validation or held-out); the probe asked "
                f"{self.probe_calls} calls{share}" + (f"; {self.note}" if self.note else ""))


@dataclass(frozen=True)
class ProbeResult:
    source: str
    #: What makes two probes the same (:func:`probe_signature`): a stored probe is read back only when it matches.
    signature: str
    task_model: str
    judge_model: str
    optimizer_model: str
    pilot: Pilot
    initial: Effect
    effects: tuple[Effect, ...]
    task: TaskLimits
    judge: JudgeLimits
    proposer: ProposerLimits
    recommendation: Recommendation
    #: Requests by role (made + cache hits), and how many were made (not from the cache).
    calls: Mapping[str, int]
    made: int
    wall_s: float
    top_k: int
    #: Why a contrast is missing (the optimizer gave no usable contrasting instruction), if one is.
    notes: tuple[str, ...] = ()
    created: str = ""
    questions: tuple[str, ...] = field(default_factory=tuple)
    #: What its paired noise belongs to (:meth:`opro.experiment.Experiment.noise_digest`; empty in a probe
    #: stored before it was kept: then no plan takes its noise).
    noise_digest: str = ""

    # -- rendering --
    def table(self) -> list[str]:
        """Every configuration in one grid that fits 80 columns (instructions are listed below it)."""
        rows = [self.initial, *self.effects]
        width = max(14, *(len(_short(e.label)) for e in rows))
        head = (f"{'contrast':<{width}} {'mean':>4}  {'vs initial [95% CI]':<20} {'W/T/L':>8} {'p':>5} {'words':>5} "
                f"{'cost':>5}  verdict")
        out = [head, "-" * len(head)]
        base_cost = self.initial.cost
        for e in rows:
            cost = "" if e is self.initial or e.cost is None or not base_cost else f"{e.cost / base_cost - 1:+.0%}"
            kind = "" if e.verdict is None or e.verdict.kind == "baseline" else e.verdict.kind
            p = "" if e.p is None else "<.001" if e.p < 0.001 else f"{e.p:.3f}"
            out.append(f"{_short(e.label):<{width}} {_num(e.mean):>4}  {(e.interval or '(baseline)'):<20} "
                       f"{e.win_tie_loss or '':>8} {p:>5} {_num(e.answer_words, '.0f'):>5} {cost:>5}  {kind}".rstrip())
        return out

    def verdict_lines(self) -> list[str]:
        """The verdict per contrast and the recommendation, for `opro plan` and `opro optimize`."""
        out = [f"probe ({self.pilot.n} pilot questions, {self.created[:10]}):"]
        out += [f"  {e.label}: {e.verdict.text}" for e in self.effects if e.verdict is not None]
        out += [f"  {line}" for line in self.recommendation.lines]
        if self.proposer.flagged:
            out.append(f"  {self.proposer.line()}")
        return out

    def sections(self) -> list[tuple[str, list[str]]]:
        """The report as (title, lines), the effects' grid first; long text outside the grid."""
        unit = {"usd": "USD", "seconds": "task seconds"}.get(self.initial.cost_unit, "weighted task tokens")
        wording = [f"{e.label}: {e.instruction or '(none)'}" for e in self.effects if e.dimension in ("wording", "format")]
        if any("answer_max_tokens" in e.label for e in self.effects):
            wording.append("max_tokens in the grid: [search.space].answer_max_tokens")
        return [
            ("effects", [self.pilot.line(), f"initial instruction: {self.initial.instruction or '(none)'}", *wording,
                         *(f"note: {n}" for n in self.notes),
                         f"words: mean words per answer; cost: per answer ({unit}), against the initial configuration"]),
            ("verdicts", [f"{e.label}: {e.verdict.text}" for e in self.effects if e.verdict is not None]),
            ("limits", [*self.task.lines(top_k=self.top_k), *self.judge.lines(), self.proposer.line(),
                        *(f"{'ok' if p.usable else 'unusable'}: {p.instruction[:120]!r}" + ("" if p.usable else f" ({p.reason})")
                          for p in self.proposer.proposals)]),
            ("recommendation", list(self.recommendation.lines)),
        ]

    def lines(self) -> list[str]:
        """The report as text for a terminal: the grid, then each section."""
        out = [f"probe of {self.source}: task {self.task_model}, judge {self.judge_model}, optimizer "
               f"{self.optimizer_model}", "", *self.table()]
        for title, body in self.sections():
            out += ["", f"{title}:", *(f"  {line}" for line in body)]
        return out

    def markdown(self) -> str:
        out = [f"# opro probe: {self.source}", "",
               f"task {self.task_model}, judge {self.judge_model}, optimizer {self.optimizer_model}; {self.created}",
               "", "```text", *self.table(), "```"]
        for title, body in self.sections():
            out += ["", f"## {title}", "", *(f"- {line}" for line in body)]
        return "\n".join(out) + "\n"

    # -- storage --
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "probe.json") -> ProbeResult:
        def effect(d: Mapping[str, Any]) -> Effect:
            v = d.get("verdict")
            return Effect(**{**d, "scores": tuple(d["scores"]), "settings": dict(d["settings"]),
                             "verdict": None if v is None else Verdict(**v)})

        try:
            task = dict(data["task"])
            task["recall"] = {int(k): float(v) for k, v in task["recall"].items()}
            proposer = dict(data["proposer"])
            proposer["proposals"] = tuple(ProposalCheck(**p) for p in proposer["proposals"])
            judge = dict(data["judge"])
            judge["calibration"] = tuple(judge["calibration"])
            r = data["recommendation"]
            rec = Recommendation(open=tuple(r["open"]), closed=tuple(r["closed"]), undecided=tuple(r["undecided"]),
                                 quality_plausible=r["quality_plausible"], cost_objective=bool(r["cost_objective"]),
                                 lines=tuple(r["lines"]))
            return cls(**{
                **data, "pilot": Pilot(**data["pilot"]), "initial": effect(data["initial"]),
                "effects": tuple(effect(e) for e in data["effects"]), "task": TaskLimits(**task),
                "judge": JudgeLimits(**judge), "proposer": ProposerLimits(**proposer),
                "recommendation": rec, "calls": dict(data["calls"]),
                "notes": tuple(data.get("notes", ())), "questions": tuple(data.get("questions", ())),
            })
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{where} is not an opro probe ({exc}); run `opro probe` again") from exc


# -- running it -----------------------------------------------------------------------------------


def pilot_pool(experiment: Experiment) -> tuple[tuple[Any, ...], int]:
    """The questions a pilot may use, in order: the optimization split, then the questions in no split
    that the validation extension does not reserve; and how many come from the optimization split."""
    ds = experiment.dataset
    optimization = ds.examples_in("optimization")
    reserved = len(experiment.extension_set())
    return tuple(optimization) + tuple(ds.unused()[reserved:]), len(optimization)


def probe_signature(experiment: Experiment) -> str:
    """A hash of what the probe's figures depend on: the experiment's fingerprint (dataset, split, models,
    retrieval, judge, search space) and the optimizer settings that shape its proposals and the pilot."""
    o = experiment.config.optimizer
    blob = {"fingerprint": experiment.fingerprint(),
            "optimizer": {k: getattr(o, k) for k in ("proposer", "temperature", "max_tokens", "answer_format",
                                                      "max_instruction_chars", "exemplars", "finalists",
                                                      "validation_extension", "objective", "margin")},
            # The last entry is the verdicts' version (2: a verdict says when it may be chance after Holm;
            # 3: a contrast identical to the initial configuration, and all-tied differences without an
            # interval; 4: never inert outside the band, "cheaper and not worse" only on a non-inferiority test).
            "probe": [FORMAT_INSTRUCTION, CONTRAST_PROMPT, N_PROPOSALS, INERT_WITHIN, 4]}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def _ask_contrast(ask: Callable[[str, Sequence[int]], list[str]], *, initial: str, check: Callable[[str], ProposalCheck],
                  answer_format: str) -> tuple[str | None, list[ProposalCheck]]:
    """A markedly different instruction from the optimizer LLM: up to three samples, the first usable one."""
    prompt = CONTRAST_PROMPT.format(initial=initial or "(no instruction)", answer_format=_ANSWER_FORMATS[answer_format])
    tried = []
    for i in range(3):
        (reply,) = ask(prompt, [900 + i])
        verdict = check(reply)
        tried.append(verdict)
        if verdict.usable:
            return verdict.instruction, tried
    return None, tried


def _delta(after: Mapping[str, Mapping[str, Any]], before: Mapping[str, Mapping[str, Any]], key: str) -> dict[str, int]:
    return {role: int(u.get(key, 0)) - int((before.get(role) or {}).get(key, 0)) for role, u in after.items()}


def _search_calls(plan: Plan) -> float:
    return sum(r.search_calls + r.validation_calls for r in plan.roles)


def questions_for(plan: Plan, *, contrasts: int, available: int, alpha: float) -> tuple[int, str]:
    """Pilot questions within :data:`PROBE_SHARE` of the plan's search calls (a question costs a task and
    a judge call per configuration; the optimizer's few calls come first), never fewer than a two-sided
    sign-flip test needs to reach ``alpha``, never more than ``available``; and what to say about it."""
    from opro.stats.sequential import min_questions

    budget = PROBE_SHARE * _search_calls(plan) - (1 + N_PROPOSALS)
    n = int(budget // (2 * (1 + contrasts)))
    least = min_questions(alpha, sides=2)
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


def probe(experiment: Experiment, *, questions: int | None = None, progress: bool | None = None) -> ProbeResult:
    """Run the probe on an experiment (every call through its call cache): see the module docstring.
    ``questions``: pilot questions (default: within a fifth of the plan's search calls)."""
    from opro.probe.plan import make_plan
    from opro.search.proposers.opro import build as build_opro

    exp, cfg = experiment, experiment.config
    o = cfg.optimizer
    digest = exp.noise_digest()
    # Its verdicts never read an earlier probe (only a run's noise on this task).
    plan = make_plan(cfg, documents=lambda: exp.documents, noise_digest=digest)
    pool, n_optimization = pilot_pool(exp)
    _ = exp.search_space  # the demonstration pool (bootstrapped: answered and judged) before counting
    before = exp.usage.as_dict()
    started = time.perf_counter()  # the probe's own time: not the dataset's generation, nor the plan
    initial_text = cfg.rag.initial_instructions[0]
    initial = exp.template(initial_text)
    contrasts = [Contrast("no instruction", initial.with_instruction(""), "wording", "")]
    space_contrasts = dimension_contrasts(initial, exp.search_space)
    n, note = _pilot_size(plan, questions=questions, contrasts=3 + len(space_contrasts), available=len(pool),
                          alpha=o.alpha)
    pilot = pool[:n]
    asked_q = [e.query for e in pilot]
    shown_q = [e.query for e in exp.dataset.examples_in("exemplar")]
    template_text = exp.template("<INS>").template_text
    proposer = build_opro(llm=exp.client("optimizer"), settings=o, template_text=template_text, seed=cfg.experiment.seed)

    def check(reply: str) -> ProposalCheck:
        return check_proposal(reply, initial=initial_text, questions=[*shown_q, *asked_q], template_text=template_text,
                              max_chars=o.max_instruction_chars, answer_format=o.answer_format)

    notes: list[str] = []
    other, tried = _ask_contrast(proposer.ask, initial=initial_text, check=check, answer_format=o.answer_format)
    if other is not None:
        contrasts.append(Contrast("contrast", initial.with_instruction(other), "wording", other))
    else:
        notes.append("the optimizer LLM gave no usable contrasting instruction in 3 tries ("
                     + "; ".join(t.reason for t in tried) + "): no contrast row")
    formatted = f"{initial_text.rstrip()} {FORMAT_INSTRUCTION}".strip()
    contrasts.append(Contrast("one sentence", initial.with_instruction(formatted), "format", FORMAT_INSTRUCTION))
    contrasts += space_contrasts
    effects = measure_effects(program=exp.program, judge=exp.judge, initial=initial, contrasts=contrasts,
                              questions=pilot, cost=cfg.cost_model(),
                              progress=exp.progress if progress is None else progress)
    base = effects[0]
    if not any(e.n for e in effects[1:]):
        raise DataError(_no_pairs(effects, questions=n))
    judge = _judge_limits(cfg, plan=plan, effects=effects)
    # The search's resolution at the noise measured here, where the pilot measured it (the plan's
    # figure rests on an assumed sd until a run, a calibration or this probe measures one).
    detectable = judge.detectable_at_pilot_sd or plan.detectable
    # The inert band: +-0.2, or under the cost objective +-margin, the difference the search tolerates.
    band = o.margin if o.objective == "cost" else INERT_WITHIN
    judged = _judged(effects[1:], band=band, detectable=detectable)
    # The noise at which to size a pilot that decides: the one measured here where enough questions
    # measured it, else the plan's (measured by a run or a calibration, or assumed: it says which).
    noise = ((judge.pilot_sd, "the pilot's") if judge.pilot_sd is not None and judge.pilot_sd > 0 and n >= MIN_PILOT
             else (judge.plan_sd, f"the plan's: {judge.plan_sd_basis}"))
    rec = recommend(judged, initial=base, detectable=detectable, objective=o.objective,
                    probed_space=bool(space_contrasts), questions=n, noise=noise, available=len(pool), band=band,
                    margin=o.margin)
    after = exp.usage.as_dict()
    calls = {r: c for r, c in _delta(after, before, "calls").items() if c}
    hits = _delta(after, before, "cache_hits")
    requests = {r: calls.get(r, 0) + hits.get(r, 0) for r in after if calls.get(r, 0) + hits.get(r, 0)}
    return ProbeResult(
        source=str(cfg.source), signature=probe_signature(exp), task_model=cfg.models.task.model,
        judge_model=cfg.models.judge.model, optimizer_model=cfg.models.optimizer.model,
        pilot=Pilot(n=n, optimization=min(n, n_optimization), unused=max(0, n - n_optimization), available=len(pool),
                    search_calls=_search_calls(plan), probe_calls=sum(requests.values()), note=note),
        initial=dataclasses.replace(base, verdict=verdict_of(base)), effects=judged,
        task=_task_limits(exp, pilot=pilot, base=base, effects=effects),
        judge=judge,
        proposer=_proposer_limits(exp, proposer=proposer, base=base, check=check, initial_text=initial_text),
        recommendation=rec, calls=requests, made=sum(calls.values()),
        wall_s=time.perf_counter() - started, top_k=cfg.rag.top_k, notes=tuple(notes),
        created=datetime.now(UTC).isoformat(timespec="seconds"), questions=tuple(asked_q),
        noise_digest=exp.noise_digest() or "",
    )


def _judged(contrasted: Sequence[Effect], *, band: float, detectable: float | None) -> tuple[Effect, ...]:
    """Each contrast with its verdict, its sign-flip p Holm-adjusted over the contrasts that have one
    (one alone needs no adjustment)."""
    p_values = {i: e.p for i, e in enumerate(contrasted) if e.p is not None}
    adjusted = dict(zip(p_values, holm(list(p_values.values())), strict=True)) if len(p_values) > 1 else {}
    return tuple(dataclasses.replace(e, verdict=verdict_of(
        e, inert_within=band, detectable=detectable, holm=(adjusted[i], len(p_values)) if i in adjusted else None))
        for i, e in enumerate(contrasted))


def _no_pairs(effects: Sequence[Effect], *, questions: int) -> str:
    """Why a probe that scored no pair stores no verdict: the judge's replies (how many were
    unreadable, one reason) or the failed calls, and what to do."""
    answers = sum(len(e.scores) for e in effects)
    unreadable, failed = sum(e.unreadable for e in effects), sum(e.failed for e in effects)
    reason = next((e.unreadable_reason for e in effects if e.unreadable_reason), "")
    if not questions:
        why = "there are no pilot questions (the optimization split and the unused questions are empty)"
    else:
        why = f"the judge's replies were unreadable on {unreadable} of {answers} answers" + (
            f" (for example: {reason!r})" if reason else "") + (f", and {failed} calls failed" if failed else "")
    return (f"the probe scored no pair on its {questions} pilot questions: {why}; no verdict is stored. Fix the judge "
            "([models.judge], [judge].template and score_from; `opro judge calibrate` shows what it replies) and run "
            "`opro probe` again")


def _pilot_size(plan: Plan, *, questions: int | None, contrasts: int, available: int, alpha: float) -> tuple[int, str]:
    """How many pilot questions, and a note where the count is not what was asked or planned."""
    if questions is None:
        return questions_for(plan, contrasts=contrasts, available=available, alpha=alpha)
    if questions < 1:
        raise DataError(f"--questions {questions}: give at least 1")
    note = f"only {available} pilot questions exist (asked for {questions})" if questions > available else ""
    return min(questions, available), note


def _proposer_limits(exp: Experiment, *, proposer: Any, base: Effect, check: Callable[[str], ProposalCheck],
                     initial_text: str) -> ProposerLimits:
    """Three samples of the search's own meta-prompt (the initial instruction scored on the pilot), checked."""
    from opro.search.metaprompt import Exemplar, ScoredInstruction, draw_exemplars

    cfg = exp.config
    history = [ScoredInstruction(initial_text, base.mean)] if base.mean is not None else []
    exemplars = draw_exemplars([Exemplar(e.query, e.reference_answer) for e in exp.dataset.examples_in("exemplar")],
                               k=cfg.optimizer.exemplars, step=1, seed=cfg.experiment.seed)
    meta = proposer.builder.render(history=history, exemplars=exemplars)
    proposals = tuple(check(r) for r in proposer.ask(meta, list(range(N_PROPOSALS))))
    unusable = sum(not p.usable for p in proposals) / len(proposals)
    return ProposerLimits(model=cfg.models.optimizer.model, proposals=proposals, unusable_share=unusable,
                          flagged=unusable >= GARBAGE_SHARE)


def _task_limits(exp: Experiment, *, pilot: Sequence[Example], base: Effect, effects: Sequence[Effect]) -> TaskLimits:
    """The initial configuration's score distribution, retrieval recall@k and instruction following."""
    from opro.data.withheld import NOT_IN_CONTEXT

    cfg = exp.config
    valid = [s for s in base.scores if s is not None]
    answerable = [(i, e) for i, e in enumerate(pilot) if e.reference_contexts and e.reference_answer != NOT_IN_CONTEXT]
    recall: dict[int, float] = {}
    mean_hit = mean_miss = None
    if answerable:
        from opro.program.retrieval import first_hits, recall_from

        top_k = cfg.rag.top_k
        ks = sorted({top_k, *(int(k) for k in (exp.search_space.choices.get("top_k", ()) if exp.search_space else ()))})
        # One retrieval per question: recall at every k, and whether the configured top_k holds the passage.
        firsts = first_hits(exp.retriever, [(e.query, e.reference_contexts) for _, e in answerable], k=max(ks))
        recall = recall_from(firsts, ks=ks)
        hits = {i: f is not None and f < top_k for (i, _), f in zip(answerable, firsts, strict=True)}
        hit_scores = [s for i, h in hits.items() if h and (s := base.scores[i]) is not None]
        miss_scores = [s for i, h in hits.items() if not h and (s := base.scores[i]) is not None]
        mean_hit = statistics.fmean(hit_scores) if hit_scores else None
        mean_miss = statistics.fmean(miss_scores) if miss_scores else None
    follows, following = _following(base, next(e for e in effects if e.dimension == "format"))
    return TaskLimits(
        mean=base.mean, n=len(valid),
        ceiling_share=sum(s >= CEILING for s in valid) / len(valid) if valid else None,
        floor_share=sum(s <= FLOOR for s in valid) / len(valid) if valid else None,
        recall=recall, recall_n=len(answerable), mean_retrieved=mean_hit, mean_missed=mean_miss,
        follows=follows, following=following,
    )


def _judge_limits(cfg: OproConfig, *, plan: Plan, effects: Sequence[Effect]) -> JudgeLimits:
    """The stored calibration, the pilot's paired noise and what the plan can detect at it."""
    from opro.probe.plan import POWER
    from opro.stats.sequential import design_power

    o = cfg.optimizer
    sds = [e.sd for e in effects[1:] if e.sd is not None and e.n >= 3]
    pilot_sd = statistics.median(sds) if sds else None
    at_pilot = None
    if pilot_sd is not None and pilot_sd > 0 and plan.looks:
        at_pilot = design_power(plan.looks, alpha=o.alpha, sd=pilot_sd, futility=o.futility, power=POWER).detectable
    seconds = {r.role: r.seconds_per_call for r in plan.roles}
    calibrated, calibration = calibration_lines(cfg, judge_seconds=seconds.get("judge", 0.0),
                                                task_seconds=seconds.get("task", 0.0))
    return JudgeLimits(calibrated=calibrated, calibration=calibration, pilot_sd=pilot_sd, plan_sd=plan.difference_sd,
                       plan_sd_basis=plan.sd_basis, detectable=plan.detectable, detectable_at_pilot_sd=at_pilot,
                       heldout_detectable=plan.heldout_detectable)


def _following(base: Effect, fmt: Effect) -> tuple[bool | None, str]:
    """Whether the answers follow the format instruction: one sentence far more often, or far shorter."""
    if base.one_sentence is None or fmt.one_sentence is None or base.answer_words is None or fmt.answer_words is None:
        return None, "not measured (no answers)"
    said = (f"\"{FORMAT_INSTRUCTION}\" took one-sentence answers from {base.one_sentence:.0%} to "
            f"{fmt.one_sentence:.0%} and answers from {base.answer_words:.0f} to {fmt.answer_words:.0f} words")
    if base.one_sentence >= 0.8:
        return None, f"cannot tell: the initial answers are already one sentence ({base.one_sentence:.0%}); {said}"
    if fmt.one_sentence >= base.one_sentence + 0.3 or fmt.answer_words <= 0.75 * base.answer_words:
        return True, f"the task model follows its instruction: {said}"
    return False, (f"the task model does not follow its instruction: {said}; wording can only move what the "
                   "model reads")


# -- storing and reading it -----------------------------------------------------------------------


def write_probe(result: ProbeResult, *, output_dir: Path) -> dict[str, Path]:
    """``<output_dir>/probe.json`` (read back by ``opro plan`` and ``opro optimize``) and ``probe.md``."""
    from opro.redaction import redact_text

    run = RunDir(output_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    run.probe.write_text(redact_text(json.dumps(result.to_dict(), indent=2, ensure_ascii=False)), encoding="utf-8")
    run.probe_report.write_text(redact_text(result.markdown()), encoding="utf-8")
    return {"json": run.probe, "report": run.probe_report}


def read_probe(output_dir: Path) -> ProbeResult | None:
    """The probe stored in an output folder, whatever its settings (None: there is none)."""
    run = RunDir(output_dir)
    if not run.probe.is_file():
        return None
    return ProbeResult.from_dict(run.read_json(run.probe), where=str(run.probe))


def pilot_noise(experiment: Experiment) -> MeasuredNoise | None:
    """The paired sd the stored probe measured on its pilot (the median over its contrasts), on how many
    pairs and whose it is, for :func:`opro.probe.plan.make_plan`: only where it measured this task (its
    noise digest is this experiment's: the same dataset content, split, task and judge models, judge and
    template; other settings may differ) on at least :data:`MIN_PILOT` questions."""
    from opro.probe.plan import MeasuredNoise

    try:
        found = read_probe(experiment.config.output_dir)
    except DataError:  # an unreadable probe measured nothing a plan can use; `opro probe` rewrites it
        return None
    if (found is None or not found.noise_digest or found.noise_digest != experiment.noise_digest()
            or found.judge.pilot_sd is None or found.judge.pilot_sd <= 0 or found.pilot.n < MIN_PILOT):
        return None
    pairs = [e.n for e in found.effects if e.sd is not None and e.n >= 3]
    n = int(statistics.median(pairs)) if pairs else found.pilot.n
    return MeasuredNoise(found.judge.pilot_sd, n,
                         f"opro probe's pilot ({found.pilot.n} questions, the median over its contrasts)")


def stored_probe(experiment: Experiment, *, questions: int | None = None) -> tuple[ProbeResult | None, str | None]:
    """The stored probe when it was made with this experiment's settings (and ``questions``, if given),
    else None and why (None, None: there is none)."""
    found = read_probe(experiment.config.output_dir)
    if found is None:
        return None, None
    if found.signature != probe_signature(experiment):
        return None, (f"the stored probe ({found.created}) was made with other settings: run `opro probe "
                      f"{experiment.config.source}` again")
    if questions is not None and found.pilot.n != min(questions, found.pilot.available):
        return None, f"the stored probe has {found.pilot.n} pilot questions, not {questions}"
    return found, None


def probe_or_stored(experiment: Experiment, *, questions: int | None = None,
                    progress: bool | None = None) -> tuple[ProbeResult, bool]:
    """The stored probe when it matches (True), else a new one, written to the output folder (False)."""
    found, _ = stored_probe(experiment, questions=questions)
    if found is not None:
        return found, True
    made = probe(experiment, questions=questions, progress=progress)
    write_probe(made, output_dir=experiment.config.output_dir)
    return made, False


@dataclass(frozen=True)
class ProbeRun:
    """What :func:`run_probe` did: the result, the files it wrote and where it was recorded."""

    result: ProbeResult
    paths: Mapping[str, Path]
    recorded: tuple[Recorded, ...]


def run_probe(experiment: Experiment, *, recorders: Sequence[CommandRecorder] = (), questions: int | None = None,
              progress: bool | None = None) -> ProbeRun:
    """The probe (:func:`probe`), written to the output folder (:func:`write_probe`) and recorded through
    ``recorders`` (``opro.kind = probe``): what ``opro probe`` does."""
    result = probe(experiment, questions=questions, progress=progress)
    paths = write_probe(result, output_dir=experiment.config.output_dir)
    return ProbeRun(result, paths, record_all(recorders, probe_record(result, paths)))


def _metric_name(label: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]+", "_", label).strip("_")


def probe_record(result: ProbeResult, paths: Mapping[str, Path]) -> CommandRecord:
    """The probe as one command record (``opro.kind = probe``): its figures and its two files."""
    metrics: dict[str, float | None] = {
        "pilot_questions": result.pilot.n, "probe_calls": result.pilot.probe_calls, "initial_mean": result.initial.mean,
        "ceiling_share": result.task.ceiling_share, "floor_share": result.task.floor_share,
        "pilot_sd": result.judge.pilot_sd, "detectable": result.judge.detectable,
        "proposals_unusable_share": result.proposer.unusable_share,
        **{f"recall_at_{k}": v for k, v in result.task.recall.items()},
    }
    for e in result.effects:
        name = _metric_name(e.label)
        metrics.update({f"effect.{name}": e.difference, f"effect.{name}.low": e.low, f"effect.{name}.high": e.high,
                        f"effect.{name}.p": e.p})
    tags: dict[str, str] = {f"opro.probe.{_metric_name(e.label)}": e.verdict.kind
                            for e in result.effects if e.verdict is not None}
    tags["opro.probe.open"] = ",".join(result.recommendation.open) or "none"
    return CommandRecord(kind="probe", name="probe", params={
        "config": result.source, "signature": result.signature, "models.task": result.task_model,
        "models.judge": result.judge_model, "models.optimizer": result.optimizer_model,
        "pilot.questions": result.pilot.n}, metrics=finite_metrics(metrics), tags=tags,
        files={path: "probe" for path in paths.values()})


__all__ = [
    "ALPHA",
    "CEILING",
    "FLOOR",
    "FORMAT_INSTRUCTION",
    "INERT_WITHIN",
    "MIN_PILOT",
    "PROBE_SHARE",
    "Contrast",
    "Effect",
    "JudgeLimits",
    "Pilot",
    "ProbeResult",
    "ProbeRun",
    "ProposalCheck",
    "ProposerLimits",
    "Recommendation",
    "TaskLimits",
    "Verdict",
    "check_proposal",
    "dimension_contrasts",
    "measure_effects",
    "pilot_noise",
    "pilot_pool",
    "probe",
    "probe_or_stored",
    "probe_record",
    "probe_signature",
    "questions_for",
    "read_probe",
    "recommend",
    "run_probe",
    "stored_probe",
    "verdict_of",
    "write_probe",
]
