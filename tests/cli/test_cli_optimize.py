"""`opro optimize` tells the truth at the command line: the validated table, and no silent success."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import experiment_config, judge_reply, task_reply, write_toml
from typer.testing import CliRunner

import opro.experiment
from opro.cli import app
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM


def _pool(optimizer_reply: str) -> ModelPool:
    return ModelPool(scripted={
        "task": ScriptedLLM(default=task_reply, model="task"),
        "judge": ScriptedLLM(default=judge_reply, model="judge"),
        "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer"),
    })


def test_optimize_prints_search_and_validation_scores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reply = "<INS>Answer from the context, in one sentence.</INS>"
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: _pool(reply))
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "search score" in result.output and "validation score" in result.output
    said = " ".join(result.output.split())
    assert "a finalist beat the initial instruction on validation questions that did not choose it" in said
    assert "adjusted for having been claimed: +3.00" in said
    assert "registered: prompts:/qa-test@latest-best" in said and "no gain shown" not in said
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["score_basis"] == "validation" and summary["validated"] is True
    # No calibration was run: the record says the judge's noise is not measured, and how to measure it.
    assert summary["judge_noise"].startswith("judge noise: not measured") and "opro judge calibrate" in summary["judge_noise"]


def test_a_returned_initial_instruction_is_registered_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A judge that scores every answer 3: no finalist beats the initial instruction, and the registry's
    `latest-best` then holds the initial instruction, which the version and the command line both say."""
    from fakes import mlflow_client, optimizer_reply

    flat = ModelPool(scripted={
        "task": ScriptedLLM(default=task_reply, model="task"),
        "judge": ScriptedLLM(default=lambda m, o: '{"score": 3}', model="judge"),
        "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer"),
    })
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: flat)
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"], terminal_width=200)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "registered: prompts:/qa-test@latest-best (the initial instruction, no gain shown)" in said
    version = mlflow_client(config).get_prompt_version_by_alias("qa-test", "latest-best")
    assert version.tags["opro.returned"] == "initial instruction, no gain shown"
    assert version.commit_message.endswith("(initial instruction, no gain shown)")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert version.tags["opro.validated"] == "false" and summary["best_instruction"] in version.template


def test_no_usable_proposal_is_an_error_that_lists_the_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every proposal breaks the template (a stray brace) or repeats the initial instruction.
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: _pool("<INS>Answer the {question}.</INS>"))
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"], terminal_width=200)
    assert result.exit_code == 1, result.output
    assert "the optimizer proposed no usable instruction in 2 step(s)" in result.output
    assert "12 rejected: contains a template variable" in result.output
    assert "check [models.optimizer]" in result.output


def test_optimize_output_reads_at_80_columns_in_a_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52, item 9: piped to a log at 80 columns the result table put each instruction one word
    per line. Rows are numbered; the instructions are listed whole below the table."""
    from narrow import invoke_narrow

    from opro.llm import GenerationOptions, Message

    def long_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return (f"<INS>Answer from the context in one or two plain sentences, quoting the passage that supports "
                f"the answer, and say that you do not know when the context is silent (variant {options.seed}).</INS>")

    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: _pool(long_reply))  # type: ignore[arg-type]
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    result = invoke_narrow(["optimize", str(config), "--no-progress"], monkeypatch, min_tables=2)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    said = " ".join(result.output.split())
    assert f"#1 {summary['initial_instruction']}" in said  # the listing: each instruction whole, by its number
    assert f"#2 {summary['best_instruction']}" in said and "#2 finalist 1 *" in said  # returned: finalist 1
    assert not [line for line in result.output.splitlines() if "│" in line and "quoting" in line]  # not in the grid
