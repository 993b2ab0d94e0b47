"""The scorer: candidate instructions answered by the RAG program and judged, through the engine.

:class:`CandidateScorer` holds what a score depends on (the program, the judge, the QA template a
candidate instruction is placed into) and the one long-lived :class:`~opro.evaluation.engine.EvaluationEngine`
of a search, so the search steps, the exemplar feedback, the proposers' feedback and the validation
stage all ask through the same slots, cache and error rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from opro.errors import LLMError
from opro.evaluation.batch import Judge, Program, QAExample
from opro.evaluation.engine import EvaluationEngine, Pair, Scored, answer_then_judge, role_limit
from opro.program.cost import CostModel
from opro.program.dimensions import Value, dimension
from opro.progress import progress_bar
from opro.search.exemplars import ExemplarOutcome
from opro.search.metaprompt import Exemplar

if TYPE_CHECKING:
    from opro.judges.sidebyside import SideBySideJudge
    from opro.search.space import SearchSpace

logger = logging.getLogger(__name__)

#: A question's outcome: its score, None (the judge's reply was invalid) or the call's error.
Outcome = float | LLMError | None


class Template(Protocol):
    """A QA template whose instruction the search varies (:class:`opro.program.prompts.QATemplate`)."""

    @property
    def template_text(self) -> str: ...

    def with_instruction(self, instruction: str) -> Template: ...


@dataclass(frozen=True)
class QuestionFeedback:
    """One question answered under an instruction and judged: what a reflective proposer reads."""

    query: str
    reference: str
    answer: str
    score: float | None
    reason: str


class CandidateScorer:
    """Scores candidate configurations. Settings (program, judge, template, slots, search space) here;
    questions in calls.

    A candidate is named by its configuration (:mod:`opro.program.configurations`): its instruction,
    and in braces the values of the open dimensions that differ from the initial configuration's, so
    the initial instruction with other settings is another candidate. :meth:`configure` records a
    candidate's instruction and values (the study's record of them) under its name; every other
    method takes the name, and a name never configured is an instruction under the initial
    configuration's values (the initial configuration, a search without ``[search.space]``).
    """

    def __init__(
        self, *, program: Program, judge: Judge, template: Template, task_slots: int = 1, judge_slots: int | None = None,
        space: SearchSpace | None = None, cost: CostModel | None = None, paired: SideBySideJudge | None = None,
    ) -> None:
        self.program = program
        #: The validation stage's side-by-side judge (``[judge].paired``); None: its pairs are scored pointwise.
        self.paired = paired
        #: What an answer costs (:mod:`opro.program.cost`): each candidate's mean is kept beside its score.
        self.cost = cost if cost is not None else CostModel()
        self.judge = judge
        self.prototype = template
        self.task_slots = max(1, task_slots)
        #: None: the judge backend's max_concurrency (what its endpoint accepts).
        self.judge_slots = None if judge_slots is None else max(1, judge_slots)
        self.space = space if space is not None and space.open else None
        #: Name -> (instruction, values of the open dimensions).
        self._configured: dict[str, tuple[str, dict[str, Value]]] = {}
        self._engine: EvaluationEngine | None = None

    def name(self, instruction: str, params: Mapping[str, Value]) -> str:
        """The name of the candidate with ``instruction`` and ``params`` (the instruction alone
        without a search space, or where the values are the initial configuration's)."""
        return instruction if self.space is None else self.space.name(instruction, params)

    def configure(self, instruction: str, params: Mapping[str, Value], *, name: str | None = None) -> str:
        """Record the candidate with ``instruction`` and the values ``params`` of the open dimensions
        under ``name`` (default: :meth:`name`); returns the name."""
        name = self.name(instruction, params) if name is None else name
        values = {k: dimension(k).coerce(v) for k, v in params.items()} if self.space is not None else {}
        self._configured[name] = (instruction, values)
        return name

    def _lookup(self, name: str) -> tuple[str, dict[str, Value]]:
        return self._configured.get(name, (name, {}))

    def instruction_of(self, name: str) -> str:
        """A candidate's instruction (a name never configured is an instruction)."""
        return self._lookup(name)[0]

    def params_of(self, name: str) -> dict[str, Value]:
        """A candidate's values of the open dimensions (the initial configuration's when not configured)."""
        if self.space is None:
            return {}
        return {**self.space.initial, **self._lookup(name)[1]}

    def template(self, name: str) -> Template:
        """The candidate's whole configuration: its instruction in the template, with its values."""
        base = self.prototype.with_instruction(self.instruction_of(name))
        if self.space is None:
            return base
        return self.space.configure(base, self.params_of(name))  # type: ignore[arg-type]

    def template_text(self, name: str) -> str:
        return self.template(name).template_text

    @property
    def engine(self) -> EvaluationEngine:
        """The search's long-lived engine (closed by :meth:`close`)."""
        if self._engine is None:
            slots = self.judge_slots if self.judge_slots is not None else role_limit(self.judge)
            self._engine = EvaluationEngine(
                program=self.program, judge=self.judge, task_slots=self.task_slots, judge_slots=slots
            )
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    @staticmethod
    def outcome(scored: Scored, instruction: str) -> Outcome:
        if scored.error is not None:
            logger.warning("candidate %r, question %r: %s", instruction[:60], scored.row.query[:60], scored.error)
            return scored.error
        return scored.score

    def _one(self, name: str, query: str, reference: str) -> Scored:
        pair = Pair(key="exemplar", index=0, template=self.template(name),
                    example={"query": query, "reference_answer": reference})
        return answer_then_judge(program=self.program, judge=self.judge, pair=pair)  # permanent errors raise

    def exemplar_outcome(self, name: str, exemplar: Exemplar) -> ExemplarOutcome:
        """An exemplar answered by the candidate ``name`` and judged, for the feedback-aware strategies."""
        scored = self._one(name, exemplar.query, exemplar.answer)
        row = scored.row
        if scored.error is not None:
            logger.warning("exemplar %r: %s", exemplar.query[:60], scored.error)
            return ExemplarOutcome(answer="", score=None, passing=None)
        if row.invalid:
            return ExemplarOutcome(answer=row.answer, score=None, passing=None)
        return ExemplarOutcome(answer=row.answer, score=row.score, passing=row.passing, reason=row.feedback)

    def feedback(self, name: str, examples: Sequence[QAExample]) -> list[QuestionFeedback]:
        """Each question answered by the candidate ``name`` and judged, with the judge's reason (the
        calls of a candidate the search scored come from the call cache)."""
        got: dict[int, Scored] = {}
        template = self.template(name)
        pairs = [Pair(key=0, index=i, template=template, example=ex) for i, ex in enumerate(examples)]
        self.engine.run(pairs, on_scored=lambda s: got.__setitem__(s.pair.index, s))
        out = []
        for i, ex in enumerate(examples):
            s = got[i]
            out.append(QuestionFeedback(
                query=ex.query, reference=str(ex.reference_answer or ""), answer=s.row.answer,
                score=None if s.error is not None or s.row.invalid else s.row.score,
                reason=str(s.error) if s.error is not None else s.row.feedback,
            ))
        return out

    def score_prompts(
        self,
        prompts: Sequence[tuple[str, str]],
        examples: Sequence[QAExample],
        *,
        on_done: Callable[[int, list[Scored]], None],
        progress: bool = True,
    ) -> None:
        """Every (label, candidate name) on every question; ``on_done(k, scored)`` as soon as prompt
        ``k``'s questions are all in, in question order (each with its row: answer, contexts, verdict)."""
        if not prompts:
            return
        engine = self.engine
        templates = [self.template(ins) for _, ins in prompts]
        if engine.serial:
            # Question-major, like the search: one question's prompts are answered in one batch.
            order = [(k, i) for i in range(len(examples)) for k in range(len(prompts))]
        else:
            # Prompt by prompt: the first prompts are done (and recorded, e.g. as MLflow traces)
            # while the later ones are still being asked.
            order = [(k, i) for k in range(len(prompts)) for i in range(len(examples))]
        pairs = [Pair(key=k, index=i, template=templates[k], example=examples[i]) for k, i in order]
        got: dict[tuple[int, int], Scored] = {}
        left = [len(examples)] * len(prompts)
        with progress_bar(
            f"validation: {len(prompts)} prompt(s) x {len(examples)} questions", total=len(pairs), enabled=progress
        ) as bar:

            def on_scored(scored: Scored) -> None:
                k = int(scored.pair.key)  # type: ignore[call-overload]
                got[(k, scored.pair.index)] = scored
                bar.advance()
                left[k] -= 1
                if not left[k]:
                    on_done(k, [got[(k, i)] for i in range(len(examples))])

            engine.run(pairs, on_scored=on_scored)


__all__ = ["CandidateScorer", "Outcome", "QuestionFeedback", "Template"]
