"""Do batched answers read the same as answers asked one at a time, at real answer lengths?

    PYTHONPATH=$PWD python experiments/bench_batch_text.py experiments/history_of_alexnet.toml [--questions 10]

Answers the config's first ``--questions`` dataset questions under three instructions with the embedded
task model twice, each time with a fresh model and no call cache:

- *alone*: one call at a time (``RAGProgram.answer``; saved prefixes off, so nothing is restored);
- *batched*: each question's three calls in one ``generate_many`` batch (``RAGProgram.answer_group``, the
  engine's path; saved prefixes on, as in a run).

Greedy decoding in both. It prints how many answers are identical and, for the others, the character at
which they part. ``tests/llm/test_llamacpp_backend.py`` checks equality on short answers; over long ones a
batch's floating-point sums differ from a lone call's and greedy decoding may then take another path.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from opro.config import load_config
from opro.data.dataset import load_dataset
from opro.experiment import Experiment
from opro.llm import ChatClient
from opro.llm.llamacpp import LlamaCppLLM
from opro.llm.packs import model_path
from opro.program.rag import RAGProgram

INSTRUCTIONS = (
    "You are a QA assistant. Given the context information and not prior knowledge, answer the query.",
    "Answer the question using only the context above. Be brief and factual.",
    "Read the context carefully and answer the query in one or two sentences, citing the facts used.",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", type=Path)
    p.add_argument("--questions", type=int, default=10)
    args = p.parse_args()
    config = load_config(args.config)
    exp = Experiment(config)
    examples = load_dataset(config.resolve(config.data.dataset)).examples[: args.questions]
    templates = [exp.template(i) for i in INSTRUCTIONS]
    spec = config.models.task
    texts: dict[str, list[str]] = {}
    for mode in ("alone", "batched"):
        llm = LlamaCppLLM(model_path=str(model_path(spec.model)), n_ctx=spec.n_ctx, n_threads=spec.n_threads,
                          batch_width=spec.batch_width, prefix_cache_mb=0 if mode == "alone" else spec.prefix_cache_mb)
        program = RAGProgram(retriever=exp.retriever, llm=ChatClient(llm, role="task"),
                             max_tokens=config.rag.answer_max_tokens)
        started = time.perf_counter()
        if mode == "alone":
            texts[mode] = [program.answer(e.query, template=t).text for e in examples for t in templates]
        else:
            texts[mode] = []
            for e in examples:
                for answer in program.answer_group(e.query, templates=templates):
                    if isinstance(answer, Exception):
                        raise answer
                    texts[mode].append(answer.text)
        print(f"{mode}: {len(texts[mode])} answers in {time.perf_counter() - started:.1f} s", flush=True)
        llm.close()
    pairs = list(zip(texts["alone"], texts["batched"], strict=True))
    same = sum(a == b for a, b in pairs)
    print(f"identical: {same} of {len(pairs)} (answer_max_tokens = {config.rag.answer_max_tokens})")
    for n, (a, b) in enumerate(pairs):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            print(f"  question {n // len(templates)}, instruction {n % len(templates)}: they part at character "
                  f"{at} (lengths {len(a)} and {len(b)})")
    print(json.dumps({"identical": same, "answers": len(pairs)}))


if __name__ == "__main__":
    main()
