from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opro.cli import app
from opro.data.corpus import QUICKSTART_FILE, fetch_llama2_paper, write_quickstart_corpus
from opro.data.documents import load_documents
from opro.errors import DataError
from opro.program.retrieval import build_retriever

FAKE_DATASET = {
    "examples": [
        {
            "query": "How many parameters does the largest Llama 2 model have?",
            "query_by": {"model_name": "gpt-4", "type": "ai"},
            "reference_contexts": ["Llama 2 ... 7B, 13B and 70B parameters."],
            "reference_answer": "70 billion.",
            "reference_answer_by": {"model_name": "gpt-4", "type": "ai"},
        }
    ]
}


def test_quickstart_corpus_is_a_real_pdf_that_loads_and_retrieves(tmp_path: Path) -> None:
    path = write_quickstart_corpus(tmp_path / "corpus")
    assert path == tmp_path / "corpus" / QUICKSTART_FILE
    assert path.read_bytes()[:5] == b"%PDF-"
    docs = load_documents(path).documents
    assert len(docs) >= 5
    text = "\n".join(d.text for d in docs)
    for phrase in ('The "try" statement', "Function definitions", "Class definitions", 'The "while" statement'):
        assert phrase in text
    retriever = build_retriever(documents=docs, chunk_size=256, chunk_overlap=32, top_k=3)
    got = retriever.retrieve("When is the finally clause executed?")
    assert any("finally" in c.text for c in got)


def test_quickstart_topics_are_checked(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown pydoc topic"):
        write_quickstart_corpus(tmp_path, topics=("if", "no-such-topic"))
    path = write_quickstart_corpus(tmp_path, topics=("if",))
    assert 'The "if" statement' in load_documents(path).documents[0].text


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "paper.pdf").write_bytes(b"%PDF-1.7\nfake paper bytes\n%%EOF\n")
    (root / "rag_dataset.json").write_text(json.dumps(FAKE_DATASET))
    (root / "not-a-pdf.html").write_text("<html>Just a moment...</html>")
    handler = partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def test_fetch_from_a_local_server(file_server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = file_server
    out = tmp_path / "llama2"
    result = fetch_llama2_paper(out, paper_url=f"{url}/paper.pdf", dataset_url=f"{url}/rag_dataset.json", timeout_s=5)
    assert result.paper == out / "source_files" / "llama2.pdf"
    assert result.paper.read_bytes().startswith(b"%PDF-")
    assert json.loads(result.dataset.read_text()) == FAKE_DATASET
    assert set(result.downloaded) == {result.paper, result.dataset}
    again = fetch_llama2_paper(out, paper_url=f"{url}/paper.pdf", dataset_url=f"{url}/rag_dataset.json", timeout_s=5)
    assert again.downloaded == ()


def test_fetch_rejects_wrong_content_and_missing_files(file_server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = file_server
    with pytest.raises(DataError, match="did not return a PDF"):
        fetch_llama2_paper(tmp_path / "a", paper_url=f"{url}/not-a-pdf.html", dataset_url=f"{url}/rag_dataset.json")
    assert not (tmp_path / "a" / "source_files" / "llama2.pdf").exists()
    with pytest.raises(DataError, match="HTTP 404"):
        fetch_llama2_paper(tmp_path / "b", paper_url=f"{url}/missing.pdf", dataset_url=f"{url}/rag_dataset.json")
    with pytest.raises(DataError, match="did not return a LabelledRagDataset"):
        fetch_llama2_paper(tmp_path / "c", paper_url=f"{url}/paper.pdf", dataset_url=f"{url}/not-a-pdf.html")


def test_fetch_offline_gives_a_clear_error(tmp_path: Path) -> None:
    # Port 9 on localhost (discard) is closed here: the connection is refused, as when offline.
    with pytest.raises(DataError, match=r"cannot download the Llama 2 paper .*are you offline\?.*opro dataset corpus"):
        fetch_llama2_paper(tmp_path, paper_url="http://127.0.0.1:9/llama2.pdf", dataset_url="http://127.0.0.1:9/x.json", timeout_s=2)
    assert not any(p.name.endswith(".part") for p in tmp_path.rglob("*"))


def test_cli_corpus_and_fetch(file_server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = file_server
    runner = CliRunner()
    res = runner.invoke(app, ["dataset", "corpus", "--out", str(tmp_path / "c"), "--topic", "for", "--topic", "while"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "c" / QUICKSTART_FILE).exists()
    res = runner.invoke(
        app,
        ["dataset", "fetch-llama2", "--out", str(tmp_path / "l"), "--paper-url", f"{url}/paper.pdf", "--dataset-url", f"{url}/rag_dataset.json"],
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "l" / "rag_dataset.json").exists()
    res = runner.invoke(app, ["dataset", "fetch-llama2", "--out", str(tmp_path / "m"), "--paper-url", "http://127.0.0.1:9/p.pdf"])
    assert res.exit_code == 1 and "offline" in res.output
