"""Runs that survive: endpoint failures are re-queued on rerun, budgets and usage belong to the study,
a changed setting refuses to resume, a finished study reruns without new records, failures end the
MLflow run. Scripted models through the experiment wiring (config -> stores -> outputs)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
from fakes import experiment_config, judge_reply, optimizer_reply, task_reply
from mlflow import MlflowClient

from opro.config import config_from_dict
from opro.errors import ConfigError, LLMAuthError, LLMServerError, OproError
from opro.experiment import Experiment
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM
from opro.search.study import ValidationReuse


class Switch:
    """A judge whose endpoint can be broken and fixed between runs; counts the calls it answered."""

    def __init__(self) -> None:
        self.fault: Callable[[], Exception] | None = None
        self.calls = 0

    def __call__(self, messages: tuple[Message, ...], options: GenerationOptions) -> str:
        if self.fault is not None:
            raise self.fault()
        self.calls += 1
        return judge_reply(messages, options)


def _run(tmp_path: Path, judge: Callable[..., str], /, **overrides: dict) -> tuple[Experiment, object]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = config_from_dict(experiment_config(tmp_path, **overrides), base_dir=tmp_path, source="t.toml")
    pool = ModelPool(scripted={
        "task": ScriptedLLM(default=task_reply, model="task"),
        "judge": ScriptedLLM(default=judge, model="judge"),
        "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer"),
    })
    exp = Experiment(cfg, pool=pool, progress=False)
    try:
        return exp, exp.optimize()
    finally:
        exp.close()


def _history(tmp_path: Path) -> list[dict]:
    rows = [json.loads(line) for line in (tmp_path / "out" / "history.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("step", "instruction", "score", "status", "scores")} for r in rows]


def _mlflow_runs(tmp_path: Path) -> list[mlflow.entities.Run]:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    exps = [e for e in client.search_experiments() if e.name == "t"]
    return client.search_runs([exps[0].experiment_id]) if exps else []


@pytest.mark.parametrize(
    "fault",
    [lambda: LLMAuthError("401 bad key", model="judge"), lambda: LLMServerError("500 outage", model="judge")],
    ids=["401", "500"],
)
def test_rerun_after_the_endpoint_is_fixed_equals_an_uninterrupted_run(tmp_path: Path, fault: Callable) -> None:
    _run(tmp_path / "ref", Switch())
    reference = _history(tmp_path / "ref")

    judge = Switch()
    judge.fault = fault
    with pytest.raises(OproError):
        _run(tmp_path / "run", judge)
    runs = _mlflow_runs(tmp_path / "run")
    assert runs and all(r.info.status == "FAILED" for r in runs)  # never left RUNNING

    judge.fault = None
    _exp, result = _run(tmp_path / "run", judge)
    assert _history(tmp_path / "run") == reference
    assert result.initial_score is not None  # the initial instruction was re-queued, not lost
    assert [r.info.status for r in _mlflow_runs(tmp_path / "run")] == ["FINISHED"]


def test_budget_belongs_to_the_study_and_a_raised_budget_continues(tmp_path: Path) -> None:
    judge = Switch()
    _exp, first = _run(tmp_path, judge, optimizer={"steps": 2, "candidates_per_step": 2, "minibatch_size": 2,
                                                    "max_calls": 12, "finalists": 0})
    assert first.stopped_reason == "budget"
    calls_first = sum(u["calls"] for u in first.usage.values())
    # Same budget: the study already spent it, so a rerun makes no call.
    judge.calls = 0
    _exp, again = _run(tmp_path, judge, optimizer={"steps": 2, "candidates_per_step": 2, "minibatch_size": 2,
                                                   "max_calls": 12, "finalists": 0})
    assert judge.calls == 0 and again.stopped_reason == "budget"
    # A raised budget continues where the first run stopped, and the totals cover both processes.
    _exp, more = _run(tmp_path, judge, optimizer={"steps": 2, "candidates_per_step": 2, "minibatch_size": 2,
                                                  "max_calls": 1000, "finalists": 0})
    assert more.stopped_reason == "steps" and judge.calls > 0
    assert sum(u["calls"] for u in more.usage.values()) > calls_first
    assert len([r for r in more.history if r.status == "complete"]) == 5


def test_a_changed_setting_refuses_to_resume_and_fresh_starts_over(tmp_path: Path) -> None:
    _run(tmp_path, Switch())
    # Speed settings leave the scores as they were: the study resumes across them; batch_width does not.
    models = experiment_config(tmp_path)["models"]
    task = {**models["task"], "draft_fill": 0, "prefix_cache_mb": 0, "max_concurrency": 3}
    _run(tmp_path, Switch(), models={**models, "task": task})
    with pytest.raises(ConfigError, match=r"models\.task\.batch_width: '4' -> '2'"):
        _run(tmp_path, Switch(), models={**models, "task": {**task, "batch_width": 2}})
    with pytest.raises(ConfigError, match=r"other settings .*rag\.top_k: '2' -> '3'.*--fresh"):
        _run(tmp_path, Switch(), rag={"top_k": 3})
    cfg = config_from_dict(experiment_config(tmp_path, rag={"top_k": 3}), base_dir=tmp_path, source="t.toml")
    pool = ModelPool(scripted={
        "task": ScriptedLLM(default=task_reply, model="task"),
        "judge": ScriptedLLM(default=judge_reply, model="judge"),
        "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer"),
    })
    exp = Experiment(cfg, pool=pool, progress=False)
    try:
        # --fresh archives the study and starts a new one; under other retrieval settings that one cannot
        # re-decide the validation questions the archived study decided on (issue 49): refused before searching.
        with pytest.raises(ValidationReuse, match=r"in study 't-archived-.*other settings \(rag\.top_k\)"):
            exp.optimize(fresh=True)
    finally:
        exp.close()
    import optuna

    names = [s.study_name for s in optuna.get_all_study_summaries(storage=cfg.optuna_storage)]
    assert cfg.study_name in names and any(n.startswith(f"{cfg.study_name}-archived-") for n in names)


def test_rerunning_a_finished_study_records_nothing_new(tmp_path: Path) -> None:
    _run(tmp_path, Switch())
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    (run,) = _mlflow_runs(tmp_path)
    metrics_before = {k: len(client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics}
    versions_before = len(client.search_prompt_versions("qa-test"))

    judge = Switch()
    _run(tmp_path, judge)
    assert judge.calls == 0
    (run,) = _mlflow_runs(tmp_path)
    assert {k: len(client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics} == metrics_before
    assert len(client.search_prompt_versions("qa-test")) == versions_before
    assert run.info.status == "FINISHED"


def test_an_edited_judge_template_file_refuses_to_resume(tmp_path: Path) -> None:
    """The template's path is the same, its text is not: scores from two judge prompts must not mix."""
    template = tmp_path / "judge.toml"
    template.write_text(
        'system = "Grade the answer."\n'
        'user = "Question: {query}\\nReference: {reference_answer}\\nAnswer: {generated_answer}\\nScore 1 to 5."\n'
    )
    _run(tmp_path, judge_reply, judge={"template": "judge.toml"})
    _run(tmp_path, judge_reply, judge={"template": "judge.toml"})  # unchanged: resumes
    template.write_text(template.read_text().replace("Grade the answer.", "Grade the answer strictly."))
    with pytest.raises(ConfigError, match=r"judge\.template_sha256: '[0-9a-f]{16}' -> '[0-9a-f]{16}'.*--fresh"):
        _run(tmp_path, judge_reply, judge={"template": "judge.toml"})
