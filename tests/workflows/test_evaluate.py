"""`opro evaluate` as a library call (opro.workflows.evaluate): what it records goes through the one
recording seam, the prompt's rows included, so MLflow's GenAI evaluation runs are a recorder like any."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import experiment_config, scripted_pool, write_toml

import opro.experiment
from opro.config import load_config
from opro.testing import MemoryRecorder
from opro.workflows.evaluate import evaluate_prompt


@pytest.fixture
def scripted_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    return write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")


def test_an_evaluation_records_its_rows_through_the_recorders_it_is_given(scripted_config: Path) -> None:
    recorder = MemoryRecorder()
    done = evaluate_prompt(scripted_config, prompt="text:Answer from the context.", split="validation",
                           recorders=[recorder], progress=False)
    (record,) = recorder.records
    assert record.kind == "evaluation" and record.split == "validation"
    (evaluated,) = record.evaluations
    assert evaluated.report == done.report and evaluated.template == done.prompt.template
    assert evaluated.tags == {"opro.spec": "text:Answer from the context."}
    assert [r.recorder for r in done.recorded] == ["memory"]


def test_one_factory_picks_the_genai_recorder_for_a_command_that_evaluated(tmp_path: Path) -> None:
    from opro.tracking.factory import command_recorders

    tracking = {"prompt_name": "qa-test", "genai": True, "sidecar": False}
    cfg = load_config(write_toml(experiment_config(tmp_path, tracking=tracking), tmp_path / "exp.toml"))
    exp = opro.experiment.Experiment(cfg, progress=False)
    try:
        with_genai = [r.name for r in command_recorders(cfg, evaluated=exp)]
        plain = [r.name for r in command_recorders(cfg)]
        off = command_recorders(cfg, mlflow=False, evaluated=exp)
    finally:
        exp.close()
    assert with_genai == ["mlflow", "mlflow-genai"]
    assert plain == ["mlflow"] and off == []
