"""The validation stage: is the search's best finalist really better than the initial instruction?

On questions the search never saw, in two parts that never share a question:

1. **Selection** (with more than one finalist): the finalists answer the first
   ``selection_questions`` validation questions; the one with the best mean over its search
   questions and these is *chosen*. These questions only choose; they test nothing.
2. **Confirmation**: the chosen finalist and the initial instruction answer the other validation
   questions in ``validation_looks`` batches, and after each batch a group-sequential one-sided
   sign-flip test (:mod:`opro.sequential`) decides: success, futility, or the next batch. One
   hypothesis is tested, so no multiplicity correction is needed, and a clear effect stops early.
   When the split's looks did not decide, one more look asks up to ``validation_extension``
   questions that are in no split (never held-out): planned with the other looks before the first
   one, so the error rate holds, and asked only where the finalist is still ahead (futility stops the
   rest), which is where more questions change the decision.

The reported gain, its interval and the returned score come from the confirmation questions only:
questions that did not choose the finalist among the others (no winner's curse from the selection).
A claimed gain is also adjusted for having been claimed (a claim is made when the sample looked
good): :func:`opro.sequential.conditional_estimate`.

Every look is recorded in the study with the design it was made under; the same questions cannot
decide again under another design (:meth:`SearchStudy.begin_validation`), so a rerun cannot shop for
the alpha, finalists or steps that happen to claim a gain.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from opro.config import OptimizerSection
from opro.engine import Scored
from opro.errors import LLMError
from opro.evaluation import QAExample
from opro.evaluation_types import EvaluationRow
from opro.search.metaprompt import normalize_instruction
from opro.search.results import CandidateRecord, FinalistRecord, ValidationResult
from opro.search.scoring import CandidateScorer
from opro.search.study import SearchStudy, questions_key, sha
from opro.sequential import Look, conditional_estimate, decide, look_sizes, t_interval
from opro.stats import paired_valid

logger = logging.getLogger(__name__)

OnValidated = Callable[[str, str, Sequence[EvaluationRow]], None]


def validation_prompts(initial: str, finalists: Sequence[str]) -> list[tuple[str, str]]:
    """(label, instruction) of a validation stage: ``initial``, then ``finalist 1``, ``finalist 2``..."""
    return [("initial", initial), *((f"finalist {i}", f) for i, f in enumerate(finalists, start=1))]


def split_sizes(settings: OptimizerSection, n_questions: int, n_finalists: int) -> tuple[int, int]:
    """(selection, confirmation) questions of a validation stage over ``n_questions`` with
    ``n_finalists`` finalists: selection only when there is a choice to make, and at least 2
    questions left to confirm on."""
    n_sel = min(settings.selection_questions, max(0, n_questions - 2)) if n_finalists > 1 else 0
    return n_sel, n_questions - n_sel


def confirmation_looks(settings: OptimizerSection, n_confirmation: int, n_extension: int = 0) -> tuple[int, ...]:
    """Paired questions seen at each look of a confirmation: ``validation_looks`` near-even batches
    of the ``n_confirmation`` questions of the validation split, then one look after up to
    ``n_extension`` more (``validation_extension`` caps them)."""
    if n_confirmation < 1:
        return ()
    sizes = look_sizes(n_confirmation, settings.validation_looks)
    extra = min(n_extension, settings.validation_extension)
    return (*sizes, n_confirmation + extra) if extra else sizes


def max_calls(settings: OptimizerSection, n_questions: int, n_extension: int = 0) -> int:
    """The most task + judge calls a validation stage over ``n_questions`` (and up to ``n_extension``
    extension questions) can make (every finalist on the selection questions, both prompts on every
    confirmation question): what a call budget keeps back for it."""
    if not settings.finalists or not n_questions:
        return 0
    n_sel, n_conf = split_sizes(settings, n_questions, settings.finalists)
    sizes = confirmation_looks(settings, n_conf, n_extension)
    return 2 * (settings.finalists * n_sel + 2 * (sizes[-1] if sizes else 0))


def score_on(
    study: SearchStudy,
    scorer: CandidateScorer,
    prompts: Sequence[tuple[str, str]],
    examples: Sequence[QAExample],
    *,
    on_validated: OnValidated,
    progress: bool = True,
) -> dict[str, list[float | None]]:
    """Per-question validation scores of each (label, instruction) on ``examples``, kept in the study
    (keyed by the prompt and the questions) so a rerun asks nothing. ``on_validated(label,
    instruction, rows)`` as soon as all of a prompt's questions are scored without an LLM error (a
    prompt with errors is asked again by a rerun); ``rows`` are its answers and verdicts, in order."""
    queries = [e.query for e in examples]
    out: dict[str, list[float | None]] = {}
    todo: list[tuple[str, str]] = []
    for label, ins in prompts:
        stored = study.validation_scores(ins, queries)
        if stored is not None and len(stored) == len(examples):
            out[ins] = stored
        else:
            todo.append((label, ins))

    def done(k: int, scored: list[Scored]) -> None:
        label, ins = todo[k]
        results = [scorer.outcome(s, ins) for s in scored]
        out[ins] = [None if isinstance(r, LLMError) else r for r in results]
        if not any(isinstance(r, LLMError) for r in results):  # a rerun retries the questions that failed
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


def _mean(values: Sequence[float | None]) -> float | None:
    valid = [x for x in values if x is not None]
    return sum(valid) / len(valid) if valid else None


def _ci(values: Sequence[float | None]) -> tuple[float, float] | None:
    return t_interval([x for x in values if x is not None])


def _interval(lo: float, hi: float) -> str:
    """A gain's interval in words; open below (``lo`` is ``-inf``) where the claim was too rare to
    simulate at lower gains (:func:`opro.sequential.conditional_estimate`)."""
    return f"below {hi:+.2f}" if lo == -math.inf else f"{lo:+.2f} to {hi:+.2f}"


def validate(
    *,
    study: SearchStudy,
    scorer: CandidateScorer,
    settings: OptimizerSection,
    validation_set: Sequence[QAExample],
    history: Sequence[CandidateRecord],
    initial: str,
    extension_set: Sequence[QAExample] = (),
    seed: int = 0,
    on_validated: OnValidated = lambda label, instruction, rows: None,
    progress: bool = True,
) -> ValidationResult:
    """Choose a finalist on the selection questions, then test it against the initial instruction
    on the confirmation questions, look by look, the last look on up to ``validation_extension`` of
    ``extension_set`` (questions in no split) when the earlier ones did not decide (see the module
    docstring)."""
    s = settings
    initial_key = normalize_instruction(initial)
    complete = [r for r in history if r.status == "complete" and r.score is not None]
    finalists = sorted(
        (r for r in complete if normalize_instruction(r.instruction) != initial_key),
        key=lambda r: (-(r.score or 0.0), r.step, r.index),
    )[: s.finalists]
    n = len(validation_set)
    if not finalists:
        return ValidationResult(
            n_questions=0, alpha=s.alpha, initial_score=None, initial_ci=None, initial_scores=(), finalists=(),
            winner=None, verdict="no candidate besides the initial instruction completed the search: nothing to validate",
        )
    n_sel, _ = split_sizes(s, n, len(finalists))
    selection, confirmation = list(validation_set[:n_sel]), list(validation_set[n_sel:])
    sizes = confirmation_looks(s, len(confirmation), len(extension_set))
    extension = list(extension_set[: sizes[-1] - len(confirmation)])
    confirmation += extension
    labels = validation_prompts(initial, [f.instruction for f in finalists])
    design = {
        "alpha": s.alpha, "looks": len(sizes), "futility": s.futility, "selection_questions": n_sel,
        "finalists": [ins for label, ins in labels[1:]], "initial": initial, "n_questions": n,
        "procedure": "chosen finalist vs initial: group-sequential one-sided sign-flip test, "
                     "O'Brien-Fleming-type alpha spending, non-binding futility",
        "questions": questions_key([e.query for e in validation_set]),
    }
    if s.futility:  # earlier versions stopped from look 2: in the key, a decision is never resumed under another rule
        design["futility_from_look"] = 1
    if extension:  # absent otherwise, so that designs recorded before extensions existed still match
        design["extension"] = len(extension)
        design["extension_questions"] = questions_key([e.query for e in extension])
    design["key"] = sha(repr(sorted((k, repr(v)) for k, v in design.items())))
    study.begin_validation(design)
    rows = _Rows()

    def collect(label: str, instruction: str, got: Sequence[EvaluationRow]) -> None:
        rows.add(label, instruction, got)

    # 1. Selection: the finalists on the selection questions; pooled with their search questions.
    sel_scores: dict[str, list[float | None]] = {}
    chosen = 0
    if n_sel:
        for label, ins in labels[1:]:
            rows.expect(label, ins)
        sel_scores = score_on(study, scorer, labels[1:], selection, on_validated=collect, progress=progress)

        def pooled(k: int) -> tuple[float, int]:
            f = finalists[k]
            valid = [x for x in sel_scores[f.instruction] if x is not None]
            total = (f.score or 0.0) * f.n_scored + sum(valid)
            return (total / max(1, f.n_scored + len(valid)), -k)  # ties to the better search rank

        chosen = max(range(len(finalists)), key=pooled)
    pick = finalists[chosen]
    pick_label = labels[1 + chosen][0]

    # 2. Confirmation: the chosen finalist and the initial instruction, batch by batch, a look after each.
    pairs = [("initial", initial), (pick_label, pick.instruction)]
    init_scores: list[float | None] = []
    pick_scores: list[float | None] = []
    looks: list[Look] = []
    seen: list[int] = []
    start = 0
    for k, size in enumerate(sizes, start=1):
        batch = confirmation[start:size]
        start = size
        for label, ins in pairs:
            rows.expect(label, ins)
        got = score_on(study, scorer, pairs, batch, on_validated=collect, progress=progress)
        init_scores += got[initial]
        pick_scores += got[pick.instruction]
        a, b = paired_valid(pick_scores, init_scores)
        seen.append(len(a))
        look = decide([x - y for x, y in zip(a, b, strict=True)], seen=seen, n_max=len(confirmation),
                      last=k == len(sizes), earlier=[x.boundary for x in looks], alpha=s.alpha,
                      futility=s.futility, seed=seed)
        looks.append(look)
        study.save_validation_look(look.as_dict())
        logger.info("validation look %d/%d: %d pairs, mean difference %+.2f, p=%.3g: %s",
                    k, len(sizes), look.n, look.mean_difference, look.p_value, look.decision)
        if look.decision != "continue":
            break
    rows.finish(on_validated)
    final = looks[-1]
    asked = len(init_scores)
    covered = (sum(x is not None for x in pick_scores) >= s.min_coverage * asked
               and sum(x is not None for x in init_scores) >= s.min_coverage * asked)
    a, b = paired_valid(pick_scores, init_scores)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    claimed = bool(covered and final.decision == "success")
    raw = sum(diffs) / len(diffs) if diffs else None
    difference, difference_ci = raw, t_interval(diffs)
    if claimed and len(diffs) >= 2:
        # Among claims the plain mean is inflated (a claim is made when the sample looked good):
        # report the gain adjusted for having been claimed, with its conditional interval.
        est = conditional_estimate(diffs, sizes=sizes, alpha=s.alpha, futility=s.futility, seed=seed)
        difference, difference_ci = est.gain, est.ci
    records = []
    for k, f in enumerate(finalists):
        if k == chosen:
            records.append(FinalistRecord(
                instruction=f.instruction, trial_number=f.trial_number, search_score=float(f.score or 0.0),
                validation_score=_mean(pick_scores), validation_ci=_ci(pick_scores),
                difference=difference, difference_ci=difference_ci, difference_raw=raw,
                n_pairs=len(diffs), p_value=final.p_value, p_adjusted=final.p_value,
                significant=claimed, scores=tuple(pick_scores),
                chosen=True, selection_score=_mean(sel_scores.get(f.instruction, [])),
            ))
        else:
            records.append(FinalistRecord(
                instruction=f.instruction, trial_number=f.trial_number, search_score=float(f.score or 0.0),
                validation_score=None, validation_ci=None, difference=None, difference_ci=None, n_pairs=0,
                p_value=math.nan, p_adjusted=math.nan, significant=False, scores=(),
                chosen=False, selection_score=_mean(sel_scores.get(f.instruction, [])),
            ))
    winner = records[chosen] if records[chosen].significant else None
    used = n_sel + asked
    extended = max(0, asked - (len(confirmation) - len(extension)))
    how = (f"finalist {chosen + 1} of {len(finalists)}"
           + (f" (chosen on {n_sel} selection questions)" if n_sel else "")
           + f", look {final.look} of {len(sizes)}, {final.n} paired questions"
           + (f", {extended} of them from the extension" if extended else ""))
    d = records[chosen].difference
    lo, hi = records[chosen].difference_ci or (math.nan, math.nan)
    if winner is not None:
        verdict = (f"a finalist beat the initial instruction on validation questions that did not choose it "
                   f"({how}; sequential one-sided p={final.p_value:.3g} <= alpha {s.alpha:g}); its gain, adjusted "
                   f"for having been claimed: {d:+.2f} (95% CI {_interval(lo, hi)}; unadjusted {raw:+.2f})")
    else:
        why = {"futility": "stopped for futility: it was not ahead",
               "end": f"sequential one-sided p={final.p_value:.3g} > alpha {s.alpha:g}"}.get(final.decision, final.decision)
        if final.decision == "success":  # significant by the test, but too few questions scored validly
            why = f"only {len(diffs)} of {asked} questions scored validly (min_coverage {s.min_coverage:g})"
        shown = "n/a" if d is None else f"{d:+.2f}"
        verdict = (f"no finalist beat the initial instruction ({how}: difference {shown}, {why}): the initial "
                   "instruction is returned and no gain is claimed")
    logger.info("validation: %s", verdict)
    return ValidationResult(
        n_questions=used,
        alpha=s.alpha,
        initial_score=_mean(init_scores),
        initial_ci=_ci(init_scores),
        initial_scores=tuple(init_scores),
        finalists=tuple(records),
        winner=winner,
        verdict=verdict,
        looks=tuple(x.as_dict() for x in looks),
        design={k: v for k, v in design.items() if k not in ("finalists", "initial")},
        selection_questions=n_sel,
    )


__all__ = ["confirmation_looks", "max_calls", "score_on", "split_sizes", "validate", "validation_prompts"]
