"""A user's query engine over a real vector database (Chroma's persistent client, through
llama-index-vector-stores-chroma), named by ``[program].factory``: optimized end to end with a warm rerun making
no call, compared, exported and loaded back into the same engine, and resumed after a kill during validation
to the decision an uninterrupted run makes. Skipped naming the package where chromadb is missing; CI must run it."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import optuna
import pipelines
import pytest
from fakes import FAULT_KEY, experiment_config, opro_process, scripted_pool, task_reply, write_toml
from fault_server import FaultServer

from opro.experiment import Experiment
from opro.llm import ChatClient
from opro.llm.scripted import ScriptedLLM
from opro.program.rag import TEXT_QA_KEY, chat_client_llm

TESTS = Path(__file__).parents[1]


@pytest.fixture
def chroma(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Chroma collection of the test corpus on disk, where ``pipelines:chroma_engine`` reads it."""
    path = tmp_path / "chroma"
    pipelines.build_chroma(path)  # skips, naming chromadb, where it is missing
    monkeypatch.setenv(pipelines.CHROMA_DIR, str(path))
    pipelines._chroma_index.cache_clear()
    return path


def _config(tmp_path: Path, *, out: str = "out", **models: dict) -> Path:
    cfg = experiment_config(tmp_path, experiment={"name": "t", "output_dir": out, "cache_path": "calls.sqlite",
                                                  "progress": False}, program={"factory": "pipelines:chroma_engine"})
    del cfg["data"]["docs"]
    cfg["models"].update(models)
    return write_toml(cfg, tmp_path / f"{out}.toml")


def test_an_engine_over_chroma_is_optimized_compared_and_its_export_loads_back(
    tmp_path: Path, chroma: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import opro.experiment
    from opro.export.load import load_llamaindex_prompt
    from opro.heldout.compare import ComparisonSettings
    from opro.workflows.compare import compare_and_save
    from opro.workflows.export import export_spec

    exp = Experiment.from_file(_config(tmp_path), pool=scripted_pool(), progress=False)
    try:
        result = exp.optimize()
    finally:
        exp.close()
    assert result.initial_score == 2.0 and result.best_score == 5.0 and result.validated
    assert json.loads(exp.fingerprint()["program"])["reports"] == {"collection": "alexnet", "store": "chroma"}
    again = Experiment.from_file(_config(tmp_path, out="again"), pool=scripted_pool(), progress=False)
    try:
        second = again.optimize()
    finally:
        again.close()
    assert again.usage.total_calls() == 0 and second.best_instruction == result.best_instruction

    monkeypatch.setattr(opro.experiment, "ModelPool", scripted_pool)
    compared = compare_and_save(_config(tmp_path), ComparisonSettings(prompts=("best",), mlflow=False), progress=False)
    assert {p.spec: set(p.scores) for p in compared.report.prompts} == {"initial": {2.0}, "best": {5.0}}

    engine = pipelines.chroma_engine(chat_client_llm(ChatClient(ScriptedLLM(default=task_reply), role="task")))
    for spec, answer in (("initial", "Yes."), ("best", "Using the context: yes.")):
        exported = export_spec(spec, config=_config(tmp_path), format="llamaindex", mlflow=False, out=tmp_path / spec)
        engine.update_prompts({TEXT_QA_KEY: load_llamaindex_prompt(exported.paths[0])})
        assert str(engine.query("Who designed AlexNet?")) == answer


def _served(tmp_path: Path, server: FaultServer) -> Path:
    models = {role: {"backend": "openai", "model": f"{'optimizer' if role == 'generator' else role}-model",
                     "base_url": server.base_url, "api_key_env": "OPRO_FAULT_KEY", "max_concurrency": 2}
              for role in ("task", "judge", "optimizer", "generator")}
    return _config(tmp_path, **models)


def _decision(run: Path) -> dict:
    summary = json.loads((run / "out" / "summary.json").read_text())
    return {k: summary[k] for k in ("best_instruction", "best_score", "initial_score", "validated")}


def test_a_kill_during_validation_resumes_to_the_same_decision(
    tmp_path: Path, chroma: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "ref").mkdir()
    (tmp_path / "run").mkdir()
    with FaultServer(key=FAULT_KEY) as server:
        reference = opro_process("optimize", str(_served(tmp_path / "ref", server)), "--no-progress")
        out, _ = reference.communicate(timeout=300)
        assert reference.returncode == 0, out
        config = _served(tmp_path / "run", server)
        server.latency_s = 0.05
        proc = opro_process("optimize", str(config), "--no-progress", start_new_session=True)
        storage = f"sqlite:///{tmp_path / 'run' / 'out' / 'optuna.db'}"
        deadline, validating = time.monotonic() + 240, False
        while not validating and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            try:  # a validation batch's scores are in the study: the stage is under way
                attrs = optuna.load_study(study_name="t", storage=storage).user_attrs
            except Exception:
                continue
            validating = any(k.startswith("validation:") for k in attrs)
        assert validating and proc.poll() is None, "the run ended before its validation could be interrupted"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert not (tmp_path / "run" / "out" / "summary.json").exists()
        server.latency_s = 0.0
        resumed = opro_process("optimize", str(config), "--no-progress")
        out, _ = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, out
    assert _decision(tmp_path / "run") == _decision(tmp_path / "ref")
    assert _decision(tmp_path / "run")["validated"]
