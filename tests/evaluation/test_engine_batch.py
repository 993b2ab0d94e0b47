"""The serial engine's batch path: a backend that decodes several calls at once gets a question's
candidates in one ``generate_many``, with the rows a one-at-a-time run gives, each call cached."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fakes import Ex

from opro.errors import LLMError
from opro.evaluation.engine import EvaluationEngine, Pair, Scored
from opro.judges import CorrectnessJudge
from opro.llm import ChatClient, Completion, GenerationOptions, Message
from opro.llm.cache import CallCache
from opro.llm.scripted import ScriptedLLM
from opro.program.prompts import QATemplate
from opro.program.rag import RAGProgram
from opro.program.retrieval import RetrievedContext


class OneChunk:
    def retrieve(self, query: str) -> list[RetrievedContext]:
        return [RetrievedContext(text=f"context of {query}", score=1.0)]

    def describe(self) -> dict[str, str]:
        return {"kind": "one chunk"}


def _reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return "answer " + str(len(messages[-1].content))


class BatchingLLM(ScriptedLLM):
    """A scripted model that says it decodes in batches, and records the batches it gets."""

    supports_batch = True
    max_concurrency = 1

    def __init__(self, width: int) -> None:
        super().__init__(default=_reply, model="batching")
        self.batch_width = width
        self.batches: list[int] = []

    def generate_many(
        self, calls: Sequence[tuple[tuple[Message, ...], GenerationOptions]]
    ) -> list[Completion | LLMError]:
        self.batches.append(len(calls))
        return super().generate_many(calls)


def _run(width: int, cache: CallCache) -> tuple[list[tuple[int, int, str, float | None]], BatchingLLM, ChatClient]:
    task_llm = BatchingLLM(width)
    task = ChatClient(task_llm, role="task", cache=cache)
    judge_llm = ScriptedLLM(default='{"score": 4, "reasoning": "fine"}', model="judge")
    judge_llm.max_concurrency = 1
    program = RAGProgram(retriever=OneChunk(), llm=task)  # type: ignore[arg-type]
    judge = CorrectnessJudge(ChatClient(judge_llm, role="judge", cache=cache))
    templates = [QATemplate(f"Instruction number {k}.", position="after") for k in range(3)]
    examples = [Ex(f"question {i}?", f"reference {i}") for i in range(4)]
    pairs = [Pair(key=k, index=i, template=t, example=ex) for i, ex in enumerate(examples) for k, t in enumerate(templates)]
    rows: list[tuple[int, int, str, float | None]] = []

    def on_scored(s: Scored) -> None:
        rows.append((int(s.pair.key), s.pair.index, s.row.answer, s.score))  # type: ignore[call-overload]

    # Candidate 2 is dropped from question 2 on: its pairs are never asked.
    def gate(p: Pair) -> str:
        return "drop" if p.key == 2 and p.index >= 2 else "run"

    with EvaluationEngine(program=program, judge=judge) as engine:
        assert engine.serial and engine.batch_width == (width if width > 1 else 1)
        engine.run(pairs, on_scored=on_scored, gate=gate)  # type: ignore[arg-type]
    return rows, task_llm, task


def test_batched_engine_gives_the_serial_rows_and_caches_every_call(tmp_path: Path) -> None:
    serial, serial_llm, _ = _run(1, CallCache(tmp_path / "serial.sqlite"))
    cache = CallCache(tmp_path / "batched.sqlite")
    batched, batched_llm, task = _run(4, cache)
    cache.close()  # a finished run has committed its calls (the writer thread may lag on a busy machine)
    assert batched == serial and len(serial) == 3 * 2 + 2 * 2
    assert serial_llm.batches == []  # width 1: one call at a time, no batch API
    # One batch per question, each holding that question's live candidates.
    assert batched_llm.batches == [3, 3, 2, 2]
    assert task.usage.snapshot()["task"].calls == 10
    # A warm rerun asks nothing: every call of a batch was cached on its own.
    again, again_llm, again_task = _run(4, CallCache(tmp_path / "batched.sqlite"))
    assert again == batched and again_llm.batches == []
    assert again_task.usage.snapshot()["task"].calls == 0 and again_task.usage.snapshot()["task"].cache_hits == 10


def test_batches_never_exceed_the_width(tmp_path: Path) -> None:
    _, llm, _ = _run(2, CallCache(tmp_path / "w2.sqlite"))
    assert llm.batches == [2, 2, 2, 2]  # 3 candidates: a batch of 2 and one call (no batch API)


def test_the_same_call_twice_in_a_batch_is_decoded_once(tmp_path: Path) -> None:
    """Two compared prompts with the same text send the same calls: one decode, the copy answered from
    it (and counted as a cache hit), so they cannot get different answers from batch numerics."""
    llm = BatchingLLM(4)
    client = ChatClient(llm, role="task", cache=CallCache(tmp_path / "calls.sqlite"))
    same = ([Message("user", "What is 2 + 2?")], {"max_tokens": 8})
    other = ([Message("user", "What is 3 + 3?")], {"max_tokens": 8})
    got = client.complete_many([same, other, same])
    assert llm.batches == [2]
    assert [c.text for c in got] == [got[0].text, got[1].text, got[0].text]  # type: ignore[union-attr]
    assert client.usage.as_dict()["task"]["calls"] == 2
    assert client.usage.as_dict()["task"]["cache_hits"] == 1
