"""Paired scores for the validation stage's decision from the side-by-side judge (``[judge].paired``).

The stage scores both prompts of a confirmation batch pointwise as always (their rows, recorders and
stored scores are unchanged); with a side-by-side judge (:mod:`opro.judges.sidebyside`) the scores its
test reads are then that judge's, one call per question seeing both prompts' answers. They are kept
in the study beside the pointwise ones, so a rerun asks nothing; a rerun that found the batch scored
(no answers in hand) answers it again through the call cache (no task or judge call when warm).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opro.evaluation.batch import QAExample
from opro.evaluation.engine import Scored
from opro.evaluation.rows import EvaluationRow
from opro.judges.sidebyside import SideBySideJudge
from opro.search.scoring import CandidateScorer
from opro.search.study import SearchStudy

_KEY = "side by side\x1f"


def _key(first: str, second: str, which: int) -> str:
    # stored as a prompt's validation scores under a name no instruction can have (it holds \x1f)
    return f"{_KEY}{which}\x1f{first}\x1f{second}"


def _answers(scorer: CandidateScorer, names: Sequence[str], batch: Sequence[QAExample],
             progress: bool) -> dict[str, Sequence[EvaluationRow]]:
    out: dict[str, Sequence[EvaluationRow]] = {}

    def done(k: int, scored: list[Scored]) -> None:
        out[names[k]] = [s.row for s in scored]

    scorer.score_prompts([(n, n) for n in names], batch, on_done=done, progress=progress)
    return out


def side_by_side_scores(
    study: SearchStudy,
    scorer: CandidateScorer,
    judge: SideBySideJudge,
    *,
    first: str,
    second: str,
    batch: Sequence[QAExample],
    pointwise: Mapping[str, Sequence[float | None]],
    rows: Mapping[str, Sequence[EvaluationRow]],
    progress: bool = True,
) -> dict[str, list[float | None]]:
    """``first``'s and ``second``'s side-by-side scores on ``batch`` (by prompt name), from the study
    when kept, else judged from ``rows`` (each prompt's answers, in question order; answered again
    through the cache when absent). A question whose pointwise score is missing (a failed call) or
    whose side-by-side reply is unreadable is None for both, as an unscored pair; identical answers
    get the mean of their pointwise scores (difference 0). Kept only when every question was read."""
    queries = [e.query for e in batch]
    stored = [study.validation_scores(_key(first, second, w), queries) for w in (0, 1)]
    if stored[0] is not None and stored[1] is not None:
        return {first: stored[0], second: stored[1]}
    if first not in rows or second not in rows:
        rows = {**rows, **_answers(scorer, [n for n in (first, second) if n not in rows], batch, progress)}
    one, two = rows[first], rows[second]
    asked = [i for i in range(len(batch)) if pointwise[first][i] is not None and pointwise[second][i] is not None]
    verdicts = judge.judge_many([{"query": one[i].query, "reference": one[i].reference, "first": one[i].answer,
                                  "second": two[i].answer, "tie": (pointwise[first][i] + pointwise[second][i]) / 2}  # type: ignore[operator]
                                 for i in asked])
    got = {i: v.scores for i, v in zip(asked, verdicts, strict=True) if v.scores is not None}
    out: dict[str, list[float | None]] = {name: [got[i][w] if i in got else None for i in range(len(batch))]
                                          for w, name in enumerate((first, second))}
    complete = len(got) == len(batch)
    if complete:
        for w, name in enumerate((first, second)):
            study.save_validation_scores(_key(first, second, w), queries, out[name])
    return out


__all__ = ["side_by_side_scores"]
