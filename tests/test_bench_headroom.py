"""experiments/bench_headroom.py on scripted models: each dimension alone, paired against the
initial configuration, on questions no search, exemplar or demonstration has seen."""

from __future__ import annotations

from pathlib import Path

from bench_headroom import heldout_questions, print_table, run
from fakes import experiment_config, judge_reply

from opro.config import config_from_dict
from opro.experiment import Experiment
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM


def test_each_dimension_alone_is_scored_on_questions_nothing_else_used(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    prompts: list[str] = []

    def task(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        prompts.append(messages[-1].content)
        # A demonstration makes the scripted model cite the context (which its judge scores 5).
        return "Using the context: yes." if messages[-1].content.count("Query:") > 1 else "Yes."

    pool = ModelPool(scripted={"task": ScriptedLLM(default=task, model="task"),
                               "judge": ScriptedLLM(default=judge_reply, model="judge")})
    cfg = config_from_dict(experiment_config(
        tmp_path, questions=40, optimizer={"validation_extension": 5},
        data={"split": {"exemplar": 3, "optimization": 3, "validation": 6, "heldout": 8, "seed": 1}}),
        base_dir=tmp_path, source="t.toml")
    result = run(cfg, heldout=30, demos=[1, 2], top_ks=[1, 3], demo_chars=80, progress=False, pool=pool,
                 instructions=["Answer only from the context."])
    rows = {r["configuration"]: r for r in result["rows"]}
    # top_k 2 is the initial
    assert list(rows) == ["initial", "none", "instruction-1", "demos-1", "demos-2", "top_k-1", "top_k-3"]
    assert rows["instruction-1"]["instruction"] == "Answer only from the context."
    assert rows["demos-2"]["difference"] == 3.0 and rows["demos-2"]["p"] < 0.05 and rows["demos-2"]["demos"] == 2
    assert rows["none"]["difference"] == 0.0 and rows["none"]["instruction"] == ""
    assert result["heldout"] == 40 - 3 - 3 - 6 - 5  # the extension's 5 stay out
    exp = Experiment(cfg, pool=pool, progress=False)
    try:
        asked = {q.query for q in heldout_questions(exp.dataset, config=cfg, n=30)}
        seen = {e.query for name in ("exemplar", "optimization", "validation") for e in exp.dataset.examples_in(name)}  # type: ignore[arg-type]
        assert not asked & seen and not asked & {e.query for e in exp.dataset.unused()[:5]}
        demo_q = exp.dataset.examples_in("exemplar")[0].query
    finally:
        exp.close()
    # A demonstration comes in the question's own fields, before the question, not in the instruction.
    shown = next(p for p in prompts if p.count("Query:") == 3)
    assert shown.index(f"Query: {demo_q}") < shown.rindex("Query:")
    print_table(result)
    out = capsys.readouterr().out
    assert "| **initial** | 2.00 | (baseline) | | |" in out and "| demos-2 | 5.00 | +3.00 [+1.86, +3.51] | 23/0/0 |" in out  # the betting interval of 23 pairs of +3


def test_with_unanswerable_questions_the_table_splits_the_means_by_kind(capsys) -> None:  # type: ignore[no-untyped-def]
    row = {"configuration": "initial", "mean": 2.0, "difference": None, "mean_not_in_context": 1.0,
           "mean_answerable": 3.0}
    print_table({"config": "c.toml", "task_model": "t", "judge_model": "j", "heldout": 4, "wall_s": 60,
                 "not_in_context": 2, "rows": [row]})
    out = capsys.readouterr().out
    assert "(2 not answerable from the corpus)" in out
    assert "| initial | 1.00 | 3.00 |" in out and "mean on the 2 not answerable | mean on the 2 answerable" in out
