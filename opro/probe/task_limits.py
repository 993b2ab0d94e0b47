"""The task's limits on the pilot: the initial configuration's scores at the judge's ceiling and floor,
retrieval recall@k of the reference contexts (and the mean score where the passage was retrieved and
where not), and whether the task model follows a format instruction.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opro.probe.effects import Effect, num

if TYPE_CHECKING:
    from opro.data.dataset import Example
    from opro.experiment import Experiment


#: A score at or above this is at the ceiling of the 1-5 judge; at or below FLOOR, at its floor.
CEILING = 4.5
FLOOR = 1.5
#: The format instruction, appended to the initial one: does the answer length follow it?
FORMAT_INSTRUCTION = "Answer in one sentence."


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
        f = num
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


def task_limits(exp: Experiment, *, pilot: Sequence[Example], base: Effect, effects: Sequence[Effect]) -> TaskLimits:
    """The initial configuration's score distribution, retrieval recall@k and instruction following."""
    from opro.judges.withheld import NOT_IN_CONTEXT

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
    follows, following = follows_instruction(base, next(e for e in effects if e.dimension == "format"))
    return TaskLimits(
        mean=base.mean, n=len(valid),
        ceiling_share=sum(s >= CEILING for s in valid) / len(valid) if valid else None,
        floor_share=sum(s <= FLOOR for s in valid) / len(valid) if valid else None,
        recall=recall, recall_n=len(answerable), mean_retrieved=mean_hit, mean_missed=mean_miss,
        follows=follows, following=following,
    )


def follows_instruction(base: Effect, fmt: Effect) -> tuple[bool | None, str]:
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


__all__ = ["CEILING", "FLOOR", "FORMAT_INSTRUCTION", "TaskLimits", "follows_instruction", "task_limits"]
