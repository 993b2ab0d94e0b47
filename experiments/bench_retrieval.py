"""Retrieval recall@k on the shared AlexNet dataset, and golden-example generation time.

    .venv/bin/python experiments/bench_retrieval.py                      # BM25, chunk sizes 256/512/1024
    .venv/bin/python experiments/bench_retrieval.py --stemmer porter
    .venv/bin/python experiments/bench_retrieval.py --embed-model text-embedding-3-small [--embed-base-url URL]
    .venv/bin/python experiments/bench_retrieval.py --st-model /path/to/sentence-transformers-dir
    .venv/bin/python experiments/bench_retrieval.py --generate 4         # + time 4 golden examples (embedded 1.5B)

A retrieved chunk is a *hit* when ``opro.program.retrieval.context_overlap(reference_context, chunk) >= 0.5``:
shared word bigrams over the bigrams of the shorter text. The reference contexts were cut by a
different PDF extractor and chunker, so exact matching is impossible; this tolerates both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from opro.data.dataset import load_dataset
from opro.data.documents import load_documents
from opro.program.retrieval import Embedder, build_retriever, chunk_documents, recall_at_k

SHARED = Path(__file__).resolve().parents[1].parent / "shared/data/history_of_alexnet"
KS = (1, 2, 3, 5)


def _embedder(args: argparse.Namespace) -> Embedder | None:
    if args.embed_model:
        from opro.program.retrieval import OpenAIEmbedder

        return OpenAIEmbedder(model=args.embed_model, base_url=args.embed_base_url, api_key_env=args.api_key_env)
    if args.st_model:
        from opro.program.retrieval import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(model_path=args.st_model)
    return None


def bench_retrieval(args: argparse.Namespace) -> None:
    docs = load_documents(args.data / "source_files").documents
    dataset = load_dataset(args.data / "rag_dataset.json")
    pairs = [(e.query, e.reference_contexts) for e in dataset.examples]
    embedder = _embedder(args)
    kinds = ["bm25"] + (["dense"] if embedder is not None else [])
    print(f"recall@k over {len(pairs)} questions ({args.data.name}); hit = bigram overlap >= 0.5\n")
    header = "| retriever | chunk size | overlap | chunks | " + " | ".join(f"R@{k}" for k in KS) + " | build s | ms/query |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for kind in kinds:
        for size in args.chunk_sizes:
            overlap = size // 8
            t0 = time.perf_counter()
            chunks = chunk_documents(docs, chunk_size=size, chunk_overlap=overlap)
            retriever = build_retriever(
                chunks=chunks,
                chunk_size=size,
                chunk_overlap=overlap,
                kind=kind,  # type: ignore[arg-type]
                top_k=max(KS),
                embedder=embedder,
                stemmer=args.stemmer,
                progress=False,
            )
            build = time.perf_counter() - t0
            t1 = time.perf_counter()
            for query, _ in pairs:
                retriever.retrieve(query, top_k=max(KS))
            per_query = (time.perf_counter() - t1) / len(pairs) * 1000
            recall = recall_at_k(retriever, pairs, ks=KS)  # served from the retriever's memo
            name = f"{kind}" + (f" ({args.stemmer})" if kind == "bm25" and args.stemmer != "none" else "")
            cells = " | ".join(f"{recall[k]:.3f}" for k in KS)
            print(f"| {name} | {size} | {overlap} | {len(chunks)} | {cells} | {build:.2f} | {per_query:.2f} |")


def bench_generation(args: argparse.Namespace) -> None:
    from opro.data.generation import generate_examples
    from opro.llm import ChatClient
    from opro.llm.pool import ModelPool, ModelSpec

    docs = load_documents(args.data / "source_files").documents
    chunks = chunk_documents(docs, chunk_size=args.gen_chunk_size, chunk_overlap=args.gen_chunk_size // 8)
    per_chunk = 2
    n_chunks = max(1, -(-args.generate // per_chunk))
    spec = ModelSpec.embedded("generator", n_threads=args.n_threads)
    with ModelPool() as pool:
        t0 = time.perf_counter()
        llm = pool.get(spec)
        load_s = time.perf_counter() - t0
        client = ChatClient(llm, role="generator")  # no cache: time real calls
        t1 = time.perf_counter()
        result = generate_examples(chunks=chunks, llm=client, questions_per_chunk=per_chunk, max_chunks=n_chunks)
        gen_s = time.perf_counter() - t1
    usage = client.usage.snapshot().get("generator")
    n = len(result.dataset)
    print(f"\ngeneration: {spec.model}, chunk size {args.gen_chunk_size}, {n_chunks} chunks x {per_chunk} questions\n")
    print("| examples kept | dropped | calls | prompt tok | completion tok | model load s | generate s | s / example |")
    print("|---|---|---|---|---|---|---|---|")
    dropped = ", ".join(f"{d.reason}" for d in result.dropped) or "0"
    print(
        f"| {n} | {dropped} | {usage.calls if usage else 0} | {usage.prompt_tokens if usage else 0} | "
        f"{usage.completion_tokens if usage else 0} | {load_s:.1f} | {gen_s:.1f} | {gen_s / max(1, n):.1f} |"
    )
    for e in result.dataset.examples:
        print(f"- Q: {e.query}\n  A: {e.reference_answer[:200]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=SHARED, help="dir with rag_dataset.json and source_files/")
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--stemmer", choices=["none", "porter"], default="none")
    p.add_argument("--embed-model", help="model id at an OpenAI-compatible /v1/embeddings endpoint")
    p.add_argument("--embed-base-url", help="base URL of the embeddings server")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY")
    p.add_argument("--st-model", help="local sentence-transformers model directory")
    p.add_argument("--generate", type=int, default=0, metavar="N", help="also time generating N golden examples")
    p.add_argument("--gen-chunk-size", type=int, default=256)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--no-retrieval", action="store_true")
    args = p.parse_args()
    if not (args.data / "rag_dataset.json").exists():
        print(f"dataset not found under {args.data}", file=sys.stderr)
        return 1
    if not args.no_retrieval:
        bench_retrieval(args)
    if args.generate:
        bench_generation(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
