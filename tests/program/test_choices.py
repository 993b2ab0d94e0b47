"""The task model as a priced dimension of the search (issue 58): named task models
(``[models.task_choices.NAME]``, the embedded ``0.5b`` and ``1.5b``), ``[search.space].task_model``,
calls routed to each candidate's model, each answer priced by the model that gave it, and the cheapest
model that answers as well returned with a validated non-inferiority claim."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fakes import experiment_config

from opro.config import config_from_dict
from opro.errors import ConfigError
from opro.evaluation.batch import EvaluationRow
from opro.experiment import Experiment, RunResult
from opro.llm.pool import ModelPool, ModelSpec
from opro.llm.scripted import ScriptedLLM
from opro.llm.speed import TokenRate, calibrate
from opro.program.choices import BUILTIN_TASK_MODELS, task_cost_model
from opro.program.cost import CostModel

INITIAL = "Answer the question."
#: USD per million tokens: the big model's, and the small one's, ten times cheaper.
BIG = {"price_prompt": 1.0, "price_completion": 4.0}
SMALL = {"price_prompt": 0.1, "price_completion": 0.4}


def _config(tmp_path: Path, *, space: dict | None = None, small: dict | None = None, objective: str = "cost",
            validation: int = 14, **optimizer: object) -> dict:
    """The big model is ``[models.task]``; ``small`` a ``[models.task_choices.small]`` table (scripted)."""
    return experiment_config(
        tmp_path, questions=16 + validation,
        data={"split": {"exemplar": 2, "optimization": 4, "validation": validation, "heldout": 4, "seed": 1}},
        models={"task": {"backend": "scripted", "model": "big", **BIG},
                "task_choices": {"small": {"backend": "scripted", "model": "small", **(SMALL if small is None else small)}}},
        search={"space": {"task_model": ["task", "small"]} if space is None else space},
        optimizer={"steps": 1, "candidates_per_step": 1, "minibatch_size": 2, "objective": objective, **optimizer})


def _pool(*, worse: bool = False, searched: set[str] | None = None) -> ModelPool:
    """"big" answers "Yes.", "small" "Yep." (one token each). The judge scores a question alike from
    either; with ``worse``, a small model's answer a point lower on every question the search does
    not score (``searched``), so only the validation stage can tell."""
    seen = set() if searched is None else searched

    def judge(messages: tuple, options: object) -> str:
        text = messages[-1].content
        number = int(m.group(1)) if (m := re.search(r"Fact number (\d+)", text)) else 0
        query = f"Fact number {number} about AlexNet?"
        score = 3 + number % 2 - (1 if worse and "Yep." in text and query not in seen else 0)
        return json.dumps({"score": score, "reasoning": "scripted"})

    return ModelPool(scripted={
        "big": ScriptedLLM(default="Yes.", model="big"),
        "small": ScriptedLLM(default="Yep.", model="small"),
        "judge": ScriptedLLM(default=judge, model="judge"),
        "optimizer": ScriptedLLM(default=lambda m, o: f"<INS>Answer in full, variant {o.seed % 1000}.</INS>",
                                 model="optimizer")})


def _experiment(tmp_path: Path, cfg: dict, pool: ModelPool | None = None) -> Experiment:
    return Experiment(config_from_dict(cfg, base_dir=tmp_path, source="test.toml"), pool=pool or _pool(),
                      progress=False)


def _optimize(tmp_path: Path, cfg: dict, *, worse: bool = False) -> RunResult:
    searched: set[str] = set()
    exp = _experiment(tmp_path, cfg, _pool(worse=worse, searched=searched))
    try:
        searched.update(e.query for e in exp.dataset.examples_in("optimization"))
        return exp.optimize()
    finally:
        exp.close()


# -- named task models, checked like a role's table -----------------------------------------------------
def test_task_models_are_named_tables_and_the_embedded_ones_need_none(tmp_path: Path) -> None:
    config = config_from_dict(_config(tmp_path), base_dir=tmp_path)
    models = config.task_models()
    assert list(models) == ["task", "0.5b", "1.5b", "small"]
    assert models["small"] == ModelSpec(backend="scripted", model="small", price_prompt=0.1, price_completion=0.4)
    assert {n: models[n].model for n in BUILTIN_TASK_MODELS} == dict(BUILTIN_TASK_MODELS)
    assert config.initial_task_model() == "task"
    # The embedded default is named by its embedded name, so ["0.5b", "1.5b"] are two choices.
    cfg = experiment_config(tmp_path, models={"task": {}}, search={"space": {"task_model": ["0.5b", "1.5b"]}})
    assert config_from_dict(cfg, base_dir=tmp_path).initial_task_model() == "0.5b"


@pytest.mark.parametrize(("table", "said"), [
    ({"backend": "openai"}, r"\[models\.task_choices\.small\] sets backend = 'openai' but no `model`"),
    ({"backend": "scripted", "model": "small", "temperature": 1}, r"unknown key \[models\.task_choices\.small\]\.temperature"),
    ({"backend": "scripted", "model": "small", "price_prompt": 1.0}, r"models\.task_choices\.small"),
    ("small", r"\[models\.task_choices\.small\] must be a table"),
])
def test_a_task_choice_passes_the_checks_of_a_role_table(tmp_path: Path, table: object, said: str) -> None:
    cfg = _config(tmp_path)
    cfg["models"]["task_choices"]["small"] = table
    with pytest.raises(ConfigError, match=said):
        config_from_dict(cfg, base_dir=tmp_path, source="t.toml")


@pytest.mark.parametrize(("name", "said"), [("task", "is \\[models.task\\]'s own name"),
                                            ("two words", "cannot name a task model")])
def test_a_task_choice_needs_a_name_a_configuration_can_carry(tmp_path: Path, name: str, said: str) -> None:
    cfg = _config(tmp_path)
    cfg["models"]["task_choices"] = {name: {"backend": "scripted", "model": "small"}}
    with pytest.raises(ConfigError, match=said):
        config_from_dict(cfg, base_dir=tmp_path, source="t.toml")


def test_an_unknown_task_model_is_refused_naming_the_key_and_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_config(tmp_path, space={"task_model": ["task", "large"]}), base_dir=tmp_path, source="t.toml")
    said = str(err.value)
    assert "[search.space].task_model = 'large' names no task model" in said
    assert "[models.task_choices.NAME] table's name (small)" in said and "(0.5b, 1.5b)" in said
    with pytest.raises(ConfigError, match="lists 'task' and 'small', which are the same model table"):
        cfg = _config(tmp_path, small=BIG)
        cfg["models"]["task_choices"]["small"]["model"] = "big"
        config_from_dict(cfg, base_dir=tmp_path)
    # A prompt that names one (compare --set task_model=large) is refused by the same words.
    exp = _experiment(tmp_path, _config(tmp_path))
    try:
        with pytest.raises(ConfigError, match=r"task_model = 'large' names no task model.*\(small\)"):
            exp.program.answer("Fact number 1 about AlexNet?", template=exp.template(INITIAL).with_settings(
                task_model="large"))
    finally:
        exp.close()


# -- calls routed to the candidate's model, one cache entry per model ------------------------------------
def test_a_template_is_answered_by_its_task_model_and_cached_per_model(tmp_path: Path) -> None:
    pool = _pool()
    exp = _experiment(tmp_path, _config(tmp_path), pool)
    try:
        program, query = exp.program, "Fact number 1 about AlexNet?"
        plain, small = exp.template(INITIAL), exp.template(INITIAL).with_settings(task_model="small")
        assert program.answer(query, template=plain).text == "Yes."
        assert program.answer(query, template=small).text == "Yep."
        # The same prompt to the other model is no cache hit of the first's.
        assert program.answer(query, template=plain.with_settings(task_model="task")).completion.cached
        again = program.answer(query, template=small)
        assert again.text == "Yep." and again.completion.cached and again.completion.model == "small"
        # Several templates of one question, asked together: each by its own model, in order.
        group = program.answer_group("Fact number 2 about AlexNet?", templates=[small, plain, small])
        assert [a.text for a in group] == ["Yep.", "Yes.", "Yep."]  # type: ignore[union-attr]
        assert len(pool.get(ModelSpec(backend="scripted", model="small")).calls) == 2  # type: ignore[attr-defined]
        # Without the experiment's models, a program refuses a template naming one.
        from opro.errors import PromptError
        from opro.program.rag import RAGProgram

        lone = RAGProgram(retriever=exp.retriever, llm=exp.client("task"))
        with pytest.raises(PromptError, match="answered by the task model 'small'"):
            lone.answer(query, template=small)
    finally:
        exp.close()


def test_two_task_models_of_one_endpoint_share_its_concurrency_limit() -> None:
    from opro.llm.factory import ClientFactory

    factory = ClientFactory(pool=ModelPool(), cache=None)
    a = factory.client(ModelSpec(backend="openai", model="m-small", base_url="http://127.0.0.1:9/v1"), role="task")
    b = factory.client(ModelSpec(backend="openai", model="m-large", base_url="http://127.0.0.1:9/v1"), role="task")
    c = factory.client(ModelSpec(backend="openai", model="m-large", base_url="http://localhost:9/v1"), role="task")
    assert a.slots is b.slots and a.slots is not c.slots


# -- each answer priced by the model that gave it ----------------------------------------------------------
def _row(model: str, prompt: int = 100, completion: int = 10) -> EvaluationRow:
    return EvaluationRow(query="q", reference="r", prompt_tokens=prompt, completion_tokens=completion,
                         latency_s=1.0, model=model)


def test_each_answer_is_priced_by_its_model_in_usd_or_in_measured_seconds(tmp_path: Path) -> None:
    model = config_from_dict(_config(tmp_path), base_dir=tmp_path).cost_model()
    assert model.unit == "usd" and [m.name for m in model.models] == ["task", "small"]
    assert model.per_answer([_row("big"), _row("small")]) == pytest.approx([140e-6, 14e-6])
    # Without prices for every model: seconds, at each one's own measured seconds per token.
    specs = {"task": ModelSpec(backend="llamacpp", model="qwen2.5-coder-1.5b-instruct"),
             "0.5b": ModelSpec(backend="llamacpp", model="qwen2.5-coder-0.5b-instruct")}
    rates = {"llamacpp:qwen2.5-coder-1.5b-instruct": TokenRate("a", 0.01, 0.1, measured="2026-01-01", session="s", calls=4),
             "llamacpp:qwen2.5-coder-0.5b-instruct": TokenRate("b", 0.004, 0.05, measured="2026-01-01", session="s", calls=4)}
    seconds = task_cost_model(specs, prices={}, completion_weight=4.0, rates=rates)
    assert seconds.unit == "seconds" and seconds.measure.startswith("task seconds")
    big, small = seconds.per_answer([_row("qwen2.5-coder-1.5b-instruct"), _row("qwen2.5-coder-0.5b-instruct")])
    assert (big, small) == pytest.approx((100 * 0.01 + 10 * 0.1, 100 * 0.004 + 10 * 0.05))
    # One model: its prices, or its weighted tokens, as before.
    one = task_cost_model({"task": specs["task"]}, prices={}, completion_weight=4.0)
    assert one == CostModel(completion_weight=4.0)


def test_the_calibration_measures_each_models_seconds_per_token_back_to_back() -> None:
    from opro.llm.client import Completion

    class Timed(ScriptedLLM):
        """Seconds linear in the tokens, at this model's own rates."""

        def __init__(self, prompt_s: float, completion_s: float, name: str) -> None:
            super().__init__(rules=[("Count upward", " ".join(str(i) for i in range(40)))], default="done", model=name)
            self.rate = (prompt_s, completion_s)

        def generate(self, messages: tuple, options: object) -> Completion:
            c = super().generate(messages, options)  # type: ignore[arg-type]
            words = c.text.split()[: options.max_tokens]  # type: ignore[attr-defined]
            return Completion(text=" ".join(words), model=c.model, prompt_tokens=c.prompt_tokens,
                              completion_tokens=len(words),
                              latency_s=c.prompt_tokens * self.rate[0] + len(words) * self.rate[1])

    got = calibrate({"a": Timed(0.002, 0.05, "a"), "b": Timed(0.006, 0.11, "b")}, seed=3)
    assert (got["a"].prompt_s, got["a"].completion_s) == pytest.approx((0.002, 0.05), rel=0.02)
    assert (got["b"].prompt_s, got["b"].completion_s) == pytest.approx((0.006, 0.11), rel=0.02)
    assert got["a"].session == got["b"].session and got["a"].basis.startswith("calibrated here on ")


def test_the_plan_prices_each_model_choice_and_the_first_moves_try_the_cheaper_one(tmp_path: Path) -> None:
    from opro.probe.plan import answer_cost, first_moves_of

    config = config_from_dict(_config(tmp_path), base_dir=tmp_path)
    big, small = answer_cost(config, {"task_model": "task"}), answer_cost(config, {"task_model": "small"})
    assert small == pytest.approx(big / 10)
    assert first_moves_of(config) == [{"task_model": "small"}]
    # The quality objective tries the dearer model first where one is listed.
    quality = config_from_dict(_config(tmp_path, objective="quality", space={"task_model": ["small", "task"]}),
                               base_dir=tmp_path)
    assert first_moves_of(quality) == []  # "task" is the initial and dearest
    dearer = _config(tmp_path, objective="quality", small={"price_prompt": 5.0, "price_completion": 20.0})
    assert first_moves_of(config_from_dict(dearer, base_dir=tmp_path)) == [{"task_model": "small"}]


# -- the cheapest model that answers as well -------------------------------------------------------------
def test_a_small_model_as_good_and_cheaper_is_returned_with_a_validated_non_inferiority_claim(tmp_path: Path) -> None:
    # Tied pairs (the judge scores both models alike) show "not worse by 0.25" from about 54 (the betting test)
    result = _optimize(tmp_path, _config(tmp_path, margin=0.25, validation=72))
    cheap = f"{INITIAL} {{task_model=small}}"
    v = result.validation
    assert v is not None and v.objective.name == "cost" and v.winner is not None and v.winner.instruction == cheap
    assert result.validated and dict(result.best_params) == {"task_model": "small"}
    assert v.saving is not None and v.saving.lower and v.saving.relative == pytest.approx(0.9, abs=0.05)
    assert "not worse by more than 0.25 (betting p = " in result.headline() and "USD" in result.headline()
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_configuration"]["task_model"] == "small" and summary["validation"]["winner"] == cheap
    assert summary["cost"]["returned"]["unit"] == "usd"
    assert summary["cost"]["returned"]["cost"] == pytest.approx(summary["cost"]["initial"]["cost"] / 10, rel=0.05)
    # The exports carry the model: JSON (its setting and the model in the provenance), LlamaIndex, DSPy.
    from opro.export import export_prompt
    from opro.export.sources import resolve_prompt

    config = config_from_dict(_config(tmp_path, margin=0.25, validation=72), base_dir=tmp_path, source="test.toml")
    best = resolve_prompt("best", config=config)
    data = json.loads(export_prompt(best, format="json", out=tmp_path / "best.json", config=config).paths[0].read_text())
    assert data["task_model"] == "small"
    assert data["provenance"]["models"]["task"] == {"backend": "scripted", "model": "small", "name": "small"}
    for fmt, said in (("llamaindex", "TASK_MODEL = 'small'  # the task model it was scored with"),
                      ("dspy", "# scored with: task_model=small")):
        written = export_prompt(best, format=fmt, out=tmp_path / fmt, config=config).paths
        data = json.loads(written[0].read_text())
        assert data["task_model"] == "small" and data["metadata"]["provenance"]["models"]["task"]["model"] == "small"
        assert said in "".join(p.read_text() for p in written[1:])
    # A resume with another list of models is refused as a change of what a score depends on.
    from opro.search import FingerprintMismatch

    more = _config(tmp_path, margin=0.25, validation=72, space={"task_model": ["task", "small", "tiny"]})
    more["models"]["task_choices"]["tiny"] = {"backend": "scripted", "model": "tiny", **SMALL}
    with pytest.raises(FingerprintMismatch, match=r"2 changed: models\.task_model\.tiny: None -> .*; search\.space"):
        _optimize(tmp_path, more)


def test_a_small_model_worse_by_more_than_the_margin_is_not_returned(tmp_path: Path) -> None:
    result = _optimize(tmp_path, _config(tmp_path, margin=0.25), worse=True)
    v = result.validation
    assert v is not None and v.winner is None and not result.validated
    assert result.best_instruction == INITIAL and dict(result.best_params) == {"task_model": "task"}
    chosen = next(f for f in v.finalists if f.chosen)
    assert chosen.instruction == f"{INITIAL} {{task_model=small}}" and chosen.difference == -1.0
    assert "the initial configuration is returned" in result.headline()


def test_compare_prices_the_same_instruction_on_two_models_in_one_unit(tmp_path: Path) -> None:
    from opro.heldout.compare import compare_prompts

    exp = _experiment(tmp_path, _config(tmp_path, space={}))
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "initial {task_model=small}"], n_resamples=200)
    finally:
        exp.close()
    big, small = report.prompts
    assert big.cost is not None and small.cost is not None and report.cost_measure == "USD"
    assert small.cost.cost == pytest.approx(big.cost.cost / 10)
    v = report.versus[1]
    assert v is not None and v.cost is not None and v.cost.cost.estimate == pytest.approx(small.cost.cost - big.cost.cost)
    assert v.stats.difference.estimate == 0.0 and not v.identical


def test_compare_set_task_model_answers_the_prompts_on_that_model_and_refuses_an_unknown_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fakes import write_toml
    from typer.testing import CliRunner

    from opro.cli import app

    cfg = _config(tmp_path, space={})
    cfg["experiment"]["progress"] = False
    path = write_toml(cfg, tmp_path / "models.toml")
    monkeypatch.setattr("opro.experiment.ModelPool", lambda *a, **k: _pool())
    monkeypatch.setenv("COLUMNS", "400")

    def compare(model: str) -> tuple[int, str]:
        res = CliRunner().invoke(app, ["compare", str(path), "--prompt", "initial", "--set", f"task_model={model}",
                                       "--no-mlflow", "--no-progress"])
        return res.exit_code, " ".join(res.output.split())

    code, out = compare("small")
    assert code == 0, out
    assert "{task_model=small}" in out and "USD" in out
    code, out = compare("large")
    # Said as the user gave it (issue 66): from --set, not as a [search.space] entry the config lacks.
    assert code == 2 and "--set task_model=large names no task model" in out and "(small)" in out, out
    assert "[search.space]" not in out and "Traceback" not in out


def test_a_task_model_that_stops_answering_mid_run_is_said_not_dropped_in_silence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 66: the candidates of a model whose every call failed were marked failed and the summary said
    only "N candidates (0 pruned)"."""
    from fakes import write_toml
    from typer.testing import CliRunner

    from opro.cli import app
    from opro.errors import LLMConnectionError

    def down(messages: tuple, options: object) -> str:
        raise LLMConnectionError("cannot reach http://127.0.0.1:9/v1: connection refused", model="small")

    pool = _pool()
    pool._scripted["small"] = ScriptedLLM(default=down, model="small")
    cfg = _config(tmp_path, steps=1, candidates_per_step=2)  # under cost, the first moves try the small model
    cfg["experiment"]["progress"] = False
    path = write_toml(cfg, tmp_path / "models.toml")
    monkeypatch.setattr("opro.experiment.ModelPool", lambda *a, **k: pool)
    monkeypatch.setenv("COLUMNS", "400")
    res = CliRunner().invoke(app, ["optimize", str(path), "--no-progress"])
    out = " ".join(res.output.split())
    history = [json.loads(line) for line in (tmp_path / "out" / "history.jsonl").read_text().splitlines()]
    failed = [r for r in history if r["status"] == "failed"]
    assert failed and all(r["params"]["task_model"] == "small" for r in failed), history
    assert f"{len(failed)} failed)" in out and "every candidate with task_model=small failed" in out, out
    assert "a rerun of the same command asks them again" in out


def test_the_plan_prices_the_embedded_models_in_seconds_each_at_its_own_speed(tmp_path: Path) -> None:
    from opro.probe.plan import make_plan

    cfg = experiment_config(tmp_path, models={"task": {}}, search={"space": {"task_model": ["0.5b", "1.5b"]}},
                            optimizer={"objective": "cost", "margin": 0.25})
    config = config_from_dict(cfg, base_dir=tmp_path)
    model = config.cost_model()
    assert model.unit == "seconds" and [m.name for m in model.models] == ["0.5b", "1.5b"]
    assert all("not calibrated yet" in m.basis for m in model.models)
    text = "\n".join(make_plan(config).lines())
    assert "task seconds at each model's seconds per token" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("task_model:"))
    small, large = (float(v) for v in re.findall(r"\(([\d.]+) s\)", line))
    assert large > 1.5 * small  # the 1.5B decodes at about half the 0.5B's speed
    assert "0.5b: " in text and "1.5b: " in text  # each model's seconds per call in the time estimate
