"""A tiny real optimization on the embedded models: 2 questions, 1 step, 2 candidates, 1 finalist
validated on 2 questions (runs in CI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opro.config import config_from_dict
from opro.experiment import Experiment

pytestmark = pytest.mark.embedded

QA = [
    ("What does the break statement do in a loop?", "It terminates the nearest enclosing for or while loop."),
    ("When is the else clause of a while loop executed?", "When the loop condition becomes false, unless the loop was left by break."),
    ("What does the continue statement do?", "It skips the rest of the loop body and continues with the next cycle of the loop."),
    ("Which statement specifies exception handlers for a group of statements?", "The try statement."),
    ("What does the pass statement do?", "Nothing; it is a null operation used where a statement is required."),
    ("What does the return statement leave?", "The current function call, with the expression list (or None) as return value."),
    ("What does the del statement do to a name?", "It removes the binding of that name from the local or global namespace."),
]


def test_tiny_real_optimization(tmp_path: Path, embedded_task_llm: object, embedded_strong_llm: object) -> None:
    # The fixtures make the test skip cleanly when the embedded models are not installed.
    data = tmp_path / "qa.jsonl"
    data.write_text("\n".join(json.dumps({"query": q, "reference_answer": a}) for q, a in QA))
    cfg = config_from_dict(
        {
            "experiment": {"name": "tiny", "output_dir": "out", "cache_path": "calls.sqlite", "progress": False},
            "data": {
                "docs": ["builtin:python-reference"],
                "dataset": str(data),
                "split": {"exemplar": 1, "optimization": 2, "validation": 2, "heldout": 2, "seed": 0},
            },
            "rag": {"chunk_size": 256, "chunk_overlap": 16, "top_k": 1, "answer_max_tokens": 48},
            "judge": {"max_tokens": 48},
            "optimizer": {"steps": 1, "candidates_per_step": 2, "exemplars": 1, "minibatch_size": 2, "max_tokens": 80,
                          "finalists": 1},
            "tracking": {"prompt_name": "tiny-qa"},
        },
        base_dir=tmp_path,
        source="tiny.toml",
    )
    exp = Experiment(cfg)
    result = exp.optimize()
    usage = exp.usage.snapshot()
    exp.close()

    assert [r.step for r in result.history].count(0) == 1
    assert 1 <= [r.step for r in result.history].count(1) <= 2
    for record in result.history:
        assert record.status in ("complete", "pruned")
        assert record.score is None or 1.0 <= record.score <= 5.0
    assert result.initial_score is not None
    # Two validation questions can never make a gain significant: the initial instruction is returned
    # (after the first question when the finalist is not ahead there: futility from the first look).
    assert result.score_basis == "validation" and result.validation is not None
    looks = result.validation.looks
    assert result.validation.n_questions == looks[-1].n in (1, 2) and not result.validated
    assert looks[-1].decision in ("futility", "end")
    assert result.best_instruction == result.initial_instruction
    assert usage["task"].calls >= 2 and usage["judge"].calls >= 2 and usage["optimizer"].calls >= 1
    assert (tmp_path / "out" / "score_trajectory.png").exists()
    assert (tmp_path / "out" / "mlflow.db").exists()

    # A rerun with the warm cache and the same study makes no LLM call at all.
    again = Experiment(cfg)
    rerun = again.optimize()
    assert again.usage.total_calls() == 0
    again.close()
    assert rerun.best_instruction == result.best_instruction
