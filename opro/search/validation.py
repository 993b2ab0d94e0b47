"""The validation stage: the search's finalists against the initial instruction on questions the
search never saw, by paired one-sided tests with Holm's correction over the finalists."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from opro.config import OptimizerSection
from opro.engine import Scored
from opro.errors import LLMError
from opro.evaluation import QAExample
from opro.evaluation_types import EvaluationRow
from opro.search.metaprompt import normalize_instruction
from opro.search.results import CandidateRecord, FinalistRecord, ValidationResult
from opro.search.scoring import CandidateScorer
from opro.search.study import SearchStudy
from opro.stats import bootstrap_mean_ci, compare_paired, holm, paired_valid

logger = logging.getLogger(__name__)


def validation_prompts(initial: str, finalists: Sequence[str]) -> list[tuple[str, str]]:
    """(label, instruction) of a validation stage: ``initial``, then ``finalist 1``, ``finalist 2``..."""
    return [("initial", initial), *((f"finalist {i}", f) for i, f in enumerate(finalists, start=1))]


def score_on(
    study: SearchStudy,
    scorer: CandidateScorer,
    prompts: Sequence[tuple[str, str]],
    examples: Sequence[QAExample],
    *,
    on_validated: Callable[[str, str, Sequence[EvaluationRow]], None],
    progress: bool = True,
) -> dict[str, list[float | None]]:
    """Per-question validation scores of each (label, instruction), kept in the study so a rerun
    asks nothing. ``on_validated(label, instruction, rows)`` as soon as all of a prompt's questions
    are scored without an LLM error (a prompt with errors is asked again by a rerun); ``rows`` are
    its questions' answers and verdicts, in question order, for the recorders that keep them."""
    out: dict[str, list[float | None]] = {}
    todo: list[tuple[str, str]] = []
    for label, ins in prompts:
        stored = study.validation_scores(ins)
        if stored is not None and len(stored) == len(examples):
            out[ins] = stored
        else:
            todo.append((label, ins))

    def done(k: int, scored: list[Scored]) -> None:
        label, ins = todo[k]
        results = [scorer.outcome(s, ins) for s in scored]
        out[ins] = [None if isinstance(r, LLMError) else r for r in results]
        if not any(isinstance(r, LLMError) for r in results):  # a rerun retries the questions that failed
            study.save_validation_scores(ins, out[ins])
            on_validated(label, ins, tuple(s.row for s in scored))

    scorer.score_prompts(todo, examples, on_done=done, progress=progress)
    return out


def validate(
    *,
    study: SearchStudy,
    scorer: CandidateScorer,
    settings: OptimizerSection,
    validation_set: Sequence[QAExample],
    history: Sequence[CandidateRecord],
    initial: str,
    seed: int = 0,
    on_validated: Callable[[str, str, Sequence[EvaluationRow]], None] = lambda label, instruction, rows: None,
    progress: bool = True,
) -> ValidationResult:
    """The finalists (the best complete candidates besides the initial instruction) and the initial
    instruction on the same validation questions; a finalist wins only if it is better by a one-sided
    paired test, Holm-corrected over the finalists."""
    s = settings
    initial_key = normalize_instruction(initial)
    complete = [r for r in history if r.status == "complete" and r.score is not None]
    finalists = sorted(
        (r for r in complete if normalize_instruction(r.instruction) != initial_key),
        key=lambda r: (-(r.score or 0.0), r.step, r.index),
    )[: s.finalists]
    n = len(validation_set)
    scores = score_on(study, scorer, validation_prompts(initial, [f.instruction for f in finalists]),
                      validation_set, on_validated=on_validated, progress=progress)
    init_scores = scores[initial]
    init_valid = [x for x in init_scores if x is not None]

    def ci(values: Sequence[float]) -> tuple[float, float] | None:
        if not values:
            return None
        c = bootstrap_mean_ci(values, seed=seed)
        return (c.low, c.high)

    raw: list[tuple[CandidateRecord, list[float | None], Any]] = []
    for f in finalists:
        a, b = paired_valid(scores[f.instruction], init_scores)
        cmp = compare_paired(a, b, seed=seed, alpha=s.alpha) if a else None
        raw.append((f, scores[f.instruction], cmp))
    # One-sided: the question is only whether a finalist is *better* than the initial instruction.
    # Both nulls are symmetric, so the one-sided p-value is half the two-sided one in that direction.
    p_raw = [
        (max(c.wilcoxon.p_value, c.permutation.p_value) / 2 if c.difference.estimate > 0 else 1.0)
        if c is not None and c.n else 1.0
        for _, _, c in raw
    ]
    p_adj = holm(p_raw) if p_raw else []
    records = []
    for (f, f_scores, cmp), p, q in zip(raw, p_raw, p_adj, strict=True):
        valid = [x for x in f_scores if x is not None]
        covered = len(valid) >= s.min_coverage * n and len(init_valid) >= s.min_coverage * n
        diff = cmp.difference if cmp is not None else None
        records.append(
            FinalistRecord(
                instruction=f.instruction,
                trial_number=f.trial_number,
                search_score=float(f.score or 0.0),
                validation_score=sum(valid) / len(valid) if valid else None,
                validation_ci=ci(valid),
                difference=None if diff is None else diff.estimate,
                difference_ci=None if diff is None else (diff.low, diff.high),
                n_pairs=cmp.n if cmp is not None else 0,
                p_value=p,
                p_adjusted=q,
                significant=bool(covered and diff is not None and diff.estimate > 0 and q < s.alpha),
                scores=tuple(f_scores),
            )
        )
    winners = [r for r in records if r.significant]
    # Ties to the better search rank (the finalists' order), not to a trial number.
    winner = (
        max(winners, key=lambda r: (r.validation_score or 0.0, -records.index(r))) if winners else None
    )
    if not finalists:
        verdict = "no candidate besides the initial instruction completed the search: nothing to validate"
    elif winner is None:
        best = max(records, key=lambda r: r.difference if r.difference is not None else -math.inf)
        d = "n/a" if best.difference is None else f"{best.difference:+.2f}"
        verdict = (
            f"no finalist beat the initial instruction on {n} validation questions "
            f"(best difference {d}, one-sided Holm-adjusted p={best.p_adjusted:.3g} >= alpha {s.alpha:g} "
            f"over {len(records)} finalist(s)): the initial instruction is returned and no gain is claimed"
        )
    else:
        lo, hi = winner.difference_ci or (math.nan, math.nan)
        verdict = (
            f"a finalist beat the initial instruction on {n} validation questions by {winner.difference:+.2f} "
            f"(95% CI {lo:+.2f} to {hi:+.2f}, one-sided Holm-adjusted p={winner.p_adjusted:.3g} "
            f"over {len(records)} finalist(s), alpha {s.alpha:g})"
        )
    logger.info("validation: %s", verdict)
    return ValidationResult(
        n_questions=n,
        alpha=s.alpha,
        initial_score=sum(init_valid) / len(init_valid) if init_valid else None,
        initial_ci=ci(init_valid),
        initial_scores=tuple(init_scores),
        finalists=tuple(records),
        winner=winner,
        verdict=verdict,
    )


__all__ = ["score_on", "validate", "validation_prompts"]
