from __future__ import annotations

from pathlib import Path

import pymupdf
import pytest
from fakes import SHARED_ALEXNET

from opro.data.documents import load_documents, load_file
from opro.errors import DataError

SHARED = SHARED_ALEXNET
ALEXNET_PDF = SHARED / "source_files/HistoryOfAlexnet.pdf"


def _text_pdf(path: Path, pages: list[str]) -> Path:
    doc = pymupdf.open()
    for text in pages:
        page = doc.new_page()
        page.insert_text((72, 72), text)
    doc.save(path)
    doc.close()
    return path


def _encrypted_pdf(path: Path) -> Path:
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "secret text")
    doc.save(path, encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="user", owner_pw="owner")  # type: ignore[attr-defined]
    doc.close()
    return path


def _image_only_pdf(path: Path) -> Path:
    doc = pymupdf.open()
    page = doc.new_page()
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 40, 40), False)
    pix.clear_with(128)
    page.insert_image(pymupdf.Rect(72, 72, 200, 200), pixmap=pix)
    page.draw_rect(pymupdf.Rect(250, 250, 300, 300))
    doc.save(path)
    doc.close()
    return path


@pytest.mark.usefixtures("shared_alexnet")
def test_real_pdf_one_document_per_page_with_metadata() -> None:
    result = load_documents(ALEXNET_PDF)
    assert result.skipped == ()
    assert len(result.documents) == 39
    first = result.documents[0]
    assert first.metadata["file_name"] == "HistoryOfAlexnet.pdf"
    assert first.metadata["page"] == 1 and first.metadata["page_label"] == "1"
    assert [d.metadata["page"] for d in result.documents] == list(range(1, 40))
    assert "deep learning" in first.text
    # Ligatures are expanded so words match queries.
    assert not any("\ufb01" in d.text for d in result.documents)
    # Stable ids: loading twice gives the same ids.
    assert [d.id_ for d in load_documents(ALEXNET_PDF).documents] == [d.id_ for d in result.documents]


def test_text_and_markdown_files_and_recursive_directories(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "a.txt").write_text("Alpha text.", encoding="utf-8")
    (tmp_path / "sub" / "b.md").write_text("# Beta\n\nMarkdown body.", encoding="utf-8")
    _text_pdf(tmp_path / "sub" / "deeper" / "c.pdf", ["page one words", "page two words"])
    (tmp_path / "notes.docx").write_bytes(b"ignored in directories")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.txt").write_text("hidden", encoding="utf-8")
    result = load_documents(tmp_path)
    names = [d.metadata["file_name"] for d in result.documents]
    assert names == ["a.txt", "b.md", "c.pdf", "c.pdf"]  # sorted paths; .docx and hidden files ignored
    texts = {d.metadata["file_name"]: d.text for d in result.documents}
    assert texts["a.txt"] == "Alpha text."
    assert "page" not in result.documents[0].metadata
    assert [d.metadata.get("page") for d in result.documents if d.metadata["file_name"] == "c.pdf"] == [1, 2]


def test_corrupt_pdf_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"%PDF-1.7\nthis is not really a pdf\n")
    with pytest.raises(DataError, match=r"broken\.pdf.*(not a readable PDF|no extractable text)"):
        load_documents(bad)
    with pytest.raises(DataError, match=r"broken\.pdf"):
        load_file(bad)


def test_encrypted_pdf_is_named(tmp_path: Path) -> None:
    path = _encrypted_pdf(tmp_path / "locked.pdf")
    with pytest.raises(DataError, match=r"locked\.pdf: the PDF is encrypted"):
        load_file(path)


def test_image_only_pdf_has_no_text(tmp_path: Path) -> None:
    path = _image_only_pdf(tmp_path / "scan.pdf")
    with pytest.raises(DataError, match=r"scan\.pdf: the PDF has no extractable text.*OCR"):
        load_file(path)


def test_empty_directory_missing_path_and_unsupported_extension(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: the directory has no \.pdf, \.txt, \.md files"):
        load_documents(tmp_path / "empty")
    with pytest.raises(DataError, match="no such file"):
        load_documents(tmp_path / "nope.pdf")
    doc = tmp_path / "report.docx"
    doc.write_bytes(b"PK")
    with pytest.raises(DataError, match=r"report\.docx: unsupported file type '\.docx'"):
        load_documents(doc)
    with pytest.raises(DataError, match="no document paths"):
        load_documents([])


def test_bad_file_in_directory_fails_unless_skipped(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("Useful content.", encoding="utf-8")
    (tmp_path / "empty.md").write_text("   \n", encoding="utf-8")
    (tmp_path / "broken.pdf").write_bytes(b"garbage")
    with pytest.raises(DataError) as info:
        load_documents(tmp_path)
    message = str(info.value)
    assert "2 of 3 document file(s) cannot be used" in message
    assert "broken.pdf" in message and "empty.md" in message
    # The hint names what exists: the config key for `optimize`, the flag only for `dataset generate`.
    assert "`skip_bad = true` in [data]" in message and "--skip-bad to `opro dataset generate`" in message
    result = load_documents(tmp_path, skip_bad=True)
    assert [d.metadata["file_name"] for d in result.documents] == ["good.txt"]
    assert sorted(s.path.name for s in result.skipped) == ["broken.pdf", "empty.md"]
    assert all(s.reason for s in result.skipped)


def test_all_bad_files_fail_even_when_skipping(tmp_path: Path) -> None:
    (tmp_path / "broken.pdf").write_bytes(b"garbage")
    with pytest.raises(DataError, match="no usable documents"):
        load_documents(tmp_path, skip_bad=True)


def test_non_utf8_text_file(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes("café".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.txt: not UTF-8"):
        load_file(path)
