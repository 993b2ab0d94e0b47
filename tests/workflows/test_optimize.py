"""The one face of optimize: ``opro.optimize`` is what ``opro optimize`` runs, its checks before a
run, worker 0's plan and the run itself in one function."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakes import scripted_pool, write_config

import opro
import opro.experiment
from opro.config import load_config
from opro.errors import ConfigError
from opro.workflows.optimize import OptimizeRun


def test_opro_optimize_says_the_plan_keeps_it_and_returns_the_run_beside_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", scripted_pool)
    heard: list[str] = []
    done = opro.optimize(load_config(write_config(tmp_path)), progress=False, notice=heard.append)
    assert isinstance(done, OptimizeRun) and done.worker_index == 0
    assert done.result.best_score == 5.0 and done.result.initial_score == 2.0
    assert heard and (tmp_path / "out" / "plan.json").is_file()  # the plan, said and kept
    assert done.plan_check and "summary.json" in done.outputs  # put beside the run's calls, and its files named


def test_opro_optimize_refuses_a_missing_input_by_its_key_before_writing_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", scripted_pool)
    config = write_config(tmp_path)
    shutil.rmtree(tmp_path / "docs")
    with pytest.raises(ConfigError, match=r"\[data\]\.docs\[0\]"):
        opro.optimize(config, progress=False)
    assert not (tmp_path / "out").exists()
