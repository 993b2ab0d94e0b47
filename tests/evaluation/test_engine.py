"""The streaming evaluation engine on the network path: per-role limits as the endpoint sees them,
answers and judgments pipelined, gates that hold and drop queued pairs, permanent errors stop it."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from fakes import Ex
from fault_server import FaultServer

from opro.errors import LLMAuthError
from opro.evaluation.batch import evaluate_templates
from opro.evaluation.engine import EvaluationEngine, Gate, Pair, Scored
from opro.judges import CorrectnessJudge
from opro.llm import ChatClient, Completion
from opro.llm.openai import OpenAILLM

KEY = "sk-engine-test-0123456789abcdef"


class ContextProgram:
    """Answers through a real ChatClient; the prompt mentions the context, so the fake judge gives 5."""

    def __init__(self, llm: ChatClient) -> None:
        self.llm = llm

    def answer(self, query: str, *, template: str) -> Completion:
        return self.llm.complete(f"{template} Use the context.\n---------------------\nQuery: {query}")


def _client(server: FaultServer, role: str, limit: int, monkeypatch: pytest.MonkeyPatch) -> ChatClient:
    monkeypatch.setenv("OPRO_ENGINE_KEY", KEY)
    llm = OpenAILLM(model=f"{role}-model", base_url=server.base_url, api_key_env="OPRO_ENGINE_KEY",
                    max_concurrency=limit, max_retries=0, timeout_s=10)
    return ChatClient(llm, role=role)


def test_a_judge_limited_to_2_never_sees_more_than_2_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    with FaultServer(key=KEY, latency_s=0.05) as server:
        task = _client(server, "task", 8, monkeypatch)
        judge = CorrectnessJudge(_client(server, "judge", 2, monkeypatch))
        examples = [Ex(f"question {i}?", f"answer {i}") for i in range(12)]
        reports = evaluate_templates(program=ContextProgram(task), templates=["Answer.", "Reply."],  # type: ignore[list-item]
                                     examples=examples, judge=judge, workers=32, progress=False)
        # Other callers of the same backend (a second thread pool) are held to the limit too.
        threads = [threading.Thread(target=judge.llm.complete, args=(f"extra {i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [r.n_scored for r in reports] == [12, 12] and all(r.mean == 5.0 for r in reports)
    assert server.counts["judge"] == 24 + 8 and server.peak["judge"] == 2
    # The task endpoint was not throttled to the judge's pace: answers ran up to its own limit.
    assert 2 < server.peak["task"] <= 8


class _Echo:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.lock = threading.Lock()

    def answer(self, query: str, *, template: str) -> Completion:
        with self.lock:
            self.asked.append(f"{template}|{query}")
        return Completion(text=f"{template}: {query}", model="echo")


class _Judge:
    def measure(self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()) -> object:
        if answer.startswith("bad-key"):
            raise LLMAuthError("invalid api key", model="judge")
        return type("V", (), {"score": 3.0, "invalid": False})()


@pytest.mark.parametrize("slots", [1, 4])
def test_held_pairs_wait_and_dropped_pairs_are_never_asked(slots: int) -> None:
    program = _Echo()
    pairs = [Pair(key=k, index=i, template=k, example=Ex(f"q{i}", "r")) for i in range(4) for k in ("a", "b")]
    seen: list[tuple[str, int]] = []

    def gate(pair: Pair) -> Gate:
        if pair.key == "b" and pair.index >= 2:
            return "drop"
        # "a" asks question i only once question i-1 is scored.
        return "hold" if pair.key == "a" and pair.index > 0 and ("a", pair.index - 1) not in seen else "run"

    def on_scored(s: Scored) -> None:
        seen.append((str(s.pair.key), s.pair.index))
        assert s.score == 3.0

    with EvaluationEngine(program=program, judge=_Judge(), task_slots=slots, judge_slots=slots) as engine:
        engine.run(pairs, on_scored=on_scored, gate=gate)
    assert sorted(seen) == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 1)]
    assert [i for k, i in seen if k == "a"] == [0, 1, 2, 3]
    assert sorted(program.asked) == sorted(f"{k}|q{i}" for k, i in seen)


def test_spare_pairs_use_idle_task_slots_and_their_judgments_wait_for_the_gate() -> None:
    """Lookahead: a candidate's next question is answered while its previous one is being judged
    (on a task slot that would idle), judged only once the gate says "run", never when it drops."""
    import time

    events: list[tuple[str, str, int]] = []
    lock = threading.Lock()

    class Program:
        def answer(self, query: str, *, template: str) -> Completion:
            with lock:
                events.append(("ask", template, int(query[1:])))
            return Completion(text=f"{template}: {query}", model="echo")

    class SlowJudge:
        def measure(self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()) -> object:
            time.sleep(0.2 if answer.startswith("b") else 0.05)  # "b" is judged slowly: its spare gets asked
            with lock:
                events.append(("judge", answer.split(":")[0], int(query[1:])))
            return type("V", (), {"score": 3.0, "invalid": False})()

    scored: set[tuple[str, int]] = set()

    def gate(pair: Pair) -> Gate:
        key, i = str(pair.key), pair.index
        if key == "b" and ("b", 0) in scored:
            return "drop"  # "b" is pruned after its first question
        if i == 0 or (key, i - 1) in scored:
            return "run"
        return "spare" if i == 1 or (key, i - 2) in scored else "hold"

    def on_scored(s: Scored) -> None:
        with lock:
            events.append(("scored", str(s.pair.key), s.pair.index))
        scored.add((str(s.pair.key), s.pair.index))

    pairs = [Pair(key=k, index=i, template=k, example=Ex(f"q{i}", "r")) for k in ("a", "b") for i in range(5)]
    with EvaluationEngine(program=Program(), judge=SlowJudge(), task_slots=2, judge_slots=2) as engine:
        engine.run(pairs, on_scored=on_scored, gate=gate)
    at = {e: n for n, e in enumerate(events)}
    assert scored == {("a", 0), ("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 0)}
    # Answered ahead: question i+1 was asked before question i's judgment came back ...
    assert any(at[("ask", "a", i + 1)] < at[("judge", "a", i)] for i in range(4)), events
    # ... but judged only after question i was scored (the gate said "run").
    assert all(at[("judge", "a", i + 1)] > at[("scored", "a", i)] for i in range(4)), events
    # "b"'s answer given ahead of its drop is never judged.
    assert ("ask", "b", 1) in at and ("judge", "b", 1) not in at and ("ask", "b", 2) not in at


def test_a_permanent_error_stops_the_stream(tmp_path: Path) -> None:
    program = _Echo()
    pairs = [Pair(key="bad-key", index=i, template="bad-key", example=Ex(f"q{i}", "r")) for i in range(200)]
    with EvaluationEngine(program=program, judge=_Judge(), task_slots=4, judge_slots=2) as engine, \
            pytest.raises(LLMAuthError):
        engine.run(pairs, on_scored=lambda s: None)
    assert len(program.asked) < 200  # the queue behind the failure was never asked
