"""A user's own RAG pipeline, as opro's ``[program].factory`` names it (``rag:build_query_engine``): a LlamaIndex
``VectorStoreIndex`` over the AlexNet PDF kept in a Chroma collection on disk (Chroma's persistent client, through
llama-index-vector-stores-chroma), embedded offline by the embedded 0.5B GGUF model through llama.cpp (installed
from the package index with opro's ``local`` extra: nothing is downloaded at run time, and Chroma's own embedding
function, which would download one, is never used).

    python experiments/chroma_pipeline/rag.py           # builds the whole collection once (39 pages, 182 chunks,
                                                        # each embedded by the 0.5B model: long on a small, busy CPU)
    python experiments/chroma_pipeline/rag.py --quick   # the first QUICK_PAGES pages only, and their questions

Each collection is built once and read from disk afterwards. ``run.py`` beside it optimizes, compares and exports
the engine's QA prompt and loads the export back; ``--quick`` there uses ``build_quick_query_engine`` (the
collection of the first pages, and the dataset's questions whose reference context is on those pages).
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.node_parser import SentenceSplitter

HERE = Path(__file__).resolve().parent
STORE = HERE / "chroma"  # the persistent collections, and the quick run's questions (git-ignored: built here)
DATA = HERE.parents[2] / "shared" / "data" / "history_of_alexnet"
DOCS = DATA / "source_files"
COLLECTION = "history_of_alexnet"
EMBEDDING_MODEL = "qwen2.5-coder-0.5b-instruct"
CHUNK_SIZE = 384
#: The quick run's pages: 1-5 of 39 (about 22,000 characters, 16 of the dataset's 160 questions).
QUICK_PAGES = 5
QUICK_DATASET = STORE / f"questions_pages1-{QUICK_PAGES}.json"


class LlamaCppEmbedding(BaseEmbedding):
    """Mean-pooled embeddings of an embedded GGUF model through llama.cpp (offline)."""

    _model: Any = PrivateAttr()

    def __init__(self, model: str = EMBEDDING_MODEL, **kwargs: Any) -> None:
        super().__init__(model_name=model, embed_batch_size=16, **kwargs)
        import llama_cpp

        from opro.llm.packs import model_path

        self._model = llama_cpp.Llama(model_path=str(model_path(model)), embedding=True, n_ctx=1024, verbose=False,
                                      pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)

    def _get_text_embedding(self, text: str) -> list[float]:
        return [float(x) for x in self._model.embed(text, normalize=True)]

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_text_embedding(query)


def _collection(name: str) -> Any:
    import chromadb
    from chromadb.config import Settings

    client = chromadb.PersistentClient(path=str(STORE), settings=Settings(anonymized_telemetry=False))
    return client.get_or_create_collection(name, embedding_function=None)  # embeddings come from LlamaIndex


@functools.cache
def index(pages: int | None = None) -> VectorStoreIndex:
    """The collection of the PDF (its first ``pages`` pages where given) as a LlamaIndex index: built and
    persisted on first use, then read from disk (each time it says which, and how long it took)."""
    from llama_index.vector_stores.chroma import ChromaVectorStore

    started = time.perf_counter()
    name = COLLECTION if pages is None else f"{COLLECTION}_pages1-{pages}"
    collection = _collection(name)
    store = ChromaVectorStore(chroma_collection=collection)
    if collection.count():
        opened = VectorStoreIndex.from_vector_store(store, embed_model=LlamaCppEmbedding())
        print(f"collection {name}: {collection.count()} chunks read from {STORE} in {time.perf_counter() - started:.1f} s",
              file=sys.stderr)
        return opened
    from opro.data.documents import load_documents  # PyMuPDF, as opro reads [data].docs

    documents = [d for d in load_documents([DOCS]).documents if pages is None or d.metadata["page"] <= pages]
    built = VectorStoreIndex.from_documents(
        documents, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=LlamaCppEmbedding(),
        transformations=[SentenceSplitter(chunk_size=CHUNK_SIZE, chunk_overlap=32)], show_progress=True)
    print(f"collection {name}: {collection.count()} chunks of {len(documents)} pages embedded and stored in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
    return built


def build_query_engine(llm: Any, *, top_k: int = 2) -> Any:
    """What opro calls: this pipeline's query engine, answering with opro's ``llm``; ``top_k`` is searched."""
    return index().as_query_engine(llm=llm, similarity_top_k=top_k)


def build_quick_query_engine(llm: Any, *, top_k: int = 1) -> Any:
    """The same engine over the collection of the first QUICK_PAGES pages (``chroma_pipeline_quick.toml``)."""
    return index(QUICK_PAGES).as_query_engine(llm=llm, similarity_top_k=top_k)


def describe() -> dict[str, Any]:
    """What names this engine in opro's fingerprint: a changed store or embedding model starts a new study."""
    return {"store": "chroma", "collection": COLLECTION, "embedding": EMBEDDING_MODEL, "chunk_size": CHUNK_SIZE}


build_query_engine.describe = describe  # type: ignore[attr-defined]
build_quick_query_engine.describe = lambda: {**describe(), "pages": f"1-{QUICK_PAGES}"}  # type: ignore[attr-defined]


def _words(text: str) -> str:
    return re.sub(r"\W+", "", text).lower()


def quick_dataset() -> Path:
    """The dataset's questions whose reference context is on the first QUICK_PAGES pages, written once to
    QUICK_DATASET (a LabelledRagDataset JSON like the whole one). A question's page is the one most of its
    reference context's 40-character windows are found on (the dataset was chunked by another PDF reader, so
    the texts differ in spacing, not in words)."""
    if QUICK_DATASET.is_file():
        return QUICK_DATASET
    from opro.data.documents import load_documents

    pages = {d.metadata["page"]: _words(d.text) for d in load_documents([DOCS]).documents}
    whole = json.loads((DATA / "rag_dataset.json").read_text())
    kept = []
    for example in whole["examples"]:
        ref = _words(" ".join(example["reference_contexts"]))
        votes = Counter(p for k in range(0, max(len(ref) - 40, 1), 40) for p, text in pages.items() if ref[k:k + 40] in text)
        if votes and votes.most_common(1)[0][0] <= QUICK_PAGES:
            kept.append(example)
    STORE.mkdir(parents=True, exist_ok=True)
    QUICK_DATASET.write_text(json.dumps({**whole, "examples": kept}, indent=1))
    return QUICK_DATASET


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    if quick:
        print(f"{len(json.loads(quick_dataset().read_text())['examples'])} questions in {QUICK_DATASET}")
    index(QUICK_PAGES if quick else None)  # says whether it built the collection or read it, and how long it took
