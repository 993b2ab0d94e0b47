"""`opro doctor`: what the embedded engine finds here, and exit 1 where a model cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from opro.cli import app
from opro.llm.packs import EMBEDDED_MODELS, ModelStatus

runner = CliRunner()


def _assembled(tmp_path: Path) -> list[ModelStatus]:
    return [
        ModelStatus(name=name, state="assembled", size=pack.size, path=tmp_path / f"{name}.gguf", description="")
        for name, pack in EMBEDDED_MODELS.items()
    ]


def test_doctor_without_probes_shows_the_cpu_the_threads_and_the_engine() -> None:
    import llama_cpp

    result = runner.invoke(app, ["doctor", "--no-probe"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith("CPU: ") and "features:" in out and "AMX: " in out
    assert "in this process's CPU affinity" in out and "busy with other processes" in out
    assert "threads (n_threads unset): " in out
    assert f"llama-cpp-python: {llama_cpp.__version__}" in out and "llama.cpp system info: " in out
    assert all(name in out for name in EMBEDDED_MODELS)


def test_doctor_shows_the_fallback_the_crash_and_the_buffers(
    fake_child: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("opro.llm.packs.list_models", lambda: _assembled(tmp_path))
    monkeypatch.setenv("CRASH", "on")
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert result.output.count("extra buffers (auto): off") == 2
    assert result.output.count("probe: extra buffers on: llama.cpp crashed (SIGSEGV)") == 2
    assert "buffer: CPU_Mapped model buffer size =   950.71 MiB" in result.output


def test_doctor_exits_1_where_a_model_cannot_run(fake_child: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("opro.llm.packs.list_models", lambda: _assembled(tmp_path))
    monkeypatch.setenv("CRASH", "on,off")
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert "error: qwen2.5-coder-0.5b-instruct.gguf cannot run on this CPU" in result.output
