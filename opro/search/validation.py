"""The validation stage: is the search's best finalist really better than the initial instruction?

On questions the search never saw, in two parts that never share a question:

1. **Selection** (with more than one finalist): the finalists answer the first
   ``selection_questions`` validation questions; the one with the best mean over its search
   questions and these is *chosen* (under the cost objective, the largest expected confirmed
   saving: :mod:`opro.search.finalists`). These questions only choose; they test nothing.
2. **Confirmation**: the chosen finalist and the initial instruction answer the other validation
   questions in ``validation_looks`` batches, and after each batch a one-sided betting test of the
   mean difference (:mod:`opro.stats.sequential`, :mod:`opro.stats.betting`: valid at every look
   whatever the differences' shape) decides: success, futility, or the next batch. One
   hypothesis is tested, so no multiplicity correction is needed, and a clear effect stops early.
   When the split's looks did not decide, one more look asks up to ``validation_extension``
   questions that are in no split (never held-out): planned with the other looks before the first
   one, so the error rate holds, and asked only where the finalist is still ahead (futility stops the
   rest), which is where more questions change the decision.

The reported gain, its interval and the returned score come from the confirmation questions only:
questions that did not choose the finalist among the others (no winner's curse from the selection).
A claimed gain is also adjusted for having been claimed (a claim is made when the sample looked
good): :func:`opro.stats.sequential.conditional_estimate`.

Every look is recorded in the study with the design it was made under, and every decision (its
design, ``min_coverage`` included, the study's fingerprint, its questions and its verdict) in the
study and in the user's decision ledger (:mod:`opro.search.ledger`). Questions that decided a
verdict cannot decide again under another design or other settings, in any study, storage or output
folder (more than :data:`opro.search.ledger.MAX_SEEN_SHARE` of them shared is refused), so a rerun cannot
shop for the alpha, finalists, steps, coverage rule or judge that happen to claim a gain. With
``[optimizer].seen_validation = "label"`` such a decision is made as an exploration instead: labelled
"re-decided after a seen verdict" in every record, the initial instruction returned, nothing claimed.

A prompt's batch valid on fewer than ``min_coverage`` of its questions (unreadable judge replies, kept
out of the call cache) is not kept: the next run asks them again and decides like a clean run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from opro.data.dataset import question_hashes
from opro.errors import LLMError
from opro.evaluation.batch import QAExample
from opro.evaluation.engine import Scored
from opro.evaluation.rows import EvaluationRow
from opro.judges.parsing import SCORE_MAX, SCORE_MIN
from opro.program.cost import CostModel, CostUnit
from opro.search.design import ValidationDesign
from opro.search.finalists import choose_finalists, chosen_finalist
from opro.search.ledger import MAX_SEEN_SHARE, RE_DECIDED, Decision, DecisionLedger, now
from opro.search.paired import side_by_side_scores
from opro.search.results import (
    CandidateRecord,
    CostSaving,
    FinalistRecord,
    ValidationResult,
)
from opro.search.saving import cost_saving
from opro.search.scoring import CandidateScorer
from opro.search.settings import ValidationSettings
from opro.search.study import SearchStudy, ValidationReuse, questions_key, sha
from opro.search.validation_sizes import confirmation_looks, split_sizes
from opro.stats import betting, clusters
from opro.stats.objectives import QUALITY, Objective
from opro.stats.sequential import Look, conditional_estimate, decide, interval_text, on_scale, t_interval

logger = logging.getLogger(__name__)

OnValidated = Callable[[str, str, Sequence[EvaluationRow]], None]


def validation_prompts(initial: str, finalists: Sequence[str]) -> list[tuple[str, str]]:
    """(label, instruction) of a validation stage: ``initial``, then ``finalist 1``, ``finalist 2``..."""
    return [("initial", initial), *((f"finalist {i}", f) for i, f in enumerate(finalists, start=1))]


def score_on(
    study: SearchStudy,
    scorer: CandidateScorer,
    prompts: Sequence[tuple[str, str]],
    examples: Sequence[QAExample],
    *,
    on_validated: OnValidated,
    min_coverage: float = 0.0,
    progress: bool = True,
    costs: dict[str, list[float | None]] | None = None,
) -> dict[str, list[float | None]]:
    """Per-question validation scores of each (label, instruction) on ``examples``, kept in the study
    (keyed by the prompt and the questions) so a rerun asks nothing. ``on_validated(label,
    instruction, rows)`` as soon as all of a prompt's questions are scored without an LLM error and
    with valid judge replies on at least ``min_coverage`` of them; a prompt short of either is not
    kept, and a rerun asks it again (as the search does an ``incomplete`` candidate); ``rows`` are its
    answers and verdicts, in order. ``costs``, when given, receives each prompt's per-answer costs
    (:mod:`opro.program.cost`; None where a call failed or, for scores kept before costs were, unknown)."""
    queries = [e.query for e in examples]
    costs = {} if costs is None else costs
    out: dict[str, list[float | None]] = {}
    todo: list[tuple[str, str]] = []
    for label, ins in prompts:
        stored = study.validation_scores(ins, queries)
        if stored is not None and len(stored) == len(examples):
            out[ins] = stored
            costs[ins] = study.validation_costs(ins, queries) or [None] * len(examples)
        else:
            todo.append((label, ins))

    def done(k: int, scored: list[Scored]) -> None:
        label, ins = todo[k]
        results = [scorer.outcome(s, ins) for s in scored]
        out[ins] = [None if isinstance(r, LLMError) else r for r in results]
        costs[ins] = scorer.cost.per_answer([s.row for s in scored])
        valid = sum(x is not None for x in out[ins])
        if any(isinstance(r, LLMError) for r in results):  # a rerun retries the questions that failed
            return
        if valid < min_coverage * len(results):
            # Unreadable judge replies (never cached): kept as scored, they would never be asked again.
            logger.warning("validation of %s: %d of %d judge replies were unreadable (min_coverage %g): not kept; "
                           "the next run asks them again", label, len(results) - valid, len(results), min_coverage)
            return
        study.save_validation_costs(ins, queries, costs[ins])  # first: kept scores always have their costs
        study.save_validation_scores(ins, queries, out[ins])
        on_validated(label, ins, tuple(s.row for s in scored))

    if examples:
        scorer.score_prompts(todo, examples, on_done=done, progress=progress)
    return out


@dataclass
class _Rows:
    """Each prompt's rows over the batches this process scored; a prompt is handed to the recorders
    once its questions are all here (a batch a rerun found scored leaves it out)."""

    rows: dict[str, list[EvaluationRow]] = field(default_factory=dict)
    batches: dict[str, int] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def expect(self, label: str, instruction: str) -> None:
        self.labels[label] = instruction
        self.batches[label] = self.batches.get(label, 0) + 1

    def add(self, label: str, instruction: str, rows: Sequence[EvaluationRow]) -> None:
        self.rows.setdefault(label, []).extend(rows)
        self.batches[label] -= 1

    def finish(self, on_validated: OnValidated) -> None:
        for label, instruction in self.labels.items():
            if self.batches.get(label, 0) == 0 and label in self.rows:
                on_validated(label, instruction, tuple(self.rows[label]))


def _fingerprint(study: SearchStudy) -> dict[str, str]:
    return {k: sha(v) for k, v in sorted(study.fingerprint().items())}


def _decision(study: SearchStudy, design: ValidationDesign, queries: Sequence[str]) -> Decision:
    """The ledger's record of the decision ``design`` describes, on ``queries`` (selection,
    confirmation and extension questions), under the study's fingerprint."""
    fingerprint = _fingerprint(study)
    d = design
    # The entries a design lacks (None: absent from its stored form) are not shown.
    shown: dict[str, Any] = {k: v for k, v in (
        ("alpha", d.alpha), ("looks", d.looks), ("futility", d.futility), ("selection_questions", d.selection_questions),
        ("min_coverage", d.min_coverage), ("objective", d.objective), ("margin", d.margin),
        ("extension", d.extension), ("n_questions", d.n_questions)) if v is not None}
    # repr of the list the design stores (a tuple's would hash to another value).
    shown["finalist instructions"] = sha(repr(list(d.finalists)))
    shown["initial instruction"] = sha(d.initial)
    shown["validation questions"] = d.questions
    return Decision(
        scope="validation", key=sha(repr((d.key, sorted(fingerprint.items())))),
        questions=question_hashes(queries), design=shown, fingerprint=fingerprint, where=f"study {study.name!r}",
        at=now(),
    )


def _label_warning(reuse: ValidationReuse) -> None:
    logger.warning("[optimizer].seen_validation = 'label': %s; this validation decision is %s: the initial "
                   "instruction is returned and no gain is claimed", reuse.seen, RE_DECIDED)


def refuse_seen(
    *, study: SearchStudy, settings: ValidationSettings, validation_set: Sequence[QAExample],
    ledger: DecisionLedger | None = None,
) -> None:
    """Before the search: raise :class:`ValidationReuse` at once when the validation decision it would
    end with is sure to be refused (:func:`validate` checks again, with the finalists): these
    validation questions already decided a verdict under other settings (the study's fingerprint) or
    another alpha, futility rule or ``min_coverage``. Saves a search whose verdict could not be drawn.
    With ``seen_validation = "label"`` it warns instead (the decision will be labelled re-decided)."""
    if not settings.finalists or not validation_set:
        return
    if ledger is not None:  # a ledger deleted or edited since this storage's decisions: seen here, said
        ledger.reconcile(recorded=study.decisions_in_storage(),
                         questions=question_hashes([e.query for e in validation_set]))
    s = settings
    probe = Decision(scope="validation", key="", questions=question_hashes([e.query for e in validation_set]),
                     design={"alpha": s.alpha, "futility": s.futility, "min_coverage": s.min_coverage},
                     fingerprint=_fingerprint(study))
    earlier = [*study.decisions_in_storage(), *(("", d) for d in (ledger.decisions() if ledger else ()))]
    for where, d in earlier:
        differs = d.fingerprint != probe.fingerprint or any(
            k in d.design and d.design[k] != v for k, v in probe.design.items())
        if d.scope == probe.scope and not d.re_decided and differs and probe.seen_share(d)[1] > MAX_SEEN_SHARE:
            reuse = ValidationReuse(d, probe, where=where or None, partial=True)
            if s.seen_validation != "label":
                raise reuse
            _label_warning(reuse)
            return


def _mean(values: Sequence[float | None]) -> float | None:
    valid = [x for x in values if x is not None]
    return sum(valid) / len(valid) if valid else None


def _ci(values: Sequence[float | None]) -> tuple[float, float] | None:
    return on_scale(t_interval([x for x in values if x is not None]), SCORE_MIN, SCORE_MAX)


@dataclass(frozen=True)
class _Plan:
    """What a validation stage asks, fixed before its first question: the finalists, the questions of
    each part and the looks (planned together, so the error rate holds over all of them)."""

    initial: str
    finalists: tuple[CandidateRecord, ...]
    #: (label, instruction): the initial instruction, then each finalist (:func:`validation_prompts`).
    labels: tuple[tuple[str, str], ...]
    #: The validation split's questions: the selection ones, then the confirmation ones.
    validation: tuple[QAExample, ...]
    selection: tuple[QAExample, ...]
    #: The validation split's confirmation questions, then the extension's.
    confirmation: tuple[QAExample, ...]
    extension: tuple[QAExample, ...]
    pool: frozenset[str]  # the extension's questions from the dataset's labelled pool
    #: Paired questions seen at each look (:func:`confirmation_looks`).
    sizes: tuple[int, ...]
    objective: Objective  # what a finalist must show
    #: Each confirmation question's cluster (:mod:`opro.stats.clusters`: its source passage; all distinct,
    #: the per-question test, where the dataset records none).
    keys: tuple[str, ...] = ()

    @property
    def clustered(self) -> bool:
        return not clusters.singletons(self.keys)


@dataclass(frozen=True)
class _Opened:
    """The decision a validation stage makes, recorded as begun; ``reuse``: why it is only an
    exploration (``seen_validation = "label"`` on questions an earlier verdict saw), else None."""

    design: ValidationDesign
    decision: Decision
    reuse: ValidationReuse | None


@dataclass(frozen=True)
class _Confirmation:
    """The chosen finalist and the initial instruction on the confirmation questions asked, and the looks."""

    initial_scores: tuple[float | None, ...]
    pick_scores: tuple[float | None, ...]
    initial_costs: tuple[float | None, ...]
    pick_costs: tuple[float | None, ...]
    looks: tuple[Look, ...]
    #: Unscored questions of batches not kept (asked again by the next run).
    unkept: int

    @property
    def final(self) -> Look:
        return self.looks[-1]

    @property
    def asked(self) -> int:
        return len(self.initial_scores)


@dataclass(frozen=True)
class _Finding:
    """What the confirmation shows: the paired differences, the reported gain and interval, and whether
    a gain (or, under a non-inferiority objective, a saving) is claimed."""

    diffs: tuple[float, ...]
    #: The plain mean of ``diffs`` (None without a pair).
    raw: float | None
    difference: float | None
    difference_ci: tuple[float, float] | None
    #: What the sequential test says (coverage included), before the claim's other conditions.
    tested: bool
    claimed: bool
    saving: CostSaving | None
    cheaper: bool


def _nothing_to_validate(settings: ValidationSettings) -> ValidationResult:
    return ValidationResult(
        n_questions=0, alpha=settings.alpha, initial_score=None, initial_ci=None, initial_scores=(), finalists=(),
        winner=None, verdict=settings.objective.nothing_to_validate(margin=settings.margin),
        objective=settings.objective, margin=settings.margin if settings.objective.non_inferiority else None,
    )


def _plan(settings: ValidationSettings, *, initial: str, finalists: Sequence[CandidateRecord],
          validation_set: Sequence[QAExample], extension_set: Sequence[QAExample], pooled: int = 0) -> _Plan:
    n_sel, _ = split_sizes(settings, len(validation_set), len(finalists))
    # A cluster's questions are asked one after the other (at most one cluster is incomplete at a look);
    # those sharing a source with a selection question helped choose the finalist and confirm nothing.
    validation = tuple(validation_set[i] for i in clusters.together(clusters.keys_of(validation_set)))
    keys = clusters.keys_of(validation)
    confirmation = tuple(e for e, k in zip(validation[n_sel:], keys[n_sel:], strict=True) if k not in keys[:n_sel])
    sizes = confirmation_looks(settings, len(confirmation), len(extension_set))
    extension = tuple(extension_set[: sizes[-1] - len(confirmation)])
    extension = tuple(extension[i] for i in clusters.together(clusters.keys_of(extension)))
    return _Plan(
        initial=initial, finalists=tuple(finalists),
        labels=tuple(validation_prompts(initial, [f.instruction for f in finalists])),
        validation=validation, selection=validation[:n_sel],
        confirmation=confirmation + extension, extension=extension, sizes=sizes,
        pool=frozenset(e.query for e in extension_set[len(extension_set) - pooled:] if pooled),
        objective=settings.objective, keys=clusters.keys_of(confirmation + extension),
    )


def _design(settings: ValidationSettings, plan: _Plan) -> ValidationDesign:
    """The decision's design, keyed: what a decision is resumed under, and refused under another."""
    s = settings
    # The test is part of the key: a decision recorded under the sign flips alone is never resumed under
    # this one (nor the other way round).
    test = (f"sequential one-sided {betting.METHOD} on the judge's {SCORE_MIN:g}-{SCORE_MAX:g} scale, valid at "
            "every look, non-binding futility")
    if plan.clustered:  # only then: the key of a design without clusters is as it was
        test += (f", over the means of {len(set(plan.keys))} clusters of questions sharing a source passage "
                 "(complete clusters at a look)")
    procedure = f"chosen finalist vs initial: {test}"
    if plan.objective.non_inferiority:
        procedure = (
            f"chosen finalist vs initial: non-inferiority by the margin (differences shifted by it), {test} once "
            f"clearly worse (one-sided {1 - s.alpha:.0%} t upper bound below the margin); and a "
            "lower cost per answer on the same questions (paired t interval below 0)")
    return ValidationDesign(
        alpha=s.alpha, looks=len(plan.sizes), futility=s.futility, selection_questions=len(plan.selection),
        finalists=tuple(ins for label, ins in plan.labels[1:]), initial=plan.initial,
        n_questions=len(plan.validation), procedure=procedure,
        questions=questions_key([e.query for e in plan.validation]), min_coverage=s.min_coverage,
        # earlier versions stopped from look 2: in the key, a decision is never resumed under another rule
        futility_from_look=1 if s.futility else None,
        # None (absent) otherwise, so that designs recorded before extensions existed still match
        extension=len(plan.extension) if plan.extension else None,
        extension_questions=questions_key([e.query for e in plan.extension]) if plan.extension else None,
        # None (absent) with quality, so that designs recorded before objectives existed keep their key
        objective=None if plan.objective == QUALITY else plan.objective.name,
        margin=s.margin if plan.objective.non_inferiority else None,
    ).keyed()


def _open_decision(study: SearchStudy, *, plan: _Plan, settings: ValidationSettings,
                   ledger: DecisionLedger | None) -> _Opened:
    """Begin the decision in the study and the ledger, refused (:class:`ValidationReuse`) where its
    questions already decided a verdict under another design, or labelled re-decided with
    ``seen_validation = "label"``."""
    design = _design(settings, plan)
    asked_queries = [e.query for e in plan.validation] + [e.query for e in plan.extension]
    decision = _decision(study, design, asked_queries)
    reuse: ValidationReuse | None = None
    try:
        study.refuse_seen_validation(decision, design)
        earlier = ledger.begin(decision) if ledger is not None else None
        if earlier is not None:
            raise ValidationReuse(earlier, decision)
    except ValidationReuse as exc:
        if settings.seen_validation != "label":
            raise
        # Another decision than an unlabelled one of the same design (its own key), so that neither
        # can ever resume the other: a labelled verdict never becomes a claim.
        reuse, design = exc, replace(design, re_decided=True).keyed()
        decision = replace(_decision(study, design, asked_queries), re_decided=True)
        _label_warning(reuse)
        if ledger is not None:
            ledger.begin(decision)
    study.begin_validation(design, decision)
    return _Opened(design=design, decision=decision, reuse=reuse)


def _select(study: SearchStudy, scorer: CandidateScorer, plan: _Plan, *, settings: ValidationSettings,
            history: Sequence[CandidateRecord], rows: _Rows, collect: OnValidated,
            progress: bool) -> tuple[int, dict[str, list[float | None]]]:
    """1. Selection (:func:`opro.search.finalists.chosen_finalist`): the chosen finalist's index and each
    finalist's selection scores (none without selection questions)."""
    if not plan.selection:
        return chosen_finalist(plan.finalists, {}, initial=plan.initial,
                               n_confirmation=len(plan.confirmation), settings=settings, history=history), {}
    # Under cost the initial configuration answers them too: the choice pairs each finalist with it.
    prompts = plan.labels if plan.objective.non_inferiority else plan.labels[1:]
    for label, ins in prompts:
        rows.expect(label, ins)
    scores = score_on(study, scorer, prompts, plan.selection, on_validated=collect,
                      min_coverage=settings.min_coverage, progress=progress)
    return chosen_finalist(plan.finalists, scores, initial=plan.initial,
                           n_confirmation=len(plan.confirmation), settings=settings, history=history), scores


def _confirm(study: SearchStudy, scorer: CandidateScorer, plan: _Plan, *, chosen: int, settings: ValidationSettings,
             seed: int, rows: _Rows, collect: OnValidated, progress: bool) -> _Confirmation:
    """2. Confirmation: the chosen finalist and the initial instruction, batch by batch, a look after
    each (kept in the study), until a look decides."""
    pick_label, pick = plan.labels[1 + chosen]
    pairs = [("initial", plan.initial), (pick_label, pick)]
    scores: dict[str, list[float | None]] = {plan.initial: [], pick: []}
    costs: dict[str, list[float | None]] = {plan.initial: [], pick: []}
    # Non-inferiority tests H0: mean(finalist - initial) <= -margin on the differences shifted by
    # +margin. The betting test holds its error rate at every look whatever the differences' shape
    # (ties, rare large losses), since the judge's scale bounds them: measured over all looks in every
    # world of experiments/bench_selection.py --errors, not assumed.
    shift = plan.objective.shift(settings.margin)
    looks: list[Look] = []
    seen: list[int] = []
    start = unkept = 0
    answered: dict[str, Sequence[EvaluationRow]] = {}  # the batch's answers, for a side-by-side judge
    def keep(label: str, ins: str, got: Sequence[EvaluationRow]) -> None:
        answered[ins] = got
        collect(label, ins, got)
    for k, size in enumerate(plan.sizes, start=1):
        batch, start = plan.confirmation[start:size], size
        for label, ins in pairs:
            rows.expect(label, ins)
        batch_costs: dict[str, list[float | None]] = {}
        answered.clear()
        got = score_on(study, scorer, pairs, batch, on_validated=keep, min_coverage=settings.min_coverage,
                       progress=progress, costs=batch_costs)
        if scorer.paired is not None:  # the test reads one side-by-side call per question (opro/search/paired.py)
            got = side_by_side_scores(study, scorer, scorer.paired, first=pick, second=plan.initial, batch=batch,
                                      pointwise=got, rows=answered, progress=progress)
        for _, ins in pairs:
            costs[ins] += batch_costs.get(ins) or [None] * len(batch)
        unkept += sum(sum(x is None for x in got[ins]) for _, ins in pairs
                      if study.validation_scores(ins, [e.query for e in batch]) is None)
        for _, ins in pairs:
            scores[ins] += got[ins]
        diffs, keys = clusters.counted(scores[pick], scores[plan.initial], plan.keys)
        seen.append(len(diffs))
        look = decide([x + shift for x in diffs], seen=seen, n_max=len(plan.confirmation),
                      last=k == len(plan.sizes), earlier=looks, alpha=settings.alpha,
                      scale=(SCORE_MIN, SCORE_MAX), shift=shift, futility=settings.futility, seed=seed,
                      futility_confidence=settings.claim.futility_confidence,
                      clusters=keys if plan.clustered else None, planned_clusters=len(set(plan.keys)))
        looks.append(look)
        study.save_validation_look(look)
        logger.info("validation look %d/%d: %d pairs, mean difference %+.2f, p=%.3g: %s",
                    k, len(plan.sizes), look.n, look.mean_difference - shift, look.p_value, look.decision)
        if look.decision != "continue":
            break
    return _Confirmation(
        initial_scores=tuple(scores[plan.initial]), pick_scores=tuple(scores[pick]),
        initial_costs=tuple(costs[plan.initial]), pick_costs=tuple(costs[pick]), looks=tuple(looks), unkept=unkept,
    )


def _find(conf: _Confirmation, *, plan: _Plan, settings: ValidationSettings, reuse: ValidationReuse | None,
          unit: CostUnit, seed: int) -> _Finding:
    """The gain (or saving) the confirmation shows, and whether it is claimed."""
    s = settings
    asked = conf.asked
    covered = (sum(x is not None for x in conf.pick_scores) >= s.min_coverage * asked
               and sum(x is not None for x in conf.initial_scores) >= s.min_coverage * asked)
    diffs, keys = clusters.counted(conf.pick_scores, conf.initial_scores, plan.keys)
    # Under clusters every figure is of the cluster means (the estimand: each source passage once).
    units = clusters.cluster_means(diffs, keys).tolist() if plan.clustered else diffs
    planned = len(set(plan.keys))
    sizes = tuple(dict.fromkeys(n for n in clusters.looks_in_clusters(plan.sizes, plan.keys) if n))  # looks with a cluster
    tested = bool(covered and conf.final.decision == "success")  # what the test says
    trade = plan.objective.non_inferiority
    saving = cost_saving(conf.pick_costs, conf.initial_costs, unit=unit) if trade else None
    cheaper = saving is not None and saving.lower
    # A re-decided decision is an exploration: it claims nothing. A cost claim needs both halves.
    claimed = tested and reuse is None and (cheaper or not trade)
    raw = sum(units) / len(units) if units else None
    difference, difference_ci = raw, t_interval(units)
    if trade and diffs:
        # The interval of the test that decides: one-sided alpha on each side, so its lower end is above
        # -margin exactly where non-inferiority was shown (the same bets, tuned to the planned maximum).
        ci = betting.bound(units, scale=(SCORE_MIN, SCORE_MAX), alpha=2 * s.alpha, planned=planned)
        difference_ci = (ci.low, ci.high)
    if claimed and len(units) >= 2 and not trade:
        # Among claims the plain mean is inflated (a claim is made when the sample looked good):
        # report the gain adjusted for having been claimed, with its conditional interval.
        est = conditional_estimate(units, sizes=sizes, alpha=s.alpha, scale=(SCORE_MIN, SCORE_MAX),
                                   futility=s.futility, seed=seed)
        difference, difference_ci = est.gain, est.ci
    return _Finding(
        diffs=tuple(diffs), raw=raw, difference=difference,
        difference_ci=on_scale(difference_ci, SCORE_MIN - SCORE_MAX, SCORE_MAX - SCORE_MIN),
        tested=tested, claimed=claimed, saving=saving, cheaper=cheaper,
    )


def _records(plan: _Plan, *, chosen: int, conf: _Confirmation, finding: _Finding,
             selection_scores: Mapping[str, Sequence[float | None]]) -> tuple[FinalistRecord, ...]:
    """Every finalist's record: the chosen one with its confirmation, the others with their selection score."""
    records = []
    for k, f in enumerate(plan.finalists):
        if k == chosen:
            records.append(FinalistRecord(
                instruction=f.instruction, trial_number=f.trial_number, search_score=float(f.score or 0.0),
                validation_score=_mean(conf.pick_scores), validation_ci=_ci(conf.pick_scores),
                difference=finding.difference, difference_ci=finding.difference_ci, difference_raw=finding.raw,
                n_pairs=len(finding.diffs), p_value=conf.final.p_value, p_adjusted=conf.final.p_value,
                significant=finding.claimed, scores=conf.pick_scores,
                chosen=True, selection_score=_mean(selection_scores.get(f.instruction, [])),
            ))
        else:
            records.append(FinalistRecord(
                instruction=f.instruction, trial_number=f.trial_number, search_score=float(f.score or 0.0),
                validation_score=None, validation_ci=None, difference=None, difference_ci=None, n_pairs=0,
                p_value=math.nan, p_adjusted=math.nan, significant=False, scores=(),
                chosen=False, selection_score=_mean(selection_scores.get(f.instruction, [])),
            ))
    return tuple(records)


def _pooled(plan: _Plan, conf: _Confirmation) -> tuple[int, int]:  # (extension questions asked, the pool's)
    extended = max(0, conf.asked - (start := len(plan.confirmation) - len(plan.extension)))
    return extended, sum(e.query in plan.pool for e in plan.confirmation[start:conf.asked])


def _how(plan: _Plan, *, chosen: int, conf: _Confirmation) -> str:
    """Which finalist was tested, and at which look on how many questions (and which of them the pool gave)."""
    extended, pooled = _pooled(plan, conf)
    n_sel = len(plan.selection)
    return (f"finalist {chosen + 1} of {len(plan.finalists)}"
            + (f" (chosen on {n_sel} selection questions)" if n_sel else "")
            + f", look {conf.final.look} of {len(plan.sizes)}, {conf.final.n} paired questions"
            + (f" in {len(set(clusters.counted(conf.pick_scores, conf.initial_scores, plan.keys)[1]))} clusters "
               "sharing a source passage (each counted once)" if plan.clustered else "")
            + (f", {extended} of them from the extension" if extended else "")
            + (f" ({pooled} from the dataset's labelled pool)" if pooled else ""))


def _why(settings: ValidationSettings, *, conf: _Confirmation, finding: _Finding) -> str:
    """Why the sequential test decided as it did (quality objective)."""
    final, s = conf.final, settings
    if final.decision == "success":
        return (f"betting one-sided p={final.p_value:.3g} <= alpha {s.alpha:g}" if finding.tested  # (re-decided: not claimed)
                else f"only {len(finding.diffs)} of {conf.asked} questions scored validly (min_coverage {s.min_coverage:g})")
    return {"futility": "stopped for futility: it was not ahead",
            "end": f"betting one-sided p={final.p_value:.3g} > alpha {s.alpha:g}"}.get(final.decision, final.decision)


def _cost_texts(settings: ValidationSettings, *, conf: _Confirmation, finding: _Finding, cost: CostModel,
                why: str) -> tuple[str, str, str]:
    """(quality, saved, why) of a verdict under a non-inferiority objective (cost)."""
    s, final, saving = settings, conf.final, finding.saving
    unit = cost.short
    shown = "n/a" if finding.difference is None else f"{finding.difference:+.2f}"
    lo, hi = finding.difference_ci or (math.nan, math.nan)
    # The betting test's own interval (one-sided alpha each side): valid at every look whatever the shape.
    quality = f"quality {shown}" + (f" [{lo:+.2f}, {hi:+.2f}] ({1 - 2 * s.alpha:.0%} betting interval, "
                                    f"{len(finding.diffs)} pairs)" if finding.difference_ci else "")
    if saving is None:
        saved = "cost per answer not measured on these questions"
    elif saving.relative is None or saving.relative_ci is None:
        saved = f"cost per answer {saving.difference:+.3g} ({unit})"
    else:
        r_lo, r_hi = saving.relative_ci
        saved = f"{saving.relative:.0%} lower cost per answer ({unit}) [{r_lo:.0%}, {r_hi:.0%}]" + (
            f" ({saving.caveat})" if saving.caveat else "")
    why = {"futility": f"stopped for futility: clearly worse by more than {s.margin:g} (one-sided {1 - s.alpha:.0%} "
                       "upper bound below it)",
           "end": f"non-inferiority not shown: betting one-sided p={final.p_value:.3g} > alpha {s.alpha:g}",
           }.get(final.decision, why)
    if finding.tested and not finding.cheaper:
        why = "not worse by more than the margin, but its cost per answer was not lower on the same questions"
    return quality, saved, why


def _verdict(settings: ValidationSettings, *, plan: _Plan, chosen: int, conf: _Confirmation, finding: _Finding,
             reuse: ValidationReuse | None, cost: CostModel) -> str:
    """The validation's verdict, in words: what was claimed (or why not), on which questions."""
    s, final = settings, conf.final
    how, why = _how(plan, chosen=chosen, conf=conf), _why(s, conf=conf, finding=finding)
    d, raw = finding.difference, finding.raw
    lo, hi = finding.difference_ci or (math.nan, math.nan)
    shown = "n/a" if d is None else f"{d:+.2f}"
    trade = plan.objective.non_inferiority
    if trade:
        quality, saved, why = _cost_texts(s, conf=conf, finding=finding, cost=cost, why=why)
    if trade and finding.claimed:
        verdict = (f"{saved}; {quality}, not worse by more than {s.margin:g} (betting p = {final.p_value:.2g}): a cheaper "
                   f"finalist on validation questions that did not choose it ({how})")
    elif trade and reuse is None:
        verdict = (f"no finalist was shown cheaper and not worse than the initial configuration by more than "
                   f"{s.margin:g} ({how}: {saved}; {quality}; {why}): the initial configuration is returned and no "
                   "saving is claimed")
    elif finding.claimed:
        verdict = (f"a finalist beat the initial instruction on validation questions that did not choose it "
                   f"({how}; betting one-sided p={final.p_value:.3g} <= alpha {s.alpha:g}); its gain, adjusted "
                   f"for having been claimed: {d:+.2f} (95% CI {interval_text(lo, hi)}; unadjusted {raw:+.2f})")
    elif reuse is not None:
        verdict = (f"{RE_DECIDED}: {reuse.seen}; the initial instruction is returned and no gain is claimed; "
                   f"explored only ({how}): difference {shown}"
                   + (f" (95% CI {lo:+.2f} to {hi:+.2f})" if finding.difference_ci else "") + f", {why}")
    else:
        verdict = (f"no finalist beat the initial instruction ({how}: difference {shown}, {why}): the initial "
                   "instruction is returned and no gain is claimed")
    if conf.unkept:
        verdict += (f"; {conf.unkept} confirmation question(s) got unreadable judge replies or failed calls and are "
                    "asked again by the next run: fix the judge or the endpoint and rerun to decide on them")
    return verdict


def _settle(study: SearchStudy, ledger: DecisionLedger | None, *, opened: _Opened, conf: _Confirmation,
            plan: _Plan, settings: ValidationSettings, validated: bool) -> None:
    """The decision's verdict, recorded in the study and the ledger."""
    final = conf.final
    outcome = f"{RE_DECIDED}, not validated" if opened.reuse is not None else "validated" if validated else "no gain"
    settled = replace(opened.decision, verdict=(
        f"{outcome}: {final.decision} at look {final.look} of "
        f"{len(plan.sizes)}, {final.n} paired questions, p={final.p_value:.3g}, alpha {settings.alpha:g}"
        + (f"; {conf.unkept} question(s) unscored, asked again by the next run" if conf.unkept else "")))
    study.settle_validation(settled)
    if ledger is not None:
        ledger.settle(settled)


def validate(
    *,
    study: SearchStudy,
    scorer: CandidateScorer,
    settings: ValidationSettings,
    validation_set: Sequence[QAExample],
    history: Sequence[CandidateRecord],
    initial: str,
    extension_set: Sequence[QAExample] = (),
    pooled: int = 0,
    seed: int = 0,
    on_validated: OnValidated = lambda label, instruction, rows: None,
    on_batch: OnValidated = lambda label, instruction, rows: None,
    ledger: DecisionLedger | None = None,
    progress: bool = True,
) -> ValidationResult:
    """Choose a finalist on the selection questions, then test it against the initial instruction
    on the confirmation questions, look by look, the last look on up to ``validation_extension`` of
    ``extension_set`` (in no split; the last ``pooled`` the dataset's pool's) when the earlier ones did not
    decide (see the module docstring). ``ledger``: the user's decision ledger, checked and written with the study.

    Every prompt is named by its candidate name (:attr:`CandidateRecord.name`: the instruction, with its
    settings where they differ from the initial configuration's), which the scorer resolves to its
    configuration: the stage keys scores, finalists and its design by it."""
    s = settings
    history = [replace(r, instruction=r.name) for r in history]  # named as the stage keys them
    _, n_conf = split_sizes(s, len(validation_set), s.finalists)  # the planned pairs, to rank by cost
    finalists = choose_finalists(history, initial=initial, settings=s,
                                 n_confirmation=n_conf + min(len(extension_set), s.validation_extension))
    if not finalists:
        return _nothing_to_validate(s)
    plan = _plan(s, initial=initial, finalists=finalists, validation_set=validation_set, extension_set=extension_set, pooled=pooled)
    opened = _open_decision(study, plan=plan, settings=s, ledger=ledger)
    rows = _Rows()

    def collect(label: str, instruction: str, got: Sequence[EvaluationRow]) -> None:
        rows.add(label, instruction, got)
        on_batch(label, instruction, got)

    chosen, selection_scores = _select(study, scorer, plan, settings=s, history=history, rows=rows, collect=collect,
                                       progress=progress)
    conf = _confirm(study, scorer, plan, chosen=chosen, settings=s, seed=seed, rows=rows, collect=collect,
                    progress=progress)
    rows.finish(on_validated)
    finding = _find(conf, plan=plan, settings=s, reuse=opened.reuse, unit=scorer.cost.unit, seed=seed)
    records = _records(plan, chosen=chosen, conf=conf, finding=finding, selection_scores=selection_scores)
    winner = records[chosen] if records[chosen].significant else None
    verdict = _verdict(s, plan=plan, chosen=chosen, conf=conf, finding=finding, reuse=opened.reuse, cost=scorer.cost)
    logger.info("validation: %s", verdict)
    _settle(study, ledger, opened=opened, conf=conf, plan=plan, settings=s, validated=winner is not None)
    return ValidationResult(
        n_questions=len(plan.selection) + conf.asked,
        alpha=s.alpha,
        initial_score=_mean(conf.initial_scores),
        initial_ci=_ci(conf.initial_scores),
        initial_scores=conf.initial_scores,
        finalists=records,
        winner=winner,
        verdict=verdict,
        looks=conf.looks,
        design=opened.design,
        selection_questions=len(plan.selection),
        re_decided=opened.reuse is not None,
        objective=s.objective,
        margin=s.margin if plan.objective.non_inferiority else None,
        saving=finding.saving,
        pool_questions=_pooled(plan, conf)[1],
    )


__all__ = ["refuse_seen", "score_on", "validate", "validation_prompts"]
