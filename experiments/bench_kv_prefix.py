"""What placing the instruction after the query (``QATemplate(position="after")``) saves on llama.cpp.

llama-cpp-python keeps the KV cache of the previous prompt and re-evaluates only the tokens after
the longest common prefix. With the instruction *before* the context, two candidate instructions
share almost no prefix; *after* the query, they share chat header + context + query. The saving
is realized when calls for the same question run back to back (question-major order).

    .venv/bin/python experiments/bench_kv_prefix.py [--questions 3] [--instructions 3] [--top-k 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from opro.data.dataset import load_dataset
from opro.data.documents import load_documents
from opro.llm import ChatClient
from opro.llm.pool import ModelPool, ModelSpec
from opro.program.prompts import QATemplate
from opro.program.rag import RAGProgram
from opro.program.retrieval import build_retriever

SHARED = Path(__file__).resolve().parents[1].parent / "shared/data/history_of_alexnet"
INSTRUCTIONS = (
    "You are a QA assistant. Context information is below. Given the context information and not prior "
    "knowledge, answer the query.",
    "Answer the question using only the context. Be concise and precise.",
    "Read the context carefully and give a short, factual answer to the query.",
    "Using the passages above, reply in one or two sentences.",
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--instructions", type=int, default=3)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args()
    docs = load_documents(SHARED / "source_files").documents
    retriever = build_retriever(documents=docs, chunk_size=args.chunk_size, chunk_overlap=args.chunk_size // 8, top_k=args.top_k)
    queries = [e.query for e in load_dataset(SHARED / "rag_dataset.json").examples[: args.questions]]
    instructions = INSTRUCTIONS[: args.instructions]
    with ModelPool() as pool:
        llm = pool.get(ModelSpec.embedded("task"))
        client = ChatClient(llm, role="task")  # no cache: real calls
        program = RAGProgram(retriever=retriever, llm=client, max_tokens=args.max_tokens)
        program.answer("warm-up: load the model", template=QATemplate())
        print(f"task model {llm.model}; {len(queries)} questions x {len(instructions)} instructions, question-major order\n")
        print("| position | calls | prompt tok / call | s / call (first instr.) | s / call (other instr.) | total s |")
        print("|---|---|---|---|---|---|")
        for position in ("before", "after"):
            first: list[float] = []
            other: list[float] = []
            tokens = 0
            started = time.perf_counter()
            for q in queries:
                for j, ins in enumerate(instructions):
                    t0 = time.perf_counter()
                    ans = program.answer(q, template=QATemplate(ins, position=position))  # type: ignore[arg-type]
                    (first if j == 0 else other).append(time.perf_counter() - t0)
                    tokens += ans.completion.prompt_tokens
            total = time.perf_counter() - started
            n = len(first) + len(other)
            print(
                f"| {position} | {n} | {tokens / n:.0f} | {sum(first) / len(first):.2f} | "
                f"{sum(other) / max(1, len(other)):.2f} | {total:.1f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
