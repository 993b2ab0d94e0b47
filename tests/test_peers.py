"""opro against DSPy's optimizers on scripted models: the same budget stops every method, and the
winners are re-scored by opro's judge on held-out questions, not by the methods' own totals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes import qa_file, task_reply
from peers import BudgetedExperiment, PeerSettings, run_method, run_peers

from opro.config import config_from_dict
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM


def _judge(heldout: set[str]) -> Callable[[tuple[Message, ...], GenerationOptions], str]:
    def reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        text = messages[-1].content
        # Answers made under an instruction that mentions the context score 5, others 2; on the
        # held-out questions such answers score 3: a re-scored winner must show 3, not its search 5.
        good = "using the context" in text.lower()
        score = (3 if any(q in text for q in heldout) else 5) if good else 2
        reason = "the answer does not cite the context" if score < 4 else "fine"
        return json.dumps({"score": score, "reasoning": reason})

    return reply


def _proposer_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    instruction = f"Answer from the context, variant {(options.seed or 0) % 1000}."
    if options.json_schema:  # DSPy's JSONAdapter (GEPA's proposer): every asked field
        return json.dumps({name: instruction for name in json.loads(options.json_schema)["properties"]})
    # One reply every proposer can read: opro's <INS>, DSPy's chat-adapter fields (COPRO, MIPROv2, GEPA).
    return (
        f"<INS>{instruction}</INS>\n\n[[ ## proposed_prefix_for_output_field ## ]]\nAnswer:\n\n"
        f"[[ ## proposed_instruction ## ]]\n{instruction}\n\n[[ ## new_instruction ## ]]\n{instruction}\n\n"
        "[[ ## completed ## ]]"
    )


def _pool(heldout: set[str]) -> ModelPool:
    return ModelPool(
        scripted={
            "task": ScriptedLLM(default=task_reply, model="task"),
            "judge": ScriptedLLM(default=_judge(heldout), model="judge"),
            "optimizer": ScriptedLLM(default=_proposer_reply, model="optimizer"),
        }
    )


def _config(tmp_path: Path) -> dict:
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "alexnet.txt").write_text("AlexNet won the ImageNet challenge in 2012.\n")
    return {
        "experiment": {"name": "t", "output_dir": "out", "cache_path": "calls.sqlite"},
        "data": {
            "docs": ["docs"],
            "dataset": str(qa_file(tmp_path)),
            "query_field": "question",
            "answer_field": "answer",
            "split": {"exemplar": 3, "optimization": 3, "validation": 0, "heldout": 4, "seed": 1},
        },
        "rag": {"chunk_size": 64, "chunk_overlap": 0, "initial_instructions": ["Answer the question."]},
        "models": {
            "task": {"backend": "scripted", "model": "task"},
            "judge": {"backend": "scripted", "model": "judge"},
            "optimizer": {"backend": "scripted", "model": "optimizer"},
            "generator": {"backend": "scripted", "model": "optimizer"},
        },
        "optimizer": {"minibatch_size": 3, "finalists": 0, "exemplars": 2},
    }


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp_path = tmp_path_factory.mktemp("peers")
    cfg = config_from_dict(_config(tmp_path), base_dir=tmp_path, source="test.toml")
    heldout: set[str] = set()
    exp = BudgetedExperiment(cfg, pool=_pool(heldout), progress=False)
    heldout.update(e.query for e in exp.dataset.examples_in("heldout"))
    settings = PeerSettings(budget=40, copro_breadth=2, copro_depth=2, mipro_candidates=2, mipro_trials=3)
    report = run_peers(exp, settings=settings, out_dir=tmp_path / "peers")
    judge_calls = list(exp.pool.get(exp.spec("judge")).calls)  # type: ignore[attr-defined]
    exp.close()
    return report, settings, heldout, judge_calls


def test_every_method_stays_within_the_budget(peers: tuple) -> None:
    report, settings, _, _ = peers
    assert [r.method for r in report.results] == list(settings.methods)
    for r in report.results:
        assert 0 < r.calls_used <= settings.budget, r
        assert set(r.calls_by_role) <= {"task", "judge"}
    assert any(r.stopped == "budget" for r in report.results)



def test_winners_are_rescored_by_opros_judge_on_heldout_questions(peers: tuple) -> None:
    report, _, heldout, judge_calls = peers
    rows = {row["method"]: row for row in report.rows()}
    assert set(rows) == {"initial", "opro", "opro, failures", "COPRO", "MIPROv2", "GEPA"}
    assert rows["initial"]["heldout_mean"] == 2.0
    for label in ("opro", "opro, failures", "COPRO", "MIPROv2", "GEPA"):
        row = rows[label]
        assert "context" in row["instruction"].lower(), row  # every method found the better instruction
        # The method's own measurement (search split) says 5; opro's judge on held-out says 3.
        assert row["search_score"] == 5.0 and row["heldout_mean"] == 3.0, row
        assert row["difference"] == 1.0 and row["n_scored"] == len(heldout)
    # Each held-out question was judged for the initial instruction and the winners (distinct prompts).
    judged = [m for m, _ in judge_calls if any(q in m[-1].content for q in heldout)]
    assert len(judged) >= len(heldout) * 2
    assert report.comparison.split == "heldout" and set(report.comparison.questions) == heldout


def test_the_table_names_the_budget_and_every_row(peers: tuple) -> None:
    report, settings, _, _ = peers
    table = report.table()
    assert f"budget {settings.budget}" in table
    for label in ("initial", "opro, failures", "COPRO", "MIPROv2", "GEPA"):
        assert f"| {label} |" in table


@pytest.mark.parametrize("method", ["opro", "opro-failures", "copro", "miprov2", "gepa"])
def test_the_budget_stops_each_method_at_the_budget(tmp_path: Path, method: str) -> None:
    cfg = config_from_dict(_config(tmp_path), base_dir=tmp_path, source="test.toml")
    exp = BudgetedExperiment(cfg, pool=_pool(set()), progress=False)
    # 10 calls: the initial instruction on 3 questions (6 calls) and less than one more candidate.
    settings = PeerSettings(budget=10, methods=(method,))
    result = run_method(exp, method, settings=settings, out_dir=tmp_path / "peers")
    exp.close()
    assert result.stopped == "budget"
    assert result.calls_used == 10  # every allowed call was made; the refused one is not counted
    assert result.instruction  # a best-so-far is returned


def test_calls_answered_by_the_cache_are_charged_but_counted_apart(peers: tuple) -> None:
    report, _, _, _ = peers
    first, *later = report.results
    assert 0 < first.model_calls <= first.calls_used
    # Later methods score the same initial instruction on the same questions: cache hits, still charged.
    assert all(r.model_calls < r.calls_used for r in later)
