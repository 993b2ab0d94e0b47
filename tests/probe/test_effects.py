"""The probe's paired differences (opro.probe.effects.measure_effects) as the validation stage reads them: from the
side-by-side judge under [judge].paired = "side_by_side", and on source-passage clusters where questions share one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from fakes import experiment_config, scripted_pool, side_by_side_judge_reply

from opro.config import config_from_dict
from opro.experiment import Experiment
from opro.judges.factory import build_paired_judge
from opro.llm.scripted import ScriptedLLM
from opro.probe.contrasts import Contrast
from opro.probe.effects import measure_effects
from opro.probe.verdicts import verdict_of


def test_a_side_by_side_pilot_reads_one_paired_call_per_differing_answer(tmp_path: Path) -> None:
    """Pointwise the scripted judge gives a "context" answer 5 and another 2 (+3); side by side 4 and 3 (+1).
    One side-by-side call per question where the answers differ, none where they are identical."""
    judge = ScriptedLLM(default=side_by_side_judge_reply, model="judge")
    pool = scripted_pool(judge=judge)
    cfg = config_from_dict(experiment_config(tmp_path, questions=24, judge={"paired": "side_by_side"}),
                           base_dir=tmp_path, source="t.toml")
    exp = Experiment(cfg, pool=pool, progress=False)
    try:
        questions = exp.dataset.examples[:10]
        paired = build_paired_judge(section=cfg.judge, client=exp.client("judge"), seed=cfg.experiment.seed)
        initial = exp.template("Answer the question.")
        effects = measure_effects(
            program=exp.program, judge=exp.judge, initial=initial, questions=questions, paired=paired, progress=False,
            contrasts=[Contrast("context", exp.template("Answer from the context."), "wording", "x"),
                       Contrast("plainly", exp.template("Answer plainly."), "wording", "y")])
    finally:
        exp.close()
    moved, same = effects[1], effects[2]
    assert moved.mean == 5.0 and effects[0].mean == 2.0  # each configuration's own mean stays pointwise
    assert moved.difference == 1.0 and moved.n == 10 and moved.win_tie_loss == "10/0/0"
    assert same.difference == 0.0 and same.win_tie_loss == "0/10/0"  # identical answers: no call, difference 0
    side_by_side = [m for m, _ in judge.calls if "Answer A: " in m[-1].content]
    assert len(side_by_side) == 10


def _clustered(tmp_path: Path, questions: int, *, per_passage: int) -> Path:
    rows = [{"query": f"What is fact {i}?", "reference_answer": f"Fact {i}.",
             "reference_contexts": [f"Passage {i // per_passage} about AlexNet."]} for i in range(questions)]
    path = tmp_path / f"rag_dataset_{per_passage}.json"
    path.write_text(json.dumps({"examples": rows}))
    return path


def test_an_all_tied_pilot_on_shared_passages_is_never_inert(tmp_path: Path) -> None:
    """90 tied pairs on 90 passages: the betting interval is +-0.18, inside the +-0.2 band ("inert"); the same 90
    tied pairs on 45 passages of two are 45 cluster means, +-0.36: undecided, never inert."""
    kinds = {}
    for per in (1, 2):
        data = {"dataset": str(_clustered(tmp_path, 90, per_passage=per)), "query_field": "query",
                "answer_field": "reference_answer"}
        cfg = config_from_dict(experiment_config(tmp_path / f"p{per}", data=data), base_dir=tmp_path / f"p{per}",
                               source="t.toml")
        exp = Experiment(cfg, pool=scripted_pool(), progress=False)
        try:
            questions = exp.dataset.examples
            effects = measure_effects(program=exp.program, judge=exp.judge, initial=exp.template("Answer the question."),
                                      questions=questions, pool=questions, progress=False,
                                      contrasts=[Contrast("briefly", exp.template("Answer briefly."), "wording", "z")])
        finally:
            exp.close()
        tied = effects[1]
        assert tied.all_tied and tied.n == 90
        kinds[per] = verdict_of(tied)
        if per == 2:
            assert tied.passages == 45 and tied.high is not None and tied.high > 0.3
            assert kinds[per].text == "undecided at 90 questions (45 source passages): +0.00, 90 of 90 tied"
    assert kinds[1].kind == "inert" and kinds[2].kind == "undecided"


def test_a_cluster_the_pilot_cuts_is_not_counted(tmp_path: Path) -> None:
    """A pilot of 5 questions from passages of two: the third passage's second question is not in it, so the tests
    count the two complete passages (4 questions); the cut one is answered but not tested."""
    data = {"dataset": str(_clustered(tmp_path, 8, per_passage=2)), "query_field": "query",
            "answer_field": "reference_answer", "split": {"exemplar": 1, "optimization": 1, "validation": 2,
                                                          "heldout": 2, "seed": 1}}
    cfg = config_from_dict(experiment_config(tmp_path / "cut", data=data), base_dir=tmp_path / "cut", source="t.toml")
    exp = Experiment(cfg, pool=scripted_pool(), progress=False)
    try:
        pool = exp.dataset.examples
        effects = measure_effects(program=exp.program, judge=exp.judge, initial=exp.template("Answer the question."),
                                  questions=pool[:5], pool=pool, progress=False,
                                  contrasts=[Contrast("context", exp.template("Answer from the context."), "wording", "c")])
    finally:
        exp.close()
    moved = effects[1]
    assert len(moved.scores) == 5 and moved.n == 4 and moved.passages == 2
    assert moved.differences[4] is None and dataclasses.replace(moved, clusters=()).passages is None
