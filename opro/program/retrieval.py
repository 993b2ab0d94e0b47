"""Chunking and retrieval: BM25 (the embedded default, no model needed), dense embeddings, or hybrid
(both, fused by reciprocal rank: each chunk scores the sum of ``1 / (60 + rank)`` over the two).

Chunks come from llama-index-core's ``SentenceSplitter``. A built index is persisted under
``index_dir`` keyed by a sha256 of the chunk texts and the settings, so a rerun loads it instead of
rebuilding (that matters for dense retrieval, where building means embedding every chunk). The
chunks themselves are kept there too, keyed by the documents (or, for an experiment, by its document
files' bytes, so nothing is loaded to find them) and the chunk settings: the splitter's
first use (sentence tokenizer and token counter loaded) costs seconds in every process otherwise,
and every process of a run (resume, each scale-out worker, compare, evaluate) chunks the same text.
Retrieval results are memoized per ``(query, top_k)``: an OPRO run asks the same questions for
every candidate instruction.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from opro.data.documents import Chunk
from opro.errors import (
    ConfigError,
    DataError,
)
from opro.progress import progress_bar

if TYPE_CHECKING:
    from llama_index.core.schema import Document

RetrieverKind = Literal["bm25", "dense", "hybrid"]
#: Reciprocal rank fusion's constant (Cormack et al. 2009; LlamaIndex's QueryFusionRetriever uses it too).
RRF_K = 60
Stemmer = Literal["none", "porter"]
INDEX_FORMAT = 1  # bump when the on-disk layout or tokenization changes


@dataclass(frozen=True)
class RetrievedContext:
    text: str
    score: float
    metadata: Mapping[str, Any] = field(default_factory=dict)
    chunk_id: str = ""


def chunk_documents(documents: Iterable[Document], *, chunk_size: int = 512, chunk_overlap: int = 64) -> list[Chunk]:
    """Split documents with LlamaIndex's ``SentenceSplitter`` (sizes in tokens)."""
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.schema import MetadataMode

    if chunk_size <= 0:
        raise ConfigError(f"chunk_size must be positive, got {chunk_size}")
    if not 0 <= chunk_overlap < chunk_size:
        raise ConfigError(f"chunk_overlap must be in [0, chunk_size={chunk_size}), got {chunk_overlap}")
    docs = list(documents)
    if not docs:
        raise DataError("no documents to chunk")
    splitter = SentenceSplitter(chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    nodes = splitter.get_nodes_from_documents(docs)
    chunks: list[Chunk] = []
    counts: dict[str, int] = {}
    for node in nodes:
        text = node.get_content(metadata_mode=MetadataMode.NONE)
        if not text.strip():
            continue
        source = node.ref_doc_id or "doc"
        n = counts.get(source, 0)
        counts[source] = n + 1
        # Stable ids (document id + position) instead of LlamaIndex's random node ids.
        chunks.append(Chunk(id=f"{source}#chunk={n}", text=text, metadata=dict(node.metadata)))
    if not chunks:
        raise DataError("the documents produced no text chunks")
    return chunks


# --- tokenization (BM25) --------------------------------------------------------------------------

_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


def _make_stemmer(name: Stemmer) -> Callable[[str], str] | None:
    if name == "none":
        return None
    if name == "porter":
        try:
            from nltk.stem import PorterStemmer
        except ImportError as exc:  # optional: works offline, no data download needed
            raise ConfigError("stemmer='porter' needs nltk: `pip install nltk` (or use stemmer='none')") from exc
        stem = PorterStemmer().stem
        return lambda w: stem(w)
    raise ConfigError(f"unknown stemmer {name!r}; use 'none' or 'porter'")


class _Tokenizer:
    def __init__(self, stemmer: Stemmer) -> None:
        self._stop = _stopwords()
        self._stem = _make_stemmer(stemmer)

    def __call__(self, text: str) -> list[str]:
        words = [w for w in _TOKEN.findall(text.lower()) if w not in self._stop]
        return [self._stem(w) for w in words] if self._stem else words


# --- embedders ------------------------------------------------------------------------------------


class Embedder(ABC):
    """Turns texts into vectors. ``identity`` is part of the index key."""

    @property
    @abstractmethod
    def identity(self) -> str: ...

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """A float32 array of shape (len(texts), dim)."""


class OpenAIEmbedder(Embedder):
    """Embeddings from an OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM, llama.cpp server...)."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        batch_size: int = 64,
        timeout_s: float = 60.0,
        max_retries: int = 3,
    ) -> None:
        import openai

        key = os.environ.get(api_key_env)
        if not key:
            if base_url is None:
                raise ConfigError(
                    f"the embeddings API key variable {api_key_env} is not set; export it or give a base_url "
                    "of a local server"
                )
            key = "not-needed"  # local OpenAI-compatible servers usually ignore the key
        self._model = model
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._api_key_env = api_key_env
        self._batch = max(1, batch_size)
        from opro.llm.openai import client_url_args

        url_args = client_url_args(base_url) if base_url is not None else {}
        self._client = openai.OpenAI(api_key=key, timeout=timeout_s, max_retries=max_retries, **url_args)

    @property
    def identity(self) -> str:
        from opro.redaction import redact_url

        return f"openai:{redact_url(self._base_url or 'api.openai.com')}:{self._model}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out: list[list[float]] = []
        for start in range(0, len(texts), self._batch):
            batch = list(texts[start : start + self._batch])
            try:
                resp = self._client.embeddings.create(model=self._model, input=batch)
            except Exception as exc:
                import openai

                if isinstance(exc, openai.OpenAIError):
                    from opro.llm.openai import DEFAULT_BASE_URL, convert_openai_error

                    raise convert_openai_error(
                        exc,
                        model=self._model,
                        provider="openai-embeddings",
                        base_url=self._base_url or DEFAULT_BASE_URL,
                        timeout_s=self._timeout_s,
                        api_key_env=self._api_key_env,
                    ) from exc
                raise
            rows = sorted(resp.data, key=lambda d: d.index)
            out.extend(list(r.embedding) for r in rows)
        return np.asarray(out, dtype=np.float32).reshape(len(texts), -1)


class SentenceTransformerEmbedder(Embedder):
    """A local sentence-transformers model directory (loaded on first use)."""

    def __init__(self, *, model_path: str | Path, batch_size: int = 32, device: str | None = None) -> None:
        self._path = Path(model_path)
        if not self._path.exists():
            raise ConfigError(f"sentence-transformers model directory not found: {self._path}")
        self._batch = batch_size
        self._device = device
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def identity(self) -> str:
        return f"sentence-transformers:{self._path.resolve()}"

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ConfigError(
                        "dense retrieval with a local model needs sentence-transformers: "
                        "`pip install sentence-transformers` (or use an OpenAI-compatible embeddings endpoint)"
                    ) from exc
                self._model = SentenceTransformer(str(self._path), device=self._device)
            return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        model = self._load()
        vecs = model.encode(list(texts), batch_size=self._batch, show_progress_bar=False, convert_to_numpy=True)
        return np.asarray(vecs, dtype=np.float32)


# --- retrievers -----------------------------------------------------------------------------------


class Retriever(ABC):
    """Top-k chunks for a query. Thread-safe; results memoized per (query, top_k)."""

    kind: str = "base"

    def __init__(self, chunks: Sequence[Chunk], *, top_k: int, cache_size: int = 4096) -> None:
        if top_k <= 0:
            raise ConfigError(f"top_k must be positive, got {top_k}")
        if not chunks:
            raise DataError("cannot build a retriever over zero chunks")
        self.chunks: tuple[Chunk, ...] = tuple(chunks)
        self.top_k = top_k
        self._memo: OrderedDict[tuple[str, int], tuple[RetrievedContext, ...]] = OrderedDict()
        self._memo_size = cache_size
        self._lock = threading.Lock()

    @abstractmethod
    def _scores(self, query: str) -> np.ndarray:
        """One score per chunk (higher is better)."""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "top_k": self.top_k, "n_chunks": len(self.chunks)}

    def retrieve(self, query: str, *, top_k: int | None = None) -> list[RetrievedContext]:
        k = self.top_k if top_k is None else top_k
        if k <= 0:
            raise ConfigError(f"top_k must be positive, got {k}")
        key = (query, k)
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                return list(hit)
            scores = self._scores(query)
        k = min(k, len(self.chunks))
        top = np.argpartition(-scores, k - 1)[:k]
        # Ties broken by chunk order so results are deterministic.
        order = sorted(top.tolist(), key=lambda i: (-float(scores[i]), i))
        result = tuple(
            RetrievedContext(
                text=self.chunks[i].text, score=float(scores[i]), metadata=self.chunks[i].metadata, chunk_id=self.chunks[i].id
            )
            for i in order
            if scores[i] > 0 or self.kind != "bm25"  # a zero BM25 score shares no term with the query
        )
        with self._lock:
            self._memo[key] = result
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
        return list(result)


def retrieve_top(retriever: Any, query: str, *, top_k: int | None) -> list[RetrievedContext]:
    """``retriever.retrieve(query)``, passing ``top_k`` only when one is set (a prompt's own, else the
    retriever's): a duck-typed retriever without the keyword keeps working wherever none is set."""
    if top_k is None:
        return list(retriever.retrieve(query))
    return list(retriever.retrieve(query, top_k=top_k))


class BM25Retriever(Retriever):
    kind = "bm25"

    def __init__(
        self,
        chunks: Sequence[Chunk],
        *,
        top_k: int = 2,
        stemmer: Stemmer = "none",
        index_path: Path | None = None,
        k1: float = 1.5,
        b: float = 0.75,
    ) -> None:
        import bm25s

        super().__init__(chunks, top_k=top_k)
        self.stemmer = stemmer
        self._tokenize = _Tokenizer(stemmer)
        self.loaded_from_disk = False
        if index_path is not None and (index_path / "params.index.json").exists():
            self._bm25 = bm25s.BM25.load(str(index_path), show_progress=False)
            self.loaded_from_disk = True
        else:
            self._bm25 = bm25s.BM25(k1=k1, b=b)
            self._bm25.index([self._tokenize(c.text) for c in self.chunks], show_progress=False)
            if index_path is not None:
                _atomic_dir(index_path, lambda d: self._bm25.save(str(d), show_progress=False))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "stemmer": self.stemmer}

    def _scores(self, query: str) -> np.ndarray:
        tokens = self._tokenize(query)
        if not tokens:
            return np.zeros(len(self.chunks), dtype=np.float32)
        return np.asarray(self._bm25.get_scores(tokens), dtype=np.float32)


class DenseRetriever(Retriever):
    kind = "dense"

    def __init__(
        self,
        chunks: Sequence[Chunk],
        *,
        embedder: Embedder,
        top_k: int = 2,
        index_path: Path | None = None,
        progress: bool = True,
        batch_size: int = 32,
    ) -> None:
        super().__init__(chunks, top_k=top_k)
        self.embedder = embedder
        self.loaded_from_disk = False
        matrix: np.ndarray | None = None
        if index_path is not None and (index_path / "embeddings.npy").exists():
            matrix = np.load(index_path / "embeddings.npy")
            if matrix.shape[0] != len(self.chunks):
                matrix = None  # stale or partial: rebuild
            else:
                self.loaded_from_disk = True
        if matrix is None:
            parts: list[np.ndarray] = []
            with progress_bar("embedding chunks", total=len(self.chunks), enabled=progress) as bar:
                for start in range(0, len(self.chunks), batch_size):
                    batch = [c.text for c in self.chunks[start : start + batch_size]]
                    parts.append(embedder.embed(batch))
                    bar.advance(len(batch))
            matrix = _normalize(np.concatenate(parts, axis=0))
            if index_path is not None:
                final = matrix
                _atomic_dir(index_path, lambda d: np.save(d / "embeddings.npy", final))
        self._matrix = matrix.astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "embedder": self.embedder.identity}

    def _scores(self, query: str) -> np.ndarray:
        q = _normalize(self.embedder.embed([query]))[0]
        return np.asarray(self._matrix @ q, dtype=np.float32)  # cosine similarity


class HybridRetriever(Retriever):
    """BM25 and dense retrieval fused by reciprocal rank: a chunk scores ``sum(1 / (RRF_K + rank))``
    over the two rankings (a chunk BM25 scores 0 is not in its ranking)."""

    kind = "hybrid"

    def __init__(self, lexical: BM25Retriever, dense: DenseRetriever) -> None:
        super().__init__(lexical.chunks, top_k=lexical.top_k)
        self.lexical, self.dense = lexical, dense
        self.loaded_from_disk = lexical.loaded_from_disk and dense.loaded_from_disk

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "stemmer": self.lexical.stemmer, "embedder": self.dense.embedder.identity}

    def _scores(self, query: str) -> np.ndarray:
        fused = np.zeros(len(self.chunks), dtype=np.float64)
        for scores, ranked_only_positive in ((self.lexical._scores(query), True), (self.dense._scores(query), False)):
            order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
            for rank, i in enumerate(order, start=1):
                if scores[i] > 0 or not ranked_only_positive:
                    fused[i] += 1.0 / (RRF_K + rank)
        return fused.astype(np.float32)


def _normalize(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    if m.ndim != 2 or m.shape[0] == 0:
        raise DataError(f"the embedder returned an array of shape {m.shape}; expected (n_texts, dim)")
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.maximum(norms, 1e-12)


def _atomic_dir(final: Path, write: Callable[[Path], Any]) -> None:
    """Write an index into a temporary sibling directory, then rename it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write(tmp)
        try:
            tmp.rename(final)
        except OSError:
            if not final.exists():  # another process won the race otherwise: keep theirs
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def index_key(chunks: Sequence[Chunk], settings: Mapping[str, Any]) -> str:
    """sha256 of the chunk texts and the settings that shape the index."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": INDEX_FORMAT, **settings}, sort_keys=True).encode("utf-8"))
    for c in chunks:
        h.update(b"\0")
        h.update(c.text.encode("utf-8"))
    return h.hexdigest()


CHUNKS_FORMAT = 1  # bump when chunk_documents' output changes for the same input


def _chunks_hash(**settings: Any) -> hashlib._Hash:
    """A sha256 started with what shapes any chunks: the sizes and other ``settings``, the format and
    the splitter's version."""
    from importlib.metadata import version

    h = hashlib.sha256()
    h.update(json.dumps({"format": CHUNKS_FORMAT, "llama_index_core": version("llama-index-core"), **settings},
                        sort_keys=True).encode("utf-8"))
    return h


def _chunks_key(documents: Sequence[Document], *, chunk_size: int, chunk_overlap: int) -> str:
    """sha256 of what shapes the chunks: the documents (id, text, metadata), the sizes, the splitter's version."""
    h = _chunks_hash(chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    for d in documents:
        h.update(b"\0")
        h.update(json.dumps([d.doc_id, d.text, d.metadata], sort_keys=True, default=str).encode("utf-8"))
    return h.hexdigest()


def files_chunks_key(files: Sequence[Path], *, chunk_size: int, chunk_overlap: int, skip_bad: bool) -> str:
    """sha256 of what shapes the chunks of ``files`` (as :func:`opro.data.documents.source_files` lists
    them): each file's path and bytes, the loader's and splitter's versions, the sizes. Computed
    without loading a document: a run whose chunks are kept skips PDF parsing and LlamaIndex's import."""
    from opro.data.documents import LOADER_FORMAT

    h = _chunks_hash(chunk_size=chunk_size, chunk_overlap=chunk_overlap, loader=LOADER_FORMAT, skip_bad=skip_bad)
    for f in files:
        h.update(b"\0" + str(f).encode("utf-8") + b"\0")
        h.update(hashlib.sha256(Path(f).read_bytes()).digest())
    return h.hexdigest()


def kept_chunks(path: Path, make: Callable[[], list[Chunk]]) -> list[Chunk]:
    """The chunks kept at ``path``, or ``make()``'s, then kept there (written atomically)."""
    if path.is_file():
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
            return [Chunk(id=r["id"], text=r["text"], metadata=r["metadata"]) for r in rows]
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable (cut short, edited): chunk again and rewrite it
    chunks = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump([{"id": c.id, "text": c.text, "metadata": dict(c.metadata)} for c in chunks], f, default=str)
    os.replace(tmp, path)
    return chunks


def cached_chunks(
    documents: Iterable[Document], *, chunk_size: int, chunk_overlap: int, cache_dir: str | Path
) -> list[Chunk]:
    """:func:`chunk_documents`, kept in ``cache_dir`` under a key of its inputs (see :func:`_chunks_key`)."""
    docs = list(documents)
    path = Path(cache_dir) / f"chunks-{_chunks_key(docs, chunk_size=chunk_size, chunk_overlap=chunk_overlap)[:24]}.json"
    return kept_chunks(path, lambda: chunk_documents(docs, chunk_size=chunk_size, chunk_overlap=chunk_overlap))


def build_retriever(
    *,
    documents: Iterable[Document] | None = None,
    chunks: Sequence[Chunk] | None = None,
    chunk_size: int = 512,
    chunk_overlap: int = 64,
    kind: RetrieverKind = "bm25",
    top_k: int = 2,
    index_dir: str | Path | None = None,
    embedder: Embedder | None = None,
    stemmer: Stemmer = "none",
    progress: bool = True,
) -> Retriever:
    """Chunk ``documents`` (or take ready ``chunks``) and build, or load from ``index_dir``, a retriever.

    With ``index_dir``, the chunks are kept there too (:func:`cached_chunks`).
    """
    if (documents is None) == (chunks is None):
        raise ConfigError("give exactly one of documents= or chunks=")
    if chunks is None:
        assert documents is not None
        if index_dir is None:
            chunks = chunk_documents(documents, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        else:
            chunks = cached_chunks(documents, chunk_size=chunk_size, chunk_overlap=chunk_overlap, cache_dir=index_dir)
    if kind not in ("bm25", "dense", "hybrid"):
        raise ConfigError(f"unknown retriever kind {kind!r}; use 'bm25', 'dense' or 'hybrid'")
    if kind != "bm25" and embedder is None:
        raise ConfigError(f"kind={kind!r} needs an embedder (OpenAIEmbedder or SentenceTransformerEmbedder)")

    def path(one: str, settings: dict[str, Any]) -> Path | None:
        settings = {"kind": one, "chunk_size": chunk_size, "chunk_overlap": chunk_overlap, **settings}
        return None if index_dir is None else Path(index_dir) / f"{one}-{index_key(chunks, settings)[:24]}"

    def lexical() -> BM25Retriever:
        return BM25Retriever(chunks, top_k=top_k, stemmer=stemmer, index_path=path("bm25", {"stemmer": stemmer}))

    def dense() -> DenseRetriever:
        assert embedder is not None
        return DenseRetriever(chunks, embedder=embedder, top_k=top_k, index_path=path("dense", {"embedder": embedder.identity}),
                              progress=progress)

    if kind == "bm25":
        return lexical()
    if kind == "dense":
        return dense()
    return HybridRetriever(lexical(), dense())  # each index kept as its kind alone keeps it: built once for both


# --- evaluation helpers ---------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def _bigrams(text: str) -> Counter[tuple[str, str]]:
    words = _WORD.findall(text.lower())
    return Counter(itertools.pairwise(words))


def context_overlap(reference: str, text: str) -> float:
    """Shared word bigrams (multiset) over the bigrams of the shorter text, in [0, 1].

    Robust to different PDF extractors and chunk boundaries: a chunk inside the reference passage,
    or a reference inside a bigger chunk, both score near 1; unrelated text scores near 0.
    """
    a, b = _bigrams(reference), _bigrams(text)
    denom = min(sum(a.values()), sum(b.values()))
    return sum((a & b).values()) / denom if denom else 0.0


def is_hit(reference: str, text: str, *, threshold: float = 0.5) -> bool:
    """Whether a retrieved text counts as the reference context (``context_overlap >= threshold``)."""
    return context_overlap(reference, text) >= threshold


def first_hits(retriever: Retriever, pairs: Iterable[tuple[str, Sequence[str]]], *, k: int) -> list[int | None]:
    """For each ``(query, reference_contexts)`` pair, the rank (0-based) of the first of the top ``k``
    retrieved chunks that holds a reference context, or None: one retrieval per query serves every k' <= k."""
    out: list[int | None] = []
    for query, refs in pairs:
        got = retriever.retrieve(query, top_k=k)
        out.append(next((r for r, c in enumerate(got) if any(is_hit(ref, c.text) for ref in refs)), None))
    return out


def recall_at_k(
    retriever: Retriever, pairs: Iterable[tuple[str, Sequence[str]]], *, ks: Sequence[int] = (1, 2, 3, 5)
) -> dict[int, float]:
    """Fraction of ``(query, reference_contexts)`` pairs with a hit among the top k retrieved chunks."""
    items = list(pairs)
    if not items:
        raise DataError("recall_at_k needs at least one (query, reference_contexts) pair")
    return recall_from(first_hits(retriever, items, k=max(ks)), ks=ks)


def recall_from(firsts: Sequence[int | None], *, ks: Sequence[int]) -> dict[int, float]:
    """recall@k for each k from :func:`first_hits`' ranks."""
    return {k: sum(f is not None and f < k for f in firsts) / len(firsts) for k in ks}


__all__ = [
    "BM25Retriever",
    "Chunk",
    "DenseRetriever",
    "Embedder",
    "HybridRetriever",
    "OpenAIEmbedder",
    "RetrievedContext",
    "Retriever",
    "RetrieverKind",
    "SentenceTransformerEmbedder",
    "build_retriever",
    "cached_chunks",
    "chunk_documents",
    "context_overlap",
    "first_hits",
    "index_key",
    "is_hit",
    "recall_at_k",
    "recall_from",
    "retrieve_top",
]
