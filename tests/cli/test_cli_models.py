"""`opro models list | pull | path`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import require_embedded
from typer.testing import CliRunner

from opro.cli import app
from opro.llm.packs import EMBEDDED_MODELS, EMBEDDED_TASK_MODEL

runner = CliRunner()


def test_models_list_shows_both_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPRO_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    for name in EMBEDDED_MODELS:
        assert name in result.output
    assert "assembled" not in result.output  # empty cache dir: present or missing only


def test_models_path_unknown_name_fails_clearly() -> None:
    result = runner.invoke(app, ["models", "path", "no-such-model"])
    assert result.exit_code == 1
    assert "unknown model 'no-such-model'" in result.output


def test_models_pull_unknown_name_fails_clearly() -> None:
    result = runner.invoke(app, ["models", "pull", "no-such-model"])
    assert result.exit_code == 1
    assert "choose one of" in result.output


def test_models_path_prints_the_assembled_file() -> None:
    require_embedded(EMBEDDED_TASK_MODEL)
    pack = EMBEDDED_MODELS[EMBEDDED_TASK_MODEL]
    result = runner.invoke(app, ["models", "path", EMBEDDED_TASK_MODEL])
    assert result.exit_code == 0, result.output
    path = Path(result.output.strip().splitlines()[-1])
    assert path == pack.target() and path.stat().st_size == pack.size
