"""Which exemplars the meta-prompt shows: drawn without replacement, and for "failures" what the best
instruction so far got wrong (its answer, the reference, the judge's reason), from the exemplar split only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opro.config import config_from_dict
from opro.experiment import Experiment
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM
from opro.search.exemplars import ExemplarOutcome, ExemplarPicker
from opro.search.metaprompt import Exemplar, MetaPromptBuilder, draw_exemplars

POOL = [Exemplar(f"Question {i}?", f"Reference {i}.") for i in range(6)]


def test_draws_are_without_replacement_across_steps_while_the_pool_lasts() -> None:
    shown = [e.query for step in (1, 2, 3) for e in draw_exemplars(POOL, k=2, step=step, seed=3)]
    assert sorted(shown) == sorted(e.query for e in POOL)  # three steps of two: the whole pool, once
    assert draw_exemplars(POOL, k=2, step=2, seed=3) == draw_exemplars(POOL, k=2, step=2, seed=3)
    later = draw_exemplars(POOL, k=4, step=2, seed=3)  # crosses into a new shuffle: still no repeat
    assert len({e.query for e in later}) == 4


def test_failures_show_the_wrong_answer_the_reference_and_the_reason() -> None:
    def scorer(instruction: str, ex: Exemplar) -> ExemplarOutcome:
        wrong = ex.query.endswith(("0?", "2?", "4?"))
        return ExemplarOutcome(
            answer=f"Model answer to {ex.query}", score=2.0 if wrong else 5.0, passing=not wrong,
            reason="It contradicts the reference.\nSecond line dropped." if wrong else "fine",
        )

    picked = ExemplarPicker(strategy="failures", k=6, seed=0).pick(POOL, step=1, best_instruction="Be brief.", scorer=scorer)
    failed = {e.query for e in picked if e.failed}
    assert failed == {"Question 0?", "Question 2?", "Question 4?"}
    text = MetaPromptBuilder(template_text="<INS>\n{context_str}\n{query_str}").render(history=[], exemplars=picked)
    assert "Answer given with the best instruction so far (wrong, judged 2 of 5): Model answer to Question 0?" in text
    assert "Why it is wrong: It contradicts the reference." in text and "Second line" not in text
    assert "Expected answer: Reference 0." in text
    assert "Model answer to Question 1?" not in text  # answered right: a plain exemplar


def test_hardest_shows_the_lowest_scored_exemplars() -> None:
    scores = {f"Question {i}?": float(s) for i, s in enumerate([5, 1, 4, 2, 5, 3])}

    def scorer(instruction: str, ex: Exemplar) -> ExemplarOutcome:
        return ExemplarOutcome(answer="a", score=scores[ex.query], passing=scores[ex.query] >= 4)

    picked = ExemplarPicker(strategy="hardest", k=2, seed=0).pick(POOL, step=1, best_instruction="x", scorer=scorer)
    assert [e.query for e in picked] == ["Question 1?", "Question 3?"]


def test_random_or_no_best_yet_never_scores() -> None:
    def scorer(instruction: str, ex: Exemplar) -> ExemplarOutcome:
        raise AssertionError("must not be called")

    assert len(ExemplarPicker(strategy="random", k=2).pick(POOL, step=1, best_instruction="x", scorer=scorer)) == 2
    assert len(ExemplarPicker(strategy="failures", k=2).pick(POOL, step=1, best_instruction=None, scorer=scorer)) == 2


def _config(tmp_path: Path) -> dict:
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "a.txt").write_text("AlexNet won the ImageNet challenge in 2012.\n")
    rows = [{"question": f"Fact number {i} about AlexNet?", "answer": f"Answer {i}."} for i in range(20)]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return {
        "experiment": {"name": "t", "output_dir": "out", "cache_path": "calls.sqlite"},
        "data": {
            "docs": ["docs"], "dataset": str(tmp_path / "qa.jsonl"), "query_field": "question", "answer_field": "answer",
            "split": {"exemplar": 4, "optimization": 3, "validation": 3, "heldout": 4, "seed": 1},
        },
        "rag": {"chunk_size": 64, "chunk_overlap": 0, "initial_instructions": ["Answer the question."]},
        "models": {role: {"backend": "scripted", "model": role} for role in ("task", "judge", "optimizer", "generator")},
        "optimizer": {"steps": 2, "candidates_per_step": 1, "minibatch_size": 3, "finalists": 0,
                      "exemplars": 2, "exemplar_strategy": "failures"},
    }


def test_the_optimizer_shows_failures_and_scores_exemplar_questions_only(tmp_path: Path) -> None:
    judged: list[str] = []

    def judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        judged.append(messages[-1].content)
        return json.dumps({"score": 2, "reasoning": "Misses the date."})

    def optimizer(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return f"<INS>Answer with the date, variant {options.seed}.</INS>"

    pool = ModelPool(scripted={
        "task": ScriptedLLM(default="Some answer.", model="task"),
        "judge": ScriptedLLM(default=judge, model="judge"),
        "optimizer": ScriptedLLM(default=optimizer, model="optimizer"),
        "generator": ScriptedLLM(default="unused", model="generator"),
    })
    cfg = config_from_dict(_config(tmp_path), base_dir=tmp_path, source="t.toml")
    exp = Experiment(cfg, pool=pool, progress=False)
    exp.optimize()
    ds = exp.dataset
    exp.close()
    meta = (tmp_path / "out" / "metaprompts" / "step_001.txt").read_text()
    assert meta.count("Answer given with the best instruction so far (wrong, judged 2 of 5): Some answer.") == 2
    assert "Why it is wrong: Misses the date." in meta
    allowed = {e.query for e in ds.examples_in("exemplar")} | {e.query for e in ds.examples_in("optimization")}
    never = {e.query for e in ds.examples_in("heldout")} | {e.query for e in ds.examples_in("validation")}
    assert any(q in text for text in judged for q in {e.query for e in ds.examples_in("exemplar")})
    for text in judged:
        assert not any(q in text for q in never)
        assert any(q in text for q in allowed)


def test_an_unknown_strategy_is_a_config_error(tmp_path: Path) -> None:
    from opro.errors import ConfigError

    raw = _config(tmp_path)
    raw["optimizer"]["exemplar_strategy"] = "worst"
    with pytest.raises(ConfigError, match="exemplar_strategy"):
        config_from_dict(raw, base_dir=tmp_path, source="t.toml")
