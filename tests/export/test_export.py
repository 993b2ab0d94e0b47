"""Each export format round-trips: text, JSON, LlamaIndex, DSPy, MLflow Prompt Registry; and the CLI."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opro.errors import ConfigError, DataError, PromptError
from opro.export import export_prompt, load_dspy_signature, load_llamaindex_prompt, load_prompt_json
from opro.export.sources import resolve_prompt
from opro.program.prompts import QATemplate

INSTRUCTION = "Answer only from the context {as JSON}, in one sentence."


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """An optimization output directory as `opro optimize` leaves it (summary.json)."""
    out = tmp_path / "run"
    out.mkdir()
    template = QATemplate(instruction=INSTRUCTION).template_text
    (out / "summary.json").write_text(
        json.dumps(
            {
                "best_instruction": INSTRUCTION,
                "best_template": template,
                "best_score": 4.5,
                "score_basis": "validation",
                "initial_instruction": "Answer.",
                "initial_score": 3.0,
                "validation": {"initial_score": 3.5},
                "gain": None,
                "mlflow_run_id": "abc123",
                "study_name": "s",
            }
        )
    )
    (out / "best_prompt.txt").write_text(template)
    return out


def test_text_round_trip(run_dir: Path, tmp_path: Path) -> None:
    prompt = resolve_prompt(f"run:{run_dir}")
    assert prompt.instruction == INSTRUCTION
    result = export_prompt(prompt, format="text")
    assert result.content == prompt.template_text and not result.paths
    written = export_prompt(prompt, format="text", out=tmp_path / "p.txt")
    assert resolve_prompt(str(written.paths[0])).template == prompt.template
    # An editor's trailing newline (or a stripped trailing space) does not break the parse.
    (tmp_path / "edited.txt").write_text(prompt.template_text.rstrip() + "\n")
    assert resolve_prompt(str(tmp_path / "edited.txt")).template == prompt.template
    # After-layout templates survive too.
    after = QATemplate(instruction="Be brief.", position="after")
    (tmp_path / "after.txt").write_text(after.template_text)
    assert resolve_prompt(str(tmp_path / "after.txt")).template == after


def test_json_round_trip_with_provenance_and_no_secrets(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-xyz")
    prompt = resolve_prompt(f"run:{run_dir}")
    result = export_prompt(prompt, format="json", out=tmp_path / "exports")
    path = result.paths[0]
    assert path == tmp_path / "exports" / "prompt.json"
    data = json.loads(path.read_text())
    assert data["instruction"] == INSTRUCTION
    assert data["template"] == prompt.template_text
    assert data["variables"] == ["context_str", "query_str"]
    prov = data["provenance"]
    assert prov["mlflow_run_id"] == "abc123" and prov["score"] == 4.5 and prov["score_basis"] == "validation"
    # Each score names its data (issue 40, item 4): the initial one on both, and no gain is null, not 0.
    assert prov["initial_search_score"] == 3.0 and prov["initial_validation_score"] == 3.5 and prov["gain"] is None
    assert "optimization_score" not in prov and "initial_score" not in prov
    assert "sk-secret" not in path.read_text()
    assert load_prompt_json(path) == prompt.template
    assert resolve_prompt(str(path)).template == prompt.template  # a prompt source for compare / export


def test_llamaindex_round_trip_and_snippet(run_dir: Path, tmp_path: Path) -> None:
    prompt = resolve_prompt(f"run:{run_dir}")
    result = export_prompt(prompt, format="llamaindex", out=tmp_path / "li.json")
    json_path, py_path = result.paths
    assert py_path.name == "li.py"
    loaded = load_llamaindex_prompt(json_path)
    expected = prompt.template.format(context_str="CTX {x}", query_str="Q?")
    assert loaded.format(context_str="CTX {x}", query_str="Q?") == expected
    assert sorted(loaded.template_vars) == ["context_str", "query_str"]
    snippet = runpy.run_path(str(py_path))["TEXT_QA_TEMPLATE"]
    assert snippet.format(context_str="CTX {x}", query_str="Q?") == expected
    # A query engine accepts it under the synthesizer's QA prompt key.
    from llama_index.core.response_synthesizers import get_response_synthesizer

    from opro.export import LLAMAINDEX_PROMPT_KEY

    synth = get_response_synthesizer(llm=_MockLLM(), response_mode="compact")
    synth.update_prompts({LLAMAINDEX_PROMPT_KEY.split(":", 1)[1]: loaded})
    assert synth.get_prompts()[LLAMAINDEX_PROMPT_KEY.split(":", 1)[1]].get_template() == prompt.template_text
    assert resolve_prompt(str(json_path)).template == prompt.template


def _MockLLM() -> object:
    from llama_index.core.llms import MockLLM

    return MockLLM()


def test_dspy_round_trip_and_snippet(run_dir: Path, tmp_path: Path) -> None:
    prompt = resolve_prompt(f"run:{run_dir}")
    result = export_prompt(prompt, format="dspy", out=tmp_path)
    json_path, py_path = result.paths
    assert json_path.name == "prompt.dspy.json" and py_path.name == "prompt_dspy.py"
    signature = load_dspy_signature(json_path)
    import dspy

    assert issubclass(signature, dspy.Signature)
    assert signature.instructions == INSTRUCTION
    assert list(signature.input_fields) == ["context", "question"] and list(signature.output_fields) == ["answer"]
    snippet = runpy.run_path(str(py_path))["OproQA"]
    assert snippet.instructions == INSTRUCTION
    assert resolve_prompt(str(json_path)).instruction == INSTRUCTION
    with pytest.raises(PromptError, match="no instruction"):
        export_prompt(resolve_prompt(str(_template_only(tmp_path))), format="dspy", out=tmp_path)


def _template_only(tmp_path: Path) -> Path:
    path = tmp_path / "custom.txt"
    path.write_text("Q: {query_str}\nC: {context_str}\nA:")
    return path


def test_mlflow_registry_round_trip_with_alias(run_dir: Path, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'registry.db'}"
    prompt = resolve_prompt(f"run:{run_dir}")
    result = export_prompt(prompt, format="mlflow", name="qa", alias="production", tracking_uri=uri)
    assert result.uri == "prompts:/qa/1" and result.version == 1
    back = resolve_prompt("prompts:/qa@production", tracking_uri=uri)
    assert back.template == prompt.template
    again = export_prompt(back, format="mlflow", name="qa", alias="staging", tracking_uri=uri)
    assert again.version == 2
    assert resolve_prompt("prompts:/qa/2", tracking_uri=uri).template == prompt.template

    from mlflow import MlflowClient

    registered = MlflowClient(tracking_uri=uri, registry_uri=uri).load_prompt("prompts:/qa@production")
    assert "{{context_str}}" in registered.template
    assert registered.tags["opro.mlflow_run_id"] == "abc123"
    with pytest.raises(ConfigError, match="which MLflow store"):
        export_prompt(prompt, format="mlflow", name="qa")
    with pytest.raises(ConfigError, match="alias 'prod uction'"):
        export_prompt(prompt, format="mlflow", name="qa", alias="prod uction", tracking_uri=uri)


def test_export_errors(run_dir: Path, tmp_path: Path) -> None:
    prompt = resolve_prompt(f"run:{run_dir}")
    with pytest.raises(ConfigError, match="not one of"):
        export_prompt(prompt, format="yaml")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="give --out"):
        export_prompt(prompt, format="dspy")
    with pytest.raises(ConfigError, match="only applies to --format mlflow"):
        export_prompt(prompt, format="text", alias="production")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(DataError, match="not an opro export"):
        load_llamaindex_prompt(tmp_path / "x.json")


def test_cli_export(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opro.cli import app

    runner = CliRunner()
    text = runner.invoke(app, ["export", f"run:{run_dir}"])
    assert text.exit_code == 0, text.output
    assert text.stdout == QATemplate(instruction=INSTRUCTION).template_text
    as_json = runner.invoke(app, ["export", f"run:{run_dir}", "--format", "json"])
    assert json.loads(as_json.stdout)["instruction"] == INSTRUCTION
    li = runner.invoke(app, ["export", f"run:{run_dir}", "--format", "llamaindex", "--out", str(tmp_path / "li")])
    assert li.exit_code == 0 and (tmp_path / "li" / "prompt.llamaindex.json").is_file()
    uri = f"sqlite:///{tmp_path / 'r.db'}"
    reg = runner.invoke(
        app, ["export", f"run:{run_dir}", "--format", "mlflow", "--name", "qa", "--alias", "production", "--tracking-uri", uri]
    )
    assert reg.exit_code == 0, reg.output
    assert "registered prompts:/qa/1 (alias production: prompts:/qa@production)" in reg.stdout
    bad = runner.invoke(app, ["export", "best"])
    assert bad.exit_code == 2 and "pass its config" in bad.output
    bad = runner.invoke(app, ["export", f"run:{run_dir}", "--format", "yaml"])
    assert bad.exit_code == 2 and "is not one of" in bad.output


def test_best_comes_from_the_study_where_the_output_folder_has_no_summary(tmp_path: Path) -> None:
    """Another worker or machine shares the stores, not worker 0's folder: `best` reads the study."""
    import optuna

    from opro.config import config_from_dict

    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    cfg = config_from_dict({"experiment": {"name": "t", "output_dir": "elsewhere"},
                            "tracking": {"optuna_storage": storage, "study_name": "s"}}, base_dir=tmp_path)
    with pytest.raises(DataError, match=r"has no summary\.json and the study 's' in .* holds no finished optimization"):
        resolve_prompt("best", config=cfg)  # no study yet (and no database file is created for it)
    assert not (tmp_path / "shared.db").exists()
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    with pytest.raises(DataError, match=r"the study 's' in .* holds no finished optimization; run .* worker 0"):
        resolve_prompt("best", config=cfg)
    template = QATemplate(instruction="Answer from the context.")
    study.set_user_attr("summary", {"best_template": template.template_text, "best_instruction": template.instruction,
                                    "best_score": 4.5, "study_name": "s", "mlflow_run_id": "r1"})
    prompt = resolve_prompt("best", config=cfg)
    assert prompt.template.template_text == template.template_text
    assert prompt.provenance["summary_from"].startswith("the study 's'") and prompt.provenance["score"] == 4.5


def test_a_prompt_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    binary = tmp_path / "prompt.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(DataError, match=r"prompt .*prompt\.bin is not UTF-8 text \(byte \d+\)"):
        resolve_prompt(str(binary))


@pytest.mark.parametrize(("spec", "message"), [
    ("initial:x", "write initial (the first initial instruction) or initial:N"),
    ("initial:-1", "write initial (the first initial instruction) or initial:N"),
    ("text:  ", "has no instruction after the colon"),
])
def test_prompt_specs_that_are_typos_are_refused_not_taken_literally(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_prompt(spec)


def test_the_format_table_is_the_one_list_of_formats() -> None:
    from typing import get_args

    from opro import export
    from opro.cli import app

    assert get_args(export.ExportFormat) == export.EXPORT_FORMATS == tuple(export.EXPORTERS)
    # Every format is printed, written to a file, or published: exactly one of them.
    kinds = (export.STDOUT_FORMATS, export.FILE_ONLY_FORMATS, export.REGISTRY_FORMATS)
    assert sorted(f for kind in kinds for f in kind) == sorted(export.EXPORT_FORMATS)
    assert export.SNIPPET_FORMATS == ("llamaindex", "dspy") and export.REGISTRY_FORMATS == ("mlflow",)
    # The command line's --format choices, and what each option says it applies to, come from the table.
    help_text = " ".join(CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "300"}).output.split())
    assert "text | json | llamaindex | dspy | mlflow" in help_text
    assert "[text/json: stdout; llamaindex/dspy: OUTPUT_DIR/export/]" in help_text
    assert "llamaindex/dspy: also write a .py snippet" in help_text and "mlflow: alias to point" in help_text


def test_a_new_format_is_one_function_and_one_table_entry(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import MappingProxyType

    from opro import export
    from opro.export import formats
    from opro.export.sources import ResolvedPrompt

    def render_yaml(prompt: ResolvedPrompt, config: object) -> str:
        return f"instruction: {prompt.instruction!r}\n"

    table = {**export.EXPORTERS, "yaml": export.FileExporter(render=render_yaml, file_name="prompt.yaml")}
    monkeypatch.setattr(formats, "EXPORTERS", MappingProxyType(table))
    prompt = resolve_prompt(f"run:{run_dir}")
    result = export_prompt(prompt, format="yaml", out=tmp_path / "out")  # type: ignore[arg-type]
    assert result.paths == (tmp_path / "out" / "prompt.yaml",)
    assert result.paths[0].read_text() == f"instruction: {INSTRUCTION!r}\n"
    with pytest.raises(ConfigError, match="--format yaml writes files: give --out"):
        export_prompt(prompt, format="yaml")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--alias only applies to --format mlflow"):
        export_prompt(prompt, format="yaml", out=tmp_path, alias="production")  # type: ignore[arg-type]


def test_a_registered_configuration_keeps_its_settings_and_demonstrations(tmp_path: Path) -> None:
    from opro.export.sources import ResolvedPrompt
    from opro.program.prompts import Demo, QATemplate

    uri = f"sqlite:///{tmp_path / 'registry.db'}"
    template = QATemplate(instruction="Answer.", settings={"top_k": 4, "answer_max_tokens": 64, "chunk_size": 256},
                          demos=(Demo(query="Who?", context="Ada wrote it.", answer="Ada."),))
    prompt = ResolvedPrompt(spec="cfg.json", kind="file", label="cfg", template=template)
    export_prompt(prompt, format="mlflow", name="qa", tracking_uri=uri)
    back = resolve_prompt("prompts:/qa/1", tracking_uri=uri).template
    assert back.settings == {"top_k": 4, "answer_max_tokens": 64, "chunk_size": 256}
    assert back.template_text == template.template_text  # the demonstration is in the registered text
    # An exported JSON whose instruction was edited by hand: the structured fields win.
    path = export_prompt(prompt, format="json", out=tmp_path / "p.json").paths[0]
    data = json.loads(path.read_text())
    data["instruction"] = "Answer briefly."
    path.write_text(json.dumps(data))
    edited = resolve_prompt(str(path)).template
    assert edited.instruction == "Answer briefly." and edited.demos == template.demos and edited.setting("top_k") == 4


def test_an_export_to_files_with_a_config_is_recorded_and_says_where(tmp_path: Path) -> None:
    """An export that leaves a file or a registry version is one record (``opro.kind = export``) with its
    files; an export to stdout, or one with --no-mlflow, records nothing."""
    from fakes import experiment_config, mlflow_client, write_toml

    from opro.cli import app

    config = write_toml(experiment_config(tmp_path), tmp_path / "exp.toml")
    runner = CliRunner()
    li = runner.invoke(app, ["export", "text:Answer briefly.", "-c", str(config), "-f", "llamaindex"])
    assert li.exit_code == 0, li.output
    client = mlflow_client(config)
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert run.data.tags["opro.kind"] == "export" and run.data.params["export.format"] == "llamaindex"
    assert run.data.params["export.instruction"] == "Answer briefly."
    assert f"recorded: MLflow run {run.info.run_id} in sqlite:///" in li.stderr
    assert sorted(Path(a.path).name for a in client.list_artifacts(run.info.run_id, "export")) == [
        "prompt.llamaindex.json", "prompt_llamaindex.py"]
    reg = runner.invoke(app, ["export", "text:Answer briefly.", "-c", str(config), "-f", "mlflow", "--alias", "staging"])
    assert reg.exit_code == 0, reg.output
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id], order_by=["start_time DESC"])
    assert len(runs) == 2 and runs[0].data.tags["opro.registered"] == "prompts:/qa-test/1@staging"
    for args in (["-f", "text"], ["-f", "json", "-o", str(tmp_path / "p.json"), "--no-mlflow"]):
        quiet = runner.invoke(app, ["export", "text:Answer briefly.", "-c", str(config), *args])
        assert quiet.exit_code == 0 and "recorded:" not in quiet.output, quiet.output
    assert len(client.search_runs([client.get_experiment_by_name("t").experiment_id])) == 2
