"""What the loopback benchmarks (``bench_throughput.py``, ``bench_scaleout.py``, ``bench_genai_logging.py``)
share: a synthetic corpus with its QA file, the ``[models.*]`` tables pointing every role at one fake
server, and the experiment TOML around them."""

from __future__ import annotations

import json
from pathlib import Path

KEY_ENV = "OPRO_BENCH_KEY"


def write_data(base: Path, n_questions: int) -> None:
    """``docs/`` (8 documents of 60 facts) and ``qa.jsonl`` (``n_questions`` questions about them)."""
    docs = base / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for d in range(8):
        lines = [f"Fact {d}-{i}: the value of item {d}-{i} is {d * 100 + i}." for i in range(60)]
        (docs / f"doc{d}.txt").write_text("\n".join(lines) + "\n")
    rows = [{"question": f"What is the value of item {i % 8}-{i % 60}?", "answer": f"{(i % 8) * 100 + i % 60}."}
            for i in range(n_questions)]
    (base / "qa.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def models_toml(url: str, concurrency: int) -> str:
    """Every role on the server at ``url`` (told apart by model name), ``concurrency`` requests each."""
    return "\n".join(
        f'[models.{role}]\nbackend = "openai"\nmodel = "{model}-model"\nbase_url = "{url}"\n'
        f'api_key_env = "{KEY_ENV}"\nmax_concurrency = {concurrency}\ntimeout_s = 60\n'
        for role, model in (("task", "task"), ("judge", "judge"), ("optimizer", "optimizer"), ("generator", "optimizer"))
    )


def write_config(
    path: Path,
    *,
    name: str,
    url: str,
    concurrency: int,
    split: dict[str, int],
    optimizer: dict[str, object],
    output_dir: str | None = None,
    cache_path: str | None = None,
    chunk_size: int = 128,
    tracking: dict[str, object] | None = None,
) -> Path:
    """An experiment TOML on the loopback corpus: ``split`` and ``optimizer`` become their tables as
    given, every role points at ``url`` (:func:`models_toml`)."""

    def table(header: str, values: dict[str, object]) -> str:
        body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
        return f"[{header}]\n{body}"

    out = output_dir or name
    text = "\n".join([
        table("experiment", {"name": name, "output_dir": out, "cache_path": cache_path or f"{out}/calls.sqlite",
                             "progress": False}),
        table("data", {"docs": ["docs"], "dataset": "qa.jsonl", "query_field": "question", "answer_field": "answer"}),
        table("data.split", {"seed": 0, **split}),
        table("rag", {"chunk_size": chunk_size, "chunk_overlap": 0, "initial_instructions": ["Answer the question."]}),
        table("optimizer", optimizer),
        *([table("tracking", tracking)] if tracking else []),
        models_toml(url, concurrency),
    ])
    path.write_text(text)
    return path
