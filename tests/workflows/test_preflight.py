"""What ``opro optimize`` checks before it plans or asks anything (:mod:`opro.workflows.preflight`): a task
model of the search that cannot answer stops the run there, naming its table and what was tried."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from fakes import FAULT_KEY, experiment_config, write_toml
from fault_server import FaultServer
from typer.testing import CliRunner

from opro.cli import app

URL_SECRET = "urlsecret-5c4b3a"
PRICES = {"price_prompt": 0.1, "price_completion": 0.4}


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_task_choice_stops_optimize_before_the_search_naming_its_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 66: a [models.task_choices] model on a port nothing listens on was dropped from the search
    (its candidates marked failed, rc 0, "4 candidates (0 pruned)")."""
    port = _dead_port()
    with FaultServer(key=FAULT_KEY) as server:
        cfg = experiment_config(tmp_path, optimizer={"steps": 1, "candidates_per_step": 2, "minibatch_size": 2})
        for role in ("task", "judge", "optimizer", "generator"):
            cfg["models"][role] = {"backend": "openai", "model": f"{'optimizer' if role == 'generator' else role}-model",
                                   "base_url": server.base_url, "api_key_env": "OPRO_FAULT_KEY", **PRICES}
        cfg["models"]["task_choices"] = {"alt": {
            "backend": "openai", "model": "alt-model", "base_url": f"http://127.0.0.1:{port}/v1?api-key={URL_SECRET}",
            "api_key_env": "OPRO_FAULT_KEY", **PRICES}}
        cfg["search"] = {"space": {"task_model": ["task", "alt"]}}
        cfg["experiment"]["progress"] = False
        config = write_toml(cfg, tmp_path / "exp.toml")
        monkeypatch.setenv("OPRO_FAULT_KEY", FAULT_KEY)
        monkeypatch.setenv("COLUMNS", "400")
        result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert "[models.task_choices.alt]" in said and f"cannot reach http://127.0.0.1:{port}/v1?api-key=***" in said
    assert f"tried: GET http://127.0.0.1:{port}/v1/models?api-key=***" in said
    assert "take 'alt' out of [search.space].task_model" in said
    assert URL_SECRET not in said and "Traceback" not in said
    # Before the search: no candidate answered, nothing planned.
    assert sum(server.counts.values()) == 0, server.counts
    assert not (tmp_path / "out" / "history.jsonl").exists() and not (tmp_path / "out" / "plan.json").exists()
