"""The start-up probe: a native crash in a child process picks plain buffers instead of killing the run,
is recorded once per machine and build, and where nothing runs one line says why and what to set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import require_embedded

from opro.errors import ModelPackError
from opro.llm import probe as probe_module
from opro.llm.probe import choose_extra_buffers, recorded


def test_a_crash_with_extra_buffers_falls_back_to_plain_buffers_once_per_machine(
    fake_child: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASH", "on")
    model = tmp_path / "model.gguf"
    chosen = choose_extra_buffers(model, "abc", "auto")
    assert chosen.mode == "off" and chosen.ok and not chosen.cached
    assert chosen.buffers == ("CPU_Mapped model buffer size =   950.71 MiB",)
    crashed = recorded("abc", "on")
    assert crashed is not None and not crashed.ok and crashed.detail == "llama.cpp crashed (SIGSEGV)"
    assert crashed.buffers == ("AMX model buffer size =   950.71 MiB",)
    assert fake_child.read_text().split() == ["on", "off"]
    again = choose_extra_buffers(model, "abc", "auto")  # remembered: no child runs again
    assert again.mode == "off" and again.cached
    assert fake_child.read_text().split() == ["on", "off"]
    assert choose_extra_buffers(model, "other-model", "auto").mode == "off"  # per model
    assert fake_child.read_text().split() == ["on", "off", "on", "off"]


def test_where_extra_buffers_run_auto_keeps_them(fake_child: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRASH", "")
    assert choose_extra_buffers(tmp_path / "model.gguf", "abc", "auto").mode == "on"
    assert fake_child.read_text().split() == ["on"]


def test_a_model_that_crashes_either_way_is_one_line_that_says_what_to_do(
    fake_child: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASH", "on,off")
    with pytest.raises(ModelPackError) as caught:
        choose_extra_buffers(tmp_path / "model.gguf", "abc", "auto")
    message = str(caught.value)
    assert "\n" not in message
    assert "model.gguf cannot run on this CPU" in message and "SIGSEGV" in message
    assert "at an OpenAI-compatible endpoint" in message and "opro doctor" in message


def test_a_forced_setting_that_crashes_is_refused_with_the_way_out(
    fake_child: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASH", "on")
    with pytest.raises(ModelPackError, match=r'extra buffers on: llama.cpp crashed \(SIGSEGV\).*set \[models.task\].extra_buffers = "auto"'):
        choose_extra_buffers(tmp_path / "model.gguf", "abc", "on", where="[models.task].")
    with pytest.raises(ModelPackError, match=r'set the \[models.\*\] tables that use this model: extra_buffers = "auto"'):
        choose_extra_buffers(tmp_path / "model.gguf", "other", "on")
    assert choose_extra_buffers(tmp_path / "model.gguf", "abc", "off").mode == "off"


def test_a_child_that_fails_without_crashing_is_not_remembered(
    fake_child: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRASH", "")
    monkeypatch.setattr(probe_module, "_child_argv", lambda path, mode: [sys.executable, "-c", "raise SystemExit('disk full')"])
    result = probe_module.probe(tmp_path / "model.gguf", "abc", "on")
    assert not result.ok and result.detail == "exit 1: disk full"
    assert recorded("abc", "on") is None  # a passing fault: probed again next time


# -- the real engine --------------------------------------------------------------------------------

EMBEDDED = ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]


def _gguf(name: str) -> Path:
    from opro.llm.packs import model_path

    require_embedded(name)
    return model_path(name)


@pytest.mark.embedded
@pytest.mark.parametrize("name", EMBEDDED)
def test_each_embedded_model_decodes_in_a_child_process_the_way_opro_loads_it(
    name: str, tmp_path: Path
) -> None:
    """A native crash (the AMX segmentation fault) is this test failing with a message, not a dead
    test runner: the child loads the model as opro does by default (probe, buffers, threads) and
    decodes alone and batched. A fresh cache makes the probe run too."""
    import os

    path = _gguf(name)
    proc = subprocess.run(
        [sys.executable, "-m", "opro.llm.probe", str(path), "auto"],
        capture_output=True, text=True, errors="replace", timeout=600, stdin=subprocess.DEVNULL,
        env={**os.environ, "OPRO_CACHE_DIR": str(tmp_path / "cache"), "PYTHONFAULTHANDLER": "1"},
    )
    assert proc.returncode == 0, (
        f"{name} did not decode in a child process (exit {proc.returncode}"
        f"{', ' + probe_module._signal_name(proc.returncode) if proc.returncode < 0 else ''}):\n{proc.stderr[-3000:]}"
    )
    reply = json.loads(proc.stdout.strip().splitlines()[-1])
    assert reply["ok"] and reply["extra_buffers"] in ("on", "off") and reply["threads"] >= 1
    assert list((tmp_path / "cache" / "probes").glob("*.json"))  # the probe ran and was recorded


@pytest.mark.embedded
@pytest.mark.parametrize("mode", ["on", "off"])
def test_the_extra_buffers_setting_reaches_the_model_parameters(mode: str) -> None:
    """``Llama(...)`` ignores keywords it does not know: read the model's parameters back. In a child:
    on CPUs where extra buffers crash llama.cpp (AMX Xeons) a decode with them on kills its process, and
    the start-up probe must then say so too (it is what keeps them off there)."""
    from children import argv

    from opro.llm.probe import run_probe

    path = _gguf(EMBEDDED[0])
    proc = subprocess.run(argv("extra_buffers_decode", EMBEDDED[0], mode), capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert f"use_extra_bufts={mode == 'on'}" in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    if proc.returncode == 0:
        assert "completion_tokens=" in proc.stdout and "completion_tokens=0" not in proc.stdout
    else:
        assert mode == "on" and proc.returncode < 0, (proc.returncode, proc.stderr[-2000:])
        probed = run_probe(path, "on")
        assert not probed.ok and probed.crashed, probed  # the probe sees the same crash and keeps them off


@pytest.mark.embedded
def test_a_crashing_probe_loads_the_real_model_with_plain_buffers(
    fake_child: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback path on the real engine, forced: the probe with extra buffers crashes, so the model
    loads without them and answers."""
    from opro.llm import GenerationOptions, Message
    from opro.llm.llamacpp import LlamaCppLLM

    _gguf(EMBEDDED[0])
    monkeypatch.setenv("CRASH", "on")
    llm = LlamaCppLLM(model_path=EMBEDDED[0], n_ctx=512, batch_width=1)
    try:
        llama = llm.load()
        assert llm.probed.mode == "off" and llama.model_params.use_extra_bufts is False
        reply = llm.generate((Message("user", "Say yes."),), GenerationOptions(temperature=0.0, max_tokens=2))
        assert reply.completion_tokens >= 1
    finally:
        llm.close()
