"""Issue 52, item 9: every table a command prints reads at 80 columns in a log (no TTY): no line
wider, no row taller than 3 lines; long texts (paths, queries, answers) are listed below, not folded
into a grid. optimize and compare are checked in test_cli_optimize and test_compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import experiment_config, judge_reply, write_toml
from narrow import invoke_narrow, row_heights

import opro.experiment
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM

QUERY = "What did the authors of the paper say about the dropout rate in the two fully connected layers?"
ANSWER = ("They used dropout with probability 0.5 in the first two fully connected layers, which roughly doubled "
          "the iterations needed to converge; without it the network overfit substantially.")


def test_the_row_reader_counts_the_lines_of_each_row() -> None:
    from rich.table import Table

    table = Table(title="t")
    table.add_column("a")
    table.add_column("b")
    table.add_row("one", "x\ny\nz\nw")
    table.add_row("two", "x")
    assert row_heights(table) == [1, 4, 1] and not table.show_lines  # the header first; the table left as it was


def test_models_list_lists_paths_below_its_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opro.llm.packs import EMBEDDED_MODELS

    monkeypatch.setenv("OPRO_CACHE_DIR", str(tmp_path / "a-cache-folder-as-deep-as-a-user-home" / "opro" / "cache"))
    result = invoke_narrow(["models", "list"], monkeypatch)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    for i, name in enumerate(EMBEDDED_MODELS, start=1):
        assert f"#{i} │ {name}" in said and f"run `opro models pull {name}`" in said


def test_dataset_show_lists_examples_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from opro.cli import app

    src = tmp_path / "qa.jsonl"
    src.write_text("".join(json.dumps({"question": f"{QUERY} ({i})", "answer": ANSWER}) + "\n" for i in range(12)))
    assert CliRunner().invoke(app, ["dataset", "import", str(src), "--out", str(tmp_path / "ds")]).exit_code == 0
    result = invoke_narrow(["dataset", "show", str(tmp_path / "ds"), "-n", "2"], monkeypatch, min_tables=0)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"#1 query: {QUERY} (1) reference answer: {ANSWER}" in said
    assert max(len(line.rstrip()) for line in result.output.splitlines()) <= 80


def test_judge_calibrate_and_agreement_read_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = ModelPool(scripted={"task": ScriptedLLM(default="Using the context: yes.", model="task"),
                               "judge": ScriptedLLM(default=judge_reply, model="judge")})
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: pool)
    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    result = invoke_narrow(["judge", "calibrate", str(config), "--n", "4", "--retest", "1", "--no-mlflow",
                            "--no-progress"], monkeypatch)
    assert result.exit_code == 0, result.output
    verdicts = tmp_path / "out" / "judge_calibration" / "verdicts.csv"
    agreement = invoke_narrow(["judge", "agreement", "--answers", str(verdicts), "--labels", str(verdicts)],
                              monkeypatch, min_tables=2)
    assert agreement.exit_code == 0, agreement.output
    assert "exact agreement" in agreement.output


def _too_wide(output: str) -> list[str]:
    """Lines over 80 columns that could have wrapped (a single word, such as a long path, or a
    `quoted command`, which is kept whole so that it can be copied, cannot)."""
    import re

    return [line for line in output.splitlines()
            if len(line) > 80 and len(re.sub(r"`[^`]*`", "command", line).split()) > 1]


def test_plan_probe_and_optimize_lines_wrap_at_80_columns_in_a_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 60: nine plan and probe lines ran to 185-423 characters in an 80-column log. Every line of
    `opro plan`, `opro plan --probe`, `opro probe` and `opro optimize` now wraps at the console's width,
    a long one continued under its indent; the words stay whole (keys and paths are copyable)."""
    from fakes import scripted_pool

    monkeypatch.setattr(opro.experiment, "ModelPool", scripted_pool)
    config = write_toml(experiment_config(tmp_path, questions=40, search={"space": {"demos": [0, 2], "top_k": [1, 3]}},
                                          optimizer={"validation_extension": 5}), tmp_path / "exp.toml")
    for args in (["plan", str(config)], ["probe", str(config), "--no-mlflow", "--no-progress"],
                 ["plan", str(config), "--probe"], ["optimize", str(config), "--no-progress"]):
        result = invoke_narrow(args, monkeypatch, min_tables=0)
        assert result.exit_code == 0, result.output
        assert not _too_wide(result.output), f"opro {args[0]}: lines over 80 columns:\n" + "\n".join(
            _too_wide(result.output))
        if args[0] == "plan":
            assert "plan for" in result.output and "calls" in result.output
    said = " ".join(result.output.split())
    assert "search score: mean on the 3 optimization questions, which the search selected on" in said
