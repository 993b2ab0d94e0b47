"""A user's own LlamaIndex pipelines, as ``[program].factory`` names them (``pipelines:build_query_engine``):
query engines over the test corpus in a LlamaIndex in-memory index or a Chroma collection on disk, with
deterministic hash embeddings behind LlamaIndex's ``BaseEmbedding`` (no model, nothing downloaded), and
factories that go wrong in the ways a user's can. Imported by the tests and the child processes they start.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any

from fakes import DOC, HashEmbedder, unavailable
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.schema import TextNode

#: Where the Chroma pipelines keep their collection (set by the test, inherited by its children).
CHROMA_DIR = "OPRO_TEST_CHROMA_DIR"
COLLECTION = "alexnet"


class HashEmbedding(BaseEmbedding):
    """:class:`fakes.HashEmbedder` as a LlamaIndex embedding model."""

    def _get_query_embedding(self, query: str) -> list[float]:
        return [float(x) for x in HashEmbedder().embed([query])[0]]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_query_embedding(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


def nodes(doc: str = DOC) -> list[Any]:
    """The corpus's chunks, a line each, without metadata (the LLM sees the text alone)."""
    return [TextNode(text=line, id_=f"line-{i}") for i, line in enumerate(doc.splitlines()) if line.strip()]


@functools.cache
def memory_index() -> VectorStoreIndex:
    return VectorStoreIndex(nodes(), embed_model=HashEmbedding())


#: (settings) of every call of the factories below, in order: what the tests read back.
CALLS: list[dict[str, Any]] = []
_lock = threading.Lock()


def build_query_engine(llm: Any, *, top_k: int = 2) -> Any:
    """The user's factory over an in-memory index: one searchable setting, ``top_k``."""
    with _lock:
        CALLS.append({"top_k": top_k})
    return memory_index().as_query_engine(llm=llm, similarity_top_k=top_k)


def with_response_mode(llm: Any, *, top_k: int = 2, response_mode: str = "compact") -> Any:
    """A factory that also takes the response synthesizer's mode (``as_query_engine(response_mode=...)``)."""
    with _lock:
        CALLS.append({"top_k": top_k, "response_mode": response_mode})
    return memory_index().as_query_engine(llm=llm, similarity_top_k=top_k, response_mode=response_mode)


def described(llm: Any, *, top_k: int = 2) -> Any:
    return build_query_engine(llm, top_k=top_k)


described.describe = lambda: {"index": "memory", "embedding": "hash"}  # type: ignore[attr-defined]


def raising(llm: Any) -> Any:
    raise RuntimeError("the vector database is down")


def not_an_engine(llm: Any) -> Any:
    return memory_index()  # an index, not its query engine


def own_llm(llm: Any) -> Any:
    """Ignores the LLM it is given (a mock of LlamaIndex's answers without any call through opro)."""
    from llama_index.core.llms import MockLLM

    return memory_index().as_query_engine(llm=MockLLM())


# -- a real vector database -------------------------------------------------------------------------------


def chroma_client(path: str | Path) -> Any:
    try:
        import chromadb
        from chromadb.config import Settings
    except ImportError:
        unavailable("chromadb is not installed (pip install -e '.[chroma]')")
    return chromadb.PersistentClient(path=str(path), settings=Settings(anonymized_telemetry=False))


def build_chroma(path: str | Path) -> None:
    """The collection the Chroma pipeline reads: the corpus's chunks with their embeddings, on disk."""
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chroma_client(path).get_or_create_collection(COLLECTION, embedding_function=None)
    storage = StorageContext.from_defaults(vector_store=ChromaVectorStore(chroma_collection=collection))
    VectorStoreIndex(nodes(), storage_context=storage, embed_model=HashEmbedding())


@functools.cache
def _chroma_index(path: str) -> VectorStoreIndex:
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = chroma_client(path).get_collection(COLLECTION, embedding_function=None)
    return VectorStoreIndex.from_vector_store(ChromaVectorStore(chroma_collection=collection),
                                              embed_model=HashEmbedding())


def chroma_engine(llm: Any, *, top_k: int = 2) -> Any:
    """The user's factory over the Chroma collection in ``$OPRO_TEST_CHROMA_DIR``."""
    with _lock:
        CALLS.append({"top_k": top_k})
    return _chroma_index(os.environ[CHROMA_DIR]).as_query_engine(llm=llm, similarity_top_k=top_k)


chroma_engine.describe = lambda: {"store": "chroma", "collection": COLLECTION}  # type: ignore[attr-defined]
