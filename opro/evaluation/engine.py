"""The evaluation engine: every (prompt, question) pair of a stage streamed through one executor.

One path answers and judges for ``optimize``, ``compare`` and ``evaluate``: :func:`answer` asks the
RAG program, :func:`judge_answer` scores the answer with the judge and the extra metrics, and
:class:`EvaluationEngine` pipelines the two. A pair's judge call starts as soon as its answer
exists, while other pairs are still being answered; each stage runs at most as many pairs at once
as its role's backend allows (``[models.ROLE].max_concurrency``), and the backend's own semaphore
(:attr:`opro.llm.LLM.slots`) keeps any other caller from going past that limit.

The caller steers the stream with a *gate* (run, hold, drop or spare each queued pair: the
optimizer holds a candidate's later minibatches until its running mean is reported, answers the next
one as *spare* work, on task slots that would otherwise idle, with its judgments held until the
decision, and drops a pruned candidate's pairs), may hand it more pairs whenever a slot would idle
(``more``: the scale-out workers' next claim), and receives every result on the calling thread, so all
bookkeeping (Optuna, progress, counters) is single-threaded and results do not depend on which worker
finished first.

With one slot for both roles (an in-process llama.cpp model) the pairs run one after another in
the given order, answer then judge, exactly as a plain loop would: consecutive task calls keep
sharing their retrieved context as a KV prefix. When the task backend decodes several calls at once
(:attr:`opro.llm.LLM.supports_batch`, llama.cpp's ``batch_width``) and the program can answer a group
(``answer_group``), consecutive runnable pairs of the same question are answered in one batch, then
judged one by one in order: greedy answers (on short ones the text of one call at a time; long ones can
part from it, see ``experiments/bench_batch_text.py``), far fewer decode steps.
"""

from __future__ import annotations

import functools
import logging
import queue
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from opro.errors import ConfigError, DataError, LLMError
from opro.evaluation.rows import EvaluationRow, ExtraMetric
from opro.judges.metrics import MetricResult, as_metric, metric_name

logger = logging.getLogger(__name__)

Gate = Literal["run", "hold", "drop", "spare"]


@dataclass(frozen=True)
class Pair:
    """One question to answer under one template. ``key`` says whose it is (a candidate, a prompt)."""

    key: Hashable
    index: int
    template: Any
    example: Any


@dataclass(frozen=True)
class Scored:
    """A finished pair: its row, and the transient :class:`LLMError` when the row is an error row."""

    pair: Pair
    row: EvaluationRow
    error: LLMError | None = None

    @property
    def score(self) -> float | None:
        """The judge score, None when the judge reply was invalid or the pair failed."""
        return None if self.error is not None or self.row.invalid else self.row.score


@dataclass(frozen=True)
class Answered:
    """The task model's answer to one question, waiting for its judge."""

    query: str
    reference: str
    text: str
    contexts: tuple[str, ...]
    completion: Any


def _field(example: Any, *names: str) -> str:
    for name in names:
        value = example.get(name) if isinstance(example, Mapping) else getattr(example, name, None)
        if value is not None:
            return str(value)
    raise DataError(f"evaluation example {example!r:.120} has none of the fields {names}")


def _context_text(ctx: Any) -> str:
    return ctx if isinstance(ctx, str) else str(getattr(ctx, "text", ctx))


def _run_metric(
    metric: ExtraMetric, *, query: str, answer: str, reference: str, contexts: Sequence[str]
) -> MetricResult:
    result = as_metric(metric).measure(query=query, answer=answer, reference=reference, contexts=contexts)
    if not isinstance(result, MetricResult):
        raise ConfigError(
            f"extra metric {metric_name(metric)!r} returned {type(result).__name__}, not MetricResult"
        )
    return result


def answer(program: Any, template: Any, example: Any) -> Answered:
    """Ask ``program`` the example's question under ``template``. Raises :class:`LLMError`."""
    query = _field(example, "query")
    reference = _field(example, "reference_answer", "reference")
    return _answered(query, reference, program.answer(query, template=template))


def _answered(query: str, reference: str, result: Any) -> Answered:
    return Answered(
        query=query,
        reference=reference,
        text=str(result.text),
        contexts=tuple(_context_text(c) for c in getattr(result, "contexts", ())),
        completion=getattr(result, "completion", None),
    )


def judge_answer(judge: Any, metrics: Sequence[Any], answered: Answered) -> EvaluationRow:
    """Score an answer with the judge, then each extra metric. Raises :class:`LLMError`."""
    a = answered
    verdict = judge.measure(query=a.query, answer=a.text, reference=a.reference, contexts=a.contexts)
    scores = {
        metric_name(m): _run_metric(m, query=a.query, answer=a.text, reference=a.reference, contexts=a.contexts).score
        for m in metrics
    }
    completion = a.completion
    return EvaluationRow(
        query=a.query,
        reference=a.reference,
        answer=a.text,
        contexts=a.contexts,
        score=verdict.score,
        passing=getattr(verdict, "passing", None),
        invalid=bool(getattr(verdict, "invalid", False)),
        invalid_reason=getattr(verdict, "invalid_reason", None),
        feedback=str(getattr(verdict, "feedback", "") or ""),
        expected_score=getattr(verdict, "expected_score", None),
        metrics=scores,
        prompt_tokens=int(getattr(completion, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(completion, "completion_tokens", 0) or 0),
        latency_s=float(getattr(completion, "latency_s", 0.0) or 0.0),
        model=getattr(completion, "model", None) or None,
    )


def _error_scored(pair: Pair, exc: LLMError) -> Scored:
    example = pair.example
    query = _field(example, "query")
    reference = _field(example, "reference_answer", "reference")
    return Scored(pair, EvaluationRow(query=query, reference=reference, error=f"{type(exc).__name__}: {exc}"), exc)


def _guarded(pair: Pair, row: Callable[[], EvaluationRow]) -> Scored:
    """The pair's row, or its error row for a transient LLM error. Permanent ones are raised."""
    try:
        return Scored(pair, row())
    except LLMError as exc:
        if exc.permanent:
            raise  # a bad key or request fails every pair the same way: stop at the first
        return _error_scored(pair, exc)


def answer_then_judge(*, program: Any, judge: Any, pair: Pair, metrics: Sequence[Any] = ()) -> Scored:
    """One pair, answer then judge, in the calling thread. Permanent LLM errors are raised."""
    return _guarded(pair, lambda: judge_answer(judge, metrics, answer(program, pair.template, pair.example)))


def batch_limit(program: Any) -> int:
    """How many answers of one question ``program`` can have decoded together (1: one at a time)."""
    llm = getattr(getattr(program, "llm", None), "llm", None)
    width = getattr(llm, "batch_width", 1)
    if not getattr(llm, "supports_batch", False) or not hasattr(program, "answer_group"):
        return 1
    return width if isinstance(width, int) and width > 1 else 1


def role_limit(part: Any, default: int = 1) -> int:
    """The ``max_concurrency`` of the backend behind a program, judge or metric (``part.llm.llm``)."""
    limit = getattr(getattr(getattr(part, "llm", None), "llm", None), "max_concurrency", None)
    return limit if isinstance(limit, int) and limit > 0 else default


class EngineStalled(RuntimeError):
    """Every queued pair is held and nothing is running: the gate can never open (a caller's bug)."""


class EvaluationEngine:
    """Answers and judges pairs with ``task_slots`` answers and ``judge_slots`` judgments in flight.

    The worker threads live as long as the engine (:meth:`close`), across the steps of a search.
    """

    def __init__(
        self,
        *,
        program: Any,
        judge: Any,
        metrics: Sequence[Any] = (),
        task_slots: int | None = None,
        judge_slots: int | None = None,
        batch: bool = True,
    ) -> None:
        self.program = program
        self.judge = judge
        self.metrics = tuple(metrics)
        self.task_slots = max(1, task_slots if task_slots is not None else role_limit(program))
        self.judge_slots = max(1, judge_slots if judge_slots is not None else role_limit(judge))
        # batch=False: every answer decoded alone, so it cannot depend on what was decoded beside it.
        self.batch_width = batch_limit(program) if batch else 1
        self._pool: ThreadPoolExecutor | None = None
        # Until one judgment came back, answers wait for their judges instead of streaming on: a judge
        # that refuses every call (a bad key) then costs at most task_slots answers.
        self._judged = False

    @property
    def serial(self) -> bool:
        return self.task_slots == 1 and self.judge_slots == 1

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.task_slots + self.judge_slots, thread_name_prefix="opro-eval"
            )
        return self._pool

    def close(self) -> None:
        """Stop the workers; calls still running finish in the background, their results unused."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> EvaluationEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        pairs: Sequence[Pair],
        *,
        on_scored: Callable[[Scored], None],
        gate: Callable[[Pair], Gate] | None = None,
        more: Callable[[], Sequence[Pair]] | None = None,
    ) -> None:
        """Evaluate ``pairs`` (dispatched in the given order) and hand each result to ``on_scored``.

        ``gate`` is asked before a pair is dispatched, and again before a finished answer is judged
        ("drop" then saves the judge call). A "spare" pair is dispatched only to a task slot no "run"
        pair wants, and its answer is judged only once the gate says "run" (until then it is kept,
        as after "hold"). ``more`` is asked, on the calling thread, when a task slot
        would otherwise stay idle (every queued pair held or none left): the pairs it returns are
        queued; once it returns none it is not asked again. A permanent :class:`LLMError`, or an
        exception raised by ``on_scored``, ``gate`` or ``more``, stops the run at once: queued pairs
        are never asked.
        """
        if self.serial:
            self._run_serial(list(pairs), on_scored, gate, more)
        else:
            self._run_streaming(list(pairs), on_scored, gate, more)

    @staticmethod
    def _next(
        pending: list[Pair], gate: Callable[[Pair], Gate] | None, limit: int, *, same_as: Pair | None = None
    ) -> list[Pair]:
        """Take up to ``limit`` runnable pairs off ``pending`` (in order), dropping the dropped ones.
        With ``same_as``, only pairs of its question: the scan stops at the first pair of another
        question (that one is asked later, in order)."""
        if gate is None and same_as is None:
            head = pending[:limit]
            del pending[:limit]
            return head
        query = None if same_as is None else _field(same_as.example, "query")
        taken: list[Pair] = []
        kept: list[Pair] = []
        spare: list[Pair] = []
        for i, p in enumerate(pending):
            other = same_as is not None and (p.index != same_as.index or _field(p.example, "query") != query)
            if len(taken) >= limit or other:
                kept.extend(pending[i:])
                break
            decision = "run" if gate is None else gate(p)
            if decision == "run":
                taken.append(p)
            elif decision != "drop":
                kept.append(p)
                if decision == "spare":
                    spare.append(p)
        if spare and len(taken) < limit:
            use = {id(p) for p in spare[: limit - len(taken)]}
            taken.extend(p for p in spare if id(p) in use)
            kept = [p for p in kept if id(p) not in use]
        pending[:] = kept
        return taken

    def _run_serial(
        self,
        pending: list[Pair],
        on_scored: Callable[[Scored], None],
        gate: Callable[[Pair], Gate] | None,
        more: Callable[[], Sequence[Pair]] | None = None,
    ) -> None:
        while True:
            taken = self._next(pending, gate, 1)
            if not taken and more is not None:
                extra = list(more())
                if extra:
                    pending.extend(extra)
                    continue
                more = None
            if not taken:
                if pending:
                    raise EngineStalled(f"{len(pending)} pair(s) held with nothing running")
                return
            if self.batch_width > 1:
                taken += self._next(pending, gate, self.batch_width - 1, same_as=taken[0])
            if len(taken) > 1:
                self._answer_group_then_judge(taken, on_scored, gate)
                continue
            on_scored(answer_then_judge(program=self.program, judge=self.judge, pair=taken[0], metrics=self.metrics))

    def _answer_group_then_judge(
        self, taken: list[Pair], on_scored: Callable[[Scored], None], gate: Callable[[Pair], Gate] | None
    ) -> None:
        """Answer one question under several templates in one batch, then judge each answer in order."""
        first = taken[0].example
        query, reference = _field(first, "query"), _field(first, "reference_answer", "reference")
        results = self.program.answer_group(query, templates=[p.template for p in taken])
        for pair, result in zip(taken, results, strict=True):
            if isinstance(result, LLMError):
                if result.permanent:
                    raise result
                on_scored(_error_scored(pair, result))
                continue
            if gate is not None and gate(pair) == "drop":
                continue  # pruned while its batch was decoded: the judge call is saved
            answered = _answered(query, reference, result)
            on_scored(_guarded(pair, functools.partial(judge_answer, self.judge, self.metrics, answered)))

    def _run_streaming(
        self,
        pending: list[Pair],
        on_scored: Callable[[Scored], None],
        gate: Callable[[Pair], Gate] | None,
        more: Callable[[], Sequence[Pair]] | None = None,
    ) -> None:
        pool = self._executor()
        done: queue.SimpleQueue[tuple[str, Pair, Any]] = queue.SimpleQueue()
        program, judge, metrics = self.program, self.judge, self.metrics

        def ask(pair: Pair) -> None:
            try:
                done.put(("answer", pair, answer(program, pair.template, pair.example)))
            except BaseException as exc:  # handed to the coordinating thread
                done.put(("answer_error", pair, exc))

        def grade(pair: Pair, answered: Answered) -> None:
            try:
                done.put(("row", pair, judge_answer(judge, metrics, answered)))
            except BaseException as exc:  # handed to the coordinating thread
                done.put(("judge_error", pair, exc))

        asking = judging = 0
        to_judge: list[tuple[Pair, Answered]] = []
        parked: list[tuple[Pair, Answered]] = []  # answered ahead of a decision: judged once it allows
        while True:
            if parked:
                run, parked = _by_gate(parked, gate)
                to_judge.extend(run)
            # Judgments first: they finish pairs, which opens gates (running means, pruning).
            while to_judge and judging < self.judge_slots:
                p, a = to_judge.pop(0)
                pool.submit(grade, p, a)
                judging += 1
            room = self.task_slots - asking
            if not self._judged:
                room -= judging + len(to_judge)
            if room > 0 and pending:
                for p in self._next(pending, gate, room):
                    pool.submit(ask, p)
                    asking += 1
                    room -= 1
            if room > 0 and more is not None:
                extra = list(more())
                if extra:
                    pending.extend(extra)
                    continue  # dispatch them now
                more = None
            if not (asking or judging or to_judge):
                if pending or parked:
                    raise EngineStalled(f"{len(pending) + len(parked)} pair(s) held with nothing running")
                return
            kind, pair, payload = done.get()
            if kind == "answer":
                asking -= 1
                run, wait = _by_gate([(pair, payload)], gate)
                to_judge.extend(run)
                parked.extend(wait)
                continue
            if kind == "row":
                judging -= 1
                self._judged = True
                on_scored(Scored(pair, payload))
                continue
            if kind == "answer_error":
                asking -= 1
            else:
                judging -= 1
                self._judged = self._judged or (isinstance(payload, LLMError) and not payload.permanent)
            if isinstance(payload, LLMError) and not payload.permanent:
                on_scored(_error_scored(pair, payload))
                continue
            raise payload


def _by_gate(answered: Sequence[tuple[Pair, Answered]], gate: Callable[[Pair], Gate] | None,
             ) -> tuple[list[tuple[Pair, Answered]], list[tuple[Pair, Answered]]]:
    """Answered pairs by what their gate says now: (to judge, parked until it decides); dropped ones
    are left out (their judge call is saved)."""
    run: list[tuple[Pair, Answered]] = []
    parked: list[tuple[Pair, Answered]] = []
    for p, a in answered:
        decision = "run" if gate is None else gate(p)
        if decision == "run":
            run.append((p, a))
        elif decision != "drop":
            parked.append((p, a))
    return run, parked


__all__ = [
    "Answered",
    "EngineStalled",
    "EvaluationEngine",
    "Gate",
    "Pair",
    "Scored",
    "answer",
    "answer_then_judge",
    "batch_limit",
    "judge_answer",
    "role_limit",
]
