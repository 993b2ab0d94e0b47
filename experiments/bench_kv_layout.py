"""What a decode step costs when its answers share one context, or each has its own (cross-question batching).

    PYTHONPATH=$PWD python experiments/bench_kv_layout.py [--model qwen2.5-coder-0.5b-instruct] [--repeats 30]

The engine batches the answers of one question: its candidates share the retrieved context, held once
in a unified KV cache. Batching the answers of different questions instead (to fill the steps where one
answer decodes alone) puts distinct contexts side by side, and llama.cpp offers two layouts for that: one
unified cache (every token's attention spans all the contexts' cells, masked) or one cache stream per
sequence (``kv_unified = false``, attention per stream). This script prefills 700-token contexts and
times one ``llama_decode`` of one token per sequence for 1 to 4 sequences (median of ``--repeats``,
idle machine) in three layouts:

- *unified, shared context*: the engine's batch (sequences copy one context's cells);
- *unified, distinct contexts*: cross-question batching in the engine's cache;
- *split, distinct contexts*: cross-question batching with a stream per sequence.

The first row's 1-sequence step is what an answer decoding alone costs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

from opro.llm.llamacpp import LlamaCppLLM
from opro.llm.llamacpp_batch import put_token as _put

CONTEXT = 700
TEXTS = (
    "The history of AlexNet and deep learning. ",
    "Convolutional networks on GPUs were trained by Krizhevsky. ",
    "ImageNet has a thousand classes of images drawn from WordNet. ",
    "Dropout reduces overfitting in large networks. ",
)


def _context(model: str, *, unified: bool, sequences: int) -> tuple[LlamaCppLLM, Any]:
    from llama_cpp import _internals

    llm = LlamaCppLLM(model_path=model, batch_width=1, n_ctx=4096)
    llama = llm.load()
    params = llama.context_params
    params.n_seq_max = sequences
    params.kv_unified = unified
    params.n_ctx = 4096 if unified else 1024 * sequences  # a split cache gives each stream n_ctx / n_seq_max
    params.n_batch = 1024
    ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
    old = llama._ctx
    llama._ctx = llama._stack.enter_context(contextlib.closing(ctx))
    old.close()
    return llm, llama


def _prefill(llama: Any, seqs: list[int], *, distinct: bool) -> None:
    import llama_cpp

    ctx = llama._ctx.ctx
    mem = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(CONTEXT, 0, 1)
    try:
        for i, seq in enumerate(seqs):
            if i and not distinct:
                llama_cpp.llama_memory_seq_cp(mem, seqs[0], seq, -1, -1)
                continue
            tokens = llama.tokenize((TEXTS[i % len(TEXTS)] * 100).encode(), add_bos=False)[:CONTEXT]
            for k, token in enumerate(tokens):
                _put(batch, k, token=token, pos=k, seq_id=seq, logits=False)
            batch.n_tokens = len(tokens)
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
    finally:
        llama_cpp.llama_batch_free(batch)


def _step_ms(llama: Any, seqs: list[int], repeats: int) -> float:
    import llama_cpp

    ctx = llama._ctx.ctx
    mem = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(len(seqs), 0, 1)

    def step() -> float:
        for row, seq in enumerate(seqs):
            _put(batch, row, token=1000, pos=CONTEXT, seq_id=seq, logits=True)
        batch.n_tokens = len(seqs)
        started = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        took = time.perf_counter() - started
        for seq in seqs:
            llama_cpp.llama_memory_seq_rm(mem, seq, CONTEXT, -1)
        return took

    try:
        step()  # warm-up
        return statistics.median(step() for _ in range(repeats)) * 1000
    finally:
        llama_cpp.llama_batch_free(batch)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="embedded model name or GGUF path")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    print(f"| layout ({CONTEXT}-token contexts) | 1 sequence ms | 2 | 3 | 4 |")
    print("|---|---|---|---|---|")
    for name, unified, distinct in (
        ("unified, shared context (the engine)", True, False),
        ("unified, distinct contexts", True, True),
        ("split, distinct contexts", False, True),
    ):
        # The engine's cache keeps sequence 0 for the shared prefix; a split cache needs no spare stream.
        llm, llama = _context(args.model, unified=unified, sequences=5 if unified else 4)
        try:
            seqs = [1, 2, 3, 4] if unified else [0, 1, 2, 3]
            _prefill(llama, seqs, distinct=distinct)
            ms = [_step_ms(llama, seqs[:n], args.repeats) for n in (1, 2, 3, 4)]
        finally:
            llm.close()
        print(f"| {name} | " + " | ".join(f"{m:.1f}" for m in ms) + " |", flush=True)


if __name__ == "__main__":
    main()
