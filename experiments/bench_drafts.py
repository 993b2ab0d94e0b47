"""What drafted tokens (``[models.*].draft_fill``) buy the embedded task model, and what they change.

    PYTHONPATH=$PWD python experiments/bench_drafts.py experiments/history_of_alexnet.toml
        [--questions 10] [--fills 0,4,0,4] [--repeats 30]

Two measurements, on the config's task model (idle machine; both cores are used):

1. *Step cost by tokens*: one ``llama_decode`` of N tokens (N = 1..8, 12, 16) spread over 3 sequences
   that share a 700-token prefix, logits at every token (as a step with drafts needs), in shuffled
   order, ``--repeats`` times each: the median ms and tokens/s. On a CPU, llama.cpp multiplies the
   weights by 4 token columns at a time and by fewer one column at a time, which this table shows.
2. *Answers*: the config's first ``--questions`` dataset questions under three instructions, each
   question's three calls in one ``generate_many`` batch (the engine's path), no call cache, a fresh
   model per pass, once per value in ``--fills`` (alternate them: this machine's speed drifts). Per pass:
   the seconds, the drafted and kept tokens, and the decode steps by tokens per step with their time;
   then how many answers equal the first pass's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_batch_text import INSTRUCTIONS

from opro.config import load_config
from opro.data.dataset import load_dataset
from opro.experiment import Experiment
from opro.llm import ChatClient
from opro.llm.llamacpp import LlamaCppLLM
from opro.llm.llamacpp_batch import put_token as _put
from opro.llm.packs import model_path
from opro.program.rag import RAGProgram

TOKENS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)


def step_costs(path: Path, repeats: int) -> None:
    import llama_cpp

    llm = LlamaCppLLM(model_path=str(path), batch_width=3)
    llama = llm.load()
    ctx = llama._ctx.ctx
    mem = llama_cpp.llama_get_memory(ctx)
    prefix = llama.tokenize(("The history of AlexNet and deep learning. " * 80).encode(), add_bos=False)[:700]
    llama.eval(prefix)
    for seq in (1, 2, 3):
        llama_cpp.llama_memory_seq_cp(mem, 0, seq, -1, -1)
    batch = llama_cpp.llama_batch_init(64, 0, 1)

    def step(n: int) -> float:
        per = [n // 3 + (1 if i < n % 3 else 0) for i in range(3)]
        row = 0
        for seq, count in enumerate(per):
            for k in range(count):
                _put(batch, row, token=1000 + k, pos=len(prefix) + k, seq_id=seq + 1, logits=True)
                row += 1
        batch.n_tokens = row
        started = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        took = time.perf_counter() - started
        for seq in (1, 2, 3):
            llama_cpp.llama_memory_seq_rm(mem, seq, len(prefix), -1)
        return took

    times: dict[int, list[float]] = {n: [] for n in TOKENS}
    rng = random.Random(0)
    for n in TOKENS:
        step(n)  # warm-up
    for _ in range(repeats):
        order = list(TOKENS)
        rng.shuffle(order)
        for n in order:
            times[n].append(step(n))
    llama_cpp.llama_batch_free(batch)
    llm.close()
    print("| tokens in the step | median ms | tokens/s |")
    print("|---|---|---|")
    for n in TOKENS:
        median = statistics.median(times[n])
        print(f"| {n} | {median * 1000:.1f} | {n / median:.1f} |", flush=True)


def answers(config_path: Path, questions: int, fills: list[int]) -> None:
    config = load_config(config_path)
    exp = Experiment(config)
    examples = load_dataset(config.resolve(config.data.dataset)).examples[:questions]
    templates = [exp.template(i) for i in INSTRUCTIONS]
    spec = config.models.task
    first: list[str] | None = None
    for fill in fills:
        llm = LlamaCppLLM(model_path=str(model_path(spec.model)), n_ctx=spec.n_ctx, n_threads=spec.n_threads,
                          batch_width=spec.batch_width, prefix_cache_mb=spec.prefix_cache_mb, draft_fill=fill)
        steps: dict[int, list[float]] = defaultdict(list)
        decode = llm._decode

        def timed(llama: Any, batch: Any, steps: dict[int, list[float]] = steps, decode: Any = decode) -> None:
            started = time.perf_counter()
            decode(llama, batch)
            steps[batch.n_tokens].append(time.perf_counter() - started)

        llm._decode = timed  # type: ignore[method-assign]
        program = RAGProgram(retriever=exp.retriever, llm=ChatClient(llm, role="task"),
                             max_tokens=config.rag.answer_max_tokens)
        llm.load()
        started = time.perf_counter()
        texts = []
        for e in examples:
            for answer in program.answer_group(e.query, templates=templates):
                if isinstance(answer, Exception):
                    raise answer
                texts.append(answer.text)
        took = time.perf_counter() - started
        llm.close()
        small = " ".join(f"{n}: {len(t)} x {statistics.median(t) * 1000:.0f} ms = {sum(t):.1f} s"
                         for n, t in sorted(steps.items()) if n <= 16)
        same = "" if first is None else f"; {sum(a == b for a, b in zip(first, texts, strict=True))} of {len(texts)} " \
                                        f"answers equal the first pass's"
        print(f"draft_fill {fill}: {took:.1f} s for {len(texts)} answers, drafted {llm.drafted}, kept {llm.draft_hits}"
              f"{same}\n  decode steps by tokens: {small}", flush=True)
        first = texts if first is None else first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", type=Path)
    p.add_argument("--questions", type=int, default=10)
    p.add_argument("--fills", default="0,4,0,4", help="draft_fill of each answer pass, in order")
    p.add_argument("--repeats", type=int, default=30, help="timings per step size")
    p.add_argument("--steps-only", action="store_true", help="only the step-cost table")
    args = p.parse_args()
    config = load_config(args.config)
    step_costs(model_path(config.models.task.model), args.repeats)
    if not args.steps_only:
        answers(args.config, args.questions, [int(x) for x in args.fills.split(",")])


if __name__ == "__main__":
    main()
