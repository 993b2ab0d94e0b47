"""Load source documents: PDFs (one LlamaIndex ``Document`` per page, via PyMuPDF), ``.txt`` and ``.md``.

Every bad file is reported by name with what is wrong and what to do. In a directory, one bad file
does not silently drop the others: loading fails with the list of bad files unless the caller asks
to skip them (``skip_bad=True``), in which case :attr:`LoadResult.skipped` says what was left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import DataError

if TYPE_CHECKING:
    from llama_index.core.schema import Document

SUPPORTED_EXTENSIONS: tuple[str, ...] = (".pdf", ".txt", ".md")

#: Bump when the documents loaded from the same files change (text clean-up, metadata, ids): caches
#: keyed by the files' bytes (:func:`opro.program.retrieval.files_chunks_key`) must not outlive it.
LOADER_FORMAT = 1

# Metadata that should not be shown to the LLM nor counted against the chunk size.
_HIDDEN_METADATA = ("file_path", "page")


@dataclass(frozen=True)
class Chunk:
    """A piece of a document as retrieval indexes it (:func:`opro.program.retrieval.chunk_documents`)."""

    id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SkippedFile:
    path: Path
    reason: str


@dataclass(frozen=True)
class LoadResult:
    documents: tuple[Document, ...]
    skipped: tuple[SkippedFile, ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        """Distinct source file names, in load order."""
        seen: dict[str, None] = {}
        for doc in self.documents:
            seen.setdefault(str(doc.metadata.get("file_path", "")), None)
        return tuple(seen)


class _BadFile(Exception):
    """Internal: one file cannot be used (the reason is the message)."""


def _make_document(text: str, *, path: Path, page: int | None, page_label: str | None) -> Document:
    from llama_index.core.schema import Document

    metadata: dict[str, object] = {"file_name": path.name, "file_path": str(path)}
    if page is not None:
        metadata["page_label"] = page_label or str(page)
        metadata["page"] = page
    # A stable id (not a random uuid) keeps chunk ids, and so index keys, reproducible.
    doc_id = f"{path}#page={page}" if page is not None else str(path)
    return Document(
        text=text,
        id_=doc_id,
        metadata=metadata,
        excluded_llm_metadata_keys=list(_HIDDEN_METADATA),
        excluded_embed_metadata_keys=list(_HIDDEN_METADATA),
    )


def _load_pdf(path: Path) -> list[Document]:
    import pymupdf

    try:
        pdf = pymupdf.open(path)
    except Exception as exc:  # PyMuPDF raises FileDataError / RuntimeError variants
        raise _BadFile(f"not a readable PDF ({exc}); check that the file is complete and not corrupt") from exc
    with pdf:
        if pdf.needs_pass:
            raise _BadFile("the PDF is encrypted (password protected); decrypt it first, e.g. `qpdf --decrypt`")
        if not pdf.is_pdf:
            raise _BadFile("not a PDF file")
        docs: list[Document] = []
        # Expand ligatures ("ﬁ" -> "fi") so words match queries in BM25 and in the judges' eyes.
        flags = pymupdf.TEXTFLAGS_TEXT & ~pymupdf.TEXT_PRESERVE_LIGATURES
        try:
            for index in range(pdf.page_count):
                page = pdf[index]
                text = page.get_text("text", flags=flags)
                if not text.strip():
                    continue  # blank or image-only page; the whole file is checked below
                label = page.get_label() or None
                docs.append(_make_document(text, path=path, page=index + 1, page_label=label))
        except Exception as exc:
            raise _BadFile(f"failed to extract text from the PDF ({exc})") from exc
    if not docs:
        raise _BadFile(
            "the PDF has no extractable text (a scanned / image-only PDF?); run OCR on it first, "
            "e.g. `ocrmypdf in.pdf out.pdf`"
        )
    return docs


def _load_text(path: Path) -> list[Document]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _BadFile(f"not UTF-8 text ({exc}); convert it to UTF-8") from exc
    except OSError as exc:
        raise _BadFile(f"cannot be read ({exc})") from exc
    if not text.strip():
        raise _BadFile("the file is empty (no text)")
    return [_make_document(text, path=path, page=None, page_label=None)]


def load_file(path: str | Path) -> list[Document]:
    """Load one file; raise :class:`DataError` naming the file when it cannot be used."""
    p = Path(path)
    try:
        return _load_one(p)
    except _BadFile as exc:
        raise DataError(f"{p}: {exc}") from exc


def _load_one(path: Path) -> list[Document]:
    if not path.exists():
        raise _BadFile("no such file or directory")
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_EXTENSIONS:
        raise _BadFile(f"unsupported file type {suffix or '(no extension)'!r}; supported: {', '.join(SUPPORTED_EXTENSIONS)}")
    return _load_pdf(path) if suffix == ".pdf" else _load_text(path)


def _expand(path: Path) -> list[Path]:
    """A file as is; a directory as its supported files, recursively, in sorted order (hidden ones skipped)."""
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    files = sorted(
        f
        for f in path.rglob("*")
        if f.is_file()
        and f.suffix.lower() in SUPPORTED_EXTENSIONS
        and not any(part.startswith(".") for part in f.relative_to(path).parts)
    )
    if not files:
        raise DataError(
            f"{path}: the directory has no {', '.join(SUPPORTED_EXTENSIONS)} files (searched recursively); "
            "point [data].docs (or `opro dataset generate --docs`) at a directory with documents"
        )
    return files


def source_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """The files :func:`load_documents` reads for ``paths``, in its order (directories expanded)."""
    items = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    if not items:
        raise DataError("no document paths given")
    files: list[Path] = []
    for item in items:
        for f in _expand(item):
            if f not in files:
                files.append(f)
    return files


def load_documents(paths: str | Path | Iterable[str | Path], *, skip_bad: bool = False) -> LoadResult:
    """Load files and directories (recursively) into LlamaIndex ``Document`` objects.

    PDFs give one document per page with ``file_name``, ``file_path``, ``page_label`` and ``page``
    (1-based) metadata; ``.txt`` / ``.md`` give one document per file. Files given explicitly must
    have a supported extension; in directories other files are ignored.

    Raises :class:`DataError` listing every bad file unless ``skip_bad`` is set; then the bad files
    are reported in :attr:`LoadResult.skipped` (loading still fails if nothing usable is left).
    """
    files = source_files(paths)
    documents: list[Document] = []
    skipped: list[SkippedFile] = []
    for f in files:
        try:
            documents.extend(_load_one(f))
        except _BadFile as exc:
            skipped.append(SkippedFile(f, str(exc)))
    if skipped and not skip_bad:
        listing = "\n".join(f"  {s.path}: {s.reason}" for s in skipped)
        # Only `dataset generate` has the flag; `optimize` reads the config key.
        hint = (
            " (to load the others, set `skip_bad = true` in [data] of the config, or pass --skip-bad to"
            " `opro dataset generate`)"
            if documents
            else ""
        )
        raise DataError(f"{len(skipped)} of {len(files)} document file(s) cannot be used{hint}:\n{listing}")
    if not documents:
        listing = "\n".join(f"  {s.path}: {s.reason}" for s in skipped)
        raise DataError(f"no usable documents: every file was bad:\n{listing}")
    return LoadResult(documents=tuple(documents), skipped=tuple(skipped))


__all__ = [
    "LOADER_FORMAT", "SUPPORTED_EXTENSIONS", "Chunk", "LoadResult", "SkippedFile", "load_documents", "load_file", "source_files",
]
