"""opro's own RAG program against the same pipeline as a user's LlamaIndex query engine ([program].factory).

One dataset, two programs with the same chunks, the same retrieval and the same model: opro's ``RAGProgram``, and a
factory that builds LlamaIndex's ``RetrieverQueryEngine`` over opro's retriever (``as_llama_index_retriever``: the
same chunks in the same order) with the LLM opro hands it. Both answer every question under two instructions and
are judged, through the evaluation engine on the loopback OpenAI-compatible server (tests/fault_server.py, every
request answered after ``--latency`` seconds, ``--concurrency`` requests per role), with the call cache off. The
table gives, per program and round, the pairs per second and the CPU milliseconds this process spent per pair (on a
shared machine the first follows the other processes' load, the second much less); then whether every answer and
every score is the same.

Usage (about a minute):

    PYTHONPATH=$PWD LITELLM_LOCAL_MODEL_COST_MAP=True python experiments/bench_pipeline.py

It is a benchmark, not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _loopback import KEY_ENV, write_config, write_data  # this folder is on sys.path when run as a script

from opro.config import load_config
from opro.evaluation.batch import evaluate_templates
from opro.experiment import Experiment
from opro.program.rag import as_llama_index_retriever

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTIONS = ("Answer the question.", "Answer from the context, in one sentence.")


def user_factory(retriever: Any) -> Any:
    """A user's factory: LlamaIndex's own query engine over the given retriever, with opro's LLM."""

    def build_query_engine(llm: Any, *, top_k: int) -> Any:
        from llama_index.core.query_engine import RetrieverQueryEngine

        return RetrieverQueryEngine.from_args(retriever=as_llama_index_retriever(retriever, top_k=top_k), llm=llm)

    return build_query_engine


def run(exp: Experiment) -> tuple[float, float, list[list[tuple[str, float | None, tuple[str, ...]]]]]:
    """Seconds to answer and judge every question under each instruction, the CPU seconds this process spent
    meanwhile (its every thread, the loopback server's included), and (answer, score, contexts) per pair."""
    templates = [exp.template(i) for i in INSTRUCTIONS]
    examples = exp.dataset.examples
    started, cpu = time.perf_counter(), time.process_time()
    reports = evaluate_templates(program=exp.program, templates=templates, examples=examples, judge=exp.judge,
                                 progress=False)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return seconds, cpu, [[(r.answer, r.score, r.contexts) for r in report.rows] for report in reports]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))  # the loopback fake server the network tests use
    import os

    from fault_server import FaultServer

    os.environ[KEY_ENV] = "sk-bench-pipeline-0123456789"
    with tempfile.TemporaryDirectory(prefix="opro-pipeline-") as tmp, FaultServer(
            key=os.environ[KEY_ENV], latency_s=args.latency, max_requests=10**6) as server:
        base = Path(tmp)
        write_data(base, args.questions)
        split = {"exemplar": 2, "optimization": 6, "validation": 12, "heldout": args.questions - 20}
        path = write_config(base / "exp.toml", name="pipeline", url=server.base_url, concurrency=args.concurrency,
                            split=split, optimizer={"steps": 1})
        with path.open("a") as f:
            f.write("\n")
        text = path.read_text().replace("[experiment]\n", "[experiment]\ncache = false\n", 1)
        path.write_text(text)
        builtin = Experiment(load_config(path), progress=False)
        user = Experiment(load_config(path), progress=False, program=user_factory(builtin.retriever))
        pairs = len(INSTRUCTIONS) * len(builtin.dataset.examples)
        rates: dict[str, list[float]] = {"built-in RAGProgram": [], "user engine (factory)": []}
        cpu_ms: dict[str, list[float]] = {name: [] for name in rates}
        answers: dict[str, Any] = {}
        for r in range(args.rounds):
            for name, exp in (("built-in RAGProgram", builtin), ("user engine (factory)", user)):
                seconds, cpu, rows = run(exp)
                rates[name].append(pairs / seconds)
                cpu_ms[name].append(1000 * cpu / pairs)
                answers.setdefault(name, rows)
                print(f"round {r + 1}  {name:24s} {pairs} pairs in {seconds:6.2f} s: {pairs / seconds:6.1f} pairs/s, "
                      f"{1000 * cpu / pairs:5.1f} ms CPU per pair", flush=True)
        print(f"\nlatency {args.latency} s, {args.concurrency} requests per role, {args.questions} questions x "
              f"{len(INSTRUCTIONS)} instructions, cache off")
        for name, values in rates.items():
            print(f"{name:24s} median {statistics.median(values):6.1f} pairs/s  ({', '.join(f'{v:.1f}' for v in values)}); "
                  f"median {statistics.median(cpu_ms[name]):.1f} ms CPU per pair")
        ratio = statistics.median(rates["user engine (factory)"]) / statistics.median(rates["built-in RAGProgram"])
        # Each round's two runs are back to back, so a round's ratio sees the same load on both.
        paired = [u / b for u, b in zip(rates["user engine (factory)"], rates["built-in RAGProgram"], strict=True)]
        print(f"user / built-in throughput per round: {', '.join(f'{p:.2f}' for p in paired)} (median "
              f"{statistics.median(paired):.2f})")
        same = answers["built-in RAGProgram"] == answers["user engine (factory)"]
        scores = [[s for _, s, _ in rows] for rows in answers["built-in RAGProgram"]]
        print(f"user / built-in throughput: {ratio:.2f}; every answer , score and context the same: {same}; mean score per "
              f"instruction: {[round(statistics.fmean(s for s in row if s is not None), 2) for row in scores]}")
        builtin.close()
        user.close()


if __name__ == "__main__":
    main()
