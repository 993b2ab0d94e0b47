"""MLflow 3 GenAI records on scripted models: evaluation datasets, evaluation runs, traces, assessments."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fakes import mlflow_client as _client
from fakes import optimized, scripted_pool

from opro.experiment import Experiment
from opro.heldout.compare import compare_prompts, save_comparison


def _logger(config: Path) -> Any:
    from opro.tracking.genai import GenAILogger

    return GenAILogger(tracking_uri=f"sqlite:///{config.parent / 'out' / 'mlflow.db'}", experiment_name="t",
                       dataset_prefix="t")


def _traces(client: Any, run_id: str) -> list[Any]:
    exp_id = client.get_run(run_id).info.experiment_id
    return list(client.search_traces(locations=[exp_id], run_id=run_id, max_results=500))


@pytest.fixture
def compared(genai_compared: tuple[Path, Any, Any]) -> tuple[Path, Any, Any]:
    return genai_compared


def test_the_split_dataset_is_registered_as_evaluation_datasets(compared: tuple[Path, Any, Any]) -> None:
    config, report, _ = compared
    client = _client(config)
    exp = client.get_experiment_by_name("t")
    names = {d.name: d for d in client.search_datasets(experiment_ids=[exp.experiment_id])}
    by_split = {n.split(".")[1]: d for n, d in names.items()}
    assert set(by_split) == {"exemplar", "optimization", "validation", "heldout"}
    heldout = by_split["heldout"]
    assert heldout.tags["opro.split"] == "heldout" and heldout.tags["opro.n_questions"] == "10"
    records = _logger(config).records(heldout.dataset_id)
    assert len(records) == 10
    assert {r["inputs"]["question"] for r in records} == set(report.questions)
    assert all(r["expectations"]["expected_response"].startswith("Answer ") for r in records)
    assert all("reference_contexts" in r["expectations"] for r in records)


def test_compare_makes_one_evaluation_run_per_prompt_with_traces_and_verdicts(
    compared: tuple[Path, Any, Any],
) -> None:
    config, report, saved = compared
    client = _client(config)
    assert len(saved.evaluation_run_ids) == 2
    for prompt, run_id in zip(report.prompts, saved.evaluation_run_ids, strict=True):
        run = client.get_run(run_id)
        tags = run.data.tags
        assert tags["mlflow.runType"] == "genai_evaluate" and tags["opro.source"] == "compare"
        assert tags["opro.comparison_run_id"] == saved.recorded[0].ref and tags["opro.spec"] == prompt.spec
        # the prompt version holds exactly the compared template and is linked to the run
        name, version = tags["opro.prompt_uri"].removeprefix("prompts:/").split("/")
        assert json.loads(tags["mlflow.linkedPrompts"]) == [{"name": name, "version": version}]
        template = client.get_prompt_version(name, version).template
        assert template.replace("{{", "{").replace("}}", "}") == prompt.template_text
        assert run.data.metrics["correctness/mean"] == pytest.approx(prompt.mean.estimate)
        assert run.data.metrics["opro/n_questions"] == 10
        assert [i.dataset.name for i in run.inputs.dataset_inputs] == [f"t.heldout.{prompt_hash(config)}"]

        traces = _traces(client, run_id)
        assert len(traces) == 10
        rows = {r.query: r for r in prompt.evaluation.rows}
        for trace in traces:
            spans = {s.span_type: s for s in trace.data.spans}
            assert {"RETRIEVER", "LLM"} <= set(spans)
            question = spans["RETRIEVER"].inputs["query"]
            row = rows[question]
            assert [d["page_content"] for d in spans["RETRIEVER"].outputs] == list(row.contexts)
            llm = spans["LLM"]
            assert question in llm.inputs["messages"][0]["content"]
            assert prompt.instruction in llm.inputs["messages"][0]["content"]
            assert llm.outputs["choices"][0]["message"]["content"] == row.answer
            assert llm.get_attribute("mlflow.chat.tokenUsage")["input_tokens"] == row.prompt_tokens
            feedback = {a.name: a for a in trace.info.assessments if a.feedback is not None}
            assert feedback["correctness"].value == row.score
            assert feedback["correctness"].rationale == (row.feedback or None)
            assert feedback["passing"].value is row.passing
            expectations = {a.name: a.value for a in trace.info.assessments if a.expectation is not None}
            assert expectations["expected_response"] == row.reference
            assert json.loads(trace.info.tags["mlflow.linkedPrompts"]) == [{"name": name, "version": version}]


def prompt_hash(config: Path) -> str:
    from opro.data.dataset import load_dataset

    return load_dataset(config.parent / "out" / "dataset").content_hash[:8]


def _answered(validation: dict[str, Any]) -> dict[str, tuple[int, float]]:
    """Each prompt's validation questions and mean from summary.json: the finalists answered the
    selection questions, the chosen one and the initial instruction the confirmation questions."""
    n_sel = validation["selection_questions"]
    out = {"initial": (len(validation["initial_scores"]), validation["initial_score"])}
    for i, f in enumerate(validation["finalists"], start=1):
        conf = f["scores"] if f["chosen"] else []
        total = (f["selection_score"] or 0.0) * n_sel + sum(conf)
        if n_sel + len(conf):
            out[f"finalist {i}"] = (n_sel + len(conf), total / (n_sel + len(conf)))
    return out


def test_optimize_records_its_validation_stage_once(compared: tuple[Path, Any, Any]) -> None:
    config, _, _ = compared
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id

    def validation_runs() -> list[Any]:
        return list(client.search_runs([exp_id], filter_string="tags.`opro.source` = 'validation'"))

    runs = validation_runs()
    summary = json.loads((config.parent / "out" / "summary.json").read_text())
    finalists = summary["validation"]["finalists"]
    answered = _answered(summary["validation"])
    assert len(runs) == len(answered) == 1 + len(finalists)
    by_label = {r.data.tags["opro.prompt_label"]: r for r in runs}
    for label, (n, mean) in answered.items():
        assert by_label[label].data.metrics["correctness/mean"] == pytest.approx(mean)
        assert len(_traces(client, by_label[label].info.run_id)) == n
    assert all(r.data.tags["opro.optimization_run_id"] == summary["mlflow_run_id"] for r in runs)
    winner = summary["validation"]["winner"]
    roles = {r.data.tags["opro.prompt_label"]: r.data.tags["opro.role"] for r in runs}
    assert roles == {"initial": "initial", **{
        f"finalist {i}": "returned finalist" if f["instruction"] == winner else "finalist"
        for i, f in enumerate(finalists, start=1)}}

    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        exp.optimize()  # a finished study: nothing new is recorded
    finally:
        exp.close()
    assert len(validation_runs()) == len(runs)


def test_genai_records_can_be_switched_off(tmp_path: Path) -> None:
    config = optimized(tmp_path, genai=False)
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"])
        saved = save_comparison(report, experiment=exp, name="off")
    finally:
        exp.close()
    assert [r.recorder for r in saved.recorded] == ["mlflow"] and saved.evaluation_run_ids == ()
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id
    assert not client.search_runs([exp_id], filter_string="tags.`opro.kind` = 'evaluation'")
    assert not list(client.search_datasets(experiment_ids=[exp_id]))


def test_opro_judges_are_mlflow_scorers(tmp_path: Path) -> None:
    import mlflow

    from opro.judges import CorrectnessJudge, FaithfulnessJudge
    from opro.llm import ChatClient
    from opro.llm.scripted import ScriptedLLM
    from opro.tracking import MlflowTracker
    from opro.tracking.evaluations import genai_logger  # noqa: F401
    from opro.tracking.genai import _use_store
    from opro.tracking.scorers import judge_scorer

    judge_llm = ScriptedLLM(rules=[
        (r"Paris", json.dumps({"score": 5, "reasoning": "names the capital"})),
        (r"Context information", "YES"),  # faithfulness: supported by the chunks
    ], default=json.dumps({"score": 2, "reasoning": "wrong city"}), model="judge")
    client = ChatClient(judge_llm, role="judge")
    data = [
        {"inputs": {"question": "What is the capital of France?"}, "outputs": "Paris.",
         "expectations": {"expected_response": "Paris"}},
        {"inputs": {"question": "What is the capital of Italy?"}, "outputs": "Milan.",
         "expectations": {"expected_response": "Rome"}},
    ]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp_id = MlflowTracker(tracking_uri=uri, experiment_name="scorers").experiment_id()
    with _use_store(uri, exp_id):
        result = mlflow.genai.evaluate(
            data=data, scorers=[judge_scorer(CorrectnessJudge(client)), judge_scorer(FaithfulnessJudge(client))]
        )
    assert result.metrics["correctness/mean"] == pytest.approx(3.5)  # 5 and 2
    frame = result.result_df
    assert sorted(frame["correctness/value"]) == [2.0, 5.0]
    # no retrieval span in these traces: faithfulness has no contexts and says so, as an error, not a score
    assert "faithfulness/value" not in frame or frame["faithfulness/value"].isna().all()
    n_calls = len(judge_llm.calls)
    assert n_calls == 2  # one correctness call per row; faithfulness made none without contexts


def test_mlflow_correctness_judge_as_opro_judge() -> None:
    from mlflow.genai.judges.prompts.correctness import CORRECTNESS_PROMPT_INSTRUCTIONS

    from opro.judges import MlflowCorrectnessJudge, parse_yes_no_verdict
    from opro.llm import ChatClient
    from opro.llm.scripted import ScriptedLLM
    from opro.tracking.scorers import mlflow_correctness_judge

    llm = ScriptedLLM(rules=[
        (r"Paris", json.dumps({"rationale": "Let's think step by step. Supported.", "result": "yes"})),
        (r"Milan", json.dumps({"rationale": "Let's think step by step. Rome is not Milan.", "result": "no"})),
    ], default="I cannot tell", model="judge")
    judge = mlflow_correctness_judge(ChatClient(llm, role="judge"))
    assert isinstance(judge, MlflowCorrectnessJudge)  # the judge lives with the judges; its prompt is MLflow's
    yes = judge.evaluate(query="Capital of France?", answer="Paris.", reference="Paris")
    no = judge.evaluate(query="Capital of Italy?", answer="Milan.", reference="Rome")
    bad = judge.evaluate(query="Capital of Spain?", answer="Madrid.", reference="Madrid")
    assert (yes.score, yes.passing, no.score, no.passing) == (5.0, True, 1.0, False)
    assert "Rome is not Milan" in no.feedback
    assert bad.invalid and bad.score is None and "no yes/no result" in (bad.invalid_reason or "")
    # MLflow's own prompt text, and its verdict schema on a backend that takes JSON schemas
    sent, options = llm.calls[0]
    assert CORRECTNESS_PROMPT_INSTRUCTIONS.split("{{")[0] in sent[-1].content
    assert options.json_schema is not None
    assert json.loads(options.json_schema)["properties"]["result"]["enum"] == ["yes", "no"]
    assert parse_yes_no_verdict('```json\n{"result": "no", "rationale": "r"}\n```') == (False, "r")
    assert parse_yes_no_verdict('... "result": "yes" ... "result": "no"')[0] is None


def test_judge_agreement_with_mlflow_correctness_judge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from typer.testing import CliRunner

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from fault_server import FaultServer

    from opro.cli import app

    rows = [{"query": f"Question {i}?", "answer": f"Answer {i}.", "reference": f"Answer {i}.", "score": s}
            for i, s in enumerate([5, 4, 2, 1])]
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(rows))
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    with FaultServer(key="k") as server:
        result = CliRunner().invoke(app, [
            "judge", "agreement", "--answers", str(answers), "--judge-b", f"mlflow:openai:judge-model@{server.base_url}",
            "--cache", str(tmp_path / "calls.sqlite"),
        ])
        assert result.exit_code == 0, result.output
        assert server.counts["judge"] == 4
    # the fake judge's reply has no yes/no result: every verdict is invalid and dropped, and said so
    assert "pairs dropped (invalid / unlabelled)" in result.output and "pass / fail agreement" in result.output


def test_credentials_in_urls_never_reach_the_records(tmp_path: Path) -> None:
    from opro.data.dataset import Example, GoldenDataset
    from opro.evaluation.batch import EvaluationReport, EvaluationRow
    from opro.program.prompts import QATemplate
    from opro.tracking.genai import GenAILogger, PromptEvaluation

    secret = "sk-live-0123456789"
    q = f"What does https://user:{secret}@example.com/v1 serve?"
    dataset = GoldenDataset((Example(q, f"A model at https://example.com/?api-key={secret}.", (f"ctx https://h.example/?key={secret}",)),
                             Example("Another question?", "Yes."))).with_split(
        exemplar=0, optimization=0, validation=0, heldout=2, seed=0)
    rows = tuple(
        EvaluationRow(query=e.query, reference=e.reference_answer, answer=f"See https://u:{secret}@h.example/x",
                      contexts=(f"doc https://h.example/?token={secret}",), score=4.0, passing=True,
                      feedback=f"matches https://h.example/?sig={secret}", prompt_tokens=12, completion_tokens=3)
        for e in dataset.examples
    )
    db = tmp_path / "mlflow.db"
    log = GenAILogger(tracking_uri=f"sqlite:///{db}", experiment_name="secrets", dataset_prefix="s",
                      prompt_name="qa-secrets", task_model="task", judge_model=f"judge@https://k:{secret}@judge.example")
    record = log.log_evaluations(
        [PromptEvaluation(label="p", template=QATemplate(instruction="Answer."), report=EvaluationReport(rows=rows))],
        dataset=dataset, split="heldout", source="test",
    )
    assert len(record.runs[0].trace_ids) == 2
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert secret.encode() not in stored
    assert b"***" in stored  # redacted, not dropped


def test_cli_evaluate_records_an_evaluation_run(compared: tuple[Path, Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import opro.experiment
    from opro.cli import app

    config, _, _ = compared
    monkeypatch.setattr(opro.experiment, "ModelPool", scripted_pool)
    result = CliRunner().invoke(app, ["evaluate", str(config), "--prompt", "best", "--split", "heldout", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "MLflow evaluation run" in result.output and "(10 traces)" in result.output
    assert "Evaluating" not in result.output  # MLflow's own progress bar stays quiet
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id
    runs = client.search_runs([exp_id], filter_string="tags.`opro.source` = 'evaluate'")
    assert len(runs) == 1 and runs[0].data.tags["opro.spec"] == "best"
    assert runs[0].data.metrics["correctness/mean"] == 5.0
    # The evaluation's own MLflow run names its evaluation run (the GenAI recorder links them).
    (command,) = [r for r in client.search_runs([exp_id], filter_string="tags.`opro.kind` = 'evaluation'")
                  if "opro.source" not in r.data.tags]
    assert command.data.tags["opro.genai_runs"] == runs[0].info.run_id


def test_recording_an_evaluation_does_not_import_litellm(tmp_path: Path) -> None:
    """MLflow's evaluate asks litellm (2,400 modules, seconds of CPU) whether its retries are on; opro's
    replay makes no LLM calls, so the records must not pay for that import."""
    import subprocess

    from children import argv

    out = subprocess.run(argv("record_evaluation", f"sqlite:///{tmp_path / 'mlflow.db'}"), capture_output=True,
                         text=True, timeout=300, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_the_records_start_in_a_sidecar_with_the_search_and_its_failure_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The records' fixed costs (MLflow imports, the dataset registration) start with the search, in the
    # MLflow recorder's child process, queued through its thread; a failure there (here: a store that is
    # not a database) reaches whoever drains that thread, as a failed tracking call does.
    from types import SimpleNamespace

    import opro.tracking.validation_traces
    from opro.errors import OproError
    from opro.search.storage import open_storage
    from opro.search.study import SearchStudy
    from opro.tracking import MlflowTracker
    from opro.tracking.recorder import MlflowRecorder
    from opro.tracking.validation_traces import ValidationTraces

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    monkeypatch.setattr(opro.tracking.validation_traces, "_logger_settings", lambda experiment, tracking_uri=None: {
        "tracking_uri": f"sqlite:///{garbage}", "experiment_name": "e", "dataset_prefix": "e"})
    tracking = MlflowRecorder(MlflowTracker(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment_name="e"),
                              sidecar=True)
    traces = ValidationTraces(SimpleNamespace(dataset=None), tracking=tracking)  # type: ignore[arg-type]
    study = SearchStudy.open(open_storage(f"sqlite:///{tmp_path / 'optuna.db'}"), name="s")
    tracking.on_search_start(study, lead=True)  # type: ignore[arg-type]
    assert len(tracking._jobs) == 1 and tracking.sidecar is not None  # the run's start
    traces.on_search_start(study, lead=True)  # type: ignore[arg-type]
    assert len(tracking._jobs) == 2
    with pytest.raises(OproError, match=r"garbage.db cannot be opened") as info:
        tracking._drain()
    assert any("in the sidecar process" in note for note in info.value.__notes__)
    assert tracking.tracker.run_id is not None  # the run itself started, in the same child
    error = info.value
    tracking.on_search_failed(study, error, abandoned=False)  # type: ignore[arg-type]
    traces.on_search_failed(study, error, abandoned=False)  # type: ignore[arg-type]
    assert tracking.sidecar._process.poll() == 0  # closed once both let go of it, not left behind
    assert _client_at(tmp_path / "mlflow.db").get_run(tracking.tracker.run_id).info.status == "FAILED"


def _client_at(db: Path) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{db}")


def test_optimize_writes_its_mlflow_records_in_the_sidecar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's writes (the run, its metrics, the evaluation runs' traces: CPU in its SQLAlchemy store)
    never run in the searching process."""
    from opro.tracking import MlflowTracker
    from opro.tracking.genai import GenAILogger

    def not_here(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("MLflow records written in the searching process")

    for cls, method in ((GenAILogger, "log_evaluations"), (GenAILogger, "prewarm"), (MlflowTracker, "start"),
                        (MlflowTracker, "log_metrics"), (MlflowTracker, "register_prompt")):
        monkeypatch.setattr(cls, method, not_here)
    config = optimized(tmp_path, genai=True)
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id
    runs = client.search_runs([exp_id], filter_string="tags.`opro.source` = 'validation'")
    summary = json.loads((config.parent / "out" / "summary.json").read_text())
    answered = _answered(summary["validation"])
    assert len(runs) == len(answered) == 1 + len(summary["validation"]["finalists"])
    assert sorted(len(_traces(client, r.info.run_id)) for r in runs) == sorted(n for n, _ in answered.values())
    run = client.get_run(summary["mlflow_run_id"])
    assert "best_score" in run.data.metrics and run.info.status == "FINISHED"


def test_validation_traces_keep_the_answers_the_search_scored(tmp_path: Path) -> None:
    """The validation stage's records come from its own scoring (answers, contexts, verdicts), not from
    asking again: without a call cache to replay through, every prompt is still recorded with a
    trace per question and the scores the search used."""
    from fakes import COMPARE_DOC, experiment_config, write_toml

    split = {"exemplar": 2, "optimization": 3, "validation": 12, "heldout": 4, "seed": 1}
    cfg = experiment_config(tmp_path, questions=24, doc=COMPARE_DOC,
                            experiment={"name": "t", "output_dir": "out", "progress": False, "cache": False},
                            data={"dataset": "qa.jsonl", "split": split},
                            models={"task": {"backend": "scripted", "model": "task"}}, optimizer={"steps": 1},
                            tracking={"prompt_name": "qa-t", "genai": True, "sidecar": False})
    config = write_toml(cfg, tmp_path / "t.toml")
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        result = exp.optimize()
    finally:
        exp.close()
    assert result.validation is not None and result.validation.finalists
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id
    runs = list(client.search_runs([exp_id], filter_string="tags.`opro.source` = 'validation'"))
    assert len(runs) == 1 + len(result.validation.finalists)
    by_label = {r.data.tags["opro.prompt_label"]: r for r in runs}
    assert by_label["initial"].data.metrics["correctness/mean"] == pytest.approx(result.validation.initial_score)
    answered = _answered(json.loads((tmp_path / "out" / "summary.json").read_text())["validation"])
    for r in runs:
        traces = _traces(client, r.info.run_id)
        assert len(traces) == answered[r.data.tags["opro.prompt_label"]][0]
        assert all(t.data.response for t in traces)  # the answers the search got, not empty replays


def test_every_trace_a_command_logs_is_in_the_store_when_it_returns(tmp_path: Path) -> None:
    """Issue 40, item 7: `opro evaluate` with every call cached kept 25-27 of 30 traces (those still
    queued when the CLI left through os._exit were lost). Run as a user runs it, twice (the second
    time every call is cached), each run's traces are all there once the process has exited."""
    import subprocess

    from children import argv

    config = optimized(tmp_path, genai=True)
    for attempt in ("uncached", "cached"):
        done = subprocess.run(argv("cli_on_scripted_models", "evaluate", str(config), "--prompt", "best",
                                   "--split", "heldout", "--no-progress"),
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        assert done.returncode == 0, (attempt, done.stdout[-2000:], done.stderr[-2000:])
        client = _client(config)
        exp_id = client.get_experiment_by_name("t").experiment_id
        runs = client.search_runs([exp_id], filter_string="tags.`opro.source` = 'evaluate'",
                                  order_by=["attributes.start_time DESC"])
        traces = client.search_traces(locations=[exp_id], run_id=runs[0].info.run_id, max_results=1000)
        assessed = [t for t in traces if t.info.assessments]
        assert len(traces) == 10 and len(assessed) == 10, (attempt, len(traces), len(assessed))


def _close_call(tmp_path: Path, *, validation: int, unused: int, ahead_every: int) -> tuple[Path, list[str], list[str]]:
    """A scripted experiment whose finalist (an instruction naming the context) is ahead of the initial
    instruction on every ``ahead_every``-th confirmation question and tied on the others, and ahead on
    every question in no split; GenAI records on, in the sidecar. (config, validation questions, the
    questions in no split, in the order an extension asks them); the ties are in ``tied.txt``."""
    from fakes import COMPARE_DOC, experiment_config, scripted_pool, write_toml

    split = {"exemplar": 2, "optimization": 3, "validation": validation, "heldout": 4, "seed": 1}
    cfg = experiment_config(tmp_path, questions=9 + validation + unused, doc=COMPARE_DOC,
                            experiment={"name": "t", "output_dir": "out", "progress": False},
                            data={"dataset": "qa.jsonl", "split": split},
                            models={"task": {"backend": "scripted", "model": "task"}}, optimizer={"steps": 1},
                            tracking={"prompt_name": "qa-t", "genai": True, "sidecar": True})
    config = write_toml(cfg, tmp_path / "t.toml")
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        val = [e.query for e in exp.dataset.examples_in("validation")]
        pool = [e.query for e in exp.dataset.unused()]
    finally:
        exp.close()
    confirmation = val[4:]  # after the 4 selection questions of 2 finalists
    (tmp_path / "tied.txt").write_text("".join(f"{q}\n" for i, q in enumerate(confirmation) if i % ahead_every != 1))
    return config, val, pool


def _optimize_process(config: Path) -> subprocess.CompletedProcess[str]:
    from children import argv

    return subprocess.run(argv("cli_on_close_call_models", str(config.parent / "tied.txt"), "optimize", str(config),
                               "--no-progress"), capture_output=True, text=True, timeout=600,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})


def _traced_questions(config: Path) -> dict[str, list[str]]:
    """Each validation evaluation run's prompt label -> the questions of its traces (one per trace)."""
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id
    runs = client.search_runs([exp_id], filter_string="tags.`opro.source` = 'validation'")
    out: dict[str, list[str]] = {}
    for r in runs:
        label = r.data.tags["opro.prompt_label"]
        assert label not in out, f"two evaluation runs for {label}"
        out[label] = sorted(next(s for s in t.data.spans if s.parent_id is None).inputs["question"]
                            for t in _traces(client, r.info.run_id))
    return out


def test_optimize_through_the_extension_records_every_question_it_asked(tmp_path: Path) -> None:
    """Issue 49, item 1: the looks of the split do not decide, the finalist is still ahead, and the last
    look asks questions in no split. `opro optimize` (a real process, GenAI records in the sidecar) ends
    rc 0 with one evaluation run per prompt and a trace for every question it answered, the extension's
    included, in a dataset of the split and the extension questions asked."""
    config, val, pool = _close_call(tmp_path, validation=12, unused=6, ahead_every=3)
    done = _optimize_process(config)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    v = summary["validation"]
    assert [x["n"] for x in v["looks"]] == [3, 6, 8, 14] and v["looks"][-1]["decision"] == "success"
    chosen = next(i for i, f in enumerate(v["finalists"], start=1) if f["chosen"])
    selection, confirmation, extension = val[:4], val[4:], pool[:6]
    traced = _traced_questions(config)
    assert traced == {
        "initial": sorted(confirmation + extension),
        f"finalist {chosen}": sorted(selection + confirmation + extension),
        f"finalist {3 - chosen}": sorted(selection),
    }
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id
    names = {d.name: d for d in client.search_datasets(experiment_ids=[exp_id])}
    both = [d for n, d in names.items() if n.startswith("t.validation+extension.")]
    assert len(both) == 1 and both[0].tags["opro.n_questions"] == "18" and both[0].tags["opro.extension_questions"] == "6"


@pytest.mark.parametrize("ending", ["success", "futility", "budget"])
def test_every_way_a_validation_ends_records_every_question_in_a_real_process(tmp_path: Path, ending: str) -> None:
    """The other endings beside the extension's (above): a finalist ahead everywhere (success), tied
    everywhere (futility at the first look), and a search cut short by its call budget; each a real
    `opro optimize` with GenAI records in the sidecar, rc 0, one evaluation run per prompt that answered,
    every question it answered traced."""
    config, val, _ = _close_call(tmp_path, validation=12, unused=0, ahead_every=1)
    confirmation = val[4:]
    # Tied (both answers scored 2) on every confirmation question, or on none.
    (tmp_path / "tied.txt").write_text("".join(f"{q}\n" for q in confirmation) if ending == "futility" else "")
    if ending == "budget":
        text = config.read_text().replace("[optimizer]\n", "[optimizer]\nmax_calls = 90\n", 1)
        config.write_text(text.replace("steps = 1\n", "steps = 20\n", 1))
    done = _optimize_process(config)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    v = summary["validation"]
    decisions = [x["decision"] for x in v["looks"]]
    if ending == "futility":
        assert decisions == ["futility"] and not summary["validated"]
    else:
        assert decisions[-1] == "success" and summary["validated"]
    assert summary["stopped_reason"] == ("budget" if ending == "budget" else "steps"), summary["stopped_reason"]
    chosen = next(i for i, f in enumerate(v["finalists"], start=1) if f["chosen"])
    asked = confirmation[: v["looks"][-1]["n"]]
    expected = {"initial": sorted(asked), f"finalist {chosen}": sorted(val[:4] + asked)}
    expected.update({f"finalist {i}": sorted(val[:4]) for i in range(1, len(v["finalists"]) + 1) if i != chosen})
    assert _traced_questions(config) == expected


def test_a_prompt_whose_validation_batches_two_runs_scored_is_recorded_whole(tmp_path: Path) -> None:
    """A run that stops between two of a prompt's validation batches (here a judge call that fails, as a
    kill would leave it) keeps the batches it scored; the rerun scores the rest and finds the others in
    the study (no call), and the prompt's evaluation run holds every question, from both runs' rows."""
    from fakes import judge_reply, optimizer_reply, task_reply

    from opro.errors import LLMServerError
    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    config, val, _ = _close_call(tmp_path, validation=12, unused=0, ahead_every=1)
    config.write_text(config.read_text().replace("sidecar = true", "sidecar = false"))
    failing = val[4]  # the finalist's first confirmation question
    calls = {"judge": 0}

    def pool(fail: bool) -> ModelPool:
        def judge(messages: Any, options: Any) -> str:
            calls["judge"] += 1
            text = messages[-1].content
            if fail and failing in text and "context" in text.lower():
                raise LLMServerError("the judge's endpoint failed (scripted)", model="judge")
            return judge_reply(messages, options)

        return ModelPool(scripted={"task": ScriptedLLM(default=task_reply, model="task"),
                                   "judge": ScriptedLLM(default=judge, model="judge"),
                                   "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer")})

    for fail in (True, False):
        exp = Experiment.from_file(config, pool=pool(fail), progress=False)
        try:
            result = exp.optimize()
        finally:
            exp.close()
        if fail:
            first_calls = calls["judge"]
    assert calls["judge"] - first_calls == 1  # the rerun asked the failed question only
    v = result.validation
    assert v is not None and result.validated
    chosen = next(i for i, f in enumerate(v.finalists, start=1) if f.chosen)
    asked = val[4: 4 + v.looks[-1].n]
    traced = _traced_questions(config)
    # The first run's looks went on past a pair it lacked (it asked more): what each prompt was asked
    # in either run is traced, once.
    assert set(asked) <= set(traced["initial"]) and len(set(traced["initial"])) == len(traced["initial"])
    finalist = traced[f"finalist {chosen}"]
    assert set(val[:4] + asked) <= set(finalist) and len(set(finalist)) == len(finalist)
    assert set(finalist) - set(val[:4]) == set(traced["initial"])
    assert not (tmp_path / "out" / "validation_rows").exists()  # all in MLflow: nothing left on disk


def test_identical_runs_record_one_trace_per_question_of_each_prompt_in_its_run(tmp_path: Path) -> None:
    """Issue 49, item 5: identical runs kept 24-29 of 48 validation traces, a different number each time,
    and nothing was said (ten harness workers held SQLAlchemy's whole pool waiting on SQLite's write
    lock, and MLflow dropped what timed out). Five identical recordings of two prompts, one of which did
    not answer the first questions (as the initial instruction skips the selection questions): each
    run holds exactly one trace per question its prompt answered, every time."""
    from opro.data.dataset import Example, GoldenDataset
    from opro.evaluation.batch import EvaluationReport, EvaluationRow
    from opro.program.prompts import QATemplate
    from opro.tracking.genai import GenAILogger, PromptEvaluation

    n = 30
    dataset = GoldenDataset(tuple(Example(f"Question {i}?", f"Answer {i}.", (f"fact {i}",)) for i in range(n))).with_split(
        exemplar=0, optimization=0, validation=n, heldout=0, seed=0)
    questions = [e.query for e in dataset.examples_in("validation")]

    def rows(asked: list[str]) -> EvaluationReport:
        return EvaluationReport(rows=tuple(
            EvaluationRow(query=q, reference="r", answer=f"answer to {q}", contexts=("c1", "c2"), score=4.0, passing=True,
                          feedback="ok", prompt_tokens=10, completion_tokens=2) for q in asked))

    prompts = {"initial": questions[4:], "finalist 1": questions}
    counts = []
    for attempt in range(5):
        log = GenAILogger(tracking_uri=f"sqlite:///{tmp_path / f'mlflow-{attempt}.db'}", experiment_name="t",
                          dataset_prefix="t", prompt_name="qa-t")
        record = log.log_evaluations(
            [PromptEvaluation(label=label, template=QATemplate(instruction=f"Answer as {label}."), report=rows(asked))
             for label, asked in prompts.items()],
            dataset=dataset, split="validation", source="validation")
        by_run = {}
        for run in record.runs:
            traced = [next(s for s in t.data.spans if s.parent_id is None).inputs["question"]
                      for t in _traces(log.client, run.run_id)]
            by_run[run.label] = sorted(traced)
        assert by_run == {label: sorted(asked) for label, asked in prompts.items()}, attempt
        every = log.client.search_traces(locations=[log.experiment_id], max_results=1000)
        counts.append((len(every), *(len(t) for t in by_run.values())))
    assert counts == [(56, 26, 30)] * 5


def _children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds the sidecar through Linux's /proc")
def test_a_run_killed_while_recording_leaves_no_process_and_the_rerun_writes_what_it_lost(tmp_path: Path) -> None:
    """Issue 49: after kill -9 the MLflow sidecar went on writing for 95-156 s, racing the rerun, and the
    store then lacked runs and traces without a word. Killed while the sidecar writes the validation
    records: nothing of it is left after 10 s, and the rerun says what MLflow lacked and writes it again
    from the answers kept on disk, one finished evaluation run per prompt, every question traced."""
    import signal
    import sqlite3
    import time

    from children import argv

    config, val, pool = _close_call(tmp_path, validation=12, unused=6, ahead_every=3)
    db = tmp_path / "out" / "mlflow.db"
    proc = subprocess.Popen(argv("cli_on_close_call_models", str(tmp_path / "tied.txt"), "optimize", str(config),
                                 "--no-progress"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        deadline = time.monotonic() + 240
        writing = False
        while not writing and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            try:  # the first validation evaluation run is being written
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.2) as conn:
                    writing = bool(conn.execute("SELECT 1 FROM tags WHERE key = 'opro.source' AND value = "
                                                "'validation' LIMIT 1").fetchall())
            except sqlite3.Error:
                pass
        sidecars = _children_of(proc.pid)
        assert writing and sidecars, "the run ended or stalled before it recorded its validation stage"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        gone_by = time.monotonic() + 10
        while any(_alive(pid) for pid in sidecars) and time.monotonic() < gone_by:
            time.sleep(0.1)
        left = [pid for pid in sidecars if _alive(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, "the sidecar outlived the killed run by 10 s"
    finally:
        if proc.poll() is None:
            proc.kill()
    rerun = _optimize_process(config)
    assert rerun.returncode == 0, (rerun.stdout[-2000:], rerun.stderr[-3000:])
    assert "written again from the answers kept" in rerun.stderr, rerun.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    chosen = next(i for i, f in enumerate(summary["validation"]["finalists"], start=1) if f["chosen"])
    selection, confirmation, extension = val[:4], val[4:], pool[:6]
    assert _traced_questions(config) == {
        "initial": sorted(confirmation + extension),
        f"finalist {chosen}": sorted(selection + confirmation + extension),
        f"finalist {3 - chosen}": sorted(selection),
    }
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id
    runs = client.search_runs([exp_id], filter_string="tags.`opro.source` = 'validation'")
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert not (tmp_path / "out" / "validation_rows").exists()  # MLflow has them all now
