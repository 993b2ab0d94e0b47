"""Benchmark the embedded llama.cpp backend: load time, prefill and decode speed, KV-prefix reuse.

    .venv/bin/python experiments/bench_backends.py [--model qwen2.5-coder-0.5b-instruct] [--threads N]

Prefill speed: a ~900-token prompt with a fresh first sentence (so nothing is reused) and
max_tokens=1. Decode speed: 128 greedy tokens after a short prompt, prefill time subtracted.
KV-prefix reuse: the same long system prompt with a different question, right after a call that
evaluated that prefix, against the same prompt after a call with a different prefix (cold).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from rich.console import Console
from rich.table import Table

from opro.llm import GenerationOptions, Message
from opro.llm.llamacpp import LlamaCppLLM

FILLER = (
    "AlexNet is a convolutional neural network designed by Alex Krizhevsky with Ilya Sutskever and "
    "Geoffrey Hinton. It competed in the ImageNet Large Scale Visual Recognition Challenge in 2012 and "
    "achieved a top-5 error of 15.3%, more than 10.8 percentage points lower than the runner up. "
)


def long_prefix(tag: str, repeats: int = 14) -> str:
    return f"Context {tag}. Answer from the context only.\n" + FILLER * repeats


def bench(model: str, threads: int | None, repeats: int) -> list[tuple[str, str]]:
    llm = LlamaCppLLM(model_path=model, n_threads=threads, n_ctx=4096)
    t0 = time.perf_counter()
    llm.load()
    load_s = time.perf_counter() - t0
    rows: list[tuple[str, str]] = [("model", model), ("threads", str(llm.n_threads)), ("load time", f"{load_s:.2f} s")]
    one = GenerationOptions(temperature=0.0, max_tokens=1, seed=0)

    # Prefill: a different first sentence every time, so no prefix is reused.
    prefill = []
    for _ in range(repeats):
        msgs = (Message("system", long_prefix(uuid.uuid4().hex)), Message("user", "Who designed AlexNet?"))
        c = llm.generate(msgs, one)
        prefill.append(c.prompt_tokens / c.latency_s)
    prefill_tps = statistics.median(prefill)
    rows.append(("prompt tokens / call", str(c.prompt_tokens)))
    rows.append(("prefill (prompt tokens/s)", f"{prefill_tps:.0f}"))

    # Decode: short prompt, 128 tokens; subtract the prefill time.
    gen = []
    for i in range(repeats):
        msgs = (Message("user", f"({i}) Write a long story about a neural network that learns to see."),)
        c = llm.generate(msgs, GenerationOptions(temperature=0.0, max_tokens=128, seed=0))
        decode_s = c.latency_s - c.prompt_tokens / prefill_tps
        gen.append(c.completion_tokens / decode_s)
    rows.append(("decode (generated tokens/s)", f"{statistics.median(gen):.1f}"))

    # JSON-schema constrained decoding (grammar) on the same kind of prompt.
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    import json

    gs = []
    for i in range(repeats):
        msgs = (Message("user", f"({i}) Write a long story about a neural network, as JSON."),)
        c = llm.generate(msgs, GenerationOptions(temperature=0.0, max_tokens=128, seed=0, json_schema=json.dumps(schema)))
        gs.append(c.completion_tokens / (c.latency_s - c.prompt_tokens / prefill_tps))
    rows.append(("decode with JSON schema (tokens/s)", f"{statistics.median(gs):.1f}"))

    # KV-prefix reuse.
    cold, warm = [], []
    for i in range(repeats):
        prefix = long_prefix(f"shared-{i}")
        # Cold: the previous call had another prefix.
        llm.generate((Message("system", long_prefix(uuid.uuid4().hex)), Message("user", "x")), one)
        c1 = llm.generate((Message("system", prefix), Message("user", "Who designed AlexNet?")), one)
        c2 = llm.generate((Message("system", prefix), Message("user", "What error rate did it reach?")), one)
        cold.append(c1.latency_s)
        warm.append(c2.latency_s)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    rows.append(("shared-prefix call, cold", f"{cold_s * 1000:.0f} ms ({c1.prompt_tokens} prompt tokens)"))
    rows.append(("shared-prefix call, prefix reused", f"{warm_s * 1000:.0f} ms"))
    rows.append(("KV-prefix reuse speed-up", f"{cold_s / warm_s:.1f}x"))
    llm.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="embedded model name or GGUF path (repeatable)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    models = args.model or ["qwen2.5-coder-0.5b-instruct"]
    results = [bench(m, args.threads, args.repeats) for m in models]
    table = Table(title="llama.cpp backend (medians)")
    table.add_column("measure")
    for rows in results:
        table.add_column(rows[0][1], justify="right")
    for i, (label, _) in enumerate(results[0][1:], start=1):
        table.add_row(label, *(rows[i][1] for rows in results))
    Console().print(table)


if __name__ == "__main__":
    main()
