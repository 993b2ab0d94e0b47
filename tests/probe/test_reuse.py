"""The probe is the search's first step, not a second bill (issue 57, item 3): `opro optimize` after
`opro probe` on the same config finds the probe's answers for step 0's configurations on the
optimization questions in the call cache, and says how many calls that saved, counted by key."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fakes import experiment_config, judge_reply, optimizer_reply, write_toml
from typer.testing import CliRunner

import opro.experiment
from opro.cli import app
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM
from opro.probe.reuse import read_probe_calls
from opro.probe.store import read_probe
from opro.workflows.optimize import optimize

OPTIMIZATION = 4
#: Four passages that every question's words find, so that top_k 1 and 3 retrieve different contexts.
DOC = "\n\n".join(f"A fact about AlexNet: {fact}" for fact in (
    "it won the ImageNet challenge in 2012 with a top-5 error far below the runner-up.",
    "it used ReLU activations and dropout regularization to train faster and overfit less.",
    "its training was split across two GPUs because one card had too little memory.",
    "its architecture stacks five convolutional layers and three fully connected layers.",
)) + "\n"


def own_answer(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """An answer of its own for every prompt and answer budget, so every configuration's judge calls are
    its own too (an answer two configurations shared would be judged once)."""
    digest = hashlib.sha256(f"{messages[-1].content}|{options.max_tokens}".encode()).hexdigest()[:8]
    return f"From the context: {digest}."


def _pool() -> ModelPool:
    return ModelPool(scripted={"task": ScriptedLLM(default=own_answer, model="task"),
                               "judge": ScriptedLLM(default=judge_reply, model="judge"),
                               "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer")})


def _config(tmp_path: Path) -> Path:
    data = experiment_config(
        tmp_path, questions=40, doc=DOC,
        data={"split": {"exemplar": 3, "optimization": OPTIMIZATION, "validation": 6, "heldout": 8, "seed": 1}},
        optimizer={"steps": 1, "candidates_per_step": 2, "minibatch_size": OPTIMIZATION, "validation_extension": 2,
                   "objective": "cost", "margin": 0.25},
        search={"space": {"top_k": [1, 3], "answer_max_tokens": [32, 96]}},
        rag={"chunk_size": 32, "chunk_overlap": 0, "initial_instructions": ["Answer from the context."],
             "top_k": 3, "answer_max_tokens": 96},
    )
    return write_toml(data, tmp_path / "exp.toml")


def test_optimize_after_probe_finds_the_probes_step0_answers_in_the_cache_and_counts_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", _pool)
    monkeypatch.setenv("COLUMNS", "200")
    config = _config(tmp_path)
    out = tmp_path / "out"
    probed = CliRunner().invoke(app, ["probe", str(config), "--no-progress", "--questions", "8", "--no-mlflow"])
    assert probed.exit_code == 0, probed.output
    result = read_probe(out)
    kept = read_probe_calls(out)
    assert result is not None and kept is not None
    # The cost objective's first moves (top_k 1, answer_max_tokens 32, both together) are among the
    # contrasts, marked as step 0's: with the initial configuration, 4 configurations on 4 questions.
    assert {e.label for e in result.effects if e.step0} == {"top_k 1", "answer_max_tokens 32", "cheapest together"}
    step0 = 4 * OPTIMIZATION
    assert result.pilot.optimization == OPTIMIZATION and result.pilot.step0_calls == 2 * step0
    assert kept.n == result.made and len(kept.made["task"]) == len(kept.made["judge"]) == (1 + len(result.effects)) * 8

    done = optimize(config, progress=False)
    saving = done.probe_saving
    assert saving is not None and saving.probe_made == kept.n
    # Every task and judge call of step 0 on the optimization questions was the probe's, found in the
    # cache: counted by key, once each; nothing else the probe asked (its unused questions, its other
    # contrasts) is a search's call.
    assert {role: n for role, n in saving.by_role.items() if n} == {"task": step0, "judge": step0}, saving
    assert saving.line() == (f"probe: saved this run {2 * step0} calls (task {step0}, judge {step0}): answers "
                             f"`opro probe` made, found in the call cache (it made {kept.n})")


def test_an_unreadable_record_of_the_probes_calls_is_said_and_the_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", _pool)
    config = _config(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "probe_calls.json").write_text(json.dumps({"made": ["not", "a", "map"]}), encoding="utf-8")
    heard: list[str] = []
    done = optimize(config, progress=False, notice=heard.append)
    assert done.probe_saving is None and done.result is not None
    assert any(h.startswith("probe: ") and "probe_calls.json is not a list of the probe's calls" in h
               and "run `opro probe` again, or delete it" in h for h in heard), heard
