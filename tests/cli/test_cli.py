"""`opro optimize` and `opro evaluate` through the command line, on scripted models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import experiment_config, mlflow_client, scripted_pool, write_toml
from typer.testing import CliRunner

import opro.experiment
import opro.search.study
from opro.cli import app
from opro.errors import ConfigError


@pytest.fixture
def scripted_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    return write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")


def test_optimize_then_evaluate(scripted_config: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["optimize", str(scripted_config), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "best" in result.output and "initial" in result.output
    assert "prompts:/qa-test@latest-best" in result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["best_score"] == 5.0

    result = runner.invoke(app, ["evaluate", str(scripted_config), "--prompt", "best", "--split", "heldout", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "heldout" in result.output
    rows = json.loads((tmp_path / "out" / "evaluate" / "heldout-run.json").read_text())
    assert rows  # the per-question table was written
    # The evaluation is one record (opro.kind = evaluation): its split, figures and tables, and it says where.
    client = mlflow_client(scripted_config)
    exp_id = client.get_experiment_by_name("t").experiment_id
    (run,) = client.search_runs([exp_id], filter_string="tags.`opro.kind` = 'evaluation'")
    assert run.data.tags["opro.split"] == "heldout" and run.data.params["evaluate.n_questions"] == "4"
    assert run.data.metrics["mean"] == 5.0 and run.data.metrics["n_scored"] == 4
    assert f"recorded: MLflow run {run.info.run_id}" in result.output
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id, "evaluate")) == [
        "evaluate/heldout-run.csv", "evaluate/heldout-run.json"]

    out_csv = tmp_path / "init.csv"
    result = runner.invoke(
        app, ["evaluate", str(scripted_config), "--prompt", "initial", "--split", "optimization", "--out", str(out_csv),
              "--no-progress", "--no-mlflow"]
    )
    assert result.exit_code == 0, result.output
    assert len(out_csv.read_text().strip().splitlines()) == 1 + 3  # header + 3 optimization questions
    assert "recorded:" not in result.output
    assert len(client.search_runs([exp_id], filter_string="tags.`opro.kind` = 'evaluation'")) == 1


@pytest.mark.parametrize("command", ["optimize", "plan"])
@pytest.mark.parametrize(("key", "value"), [("[data].dataset", "no-such-qa.jsonl"), ("[data].docs[0]", "no-such-docs")])
def test_a_missing_file_is_named_by_its_key_before_the_plan(
        scripted_config: Path, command: str, key: str, value: str) -> None:
    """The plan used to be printed whole, then "No such file or directory" without the config key."""
    line = f'dataset = "{value}"' if key == "[data].dataset" else f'docs = ["{value}"]'
    text = "\n".join(line if ln.startswith(line.split(" = ")[0] + " = ") else ln
                     for ln in scripted_config.read_text().splitlines())
    scripted_config.write_text(text + "\n")
    result = CliRunner().invoke(app, [command, str(scripted_config)], terminal_width=200)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"{key} = '{value}': no such file or folder (looked for " in said, said
    assert "plan for" not in result.output and "calls" not in result.output


def test_cli_errors_are_clear(scripted_config: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.toml"
    bad.write_text(scripted_config.read_text().replace("[optimizer]", "[optimizer]\nstepz = 3"))
    result = runner.invoke(app, ["optimize", str(bad)])
    assert result.exit_code == 2
    assert "unknown key [optimizer].stepz" in result.output
    result = runner.invoke(app, ["evaluate", str(scripted_config), "--split", "train"])
    assert result.exit_code == 2 and "--split 'train'" in result.output
    result = runner.invoke(app, ["optimize", str(scripted_config), "--worker", "two"])
    assert result.exit_code == 2 and "I/N" in result.output
    result = runner.invoke(app, ["optimize", str(scripted_config), "--worker", "0/0"])
    assert result.exit_code != 0 and "--worker 0/0: N is the number of workers" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # A file where a folder must be: one line naming the path and what to do, not a traceback.
        ({"experiment": {"output_dir": "afile/out"}}, "Not a directory: "),
        ({"experiment": {"cache_path": "afile"}}, "as the call cache (file is not a database)"),
        ({"experiment": {"cache_path": "adir"}}, "as the call cache (unable to open database file)"),
        ({"tracking": {"mlflow_uri": "http://127.0.0.1:9"}},  # refused: named at once, not retried for minutes
         "cannot reach the MLflow tracking server at http://127.0.0.1:9 ([tracking].mlflow_uri)"),
        ({"tracking": {"optuna_storage": "postgresql+nosuchdriver://u@127.0.0.1:9/db"}},
         "cannot open the Optuna study store postgresql+nosuchdriver://***@127.0.0.1:9/db ([tracking].optuna_storage)"),
    ],
)
def test_paths_and_stores_that_cannot_be_used_are_named_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, dict[str, str]], message: str
) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    (tmp_path / "afile").write_text("not a folder, not a database\n")
    (tmp_path / "adir").mkdir()
    config = write_toml(experiment_config(tmp_path, **overrides), tmp_path / "exp.toml")
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("sqlite:///{tmp}/afile", "): file is not a database; point it at a new file"),
        ("sqlite:///{tmp}/adir", "names a folder: name a database file in it"),
        ("postgresql+psycopg2://u:pw@127.0.0.1:9/db",
         "cannot open the Optuna study store postgresql+psycopg2://***@127.0.0.1:9/db ([tracking].optuna_storage): "
         "connection to server at"),
    ],
)
def test_a_study_store_that_cannot_be_opened_is_named_on_a_first_run_and_on_a_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str, message: str
) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    monkeypatch.setattr(opro.search.study.time, "sleep", lambda s: None)  # the store's retries, not waited for
    (tmp_path / "afile").write_text("not a database\n")
    (tmp_path / "adir").mkdir()
    config = write_toml(experiment_config(tmp_path, tracking={"optuna_storage": store.format(tmp=tmp_path)}),
                        tmp_path / "exp.toml")
    for attempt in ("first run", "rerun"):  # a rerun opens the store earlier, to read the study's split record
        result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
        assert result.exit_code == 2, (attempt, result.output)
        text = " ".join(result.output.split())
        assert message in text and "Traceback" not in text and "pw@" not in text, (attempt, text)
        assert result.exception is None or isinstance(result.exception, SystemExit)
        run = tmp_path / "out"
        (run / "split_record.json").parent.mkdir(parents=True, exist_ok=True)
        (run / "split_record.json").write_text("{}")


def test_an_unknown_model_names_its_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    models = {"task": {"backend": "llamacpp", "model": "qwen2.5-coder-typo"}}
    config = write_toml(experiment_config(tmp_path, models=models), tmp_path / "exp.toml")
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
    text = " ".join(result.output.split())
    assert result.exit_code == 1 and "[models.task].model: unknown model 'qwen2.5-coder-typo'" in text, text


def test_an_mlflow_server_that_answers_anything_passes_the_reachability_check() -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from opro.tracking import check_server

    class Login(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # a server behind a login refuses the health check: still reachable
            self.send_response(401)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Login)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_server(f"http://127.0.0.1:{server.server_port}")
        # Credentials in the URI are MLflow's to send, not part of the host name.
        check_server(f"http://user:s3cret-pw@127.0.0.1:{server.server_port}/")
        check_server("sqlite:///nowhere/mlflow.db")  # not a server: left to MLflow
        for bad in ("http://exa mple:5000", "http://[::1"):
            with pytest.raises(ConfigError, match="is not a valid URL"):
                check_server(bad)
    finally:
        server.shutdown()
        server.server_close()


def test_a_dataset_of_one_question_repeated_says_why_the_optimization_split_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    dups = tmp_path / "dups.jsonl"
    dups.write_text((json.dumps({"question": "What is AlexNet?", "answer": "A CNN."}) + "\n") * 24)
    config = write_toml(experiment_config(tmp_path, data={"dataset": str(dups)}), tmp_path / "exp.toml")
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "the optimization split is empty: the split came out smaller than requested" in text
    assert "duplicate, near-duplicate and same-context questions are kept in one split" in text


def test_help_keeps_the_config_keys_in_brackets() -> None:
    result = CliRunner().invoke(app, ["judge", "calibrate", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "[data].dataset" in text and "instead of [models.judge]" in text


@pytest.mark.parametrize(
    ("args", "code", "stream", "text"),
    [
        (["--help"], 0, "stdout", "optimize"),
        (["optimize", "no-such-config.toml"], 2, "stderr", "config file not found: no-such-config.toml"),
        (["no-such-command"], 2, "stderr", "No such command"),
    ],
)
def test_the_command_exits_with_its_code_and_all_its_output_after_skipping_teardown(
    args: list[str], code: int, stream: str, text: str, tmp_path: Path
) -> None:
    # main() ends the process with os._exit after the exit handlers: the code and every buffered
    # line (stdout is a pipe here, so block-buffered) must still come out.
    proc = subprocess.run([sys.executable, "-m", "opro.cli", *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, timeout=120)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert text in getattr(proc, stream)


def test_evaluate_and_export_against_a_store_that_cannot_record_fail_before_any_call_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 61: `opro evaluate` and `opro export` against a read-only or unwritable MLflow store did the work
    (20 calls, files written) and then exited 2, and the message did not name --no-mlflow."""
    from fakes import judge_reply, optimizer_reply, task_reply

    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    models = {role: ScriptedLLM(default=reply, model=role) for role, reply in
              (("task", task_reply), ("judge", judge_reply), ("optimizer", optimizer_reply))}
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: ModelPool(scripted=models))
    monkeypatch.setenv("COLUMNS", "300")
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "mlflow.db").write_bytes(b"")
    runner = CliRunner()
    stores = {"unwritable": (f"sqlite:///{tmp_path / 'afile' / 'mlflow.db'}", f"{tmp_path / 'afile'} is not a folder"),
              "read-only": (f"sqlite:///{tmp_path / 'locked' / 'mlflow.db'}", "mlflow.db is read-only")}
    for name, (uri, why) in stores.items():
        config = write_toml(experiment_config(tmp_path, tracking={"prompt_name": "qa-test", "genai": False,
                                                                  "sidecar": False, "mlflow_uri": uri}),
                            tmp_path / f"{name}.toml")
        (tmp_path / "locked" / "mlflow.db").chmod(0o444)  # read-only by its mode: refused for root too
        (tmp_path / "locked").chmod(0o555)
        try:
            evaluated = runner.invoke(app, ["evaluate", str(config), "--prompt", "initial", "--split", "heldout",
                                            "--no-progress"])
            exported = runner.invoke(app, ["export", "initial", "--config", str(config), "--format", "llamaindex"])
        finally:
            (tmp_path / "locked").chmod(0o755)
            (tmp_path / "locked" / "mlflow.db").chmod(0o644)
        for done in (evaluated, exported):
            said = " ".join(done.output.split())
            assert done.exit_code == 2, (name, done.output)
            assert "cannot record" in said and why in said and "--no-mlflow" in said, said
            assert "nothing was asked or written" in said and "Traceback" not in said
        assert not any(m.calls for m in models.values())  # not one LLM call
        assert not (tmp_path / "out" / "evaluate").exists() and not (tmp_path / "out" / "export").exists()
    # --no-mlflow does the work and records nothing.
    done = runner.invoke(app, ["evaluate", str(tmp_path / "unwritable.toml"), "--prompt", "initial", "--split",
                               "heldout", "--no-progress", "--no-mlflow"])
    assert done.exit_code == 0, done.output
    assert models["judge"].calls and (tmp_path / "out" / "evaluate" / "heldout-initial.json").is_file()
