from __future__ import annotations

import csv
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import Ex

from opro.errors import ConfigError, LLMError, LLMServerError
from opro.evaluation.batch import EvaluationReport, EvaluationRow, evaluate_examples
from opro.judges import CorrectnessJudge, FaithfulnessJudge
from opro.judges.metrics import TokenF1, exact_match
from opro.llm import ChatClient, Completion
from opro.llm.scripted import ScriptedLLM


@dataclass(frozen=True)
class _Answer:
    query: str
    text: str
    contexts: tuple[str, ...]
    completion: Completion


class _Program:
    """A stand-in for opro.program.rag.RAGProgram: answers from a dict, fails on queries starting with 'fail'."""

    def __init__(self, answers: dict[str, str], *, concurrency: int = 4) -> None:
        backend = ScriptedLLM(default="unused")
        backend.max_concurrency = concurrency
        self.llm = ChatClient(backend, role="task")
        self.answers = answers
        self.templates: list[object] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def answer(self, query: str, *, template: object) -> _Answer:
        with self._lock:
            self.templates.append(template)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if query.startswith("fail"):
                raise LLMServerError("backend down", model="m", provider="p", status=503)
            text = self.answers[query]
            return _Answer(
                query,
                text,
                (f"context for {query}",),
                Completion(text, "m", prompt_tokens=10, completion_tokens=3),
            )
        finally:
            with self._lock:
                self.active -= 1


def _judge(rules: list[tuple[str, str]], *, concurrency: int = 4) -> CorrectnessJudge:
    llm = ScriptedLLM(rules=rules)
    llm.max_concurrency = concurrency
    return CorrectnessJudge(ChatClient(llm, role="judge"))


def test_scores_invalid_accounting_and_metrics(tmp_path: Path) -> None:
    examples = [Ex("q1", "Paris"), Ex("q2", "Rome"), Ex("q3", "Oslo")]
    program = _Program({"q1": "Paris", "q2": "Milan", "q3": "Oslo maybe"})
    judge = _judge(
        [
            (r"Generated Answer\s+Paris", '{"score": 5, "reasoning": "right"}'),
            (r"Generated Answer\s+Milan", '{"score": 2, "reasoning": "wrong"}'),
            (r"Generated Answer\s+Oslo", "I refuse to grade."),  # invalid
        ]
    )
    report = evaluate_examples(
        program=program,
        template="TEMPLATE",  # type: ignore[arg-type]
        examples=examples,
        judge=judge,
        extra_metrics=[TokenF1(), exact_match],
        progress=False,
    )
    assert program.templates == ["TEMPLATE"] * 3
    assert [r.query for r in report.rows] == ["q1", "q2", "q3"]
    assert (report.n, report.n_scored, report.n_invalid, report.n_errors) == (3, 2, 1, 0)
    assert report.mean == pytest.approx(3.5)  # invalid excluded, not counted as 0
    assert report.pass_rate == pytest.approx(0.5)
    q3 = report.rows[2]
    assert q3.invalid and q3.score is None and "no score" in (q3.invalid_reason or "")
    assert report.rows[0].metrics == {"token_f1": 1.0, "exact_match": 1.0}
    assert report.rows[1].metrics["token_f1"] == 0.0
    assert report.rows[0].contexts == ("context for q1",)
    assert report.rows[0].prompt_tokens == 10 and report.rows[0].completion_tokens == 3
    means = report.metric_means()
    assert means["exact_match"] == pytest.approx(1 / 3)
    assert "mean 3.500 over 2/3 scored" in report.summary() and "invalid 1" in report.summary()

    data = json.loads(report.to_json(tmp_path / "r.json").read_text())
    assert data["summary"]["n_invalid"] == 1 and data["rows"][2]["score"] is None
    with (report.to_csv(tmp_path / "r.csv")).open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0]["query"] == "q1" and rows[0]["metric_token_f1"] == "1.0"
    assert json.loads(rows[0]["contexts"]) == ["context for q1"]


def test_error_isolation_and_max_errors() -> None:
    examples = [Ex("q1", "Paris"), Ex("fail-1", "x"), Ex("q2", "Rome")]
    program = _Program({"q1": "Paris", "q2": "Rome"})
    judge = _judge([(r".", '{"score": 4, "reasoning": "ok"}')])
    report = evaluate_examples(program=program, template="T", examples=examples, judge=judge, progress=False)  # type: ignore[arg-type]
    assert (report.n, report.n_scored, report.n_errors) == (3, 2, 1)
    err = report.rows[1]
    assert err.error is not None and "LLMServerError" in err.error and err.score is None
    assert report.mean == 4.0

    many = [Ex(f"fail-{i}", "x") for i in range(5)] + [Ex("q1", "Paris")]
    with pytest.raises(LLMError, match="max_errors=2"):
        evaluate_examples(
            program=program, template="T", examples=many, judge=judge, max_errors=2, progress=False
        )  # type: ignore[arg-type]
    with pytest.raises(LLMError, match="all 2 examples failed"):
        evaluate_examples(program=program, template="T", examples=many[:2], judge=judge, progress=False)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        evaluate_examples(program=program, template="T", examples=many, judge=judge, max_errors=-1)  # type: ignore[arg-type]


def test_concurrency_capped_by_backend() -> None:
    examples = [Ex(f"q{i}", "a") for i in range(8)]
    answers = {f"q{i}": "a" for i in range(8)}
    serial = _Program(answers, concurrency=1)
    evaluate_examples(
        program=serial,
        template="T",
        examples=examples,
        judge=_judge([(".", "4")]),
        workers=8,
        progress=False,  # type: ignore[arg-type]
    )
    assert serial.max_active == 1


def test_extra_judge_metric_gets_contexts() -> None:
    program = _Program({"q1": "Paris"})
    faith_llm = ScriptedLLM(default='{"answer": "YES"}')
    report = evaluate_examples(
        program=program,
        template="T",  # type: ignore[arg-type]
        examples=[{"query": "q1", "reference_answer": "Paris"}],
        judge=_judge([(".", "5")]),
        extra_metrics=[FaithfulnessJudge(ChatClient(faith_llm, role="judge"))],
        progress=False,
    )
    assert report.rows[0].metrics == {"faithfulness": 1.0}
    assert "context for q1" in faith_llm.calls[0][0][-1].content


def test_empty_report() -> None:
    report = EvaluationReport(rows=())
    assert report.mean is None and report.pass_rate is None and report.n == 0
    assert "n/a" in report.summary()
    assert EvaluationRow(query="q", reference="r", error="x").scored is False
