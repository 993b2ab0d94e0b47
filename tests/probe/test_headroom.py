"""`opro probe` (opro.probe.headroom) on scripted models: the verdict names the dimension that truly moves the
score and calls the others inert, a garbage-writing optimizer is flagged, the pilot never touches
validation or held-out questions, a rerun asks nothing, and the commands read what it stored."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import experiment_config, judge_reply, scripted_pool, write_toml
from typer.testing import CliRunner

import opro.experiment
from opro.calibration.calibrate import (
    CalibrationReport,
    ConditionStats,
    ContrastStats,
    judge_signature,
    write_calibration,
)
from opro.cli import app
from opro.config import OproConfig, config_from_dict
from opro.experiment import Experiment
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM
from opro.probe.contrasts import Contrast
from opro.probe.effects import Effect, measure_effects
from opro.probe.headroom import probe, probe_record, run_probe
from opro.probe.pilot import pilot_pool
from opro.probe.proposer import check_proposal
from opro.probe.recommendation import recommend
from opro.probe.store import read_probe, stored_probe
from opro.probe.verdicts import verdict_of
from opro.testing import MemoryRecorder

Reply = Callable[[tuple[Message, ...], GenerationOptions], str]


def demos_help(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """A demonstration makes the answer cite the context (which the scripted judge scores 5, else 2)."""
    return "Using the context: yes." if messages[-1].content.count("Query:") > 1 else "Yes."


def short_answers_hurt(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """A short answer budget cuts the answer before its citation: only answer_max_tokens matters."""
    return "Yes." if options.max_tokens < 64 else "Using the context: yes."


def good_optimizer(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return f"<INS>Reply briefly and quote the passage you used, variant {options.seed}.</INS>"


def garbage_optimizer(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return "Sure! Here are some ideas:\n1. Be helpful.\n2. Be nice to the user."


def _pool(task: Reply, optimizer: Reply = good_optimizer) -> ModelPool:
    return ModelPool(scripted={"task": ScriptedLLM(default=task, model="task"),
                               "judge": ScriptedLLM(default=judge_reply, model="judge"),
                               "optimizer": ScriptedLLM(default=optimizer, model="optimizer")})


def _config(tmp_path: Path, **overrides: Any) -> OproConfig:
    base: dict[str, Any] = {
        "optimizer": {"validation_extension": 5},
        "data": {"split": {"exemplar": 3, "optimization": 3, "validation": 6, "heldout": 8, "seed": 1}},
        "search": {"space": {"demos": [0, 2], "top_k": [1, 3], "answer_max_tokens": [32, 96, 128]}},
        "rag": {"chunk_size": 64, "chunk_overlap": 0, "initial_instructions": ["Answer the question."],
                "answer_max_tokens": 96},
    }
    base.update(overrides)
    return config_from_dict(experiment_config(tmp_path, questions=40, **base), base_dir=tmp_path, source="t.toml")


def _probe(cfg: OproConfig, pool: ModelPool, **kwargs: Any) -> Any:
    exp = Experiment(cfg, pool=pool, progress=False)
    try:
        return probe(exp, **kwargs)
    finally:
        exp.close()


@pytest.mark.parametrize(("task", "mover", "kind"), [
    (demos_help, "demos 2", "moves"),
    (short_answers_hurt, "answer_max_tokens 32", "hurts"),
], ids=["demos-move", "short-answers-hurt"])
def test_the_verdict_names_the_one_dimension_that_moves_the_score_and_leaves_the_tied_others_undecided(
        tmp_path: Path, task: Reply, mover: str, kind: str) -> None:
    """The other contrasts tie the initial configuration on all 15 pilot questions: that does not rule out a
    failure on 1 question in 15, so none is called inert (the sign flips' floor of +-0.25 called them so)."""
    cfg = _config(tmp_path)
    result = _probe(cfg, _pool(task), questions=15)
    verdicts = {e.label: e.verdict.kind for e in result.effects if e.verdict is not None}
    assert set(verdicts) == {"no instruction", "contrast", "one sentence", "demos 2", "top_k 1", "top_k 3",
                             "answer_max_tokens 32", "answer_max_tokens 128", "dearest together"}
    assert verdicts.pop(mover) == kind
    # The search's step-0 move of every dimension at its dearest choice at once (demos 2 among them).
    assert verdicts.pop("dearest together") == ("moves" if mover == "demos 2" else "undecided")
    assert set(verdicts.values()) == {"undecided"}, verdicts
    moved = next(e for e in result.effects if e.label == mover)
    # 15 differences of 3 points: the betting test's two-sided p is 0.0010
    assert abs(moved.difference) == 3.0 and moved.p < 0.002 and moved.win_tie_loss in ("15/0/0", "0/0/15")
    rec = result.recommendation
    if kind == "moves":
        assert rec.open == ("demos",) and rec.quality_plausible is True
        assert rec.lines[0].startswith("open in [search.space]: demos (moves the score up: demos 2 +3.00")
    else:  # nothing to gain in quality: the gain is in cost
        # (not closed: its other choices tie on every pilot question, which rules out no harm)
        assert rec.open == () and "answer_max_tokens" in rec.undecided and rec.quality_plausible is False
        assert any(line.startswith("cost: the gain is in cost: set [optimizer].objective = \"cost\"") for line in rec.lines)
    assert "undecided at 15 questions: wording" in "\n".join(rec.lines)
    # The grid fits 80 columns; the instructions stand outside it.
    assert all(len(line) <= 80 for line in result.table())
    assert any(line.startswith(("demos 2 ", "max_tokens 32 ")) for line in result.table())


def test_the_pilot_is_optimization_and_unreserved_unused_questions_and_a_rerun_asks_nothing(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    pool = _pool(demos_help)
    exp = Experiment(cfg, pool=pool, progress=False)
    try:
        first = probe(exp, questions=30)
        available, _ = pilot_pool(exp)
        ds = exp.dataset
        never = {e.query for name in ("exemplar", "validation", "heldout") for e in ds.examples_in(name)}  # type: ignore[arg-type]
        reserved = {e.query for e in exp.extension_set()}
        optimization = [e.query for e in ds.examples_in("optimization")]
    finally:
        exp.close()
    assert len(reserved) == 5 and first.pilot.available == len(available) == 3 + (40 - 3 - 3 - 6 - 8 - 5)
    assert first.pilot.n == 18 and "only 18 pilot questions exist" in first.pilot.note
    assert list(first.questions[:3]) == optimization  # the search's first questions: it reuses these answers
    assert not set(first.questions) & (never | reserved)
    assert first.made > 0 and first.pilot.probe_calls == sum(first.calls.values())
    again = _probe(cfg, pool, questions=30)
    assert again.made == 0 and again.calls == first.calls
    assert [e.verdict for e in again.effects] == [e.verdict for e in first.effects]


def test_by_default_the_probe_asks_at_most_a_fifth_of_the_search_calls(tmp_path: Path) -> None:
    big = _config(tmp_path / "big", optimizer={"steps": 8, "candidates_per_step": 4, "validation_extension": 5},
                  data={"split": {"exemplar": 3, "optimization": 12, "validation": 6, "heldout": 8, "seed": 1}})
    result = _probe(big, _pool(demos_help))
    assert 6 <= result.pilot.n < result.pilot.available
    assert result.pilot.share is not None and result.pilot.share <= 0.2, result.pilot
    # A search smaller than a useful probe: the fewest questions a paired test can decide with, said so.
    small = _probe(_config(tmp_path / "small"), _pool(demos_help))
    assert small.pilot.n == 6 and "the fewest with which a paired test can reach alpha 0.05" in small.pilot.note


def test_a_garbage_writing_optimizer_is_flagged(tmp_path: Path) -> None:
    result = _probe(_config(tmp_path), _pool(demos_help, garbage_optimizer), questions=8)
    assert result.proposer.flagged and result.proposer.unusable_share == 1.0
    assert all("lines without <INS> tags" in p.reason for p in result.proposer.proposals)
    assert "contrast" not in {e.label for e in result.effects}
    assert any("no usable contrasting instruction" in n for n in result.notes)
    assert "use a stronger [models.optimizer]" in "\n".join(result.verdict_lines())
    fine = _probe(_config(tmp_path / "fine"), _pool(demos_help), questions=8)
    assert not fine.proposer.flagged and fine.proposer.unusable_share == 0.0


def test_a_proposal_is_usable_only_when_on_task_different_and_within_length() -> None:
    questions = ["Who designed AlexNet with Krizhevsky in Toronto?", "When did AlexNet win the 2012 ImageNet contest?",
                 "What did AlexNet use after every convolutional layer?"]

    def check(reply: str) -> tuple[bool, str]:
        c = check_proposal(reply, initial="Answer the question.", questions=questions, max_chars=120)
        return c.usable, c.reason

    assert check("<INS>Answer in one short sentence, quoting the context.</INS>") == (True, "")
    assert check("<INS>Mention AlexNet and answer from the context.</INS>")[0]  # in every question: the task's subject
    assert check("<INS>Say that Krizhevsky designed it.</INS>") == (
        False, "about one question: 'Krizhevsky' is from 'Who designed AlexNet with Krizhevsky in Toronto?'")
    assert check("<INS>Always answer 2012 for dates.</INS>")[1].startswith("about one question: '2012'")
    assert check("<INS>Say what AlexNet use after every convolutional layer.</INS>")[1] == (
        "about one question: it copies 'AlexNet use after every convolutional'")
    assert check("<INS>Answer the question.</INS>") == (False, "the initial instruction again")
    assert check("<INS>Answer the question please.</INS>")[0]
    assert check("<INS>Answer the question, the question.</INS>") == (False, "a near copy of the initial instruction")
    assert check("<INS>Be brief.</INS>") == (False, "fewer than three words: not an instruction")
    assert check("<INS>" + "Answer carefully. " * 10 + "</INS>") == (False, "longer than 120 characters")


def _effect(low: float, high: float, n: int = 20) -> Effect:
    return Effect(label="x", dimension="top_k", value=1, instruction="", demos=0, settings={}, n=n, mean=3.0,
                  scores=(), difference=(low + high) / 2, low=low, high=high, p=0.5, win_tie_loss="1/1/1")


def test_the_verdict_rules() -> None:
    assert verdict_of(_effect(0.12, 0.70)).text == "moves the score: +0.41 [+0.12, +0.70]"
    assert verdict_of(_effect(0.05, 0.15), detectable=0.6).text.endswith("less than the search can confirm (+0.60)")
    assert verdict_of(_effect(-0.48, -0.12)).kind == "hurts"
    assert verdict_of(_effect(-0.15, 0.19)).text == "inert here: within ±0.2 (+0.02 [-0.15, +0.19])"
    wide = _effect(-0.46, 0.40)
    assert verdict_of(wide).text == "undecided at 20 questions: -0.03 [-0.46, +0.40]"
    # However little the search could confirm, an interval that reaches below the band is not "inert" (issue
    # 61: "inert at the search's resolution" called a true -0.4 harm inert in 0.188 of pilots at n = 20).
    assert verdict_of(wide, detectable=0.62).kind == "undecided"
    assert verdict_of(_effect(-0.7, 0.4), detectable=0.62).kind == "undecided"
    # Under the cost objective the band is the margin.
    assert verdict_of(_effect(-0.24, 0.22), inert_within=0.25).text == "inert here: within ±0.25 (-0.01 [-0.24, +0.22])"
    assert verdict_of(_effect(-0.24, 0.22)).kind == "undecided"
    # Each interval is 95% on its own: a verdict that does not hold after Holm over the contrasts says so.
    chance = verdict_of(_effect(0.03, 0.53), holm=(0.14, 6))
    assert chance.kind == "moves" and chance.may_be_chance
    assert chance.text == "moves the score: +0.28 [+0.03, +0.53]; may be chance: p 0.14 after Holm over the 6 contrasts"
    held = verdict_of(_effect(-0.79, -0.11), holm=(0.01, 6))
    assert held.kind == "hurts" and not held.may_be_chance and held.text == "hurts: -0.45 [-0.79, -0.11]"


def test_an_all_tied_difference_shows_no_interval_and_an_identical_configuration_is_named(tmp_path: Path) -> None:
    """Every pair tied: "+0.00, 15 of 15 tied", not an interval beside noise sd 0.00; and never "inert": 15
    ties do not rule out a failure on 1 question in 15 (the sign flips' floor of +-0.25 called such a pilot
    inert, and a true -0.25 harm that ties on most questions inert in 0.27 of 12-question pilots). A
    contrast that is the initial configuration itself is called identical and not tested, and no
    recommendation counts it."""
    cfg = _config(tmp_path)
    result = _probe(cfg, _pool(demos_help), questions=15)  # only demos change an answer: every other pair ties
    tied = next(e for e in result.effects if e.label == "no instruction")
    assert tied.all_tied and tied.interval == "+0.00, 15 of 15 tied"
    assert tied.verdict is not None and tied.verdict.text == "undecided at 15 questions: +0.00, 15 of 15 tied"
    assert tied.low is not None and tied.low < -0.2  # the betting interval of 15 ties reaches past the band
    row = next(line for line in result.table() if line.startswith("no instruction "))
    assert "15 of 15 tied" in row and "[" not in row
    moved = next(e for e in result.effects if e.label == "demos 2")
    assert not moved.all_tied and moved.interval.startswith("+3.00 [")

    exp = Experiment(cfg, pool=_pool(demos_help), progress=False)
    try:
        initial = exp.template("Answer the question.")
        effects = measure_effects(program=exp.program, judge=exp.judge, initial=initial, questions=pilot_pool(exp)[0][:6],
                                  contrasts=[Contrast("again", exp.template("Answer the question."), "wording",
                                                      "Answer the question.")], progress=False)
    finally:
        exp.close()
    same = effects[1]
    verdict = verdict_of(same)
    assert same.identical and same.interval == "(identical)" and same.p is None and same.sd is None
    assert verdict.kind == "identical" and verdict.text.startswith("identical to the initial configuration")
    rec = recommend([dataclasses.replace(same, verdict=verdict)], initial=effects[0], detectable=0.5,
                    objective="quality", probed_space=False, questions=6)
    assert rec.open == rec.closed == rec.undecided == ()


def test_an_undecided_contrast_is_told_how_many_pilot_questions_would_decide_it() -> None:
    from opro.stats.paired import questions_for_half_width

    wide, base = dataclasses.replace(_effect(-0.46, 0.40), verdict=verdict_of(_effect(-0.46, 0.40))), _effect(0, 0)
    need = questions_for_half_width(0.61, 0.2)
    assert need is not None and 30 < need < 45  # about (1.96 x 0.61 / 0.2)^2 = 36, a little more with t
    said = recommend([wide], initial=base, detectable=0.17, objective="quality", probed_space=True, questions=20,
                     noise=(0.61, "the pilot's"), available=120).lines
    assert (f"undecided at 20 questions: top_k (`--questions {need}` can decide: an interval inside ±0.20 takes "
            f"about {need} questions at paired sd 0.61 (the pilot's))") in said
    # The band decides (under the cost objective, the margin), never the search's resolution; a pilot
    # without enough questions is told that it cannot decide.
    loose = recommend([wide], initial=base, detectable=0.4, objective="cost", probed_space=True, questions=20,
                      noise=(0.61, "the pilot's"), available=6, band=0.25).lines
    assert any(f"inside ±0.25 takes about {questions_for_half_width(0.61, 0.25)} questions" in x
               and x.endswith("only 6 pilot questions exist: the pilot cannot decide it)") for x in loose), loose
    assert any(x.endswith("(`--questions` with more pilot questions can decide)") for x in recommend(
        [wide], initial=base, detectable=0.17, objective="quality", probed_space=True, questions=20).lines)


def test_the_judge_section_shows_the_stored_calibration_or_how_long_it_takes(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    pool = _pool(demos_help)
    assert "judge: not calibrated: `opro judge calibrate t.toml` takes" in "\n".join(_probe(cfg, pool, questions=6).lines())
    conditions = tuple(ConditionStats(c, n, 0, m, {1: 0, 2: 0, 3: 0, 4: 0, 5: 0})
                       for c, n, m in (("reference", 30, 4.06), ("wrong", 30, 2.27), ("name", 26, 3.20)))
    # The hand-measured figures of issue 51: one name swapped, AUC 0.78, the reference higher in 22 of 26.
    contrasts = (ContrastStats("wrong", 30, 29, 0, 0.97, 0.97, 1.79), ContrastStats("name", 26, 22, 1, 0.78, 0.87, 0.86))
    report = CalibrationReport(judge="judge", method="reply", dataset="d", n_questions=30, seed=0,
                               conditions=conditions, auc=0.97, separation=1.79, invalid_rate=0.0,
                               auc_most_likely=None, s_per_call=1.0, calls=90, cache_hits=0, retest=None,
                               signature=judge_signature(cfg), contrasts=contrasts)
    write_calibration(report, [], output_dir=cfg.output_dir, plot=False)
    text = "\n".join(_probe(cfg, pool, questions=6).lines())
    assert "judge: calibrated (reply, 30 questions): AUC right vs wrong 0.97, separation 1.79" in text
    assert ("name: mean 3.20 on 26; against the reference: AUC 0.78, reference higher in 22 of 26 (1 tied), "
            "mean drop 0.86") in text and "not calibrated" not in text


def test_the_probe_is_written_read_back_and_recorded_as_kind_probe(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    recorder = MemoryRecorder()
    exp = Experiment(cfg, pool=_pool(demos_help), progress=False)
    try:
        done = run_probe(exp, recorders=[recorder], questions=15)
        assert stored_probe(exp)[0] == done.result and stored_probe(exp, questions=9) == (
            None, "the stored probe has 15 pilot questions, not 9")
    finally:
        exp.close()
    assert read_probe(cfg.output_dir) == done.result
    assert set(done.paths.values()) == {cfg.output_dir / "probe.json", cfg.output_dir / "probe.md"}
    md = (cfg.output_dir / "probe.md").read_text()
    assert md.startswith("# opro probe: t.toml") and "## recommendation" in md and "demos 2 " in md
    (record,) = recorder.records
    assert record.kind == "probe" and record.metrics["effect.demos_2"] == 3.0
    assert record.tags["opro.probe.demos_2"] == "moves" and record.tags["opro.probe.open"] == "demos"
    assert set(record.files) == set(done.paths.values()) and done.recorded[0].where == "record 1 in memory"
    # Another initial instruction is another probe: the stored one is not this config's.
    other = _config(tmp_path, rag={"chunk_size": 64, "chunk_overlap": 0, "initial_instructions": ["Be exact."]})
    exp = Experiment(other, pool=_pool(demos_help), progress=False)
    try:
        found, why = stored_probe(exp)
    finally:
        exp.close()
    assert found is None and why is not None and "made with other settings" in why


def test_the_commands_probe_fold_the_verdict_into_the_plan_and_optimize_prints_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    monkeypatch.setenv("COLUMNS", "200")
    data = experiment_config(tmp_path, questions=30, optimizer={"steps": 1, "candidates_per_step": 2,
                                                                  "minibatch_size": 2, "validation_extension": 2})
    config = write_toml(data, tmp_path / "exp.toml")
    runner = CliRunner()
    plan_only = runner.invoke(app, ["plan", str(config)])
    assert plan_only.exit_code == 0 and "probe (" not in plan_only.output
    done = runner.invoke(app, ["probe", str(config), "--no-progress", "--questions", "8"])
    assert done.exit_code == 0, done.output
    out = done.output
    assert "contrast" in out and "verdicts:" in out and "recommendation:" in out and "wrote " in out
    assert "MLflow run " in out  # recorded by default, in the config's store
    from mlflow import MlflowClient

    store = MlflowClient(f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    runs = store.search_runs([e.experiment_id for e in store.search_experiments()],
                             filter_string="tags.`opro.kind` = 'probe'")
    assert len(runs) == 1 and runs[0].data.params["pilot.questions"] == "8"
    stored = json.loads((tmp_path / "out" / "probe.json").read_text())
    planned = runner.invoke(app, ["plan", str(config), "--probe", "--questions", "8"])
    assert planned.exit_code == 0, planned.output
    assert "probe (8 pilot questions" in planned.output and "(read from " in planned.output
    assert json.loads((tmp_path / "out" / "probe.json").read_text()) == stored  # read, not made again
    as_json = runner.invoke(app, ["plan", str(config), "--probe", "--questions", "8", "--json"])
    assert json.loads(as_json.output)["probe"]["pilot"]["n"] == 8
    # The plan takes the paired noise a probe measured (before it: the default, 1.30); the scripted judge's
    # is 0 (every contrast scores alike), which no plan can use, so a measured one is written in.
    assert "paired score sd 1.30: default (pointwise): not measured; `opro probe` measures it" in plan_only.output
    assert stored["judge"]["pilot_sd"] == 0
    assert "paired score sd 1.30: default" in runner.invoke(app, ["plan", str(config)]).output
    noisy = {**stored, "judge": {**stored["judge"], "pilot_sd": 0.66}}
    (tmp_path / "out" / "probe.json").write_text(json.dumps(noisy), encoding="utf-8")
    # (8 pilot questions: planned at the sd's 90% upper bound.)
    assert "paired score sd 1.04: opro probe's pilot (8 questions" in runner.invoke(app, ["plan", str(config)]).output
    # Only a pilot of this task (its noise digest: dataset, split, models, judge), of 6 or more questions,
    # measured this task's noise; a probe stored before the digest was kept is not used.
    for other in ({**noisy, "noise_digest": "0123456789abcdef"}, {**noisy, "noise_digest": ""},
                  {**noisy, "pilot": {**noisy["pilot"], "n": 5}}):
        (tmp_path / "out" / "probe.json").write_text(json.dumps(other), encoding="utf-8")
        assert "paired score sd 1.30: default" in runner.invoke(app, ["plan", str(config)]).output
    (tmp_path / "out" / "probe.json").write_text(json.dumps(stored), encoding="utf-8")
    optimized = runner.invoke(app, ["optimize", str(config), "--no-progress"])
    assert optimized.exit_code == 0, optimized.output
    said = optimized.output
    assert said.index("probe (8 pilot questions") < said.index("opro optimize: t")  # at the start, before the run
    assert "probe: saved this run " in said  # the probe's answers the search found in the call cache
    # Other settings: `plan --probe` probes again; optimize says the stored one is not this config's.
    data["rag"]["initial_instructions"] = ["Answer from the context."]
    write_toml(data, config)
    replanned = runner.invoke(app, ["plan", str(config), "--probe", "--questions", "6"])
    assert replanned.exit_code == 0 and "wrote " in replanned.output and "probe (6 pilot questions" in replanned.output
    data["rag"]["top_k"] = 3
    write_toml(data, config)
    # (The run itself is then refused by the decision ledger: these validation questions already decided.)
    stale = runner.invoke(app, ["optimize", str(config), "--no-progress", "--fresh"])
    assert "probe: the stored probe" in stale.output and "made with other settings" in stale.output


PARAGRAPHS = (
    "AlexNet won the ImageNet challenge in 2012 with a top-5 error far below the runner-up.",
    "The network used ReLU activations and dropout regularization to train faster and overfit less.",
    "Training was split across two GPUs because one card had too little memory for the model.",
    "Its architecture stacks five convolutional layers and three fully connected layers.",
)
KEYWORDS_OF = ("ImageNet challenge", "ReLU activations", "two GPUs", "convolutional layers")
ABSENT = "Zebras migrate across the savanna every spring following the rains and fresh grass."


def _contexts_config(tmp_path: Path) -> OproConfig:
    """Questions with reference contexts: every fifth one's passage is not in the corpus."""
    rows = [{"question": f"What about the {KEYWORDS_OF[i % 4]} (fact {i})?", "answer": f"Answer {i}.",
             "contexts": [ABSENT if i % 5 == 0 else PARAGRAPHS[i % 4]]} for i in range(40)]
    data = experiment_config(tmp_path, questions=40, doc="\n\n".join(PARAGRAPHS) + "\n",
                             optimizer={"validation_extension": 5},
                             search={"space": {"top_k": [1, 3]}})
    (tmp_path / "qa_contexts.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    data["data"].update({"dataset": str(tmp_path / "qa_contexts.jsonl"), "contexts_field": "contexts",
                         "split": {"exemplar": 3, "optimization": 3, "validation": 6, "heldout": 8, "seed": 1}})
    return config_from_dict(data, base_dir=tmp_path, source="t.toml")


def long_unless_told(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """Three sentences, or one when the instruction asks for one: a task model that follows it."""
    if "one sentence" in messages[-1].content:
        return "Using the context: yes."
    return "Using the context: yes. It says so plainly. Nothing else is needed here."


def test_retrieval_recall_and_instruction_following_are_measured(tmp_path: Path) -> None:
    result = _probe(_contexts_config(tmp_path), _pool(long_unless_told), questions=15)
    exp = Experiment(_contexts_config(tmp_path), pool=_pool(long_unless_told), progress=False)
    try:
        pilot = {e.query: e for e in exp.dataset.examples}
    finally:
        exp.close()
    absent = sum(pilot[q].reference_contexts == (ABSENT,) for q in result.questions)
    assert 0 < absent < 15 and result.task.recall_n == 15
    assert set(result.task.recall) == {1, 2, 3}
    assert result.task.recall[2] == result.task.recall[3] == pytest.approx((15 - absent) / 15)
    assert result.task.mean_retrieved is not None and result.task.mean_missed is not None
    assert "wording cannot fix a passage never retrieved" in "\n".join(result.lines())
    assert result.task.follows is True and "follows its instruction" in result.task.following
    fmt = next(e for e in result.effects if e.label == "one sentence")
    assert fmt.answer_words is not None and result.initial.answer_words is not None
    assert fmt.answer_words < result.initial.answer_words and fmt.one_sentence == 1.0
    ignored = _probe(_contexts_config(tmp_path / "ignored"), _pool(demos_help), questions=8)
    assert ignored.task.follows is None and ignored.task.following.startswith("cannot tell: the initial answers are")


def test_the_verdicts_use_the_search_resolution_at_the_noise_the_pilot_measured(tmp_path: Path) -> None:
    """With a noisy judge the pilot measures the paired sd; the verdicts and the recommendation then judge
    every contrast against what the validation stage confirms at that noise, not at the plan's assumed sd."""
    import hashlib

    def noisy_task(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return "Answer " + hashlib.sha256(messages[-1].content.encode()).hexdigest()[:8]

    def noisy_judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        h = int(hashlib.sha256(messages[-1].content.encode()).hexdigest(), 16)
        return json.dumps({"score": 2 + h % 3, "reasoning": "scripted"})

    pool = ModelPool(scripted={"task": ScriptedLLM(default=noisy_task, model="task"),
                               "judge": ScriptedLLM(default=noisy_judge, model="judge"),
                               "optimizer": ScriptedLLM(default=good_optimizer, model="optimizer")})
    result = _probe(_config(tmp_path), pool, questions=12)
    j = result.judge
    assert j.pilot_sd is not None and j.pilot_sd > 0.3 and j.detectable_at_pilot_sd is not None
    assert abs(j.detectable_at_pilot_sd - j.detectable) > 0.05  # the measured noise is not the assumed 1.3
    text = "\n".join(result.lines())
    assert f"quality: a gain of {j.detectable_at_pilot_sd:+.2f}" in text
    assert f"quality: a gain of {j.detectable:+.2f}" not in text
    assert all(f"±{j.detectable:.2f}" not in e.verdict.text for e in result.effects)


# -- issue 61, item 3: a harm is never called inert, nor cheaper and not worse ----------------------------------


def _pilot_effect(label: str, scores: list[float], base: list[float], *, cost: float) -> Effect:
    """A contrast as the probe measures it (:func:`opro.stats.paired.compare_paired` on the pairs: the betting
    interval and test at the probe's alpha)."""
    import statistics

    from opro.probe.effects import ALPHA, SCALE
    from opro.stats.paired import compare_paired

    c = compare_paired(scores, base, scale=SCALE, alpha=ALPHA)
    return Effect(label=label, dimension="top_k", value=1, instruction="", demos=0, settings={}, n=len(scores),
                  mean=statistics.fmean(scores), scores=tuple(scores), difference=c.difference.estimate,
                  low=c.difference.low, high=c.difference.high, p=c.test.p_value,
                  win_tie_loss=str(c.win_tie_loss), sd=statistics.stdev(a - b for a, b in zip(scores, base, strict=True)),
                  cost=cost)


def test_a_cheaper_contrast_is_named_not_worse_only_on_its_non_inferiority_test() -> None:
    # 70 tied pairs: ties show non-inferiority at margin 0.25 from about 60 (the betting test).
    equal = [3.0, 4.0, 3.0, 4.0, 5.0, 3.0, 4.0, 4.0, 3.0, 5.0] * 7
    initial = Effect(label="initial", dimension="initial", value=None, instruction="", demos=0, settings={}, n=70,
                     mean=3.8, scores=tuple(equal), cost=100.0)
    same = _pilot_effect("top_k 1", equal, equal, cost=60.0)
    same = dataclasses.replace(same, verdict=verdict_of(same, inert_within=0.25))
    rec = recommend([same], initial=initial, detectable=None, objective="quality", probed_space=True, questions=70,
                    margin=0.25)
    (line,) = [x for x in rec.lines if x.startswith("cost:")]
    assert "cheaper and not worse here: top_k 1 (p " in line and "non-inferiority at margin 0.25 on the pilot" in line
    # Without a margin to test at, none is named, whatever its interval.
    assert not any("cheaper and not worse" in x for x in recommend(
        [same], initial=initial, detectable=None, objective="quality", probed_space=True, questions=30).lines)


def unreadable_judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return "I would rather not grade this answer."


def test_a_probe_whose_judge_replies_are_all_unreadable_fails_and_stores_no_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 61: every judge reply unreadable, 0 scored pairs, and `opro probe` exited 0, concluded that a gain
    "is not plausible", recommended the cost objective and stored it for `opro optimize` to print."""
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: ModelPool(scripted={
        "task": ScriptedLLM(default=demos_help, model="task"),
        "judge": ScriptedLLM(default=unreadable_judge, model="judge"),
        "optimizer": ScriptedLLM(default=good_optimizer, model="optimizer")}))
    monkeypatch.setenv("COLUMNS", "200")
    config = write_toml(experiment_config(tmp_path, questions=30, optimizer={"validation_extension": 2}),
                        tmp_path / "exp.toml")
    done = CliRunner().invoke(app, ["probe", str(config), "--no-progress", "--questions", "8", "--no-mlflow"])
    assert done.exit_code == 1, done.output
    said = " ".join(done.output.split())
    assert "the probe scored no pair on its 8 pilot questions: the judge's replies were unreadable on" in said
    assert "(for example: " in said and "no verdict is stored" in said and "Traceback" not in said
    assert "verdicts:" not in said and "recommendation" not in said and "not plausible" not in said
    assert not (tmp_path / "out" / "probe.json").exists() and not (tmp_path / "out" / "probe.md").exists()
    planned = CliRunner().invoke(app, ["plan", str(config)])
    assert planned.exit_code == 0 and "probe (" not in planned.output


# -- issue 57, item 3: under objective "cost" the verdicts and the recommendation are about cost -------------


def test_under_the_cost_objective_each_verdict_carries_its_saving_and_only_a_passed_test_names_it_not_worse(
        tmp_path: Path) -> None:
    """top_k 1 changes no answer (every pair tied) and sends less context: cheaper, and not worse by more than
    the margin on the pilot's non-inferiority test. answer_max_tokens 32 is cheaper too but cuts the answer
    before its citation: it hurts, and is never named "cheaper and not worse"."""
    space = {"space": {"top_k": [1, 3], "answer_max_tokens": [32, 96, 128]}}
    # Passages every question's words find: top_k 1 sends one, the initial top_k 2 sends two.
    doc = "\n\n".join(f"A fact about AlexNet: {p}" for p in PARAGRAPHS) + "\n"
    rag = {"chunk_size": 32, "chunk_overlap": 0, "initial_instructions": ["Answer the question."], "answer_max_tokens": 96}

    def config(where: Path, **optimizer: Any) -> OproConfig:
        data = experiment_config(where, questions=110, doc=doc, search=space, rag=rag,
                                 optimizer={"validation_extension": 5, **optimizer},
                                 data={"split": {"exemplar": 3, "optimization": 3, "validation": 6, "heldout": 8,
                                                 "seed": 1}})
        return config_from_dict(data, base_dir=where, source="t.toml")

    # On 15 tied pilot pairs no non-inferiority claim is made (a failure on 1 question in 15 would not show);
    # from about 60 tied pairs it is.
    small = _probe(config(tmp_path / "small", objective="cost", margin=0.25), _pool(short_answers_hurt), questions=15)
    small_top1 = {e.label: e for e in small.effects}["top_k 1"]
    assert small_top1.verdict is not None and small_top1.verdict.kind == "undecided"
    assert "; not shown within 0.25 (betting test on 15 pairs, p " in small_top1.verdict.text
    assert not any(x.startswith("cheaper and not worse here: ") for x in small.recommendation.lines)
    cost = _probe(config(tmp_path / "cost", objective="cost", margin=0.25), _pool(short_answers_hurt), questions=80)
    by = {e.label: e for e in cost.effects}
    top1, short = by["top_k 1"], by["answer_max_tokens 32"]
    assert top1.saving is not None and top1.saving.lower and top1.saving.relative is not None
    assert top1.saving.relative < 0 and top1.saving.n == 80 and top1.step0
    assert top1.verdict is not None and top1.verdict.text.startswith(
        f"inert here: within ±0.25 (+0.00, 80 of 80 tied); cost {top1.saving.relative:+.0%} per answer (")
    assert "; cheaper and not worse by more than 0.25 (betting test on 80 pairs, p " in top1.verdict.text
    assert short.verdict is not None and short.verdict.kind == "hurts" and "; cost -" in short.verdict.text
    assert "not worse" not in short.verdict.text and "not shown within" not in short.verdict.text
    together = by["cheapest together"]
    assert together.step0 and together.verdict is not None and together.verdict.kind == "hurts"
    lines = cost.recommendation.lines
    (head,) = [x for x in lines if x.startswith('cost (objective "cost", margin 0.25; per answer, in ')]
    assert f"top_k 1 {top1.saving.text()}" in head and "answer_max_tokens 32 " in head
    (named,) = [x for x in lines if x.startswith("cheaper and not worse here: ")]
    assert "top_k 1 (p " in named and "answer_max_tokens" not in named and "together" not in named
    assert "non-inferiority at margin 0.25 on the pilot, alpha 0.05" in named
    assert any(x.startswith("keep open for cost: top_k ") for x in lines)
    assert any(x.startswith("the search: step 0 tries ") and "top_k 1" in x for x in lines)
    assert "keep closed: top_k" not in "\n".join(lines)
    recorded = probe_record(cost, {}).metrics  # MLflow keeps each saving beside the effect
    assert recorded["effect.top_k_1.cost_change"] == pytest.approx(top1.saving.difference)
    # Under the quality objective the same world's verdicts say nothing about cost.
    quality = _probe(config(tmp_path / "quality"), _pool(short_answers_hurt), questions=80)
    assert all("; cost " not in e.verdict.text for e in quality.effects if e.verdict is not None)
    assert not any(x.startswith("cost (objective") for x in quality.recommendation.lines)
