"""Every cheap direction is tried (issue 57, item 2): step 0 evaluates the initial instruction with the
first moves of the search space (each open dimension alone at the choice the plan prices lowest, under
``objective = "cost"``, or highest, under ``"quality"``, and all of them together), whatever the seed;
and a candidate is a configuration, so the initial instruction with other settings is another
candidate everywhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fakes import experiment_config, scripted_pool

from opro.config import config_from_dict
from opro.experiment import Experiment, RunResult
from opro.probe.plan import answer_cost, first_moves_of, make_plan
from opro.search.space import first_moves

INITIAL = "Answer the question."
#: 27 settings: three dimensions of three choices, the initial configuration's in the middle of each.
SPACE = {"top_k": [1, 2, 3], "answer_max_tokens": [48, 128, 256], "chunk_size": [32, 64, 128]}
RAG = {"chunk_size": 64, "chunk_overlap": 0, "top_k": 2, "answer_max_tokens": 128, "initial_instructions": [INITIAL]}
#: Enough text for several chunks at every chunk size (two retrieved chunks are a longer prompt than one).
DOC = "\n".join(f"Fact {i}: AlexNet's layer {i} has {64 * i} filters and was trained on GPU {i % 2}." for i in range(40))


def _config(tmp_path: Path, *, objective: str, seed: int = 0, space: dict | None = None, validation: int = 14,
            **optimizer: object) -> dict:
    return experiment_config(
        tmp_path, questions=16 + validation, doc=DOC,
        experiment={"name": "t", "output_dir": "out", "cache_path": "calls.sqlite", "seed": seed},
        data={"split": {"exemplar": 2, "optimization": 4, "validation": validation, "heldout": 4, "seed": 1}},
        rag=RAG, search={"space": SPACE if space is None else space},
        optimizer={"steps": 2, "candidates_per_step": 3, "minibatch_size": 2, "objective": objective, **optimizer})


def test_the_first_moves_are_each_dimension_at_its_cheapest_or_dearest_and_all_together(tmp_path: Path) -> None:
    cfg = config_from_dict(_config(tmp_path, objective="cost"), base_dir=tmp_path)
    assert first_moves_of(cfg) == [
        {"top_k": 1, "answer_max_tokens": 128, "chunk_size": 64},
        {"top_k": 2, "answer_max_tokens": 48, "chunk_size": 64},
        {"top_k": 2, "answer_max_tokens": 128, "chunk_size": 32},
        {"top_k": 1, "answer_max_tokens": 48, "chunk_size": 32},
    ]
    # One price for the plan and the moves: each move is cheaper than the initial configuration.
    base = answer_cost(cfg, {})
    assert all(answer_cost(cfg, m) < base for m in first_moves_of(cfg))
    quality = config_from_dict(_config(tmp_path, objective="quality"), base_dir=tmp_path)
    # The plan expects answers of about 70 tokens, so a cap above 128 costs nothing more: no move there.
    assert first_moves_of(quality) == [{"top_k": 3, "answer_max_tokens": 128, "chunk_size": 64},
                                       {"top_k": 2, "answer_max_tokens": 128, "chunk_size": 128},
                                       {"top_k": 3, "answer_max_tokens": 128, "chunk_size": 128}]
    plan = make_plan(cfg)
    assert plan.first_moves == ("top_k=1", "answer_max_tokens=48", "chunk_size=32",
                                "top_k=1, answer_max_tokens=48, chunk_size=32")
    assert "first moves (step 0, the initial instruction with): top_k=1; answer_max_tokens=48" in " ".join(plan.lines())
    # A dimension whose choices all cost the same (the retriever kind) has no move; one whose cheapest
    # choice is the initial one neither; a single move is not repeated as a combination.
    flat = first_moves({"retriever": ("bm25", "hybrid"), "top_k": (1, 2)}, {"retriever": "bm25", "top_k": 1},
                       price=lambda v: float(v["top_k"]), objective="cost")
    assert flat == []
    one = first_moves({"retriever": ("bm25", "hybrid"), "top_k": (1, 2)}, {"retriever": "bm25", "top_k": 2},
                      price=lambda v: float(v["top_k"]), objective="cost")
    assert one == [{"retriever": "bm25", "top_k": 1}]


def _optimize(tmp_path: Path, cfg: dict, pool: object | None = None) -> RunResult:
    exp = Experiment(config_from_dict(cfg, base_dir=tmp_path, source="test.toml"), pool=pool or scripted_pool(),
                     progress=False)
    try:
        return exp.optimize()
    finally:
        exp.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_cheapest_setting_of_each_dimension_and_their_combination_are_evaluated_whatever_the_seed(
        tmp_path: Path, seed: int) -> None:
    result = _optimize(tmp_path, _config(tmp_path, objective="cost", seed=seed))
    step0 = [(r.instruction, dict(r.params)) for r in result.history if r.step == 0]
    assert step0 == [
        (INITIAL, {"top_k": 2, "answer_max_tokens": 128, "chunk_size": 64}),
        (INITIAL, {"top_k": 1, "answer_max_tokens": 128, "chunk_size": 64}),
        (INITIAL, {"top_k": 2, "answer_max_tokens": 48, "chunk_size": 64}),
        (INITIAL, {"top_k": 2, "answer_max_tokens": 128, "chunk_size": 32}),
        (INITIAL, {"top_k": 1, "answer_max_tokens": 48, "chunk_size": 32}),
    ]
    # Each is its own candidate, complete on every optimization question (step 0 prunes nothing).
    assert [r.name for r in result.history if r.step == 0] == [
        INITIAL, f"{INITIAL} {{top_k=1}}", f"{INITIAL} {{answer_max_tokens=48}}", f"{INITIAL} {{chunk_size=32}}",
        f"{INITIAL} {{top_k=1, answer_max_tokens=48, chunk_size=32}}"]
    assert all(r.status == "complete" and len(r.scores) == 4 for r in result.history if r.step == 0)
    # ... and then the sampler's 6 candidates.
    assert sum(1 for r in result.history if r.step > 0) == 6


# -- the initial instruction with other settings is another candidate, everywhere ---------------------
LONG = "Using the context, the answer is yes, as the passage plainly says."


def _equal_cheap_pool() -> object:
    """The answer does not depend on the settings (the judge scores a question alike under any
    configuration), so one retrieved chunk is truly as good as two, and cheaper (a shorter prompt)."""
    from fault_server import instruction_of

    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    def judge(messages: tuple, options: object) -> str:
        number = int(m.group(1)) if (m := re.search(r"Fact number (\d+)", messages[-1].content)) else 0
        return json.dumps({"score": 3 + number % 2, "reasoning": "scripted"})

    return ModelPool(scripted={
        "task": ScriptedLLM(default=lambda m, o: LONG if "fully" in instruction_of(m[-1].content) else "Yes.", model="task"),
        "judge": ScriptedLLM(default=judge, model="judge"),
        "optimizer": ScriptedLLM(default=lambda m, o: f"<INS>Answer fully, variant {o.seed % 1000}.</INS>",
                                 model="optimizer")})


def test_the_initial_instruction_with_other_settings_is_another_candidate_everywhere(tmp_path: Path) -> None:
    from opro.search import SearchStudy
    from opro.search.storage import open_storage

    # Equal on every question: tied pairs show non-inferiority at margin 0.25 from about 60 of them.
    cfg = _config(tmp_path, objective="cost", space={"top_k": [1, 2]}, steps=1, candidates_per_step=1, validation=76)
    result = _optimize(tmp_path, cfg, _equal_cheap_pool())
    cheap = f"{INITIAL} {{top_k=1}}"
    # Returned with a validated non-inferiority claim: the same wording, one chunk.
    assert result.validated and result.best_instruction == INITIAL and dict(result.best_params) == {"top_k": 1}
    v = result.validation
    assert v is not None and v.winner is not None and v.winner.instruction == cheap
    assert v.design is not None and v.design.finalists == (cheap,) and v.design.initial == INITIAL
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_configuration"]["top_k"] == 1 and summary["validation"]["winner"] == cheap
    assert summary["cost"]["returned"]["cost"] < summary["cost"]["initial"]["cost"]
    # history.jsonl: two lines with the same instruction, the second named by its configuration.
    lines = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    assert [(x["instruction"], x.get("name"), x["params"]) for x in lines if x["step"] == 0] == [
        (INITIAL, None, {"top_k": 2}), (INITIAL, cheap, {"top_k": 1})]
    # The study: each its own trial and record, its own validation scores.
    study = SearchStudy.open(open_storage(f"sqlite:///{out / 'optuna.db'}"), name=result.study_name)
    assert [r.name for r in study.records() if r.step == 0] == [INITIAL, cheap]
    keys = [k for k in study.optuna.user_attrs if k.startswith("validation:")]
    assert len({k.split(":")[1] for k in keys}) == 2  # the initial configuration's and the cheap one's
    assert v.finalists[0].n_pairs > 0
    # The export carries the configuration.
    from opro.export import export_prompt
    from opro.export.sources import resolve_prompt

    config = config_from_dict(cfg, base_dir=tmp_path, source="test.toml")
    exported = export_prompt(resolve_prompt("best", config=config), format="json", out=tmp_path / "best.json",
                             config=config).paths[0]
    data = json.loads(exported.read_text())
    assert (data["instruction"], data["top_k"]) == (INITIAL, 1)
