"""Shared test doubles: scripted task / judge / optimizer models, an experiment config on them, and
a TOML writer. Imported by the tests (``from fakes import ...``); fixtures built on them are in
``conftest.py``."""

from __future__ import annotations

import json
from pathlib import Path

from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM

SECRET = "sk-test-DO-NOT-LOG-7f3a9c"

DOC = """AlexNet won the ImageNet challenge in 2012. It was designed by Alex Krizhevsky.
It used ReLU activations and dropout. It was trained on two GPUs.
The network has five convolutional layers and three fully connected layers.
"""


def qa_file(tmp_path: Path, n: int = 20) -> Path:
    rows = [{"question": f"Fact number {i} about AlexNet?", "answer": f"Answer {i}."} for i in range(n)]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def judge_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    text = messages[-1].content
    # Answers produced under an instruction mentioning "context" score 5, others 2.
    score = 5 if "context" in text.lower() else 2
    return json.dumps({"score": score, "reasoning": "scripted"})


def task_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    prompt = messages[-1].content
    return "Using the context: yes." if "context" in prompt.split("---------------------")[0].lower() else "Yes."


def optimizer_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    i = (options.seed or 0) % 1000
    return f"<INS>Answer from the context, variant {i}.</INS>" if i % 2 else f"<INS>Answer plainly, variant {i}.</INS>"


def scripted_pool() -> ModelPool:
    return ModelPool(
        scripted={
            "task": ScriptedLLM(default=task_reply, model="task"),
            "judge": ScriptedLLM(default=judge_reply, model="judge"),
            "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer"),
        }
    )


def experiment_config(tmp_path: Path, **overrides: dict) -> dict:
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "alexnet.txt").write_text(DOC)
    cfg = {
        "experiment": {"name": "t", "output_dir": "out", "cache_path": "calls.sqlite"},
        "data": {
            "docs": ["docs"],
            "dataset": str(qa_file(tmp_path)),
            "query_field": "question",
            "answer_field": "answer",
            "split": {"exemplar": 2, "optimization": 3, "validation": 8, "heldout": 4, "seed": 1},
        },
        "rag": {"chunk_size": 64, "chunk_overlap": 0, "initial_instructions": ["Answer the question."]},
        "models": {
            "task": {"backend": "scripted", "model": "task", "api_key_env": "OPENAI_API_KEY"},
            "judge": {"backend": "scripted", "model": "judge"},
            "optimizer": {"backend": "scripted", "model": "optimizer"},
            "generator": {"backend": "scripted", "model": "optimizer"},
        },
        "optimizer": {"steps": 2, "candidates_per_step": 2, "minibatch_size": 2},
        # The MLflow GenAI records (evaluation runs, traces) are tested in test_genai; off here for speed.
        "tracking": {"prompt_name": "qa-test", "genai": False},
    }
    for section, values in overrides.items():
        cfg.setdefault(section, {}).update(values)
    return cfg



def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return str(v)


def write_toml(data: dict, path: Path) -> Path:
    lines: list[str] = []

    def table(prefix: str, d: dict) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
        if prefix:
            lines.append(f"[{prefix}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in scalars.items())
        for k, v in d.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    path.write_text("\n".join(lines) + "\n")
    return path
