"""What an answer costs (issue 50): one definition (opro.program.cost), kept per candidate by the search
(history, study, MLflow, summary.json) and per prompt by ``opro compare``."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fakes import experiment_config, scripted_pool

from opro.config import config_from_dict
from opro.errors import ConfigError
from opro.evaluation.batch import EvaluationRow
from opro.experiment import Experiment, RunResult
from opro.experiment.settings import validation_settings
from opro.program.cost import CostModel
from opro.search.results import CandidateRecord
from opro.tracking.commands import mlflow_run_of


def _row(prompt: int, completion: int, seconds: float, error: str | None = None) -> EvaluationRow:
    return EvaluationRow(query="q", reference="r", prompt_tokens=prompt, completion_tokens=completion,
                         latency_s=seconds, error=error)


def test_cost_is_weighted_task_tokens_without_prices_and_money_with_them() -> None:
    rows = [_row(100, 10, 1.0), _row(300, 30, 3.0), _row(0, 0, 0.0, error="LLMTimeoutError: no answer")]
    tokens = CostModel(completion_weight=4).summarize(rows)
    assert tokens is not None
    # The failed call has no answer: it is in no mean.
    assert (tokens.n, tokens.prompt_tokens, tokens.completion_tokens, tokens.seconds) == (2, 200.0, 20.0, 2.0)
    assert tokens.cost == 200 + 4 * 20 and tokens.unit == "tokens"
    assert CostModel(completion_weight=4).per_answer(rows) == [140.0, 420.0, None]
    usd = CostModel(price_prompt=1.0, price_completion=10.0).summarize(rows)
    assert usd is not None and usd.unit == "usd" and usd.cost == pytest.approx((200 * 1.0 + 20 * 10.0) / 1e6)
    assert CostModel().summarize([_row(1, 1, 1.0, error="x")]) is None


def test_the_config_prices_the_task_model_or_weighs_its_tokens(tmp_path: Path) -> None:
    cfg = experiment_config(tmp_path, optimizer={"completion_weight": 2.5})
    model = config_from_dict(cfg, base_dir=tmp_path).cost_model()
    assert (model.unit, model.completion_weight) == ("tokens", 2.5)
    cfg["models"]["task"].update(price_prompt=0.5, price_completion=2.0)
    model = config_from_dict(cfg, base_dir=tmp_path).cost_model()
    assert (model.unit, model.price_prompt, model.price_completion) == ("usd", 0.5, 2.0)
    cfg["optimizer"]["completion_weight"] = -1
    with pytest.raises(ConfigError, match=r"\[optimizer\]\.completion_weight"):
        config_from_dict(cfg, base_dir=tmp_path)


def _optimize(tmp_path: Path, output_dir: str) -> tuple[Experiment, RunResult]:
    cfg = experiment_config(tmp_path, experiment={"output_dir": output_dir})
    exp = Experiment(config_from_dict(cfg, base_dir=tmp_path, source="test.toml"), pool=scripted_pool(), progress=False)
    try:
        return exp, exp.optimize()
    finally:
        exp.close()


def test_every_candidate_keeps_its_cost_per_answer_in_history_study_mlflow_and_summary(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    exp, result = _optimize(tmp_path, "out")
    out = tmp_path / "out"
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert history and all(r["cost"] is not None for r in history)
    for r in history:
        c = r["cost"]
        # The scripted task model counts words: "Using the context: yes." (4) under a "context"
        # instruction, "Yes." (1) otherwise.
        assert c["completion_tokens"] == (4.0 if "context" in r["instruction"].lower() else 1.0)
        assert c["cost"] == pytest.approx(c["prompt_tokens"] + 4 * c["completion_tokens"]) and c["unit"] == "tokens"
        assert c["n"] == r["n_scored"] + r["n_invalid"] and c["prompt_tokens"] > 0 and c["seconds"] > 0
    # The study holds the same figures (what a resume and `opro compare best` read).
    from opro.search import SearchStudy
    from opro.search.storage import open_storage

    study = SearchStudy.open(open_storage(exp.config.optuna_storage), name=result.study_name)
    assert [r.cost.as_dict() if r.cost else None for r in study.records()] == [r["cost"] for r in history]
    summary = json.loads((out / "summary.json").read_text())
    returned = next(r["cost"] for r in history if r["instruction"] == summary["best_instruction"])
    initial = next(r["cost"] for r in history if r["instruction"] == summary["initial_instruction"])
    assert summary["cost"] == {"returned": returned, "initial": initial}
    assert returned["completion_tokens"] > initial["completion_tokens"]  # "context" answers are longer here
    uri = f"sqlite:///{out / 'mlflow.db'}"
    run = MlflowClient(tracking_uri=uri).get_run(mlflow_run_of(result.recorded))
    client = MlflowClient(tracking_uri=uri)
    logged = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "candidate_completion_tokens"),
                                      key=lambda m: m.step)]
    assert logged == [r["cost"]["completion_tokens"] for r in history]
    assert len(client.get_metric_history(run.info.run_id, "candidate_cost")) == len(history)

    # Answered again from the call cache (another output folder, the same cache file): the cached
    # copy of each call keeps the tokens it cost, so every figure is the same.
    _, again = _optimize(tmp_path, "out2")
    assert again.usage["task"]["calls"] == 0 and again.usage["task"]["cache_hits"] > 0
    second = [json.loads(line) for line in (tmp_path / "out2" / "history.jsonl").read_text().splitlines()]
    assert [r["cost"] for r in second] == [r["cost"] for r in history]


def test_compare_shows_each_prompts_tokens_and_seconds_per_answer_and_the_paired_differences(tmp_path: Path) -> None:
    from fakes import optimized

    from opro.heldout.compare import compare_prompts, save_comparison

    config = optimized(tmp_path)
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"], n_resamples=200)
        saved = save_comparison(report, experiment=exp, name="cost", mlflow=False)
    finally:
        exp.close()
    initial, best = report.prompts
    assert initial.cost is not None and best.cost is not None
    # "Yes." against "Using the context: yes.", on every one of the 10 held-out questions.
    assert (initial.cost.completion_tokens, best.cost.completion_tokens, best.cost.n) == (1.0, 4.0, 10)
    v = report.versus[1]
    assert v is not None and v.cost is not None and v.cost.tokens.n == 10
    more = (best.cost.prompt_tokens + best.cost.completion_tokens) - (initial.cost.prompt_tokens + initial.cost.completion_tokens)
    assert v.cost.tokens.estimate == pytest.approx(more) and more > 3
    assert v.cost.tokens.ci is not None and v.cost.tokens.ci[0] <= v.cost.tokens.estimate <= v.cost.tokens.ci[1]
    assert v.cost.cost.estimate == pytest.approx(best.cost.cost - initial.cost.cost)
    data = json.loads((saved.directory / "report.json").read_text())
    assert data["prompts"][1]["cost"]["completion_tokens"] == 4.0
    assert data["prompts"][1]["versus_baseline"]["cost_difference"]["tokens"]["estimate"] == pytest.approx(more)
    md = (saved.directory / "report.md").read_text()
    assert "tokens/answer" in md and "Δ tokens [95% CI]" in md and f"+{more:.0f} [" in md


# -- objective = "cost": a validated non-inferiority claim and a lower cost (issue 50, items 2 and 3) ----
LONG = "Using the context, the answer is yes, as the passage plainly says."


def _cost_world(tmp_path: Path, *, worse: bool, cheaper: bool = True, candidates: int = 3,
                validation: int = 12) -> RunResult:
    """"briefly" in the instruction makes answers one word instead of twelve. The judge scores a
    question the same under any instruction; with ``worse``, a one-word answer loses a point on every
    question the search does not score (so the search still finds it within the margin, and only the
    validation stage can tell). Without ``cheaper`` the optimizer never proposes "briefly".
    ``validation``: the validation split (a claim on tied pairs at margin 0.25 needs about 60 of them)."""
    import re

    from fault_server import instruction_of

    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    searched: set[str] = set()

    def task(messages: tuple, options: object) -> str:
        return "Yes." if "briefly" in instruction_of(messages[-1].content).lower() else LONG

    def judge(messages: tuple, options: object) -> str:
        text = messages[-1].content
        number = int(m.group(1)) if (m := re.search(r"Fact number (\d+)", text)) else 0
        score = 3 + number % 2
        query = f"Fact number {number} about AlexNet?"
        if worse and LONG not in text and query not in searched:
            score -= 1
        return json.dumps({"score": score, "reasoning": "scripted"})

    def optimizer(messages: tuple, options: object) -> str:
        i = (getattr(options, "seed", 0) or 0) % 1000
        return f"<INS>Answer briefly, variant {i}.</INS>" if i % 2 and cheaper else f"<INS>Answer the question fully, variant {i}.</INS>"

    pool = ModelPool(scripted={"task": ScriptedLLM(default=task, model="task"),
                               "judge": ScriptedLLM(default=judge, model="judge"),
                               "optimizer": ScriptedLLM(default=optimizer, model="optimizer")})
    cfg = experiment_config(tmp_path, questions=validation + 12,
                            optimizer={"steps": 1, "candidates_per_step": candidates, "minibatch_size": 3,
                                       "objective": "cost", "margin": 0.25},
                            data={"split": {"exemplar": 2, "optimization": 3, "validation": validation, "heldout": 4,
                                            "seed": 1}})
    exp = Experiment(config_from_dict(cfg, base_dir=tmp_path, source="test.toml"), pool=pool, progress=False)
    try:
        searched.update(e.query for e in exp.dataset.examples_in("optimization"))
        return exp.optimize()
    finally:
        exp.close()


def test_a_shorter_instruction_at_the_same_quality_is_returned_with_a_non_inferiority_claim_and_the_saving(
        tmp_path: Path) -> None:
    result = _cost_world(tmp_path, worse=False, validation=76)
    v = result.validation
    assert v is not None and v.objective.name == "cost" and v.margin == 0.25 and v.winner is not None
    assert "briefly" in result.best_instruction and result.validated
    assert v.saving is not None and v.saving.lower and v.saving.difference_ci is not None
    assert v.saving.difference_ci[1] < 0
    assert v.saving.relative is not None and v.saving.relative > 0.2  # 1 completion token instead of 12, weighted x4
    assert v.winner.difference == 0.0  # the same quality, question by question
    assert "lower cost per answer (task tokens, completion x4)" in result.headline()
    assert "not worse by more than 0.25 (betting p = " in result.headline()
    # The quality interval beside a cost claim is the betting test's own, and says so, with its pairs.
    assert "90% betting interval, " in result.headline() and " pairs)" in result.headline()
    # The objective and the margin are in the decision's design (and so in its key).
    assert v.design is not None and v.design.objective == "cost" and v.design.margin == 0.25
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["validation"]["saving"]["lower"] and summary["validation"]["objective"] == "cost"
    # The quality-cost front: in summary.json (and its copy in the study), drawn, and logged to MLflow.
    front = summary["pareto_front"]
    assert [p["instruction"] for p in front] == [result.best_instruction] and front[0]["cost"] < returned_cost(summary)
    assert (tmp_path / "out" / "pareto.png").stat().st_size > 1000
    from opro.search import SearchStudy
    from opro.search.storage import open_storage

    stored = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 'out' / 'optuna.db'}"), name=result.study_name).summary()
    assert stored is not None and stored["pareto_front"] == front
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    assert "pareto.png" in {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(mlflow_run_of(result.recorded))}
    # A rerun resumes the decision from the study (scores and costs kept there): the same claim.
    again = _cost_world(tmp_path, worse=False, validation=76)
    assert again.validation is not None and (again.validation.verdict, again.validation.saving) == (v.verdict, v.saving)
    # The optimizer saw each instruction's mean answer length beside its score (the initial one's 12 words).
    meta = "".join(p.read_text() for p in sorted((tmp_path / "out" / "metaprompts").iterdir()))
    # (its score is that of the optimization questions this split draws: the words beside it are the point)
    assert re.search(r"score:\n[1-5]\.\d\d\nanswer length:\n12 tokens", meta) and "shorter answers cost less" in meta


def _moved(instruction: str, moves: tuple[float, ...], index: int, cost: float,
           params: dict[str, int] | None = None) -> CandidateRecord:
    """A complete candidate scored on 6 search questions: the initial configuration's scores (3, 4, 3, 4,
    3, 4) moved by ``moves``, at ``cost`` weighted tokens per answer."""
    from opro.program.cost import CostSummary

    scores = tuple(x + d for x, d in zip((3.0, 4.0, 3.0, 4.0, 3.0, 4.0), moves, strict=True))
    return CandidateRecord(step=index and 1, instruction=instruction, score=sum(scores) / len(scores), n_scored=6,
                           n_invalid=0, n_errors=0, status="complete", trial_number=index, index=index, scores=scores,
                           params=params or {}, cost=CostSummary(n=6, prompt_tokens=cost, completion_tokens=0.0,
                                                                 seconds=1.0, cost=cost, unit="tokens"))


def test_the_cost_finalist_chosen_is_the_one_likeliest_to_confirm_its_saving_on_the_same_questions() -> None:
    """Issues 61 and 57: the cheapest finalist within the margin of the initial configuration was chosen,
    its search-plus-selection mean set against the initial one's search mean (other questions); and even
    paired, a cheaper finalist truly worse by 0.5 lands within the margin on 6 search questions often
    enough that the confirmation, which then refuses it, never sees the equal one (bench_selection --cost
    --space: 0.58). The choice is now the largest expected confirmed saving, from the paired differences
    on the search questions: a saving of 50% that a 44-pair confirmation would show within the margin in
    about 15% of runs loses to a saving of 30% it would show in nearly all."""
    from opro.config import OptimizerSection
    from opro.program.cost import CostSummary
    from opro.search.finalists import chosen_finalist, expected_saving
    from opro.search.results import CandidateRecord

    def rec(instruction: str, scores: tuple[float, ...], index: int, cost: float) -> CandidateRecord:
        return CandidateRecord(step=index and 1, instruction=instruction, score=sum(scores) / len(scores),
                               n_scored=len(scores), n_invalid=0, n_errors=0, status="complete", trial_number=index,
                               index=index, scores=scores,
                               cost=CostSummary(n=len(scores), prompt_tokens=cost, completion_tokens=0.0, seconds=1.0,
                                                cost=cost, unit="tokens"))

    base = (3.0, 4.0, 3.0, 4.0, 3.0, 4.0)
    initial = rec("initial", base, 0, 100.0)
    # Mean -0.2 (within the margin of 0.25), spread 0.55; mean 0, spread 0.27.
    cheapest = rec("cheapest", tuple(x + d for x, d in zip(base, (-0.7, 0.3, -0.7, 0.3, 0.3, -0.7), strict=True)), 1, 50.0)
    equal = rec("cheaper", tuple(x + d for x, d in zip(base, (0.3, -0.3, 0.3, -0.3, 0.0, 0.0), strict=True)), 2, 70.0)
    settings = validation_settings(OptimizerSection(objective="cost", margin=0.25))
    history = [initial, cheapest, equal]
    # The selection scores (questions the initial configuration never answered) decide nothing under cost.
    easy = {"cheapest": [5.0] * 4, "cheaper": [1.0] * 4}
    pick = chosen_finalist((cheapest, equal), easy, initial="initial", n_confirmation=44,
                           settings=settings, history=history)
    assert pick == 1
    low = expected_saving(cheapest, initial, margin=0.25, alpha=0.05, n_confirmation=44)
    high = expected_saving(equal, initial, margin=0.25, alpha=0.05, n_confirmation=44)
    assert low is not None and high is not None and low < 0.1 < 0.29 < high <= 0.3
    # Two finalists as good as the initial one: the cheaper is chosen.
    same = rec("cheapest", equal.scores, 1, 50.0)
    assert chosen_finalist((same, equal), easy, initial="initial", n_confirmation=44,
                           settings=settings, history=[initial, same, equal]) == 0
    # By quality, the best mean over the search and selection questions.
    assert chosen_finalist((cheapest, equal), easy, initial="initial", n_confirmation=44,
                           settings=validation_settings(OptimizerSection()), history=history) == 0


def test_the_cost_finalists_are_those_likeliest_to_confirm_a_saving_not_the_cheapest_on_the_front() -> None:
    """Two cheaper candidates a little worse on 6 search questions, with a large spread (each truly worse
    by 0.5 in bench_selection --cost --space), fill the 2 finalist places of the cheapest-first front, and
    the equal, tighter candidate is never validated; ranked by expected confirmed saving it is a finalist."""
    from opro.config import OptimizerSection
    from opro.search.finalists import choose_finalists, cost_finalists

    history = [_moved("initial", (0.0,) * 6, 0, 100.0),
               _moved("cheapest", (-0.7, 0.3, -0.7, 0.3, 0.3, -0.7), 1, 40.0),
               _moved("cheaper", (-0.8, 0.4, -0.6, 0.4, 0.2, -0.5), 2, 45.0),
               _moved("equal", (0.3, -0.3, 0.3, -0.3, 0.0, 0.0), 3, 70.0)]
    settings = validation_settings(OptimizerSection(objective="cost", margin=0.25, finalists=2))
    assert [r.instruction for r in cost_finalists(history, initial="initial", margin=0.25)] == [
        "cheapest", "cheaper", "equal"]
    got = choose_finalists(history, initial="initial", settings=settings, n_confirmation=44)
    assert "equal" in [r.instruction for r in got] and [r.cost.cost for r in got if r.cost] == sorted(
        r.cost.cost for r in got if r.cost)


def test_the_cost_choice_pairs_each_finalist_with_the_initial_configuration_on_the_selection_questions() -> None:
    """Issue 57: on 6 search questions a cheaper, truly worse setting looked as good as the equal one in
    about one run in eight (bench_selection --cost --space), and selection questions the initial
    configuration never answered could not tell them apart (other questions, other difficulty). Under
    cost the initial configuration now answers the selection questions too, and the choice weighs each
    finalist's paired differences on the search and selection questions together."""
    from opro.config import OptimizerSection
    from opro.search.finalists import chosen_finalist, expected_saving

    initial = _moved("initial", (0.0,) * 6, 0, 100.0)
    # On the search questions both look level with the initial configuration (the cheaper one more so).
    cheaper = _moved("cheaper", (0.3, -0.3, 0.3, -0.3, 0.0, 0.0), 1, 50.0)
    equal = _moved("equal", (0.4, -0.4, 0.3, -0.3, 0.0, 0.0), 2, 70.0)
    settings = validation_settings(OptimizerSection(objective="cost", margin=0.25))
    history = [initial, cheaper, equal]
    assert chosen_finalist((cheaper, equal), {}, initial="initial", n_confirmation=60,
                           settings=settings, history=history) == 0
    # The selection questions, answered by all three: the cheaper one loses a point on each.
    base = [3.0, 4.0, 2.0, 5.0]
    selection = {"initial": base, "cheaper": [x - 1.0 for x in base], "equal": list(base)}
    assert chosen_finalist((cheaper, equal), selection, initial="initial", n_confirmation=60,
                           settings=settings, history=history) == 1
    paired = expected_saving(cheaper, initial, margin=0.25, alpha=0.05, n_confirmation=60,
                             selection=(selection["cheaper"], selection["initial"]))
    alone = expected_saving(cheaper, initial, margin=0.25, alpha=0.05, n_confirmation=60)
    assert paired is not None and alone is not None and paired < 0.1 < 0.4 < alone
    # A finalist's selection scores without the initial configuration's pair with nothing.
    assert expected_saving(cheaper, initial, margin=0.25, alpha=0.05, n_confirmation=60,
                           selection=(selection["cheaper"], [])) == alone


def test_the_cost_finalists_are_one_per_setting() -> None:
    """Issue 57: two wordings of one cheaper, truly worse setting that the search questions put level took
    both finalist places and left the equal setting unvalidated (5 of 60 runs of bench_selection --cost
    --space); each setting now has one place, its wording with the largest expected saving. Without a
    settings space every candidate is its own."""
    from opro.config import OptimizerSection
    from opro.search.finalists import choose_finalists

    short = {"top_k": 1, "answer_max_tokens": 48}
    history = [_moved("initial", (0.0,) * 6, 0, 100.0, {"top_k": 3, "answer_max_tokens": 128}),
               _moved("short a", (0.1, -0.1, 0.1, -0.1, 0.0, 0.0), 1, 40.0, short),
               _moved("short b", (0.2, -0.2, 0.1, -0.1, 0.0, 0.0), 2, 40.0, short),
               _moved("equal", (0.3, -0.3, 0.3, -0.3, 0.0, 0.0), 3, 70.0, {"top_k": 1, "answer_max_tokens": 128})]
    settings = validation_settings(OptimizerSection(objective="cost", margin=0.25, finalists=2))
    assert [r.instruction for r in choose_finalists(history, initial="initial", settings=settings,
                                                    n_confirmation=44)] == ["short a", "equal"]
    wordings = [replace(r, params={}) for r in history]
    assert [r.instruction for r in choose_finalists(wordings, initial="initial", settings=settings,
                                                    n_confirmation=44)] == ["short a", "short b"]


def test_the_share_saved_in_the_validation_verdict_covers_where_each_question_saves_the_same() -> None:
    """Issue 57, item 5, where the validation stage computes it: costs vary by question, the cut is about
    150 tokens on each; the share's interval used to divide the difference's by the initial mean as if
    known (covering about a third of samples) and is now Fieller's."""
    from opro.search.saving import cost_saving
    from opro.testing.cost_worlds import costs, true_saving

    rng = np.random.default_rng(61)
    new, old = costs(rng, sims=300, n=20, cut="constant")
    savings = [cost_saving(list(x), list(y), unit="tokens") for x, y in zip(new, old, strict=True)]
    truth = true_saving("constant")
    covered = [s is not None and s.relative_ci is not None and s.relative_ci[0] <= truth <= s.relative_ci[1]
               for s in savings]
    assert np.mean(covered) >= 0.93


def returned_cost(summary: dict) -> float:
    """The initial configuration's cost per answer on the search questions, as summary.json gives it."""
    return float(summary["cost"]["initial"]["cost"])


def test_shorter_answers_worse_by_more_than_the_margin_return_the_initial_configuration(tmp_path: Path) -> None:
    result = _cost_world(tmp_path, worse=True)
    v = result.validation
    assert v is not None and v.winner is None and not result.validated
    assert result.best_instruction == "Answer the question."
    chosen = next(f for f in v.finalists if f.chosen)
    # It was validated (the search could not tell), cheaper, and a point worse.
    assert "briefly" in chosen.instruction and chosen.difference == -1.0 and v.n_questions > 0
    assert v.saving is not None and v.saving.lower
    assert "no finalist was shown cheaper and not worse than the initial configuration by more than 0.25" in v.verdict
    assert "the initial configuration is returned" in result.headline()


def test_under_cost_the_initial_configuration_answers_the_selection_questions(tmp_path: Path) -> None:
    """Issue 57: two cheaper wordings reach the validation stage; the one confirmed is chosen on the search
    and selection questions paired with the initial configuration, which answered them too (kept in the
    study, so a rerun asks nothing), and a worse one is still refused by the confirmation."""
    from opro.search import SearchStudy
    from opro.search.storage import open_storage

    result = _cost_world(tmp_path, worse=True, candidates=4)
    v = result.validation
    assert v is not None and v.design is not None and not result.validated
    assert v.design.selection_questions == 4 and len(v.finalists) == 2
    assert all("briefly" in f.instruction for f in v.finalists)
    study = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 'out' / 'optuna.db'}"), name=result.study_name)
    cfg = config_from_dict(experiment_config(tmp_path), base_dir=tmp_path, source="test.toml")
    exp = Experiment(cfg, pool=scripted_pool(), progress=False)
    try:
        validation = [e.query for e in exp.dataset.examples_in("validation")]
    finally:
        exp.close()
    initial = study.validation_scores(result.initial_instruction, validation[:4])
    chosen = next(f for f in v.finalists if f.chosen)
    assert initial is not None and len(initial) == 4
    # The finalists lost a point on each selection question against the initial configuration's answers.
    assert [round(x - y, 6) for x, y in zip(study.validation_scores(chosen.instruction, validation[:4]) or [],
                                             initial, strict=True)] == [-1.0] * 4


def test_cost_finalists_are_the_cheapest_on_the_front_that_are_not_clearly_worse() -> None:
    from opro.program.cost import CostSummary
    from opro.search.finalists import cost_finalists
    from opro.search.results import CandidateRecord

    def rec(instruction: str, score: float, cost: float, index: int) -> CandidateRecord:
        return CandidateRecord(step=0 if instruction == "initial" else 1, instruction=instruction, score=score,
                               n_scored=6, n_invalid=0, n_errors=0, status="complete", trial_number=index, index=index,
                               cost=CostSummary(n=6, prompt_tokens=cost, completion_tokens=0, seconds=1.0, cost=cost,
                                                unit="tokens"))

    history = [rec("initial", 4.0, 100, 0), rec("same, half the cost", 4.0, 50, 1), rec("a bit worse, cheapest", 3.8, 40, 2),
               rec("clearly worse", 3.5, 10, 3), rec("dominated", 3.9, 60, 4), rec("better, dearer", 4.5, 120, 5)]
    got = [r.instruction for r in cost_finalists(history, initial="initial", margin=0.25)]
    assert got == ["a bit worse, cheapest", "same, half the cost"]
    assert cost_finalists(history, initial="initial", margin=0.0) == [history[1]]
    # With per-question scores, "not clearly worse" is the paired 95% t interval's upper end above
    # -margin: half a point lower on average but noisy passes, half a point lower everywhere does not.
    initial = replace(history[0], scores=(4.0, 4.0, 4.0, 4.0, 4.0, 4.0))
    noisy = replace(rec("noisy", 3.5, 50, 1), scores=(5.0, 2.0, 5.0, 2.0, 5.0, 2.0))
    steady = replace(rec("steadily worse", 3.5, 40, 2), scores=(3.5,) * 6)
    assert cost_finalists([initial, noisy, steady], initial="initial", margin=0.25) == [noisy]


def test_with_objective_cost_the_sampler_draws_from_the_quality_cost_front() -> None:
    """top_k 4 scores a hair above top_k 1 at twice the cost: a score-only sampler goes for 4, the
    two-objective one (maximize the score, minimize the cost) mostly for 1."""
    from collections import Counter

    from opro.program.cost import CostSummary
    from opro.search.results import CandidateRecord
    from opro.search.space import SearchSpace

    def rec(i: int, top_k: int) -> CandidateRecord:
        return CandidateRecord(
            step=1, instruction=f"i{i}", score={1: 4.0, 2: 4.0, 4: 4.05, 8: 3.9}[top_k], n_scored=6, n_invalid=0,
            n_errors=0, status="complete", trial_number=i, index=i, params={"top_k": top_k},
            cost=CostSummary(n=6, prompt_tokens=200.0 * top_k, completion_tokens=40, seconds=1.0,
                             cost=200.0 * top_k + 160, unit="tokens"))

    history = [rec(i, k) for i, k in enumerate([1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 4])]
    drawn = {}
    for objective in ("quality", "cost"):
        space = SearchSpace(dimensions={"top_k": [1, 2, 4, 8]}, initial={"top_k": 4}, objective=objective)  # type: ignore[arg-type]
        drawn[objective] = Counter(p["top_k"] for step in range(1, 6) for p in space.sample(history, 4, step=step))
    assert drawn["quality"].most_common(1)[0][0] == 4
    assert drawn["cost"].most_common(1)[0][0] == 1 and drawn["cost"][1] > drawn["quality"][1]


def test_without_a_cheaper_candidate_nothing_is_validated_and_the_initial_configuration_is_returned(
        tmp_path: Path) -> None:
    result = _cost_world(tmp_path, worse=False, cheaper=False)
    v = result.validation
    assert v is not None and not v.finalists and v.n_questions == 0 and not result.validated
    assert result.best_instruction == "Answer the question."
    assert v.verdict.startswith("no candidate of the search was cheaper per answer than the initial configuration")


# -- opro compare --margin: non-inferiority and a lower cost, held out (issue 50, item 4) -------------
def _margin_pool(*, worse: bool) -> object:
    """The initial instruction ("Answer the question.") answers "Yes."; any other, twelve words. The
    judge scores a question the same under either, or, with ``worse``, the one-word answer a point lower."""
    import re

    from fault_server import instruction_of

    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    def task(messages: tuple, options: object) -> str:
        return "Yes." if instruction_of(messages[-1].content).strip().startswith("Answer the question.") else LONG

    def judge(messages: tuple, options: object) -> str:
        text = messages[-1].content
        number = int(m.group(1)) if (m := re.search(r"Fact number (\d+)", text)) else 0
        return json.dumps({"score": 3 + number % 2 - (1 if worse and LONG not in text else 0), "reasoning": "s"})

    return ModelPool(scripted={"task": ScriptedLLM(default=task, model="task"),
                               "judge": ScriptedLLM(default=judge, model="judge"),
                               "optimizer": ScriptedLLM(default=lambda m, o: "<INS>x</INS>", model="optimizer")})


def _compare_margin(config: Path, monkeypatch: pytest.MonkeyPatch, *extra: str, worse: bool = False,
                    baseline: str = "text:Answer in full.") -> tuple[int, str]:
    """`opro compare` of the initial (one-word) instruction against ``baseline`` on the scripted world."""
    from typer.testing import CliRunner

    from opro.cli import app

    monkeypatch.setattr("opro.experiment.ModelPool", lambda *a, **k: _margin_pool(worse=worse))
    monkeypatch.setenv("COLUMNS", "400")
    res = CliRunner().invoke(app, ["compare", str(config), "--baseline", baseline, "--prompt", "initial",
                                   "--no-mlflow", "--no-progress", *extra])
    return res.exit_code, " ".join(res.output.split())


def test_compare_margin_says_not_worse_and_cheaper_and_promotes_only_then(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fakes import write_config

    from opro.paths import RunDir

    config = write_config(tmp_path, heldout=80, questions=98)  # tied pairs need about 60: see the next test
    code, said = _compare_margin(config, monkeypatch, "--margin", "0.25", "--name", "m", "--promote", "cheap")
    assert code == 0, said
    # Equal on every one of 80 questions: the betting test's capital against "worse by 0.25" reaches 1/p.
    assert "quality +0.00 [-0.21, +0.21], not worse by more than 0.25 (betting test on 80 pairs, p = 0.012)" in said
    assert "fewer tokens per answer [" in said and "promoted initial to alias 'cheap'" in said
    data = json.loads((tmp_path / "out" / "compare" / "m" / "report.json").read_text())
    assert data["margin"] == 0.25
    versus = data["prompts"][1]["versus_baseline"]
    assert versus["non_inferiority"]["passed"] and versus["non_inferiority"]["p"] == pytest.approx(0.01166, abs=1e-4)
    assert versus["non_inferiority"]["min_pairs"] == 9  # no sample of fewer pairs could show it (bets tuned to 80)
    assert versus["cost_difference"]["lower"] and versus["cost_difference"]["tokens"]["estimate"] < 0
    md = (tmp_path / "out" / "compare" / "m" / "report.md").read_text()
    assert "Non-inferiority margin 0.25 judge points" in md and "non-inferiority p (margin 0.25)" in md
    assert "betting confidence sequence" in md and "report.json gives min_pairs" in md
    # The promoted version says under which margin and test it was judged, and what its answers cost.
    from fakes import mlflow_client

    tags = mlflow_client(config).get_prompt_version_by_alias("qa-t", "cheap").tags
    assert tags["opro.heldout_margin"] == "0.25" and tags["opro.heldout_p_noninferiority"] == f"{versus['non_inferiority']['p']:.4g}"
    assert tags["opro.heldout_test"].startswith("one-sided") and float(tags["opro.heldout_tokens_difference"]) < 0
    assert float(tags["opro.heldout_tokens_per_answer"]) > 0 and tags["opro.heldout_cost_unit"] == "tokens"
    # The margin is part of the attempt: another margin on the same held-out questions is refused.
    assert RunDir(tmp_path / "out").read_promotions()[0]["margin"] == 0.25
    code, said = _compare_margin(config, monkeypatch, "--margin", "0.5", "--promote", "cheap")
    assert code == 1 and "already had a promotion attempt on these 80 held-out questions" in said
    assert "another margin" in said
    # Without a margin the same cheaper prompt is no gain, so it is not promoted.
    code, said = _compare_margin(config, monkeypatch, "--promote", "gain")
    assert code == 1 and "not a significant gain at alpha 0.05" in said


def test_compare_margin_claims_nothing_on_ten_tied_pairs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On 10 held-out questions a prompt that fails on 1 question in 10 shows no failure in 35% of
    samples. Ten equal scores gave the sign flips p = 1/1024; the betting test's interval of ten ties is
    +-1.37 on the 1-5 scale, so the claim is refused, and --promote with it, saying why."""
    from fakes import write_config

    code, said = _compare_margin(write_config(tmp_path), monkeypatch, "--margin", "0.25", "--promote", "cheap")
    assert code == 1, said
    assert ("quality +0.00 [-1.37, +1.37], not shown to be within 0.25 of the baseline (betting test on 10 pairs, "
            "p = 0.56 > alpha 0.05)") in said
    assert "promoted initial" not in said


def test_compare_margin_refuses_a_cheaper_prompt_worse_by_more_than_the_margin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fakes import write_config

    code, said = _compare_margin(write_config(tmp_path, heldout=80, questions=98), monkeypatch, "--margin", "0.25",
                                 "--promote", "cheap", worse=True)
    assert code == 1, said
    assert ("quality -1.00 [-1.16, -0.75], not shown to be within 0.25 of the baseline (betting test on 80 pairs, "
            "p = 1 > alpha 0.05)") in said
    assert "not shown to be worse by less than 0.25 at alpha 0.05" in said and "fewer tokens per answer" in said


def test_compare_margin_refuses_a_prompt_as_good_but_not_cheaper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fakes import write_config

    # Another instruction of as many words (the scripted LLM counts words as tokens) with the same one-word
    # answers: not worse (p = 0.012), but not cheaper. (The identical instruction is refused earlier.)
    code, said = _compare_margin(write_config(tmp_path, heldout=80, questions=98), monkeypatch, "--margin", "0.25",
                                 "--promote", "same", baseline="text:Answer the question.Briefly")
    assert code == 1, said
    assert "not worse by more than 0.25 (betting test on 80 pairs, p = 0.012)" in said
    assert "its cost per answer is not lower (interval not below 0)" in said


def test_exports_carry_the_cost_per_answer_with_the_data_it_was_measured_on(tmp_path: Path) -> None:
    from fakes import mlflow_client, optimized

    from opro.export import export_prompt
    from opro.export.sources import resolve_prompt
    from opro.heldout.compare import compare_prompts, save_comparison

    config = optimized(tmp_path)
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"], n_resamples=200)
        save_comparison(report, experiment=exp, name="c", mlflow=False)
        cfg = exp.config
    finally:
        exp.close()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    best = resolve_prompt("best", config=cfg)
    prov = json.loads(export_prompt(best, format="json", out=tmp_path / "e", config=cfg).paths[0].read_text())["provenance"]
    assert prov["cost"] == summary["cost"]["returned"] and prov["cost"]["n"] > 0
    assert prov["cost_basis"].startswith("search questions")
    compared = prov["comparison"]
    heldout = report.prompts[1].cost
    assert compared["split"] == "heldout" and heldout is not None and compared["cost"] == heldout.as_dict()
    assert compared["cost_difference"]["tokens"]["estimate"] > 0  # "Using the context: yes." is longer than "Yes."
    result = export_prompt(best, format="mlflow", config=cfg)
    tags = mlflow_client(config).get_prompt_version(cfg.prompt_name, result.version).tags
    search = summary["cost"]["returned"]
    assert tags["opro.tokens_per_answer"] == f"{search['prompt_tokens'] + search['completion_tokens']:.1f}"
    assert tags["opro.cost_per_answer"] == f"{search['cost']:.6g}" and tags["opro.cost_unit"] == "tokens"
    assert tags["opro.cost_basis"].startswith("search questions") and tags["opro.seconds_per_answer"]
    assert tags["opro.compared.tokens_per_answer"] == f"{heldout.prompt_tokens + heldout.completion_tokens:.1f}"
    assert tags["opro.compared.cost_basis"].startswith("heldout questions of ") and "10 answers" in tags["opro.compared.cost_basis"]
    # Token counts survive redaction; a secret under a count's name (a string) does not.
    from opro.redaction import redact

    assert redact({"prompt_tokens": 5, "tokens": "sk-abc", "access_tokens": 3, "token": 1}) == {"prompt_tokens": 5}


def test_compare_margin_holm_adjusts_over_the_prompts_and_logs_the_margin(tmp_path: Path) -> None:
    from fakes import write_config

    from opro.heldout.compare import compare_prompts, save_comparison

    exp = Experiment.from_file(write_config(tmp_path, heldout=80, questions=98), pool=_margin_pool(worse=False),  # type: ignore[arg-type]
                               progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["text:Answer in full.", "initial", "text:Answer in full, please."],
                                 margin=0.25, n_resamples=200)
        saved = save_comparison(report, experiment=exp, name="h")
    finally:
        exp.close()
    tests = [v.noninferiority for v in report.versus if v is not None]
    # Both equal to the baseline on all 80 questions: raw p 0.0117 each (the betting test), Holm over 2: 0.0233.
    raw = tests[0].p_value if tests[0] is not None else None
    assert raw == pytest.approx(0.01166, abs=1e-4)
    assert [(t.p_value, t.p, t.n_comparisons) for t in tests if t is not None] == [(raw, 2 * raw, 2)] * 2
    assert "not worse by more than 0.25 (betting test on 80 pairs, p = 0.023, Holm over 2)" in report.sentences()[0]
    # Only the one-word answers are cheaper (the third prompt is the baseline with more words).
    assert [v.cost.lower for v in report.versus if v is not None and v.cost is not None] == [True, False]
    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri=exp.config.mlflow_uri).get_run(saved.recorded[0].ref)
    assert run.data.params["compare.margin"] == "0.25" and run.data.metrics["prompt_1.noninferiority_p"] == raw


def test_the_non_inferiority_p_value_agrees_with_its_lower_bound() -> None:
    from opro.judges.parsing import SCORE_MAX, SCORE_MIN
    from opro.stats.noninferiority import noninferiority

    scale = (SCORE_MIN, SCORE_MAX)
    for a, b in (([3.0] * 80, [3.0] * 80), ([4.0, 3.0] * 40, [3.0, 3.0] * 40), ([2.0] * 80, [3.0] * 80)):
        t = noninferiority(a, b, margin=0.25, alpha=0.05, scale=scale)
        assert t.passed == (t.lower > -0.25) and 0 < t.p_value <= 1
    assert noninferiority([], [], margin=0.25, alpha=0.05, scale=scale).text().endswith("scored for both")
    few = noninferiority([5.0] * 4, [1.0] * 4, margin=0.25, alpha=0.05, scale=scale)
    assert few.too_few and not few.passed and "needs at least 5" in few.text()


def test_a_saving_or_a_surcharge_is_said_with_its_interval_in_the_same_words() -> None:
    """A prompt dearer than its baseline once read "2% more tokens per answer [-4%, -1% fewer]"."""
    from opro.program.cost import CostDifference, Difference

    def diff(estimate: float, lo: float, hi: float) -> CostDifference:
        tokens = Difference(estimate=estimate, ci=(lo, hi), n=20)
        # The share saved (1 - the ratio of the means) with its interval, as paired_difference gives it.
        return CostDifference(tokens=tokens, seconds=Difference(0.0, (-0.1, 0.1), 20), cost=tokens,
                              baseline_cost=1000.0, baseline_tokens=1000.0, tokens_saving_ci=(-hi / 1000, -lo / 1000))

    assert diff(18.0, 7.0, 29.0).saving_text().startswith("2% more tokens per answer [1%, 3% more]")
    assert diff(-300.0, -350.0, -250.0).saving_text().startswith("30% fewer tokens per answer [25%, 35% fewer]")
