from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from fakes import SHARED_ALEXNET
from llama_index.core.schema import Document

from opro.errors import ConfigError, LLMConnectionError
from opro.program.retrieval import (
    BM25Retriever,
    Chunk,
    DenseRetriever,
    Embedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    build_retriever,
    cached_chunks,
    chunk_documents,
    context_overlap,
    is_hit,
    recall_at_k,
)

SHARED = SHARED_ALEXNET

TOPICS = {
    "cats": "Cats are small domesticated felines. A cat purrs, hunts mice and sleeps most of the day.",
    "volcano": "A volcano erupts when magma rises through the crust; lava flows and ash clouds follow.",
    "bread": "Bread is baked from flour, water, yeast and salt; the dough rises before baking in an oven.",
    "chess": "Chess is a board game where the king must be protected; checkmate ends the game.",
}


def _chunks() -> list[Chunk]:
    return [Chunk(id=k, text=v, metadata={"topic": k}) for k, v in TOPICS.items()]


def test_chunk_documents_uses_sizes_and_keeps_metadata() -> None:
    text = " ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(400))
    doc = Document(text=text, id_="doc1", metadata={"file_name": "a.txt"})
    small = chunk_documents([doc], chunk_size=128, chunk_overlap=16)
    large = chunk_documents([doc], chunk_size=512, chunk_overlap=16)
    assert len(small) > len(large) > 1
    assert small[0].id == "doc1#chunk=0" and small[0].metadata["file_name"] == "a.txt"
    assert chunk_documents([doc], chunk_size=128, chunk_overlap=16) == small  # deterministic
    with pytest.raises(ConfigError, match="chunk_overlap"):
        chunk_documents([doc], chunk_size=64, chunk_overlap=64)


def test_chunks_are_cached_by_documents_and_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import opro.program.retrieval as retrieval

    docs = [Document(text=" ".join(TOPICS.values()) * 3, id_="d1", metadata={"page": 1})]
    first = cached_chunks(docs, chunk_size=32, chunk_overlap=0, cache_dir=tmp_path)
    assert first == chunk_documents(docs, chunk_size=32, chunk_overlap=0)
    assert len(list(tmp_path.glob("chunks-*.json"))) == 1

    def no_splitter(*a: object, **k: object) -> list[Chunk]:
        raise AssertionError("chunked again")

    monkeypatch.setattr(retrieval, "chunk_documents", no_splitter)
    assert cached_chunks(docs, chunk_size=32, chunk_overlap=0, cache_dir=tmp_path) == first  # from the file
    # A different size, text or metadata is a different key: chunked again.
    for changed in ({"chunk_size": 48}, {"docs": [Document(text=docs[0].text + " More.", id_="d1", metadata={"page": 1})]},
                    {"docs": [Document(text=docs[0].text, id_="d1", metadata={"page": 2})]}):
        with pytest.raises(AssertionError, match="chunked again"):
            cached_chunks(changed.get("docs", docs), chunk_size=changed.get("chunk_size", 32), chunk_overlap=0,  # type: ignore[arg-type]
                          cache_dir=tmp_path)
    monkeypatch.undo()
    # A file cut short is chunked again and rewritten, not an error.
    (path,) = tmp_path.glob("chunks-*.json")
    path.write_text(path.read_text()[:20])
    assert cached_chunks(docs, chunk_size=32, chunk_overlap=0, cache_dir=tmp_path) == first
    assert json.loads(path.read_text())[0]["id"] == first[0].id
    # build_retriever with an index_dir goes through the cache.
    monkeypatch.setattr(retrieval, "chunk_documents", no_splitter)
    r = build_retriever(documents=docs, chunk_size=32, chunk_overlap=0, top_k=1, index_dir=tmp_path)
    assert r.retrieve("Which animal purrs?")[0].text


def test_bm25_ranks_the_matching_chunk_first_and_memoizes() -> None:
    r = build_retriever(chunks=_chunks(), top_k=2)
    got = r.retrieve("why does magma make a volcano erupt?")
    assert got[0].chunk_id == "volcano" and got[0].metadata == {"topic": "volcano"}
    assert got[0].score > 0
    assert r.retrieve("why does magma make a volcano erupt?") == got
    assert [c.chunk_id for c in r.retrieve("oven dough yeast", top_k=1)] == ["bread"]
    # A query sharing no term with the corpus retrieves nothing rather than noise.
    assert r.retrieve("zebra quantum") == []


def test_bm25_index_is_persisted_and_keyed_by_content_and_settings(tmp_path: Path) -> None:
    first = build_retriever(chunks=_chunks(), index_dir=tmp_path)
    assert isinstance(first, BM25Retriever) and not first.loaded_from_disk
    again = build_retriever(chunks=_chunks(), index_dir=tmp_path)
    assert isinstance(again, BM25Retriever) and again.loaded_from_disk
    assert again.retrieve("checkmate king") == first.retrieve("checkmate king")
    changed = [*_chunks()[:-1], Chunk(id="chess", text="Chess openings: the Sicilian defence.")]
    other = build_retriever(chunks=changed, index_dir=tmp_path)
    assert isinstance(other, BM25Retriever) and not other.loaded_from_disk
    stemmed = build_retriever(chunks=_chunks(), index_dir=tmp_path, stemmer="porter")
    assert isinstance(stemmed, BM25Retriever) and not stemmed.loaded_from_disk
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 3


class BagOfWordsEmbedder(Embedder):
    """Deterministic hashed bag-of-words vectors; counts calls to check the persisted index."""

    def __init__(self) -> None:
        self.texts_embedded = 0

    @property
    def identity(self) -> str:
        return "test:bow"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts_embedded += len(texts)
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace("?", " ").replace(".", " ").split():
                out[i, sum(map(ord, w)) % 64] += 1.0
        return out


def test_dense_retrieval_and_persisted_embeddings(tmp_path: Path) -> None:
    emb = BagOfWordsEmbedder()
    r = build_retriever(chunks=_chunks(), kind="dense", embedder=emb, index_dir=tmp_path, top_k=1, progress=False)
    assert isinstance(r, DenseRetriever) and not r.loaded_from_disk
    assert r.retrieve("the king and checkmate")[0].chunk_id == "chess"
    before = emb.texts_embedded
    again = build_retriever(chunks=_chunks(), kind="dense", embedder=emb, index_dir=tmp_path, top_k=1, progress=False)
    assert isinstance(again, DenseRetriever) and again.loaded_from_disk
    assert emb.texts_embedded == before  # chunks not embedded again
    with pytest.raises(ConfigError, match="needs an embedder"):
        build_retriever(chunks=_chunks(), kind="dense")


class _EmbeddingsHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(t)), float(t.count("a")), 1.0]}
            for i, t in enumerate(body["input"])
        ]
        payload = json.dumps({"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": 1, "total_tokens": 1}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def embeddings_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmbeddingsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_embedder_against_a_local_server(embeddings_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPRO_TEST_NO_KEY", raising=False)
    emb = OpenAIEmbedder(model="fake-embed", base_url=embeddings_server, api_key_env="OPRO_TEST_NO_KEY", batch_size=2)
    vecs = emb.embed(["a", "banana", "cab"])
    assert vecs.shape == (3, 3)
    assert vecs[1].tolist() == [6.0, 3.0, 1.0]
    assert emb.identity.endswith(":fake-embed")


def test_openai_embedder_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPRO_TEST_NO_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPRO_TEST_NO_KEY"):
        OpenAIEmbedder(model="m", api_key_env="OPRO_TEST_NO_KEY")
    emb = OpenAIEmbedder(model="m", base_url="http://127.0.0.1:9/v1", api_key_env="OPRO_TEST_NO_KEY", max_retries=0, timeout_s=2)
    with pytest.raises(LLMConnectionError, match=r"cannot reach http://127\.0\.0\.1:9/v1"):
        emb.embed(["x"])


def test_sentence_transformers_is_lazy_with_an_install_hint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        SentenceTransformerEmbedder(model_path=tmp_path / "missing")
    emb = SentenceTransformerEmbedder(model_path=tmp_path)  # constructing does not import the package
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="pip install sentence-transformers"):
            emb.embed(["x"])


def test_context_overlap_defines_a_hit() -> None:
    ref = "Deep learning has garnered tremendous success in a variety of application domains."
    assert context_overlap(ref, "intro text. " + ref + " More text after it.") == 1.0
    assert is_hit(ref, "deep learning has garnered  tremendous success in a variety")
    assert not is_hit(ref, "Bread is baked from flour, water, yeast and salt.")
    assert context_overlap("", ref) == 0.0


@pytest.mark.usefixtures("shared_alexnet")
def test_bm25_recall_on_the_shared_dataset(tmp_path: Path) -> None:
    """Measured (chunk 512 / overlap 64, no stemming): R@1 0.669, R@2 0.750, R@3 0.781, R@5 0.819."""
    from opro.data.dataset import load_dataset
    from opro.data.documents import load_documents

    docs = load_documents(SHARED / "source_files").documents
    dataset = load_dataset(SHARED / "rag_dataset.json")
    assert len(dataset) == 160
    r = build_retriever(documents=docs, chunk_size=512, chunk_overlap=64, top_k=5, index_dir=tmp_path)
    recall = recall_at_k(r, [(e.query, e.reference_contexts) for e in dataset.examples])
    assert recall[1] >= 0.62
    assert recall[3] >= 0.73
    assert recall[5] >= 0.77
    assert recall[1] <= recall[2] <= recall[3] <= recall[5]
