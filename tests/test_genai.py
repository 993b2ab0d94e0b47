"""MLflow 3 GenAI records on scripted models: evaluation datasets, evaluation runs, traces, assessments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_compare import optimized
from test_experiment import _pool as scripted_pool

from opro.compare import compare_prompts, save_comparison
from opro.experiment import Experiment


def _client(config: Path) -> Any:
    from mlflow import MlflowClient

    uri = f"sqlite:///{config.parent / 'out' / 'mlflow.db'}"
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _logger(config: Path) -> Any:
    from opro.genai import GenAILogger

    return GenAILogger(tracking_uri=f"sqlite:///{config.parent / 'out' / 'mlflow.db'}", experiment_name="t",
                       dataset_prefix="t")


def _traces(client: Any, run_id: str) -> list[Any]:
    exp_id = client.get_run(run_id).info.experiment_id
    return list(client.search_traces(locations=[exp_id], run_id=run_id, max_results=500))


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    config = optimized(tmp_path_factory.mktemp("genai"))
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"])
        saved = save_comparison(report, experiment=exp, name="pair")
    finally:
        exp.close()
    return config, report, saved


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
        assert tags["opro.comparison_run_id"] == saved.mlflow_run_id and tags["opro.spec"] == prompt.spec
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
    from opro.dataset import load_dataset

    return load_dataset(config.parent / "out" / "dataset").content_hash[:8]


def test_optimize_records_its_validation_stage_once(compared: tuple[Path, Any, Any]) -> None:
    config, _, _ = compared
    client = _client(config)
    exp_id = client.get_experiment_by_name("t").experiment_id

    def validation_runs() -> list[Any]:
        return list(client.search_runs([exp_id], filter_string="tags.`opro.source` = 'validation'"))

    runs = validation_runs()
    summary = json.loads((config.parent / "out" / "summary.json").read_text())
    finalists = summary["validation"]["finalists"]
    assert len(runs) == 1 + len(finalists)
    by_label = {r.data.tags["opro.prompt_label"]: r for r in runs}
    assert by_label["initial"].data.metrics["correctness/mean"] == summary["validation"]["initial_score"]
    for i, f in enumerate(finalists, start=1):
        assert by_label[f"finalist {i}"].data.metrics["correctness/mean"] == pytest.approx(f["validation_score"])
    assert all(r.data.tags["opro.optimization_run_id"] == summary["mlflow_run_id"] for r in runs)
    assert all(len(_traces(client, r.info.run_id)) == 8 for r in runs)

    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        exp.optimize()  # a finished study: nothing new is recorded
    finally:
        exp.close()
    assert len(validation_runs()) == len(runs)


def test_genai_records_can_be_switched_off(tmp_path: Path) -> None:
    config = optimized(tmp_path)
    text = config.read_text().replace("[tracking]\n", "[tracking]\ngenai = false\n")
    config.write_text(text)
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"])
        saved = save_comparison(report, experiment=exp, name="off")
    finally:
        exp.close()
    assert saved.mlflow_run_id is not None and saved.evaluation_run_ids == ()
