"""Data to run on: an offline quickstart corpus, and a fetcher for the reference notebooks' Llama 2 setup.

The quickstart corpus is the Python language reference that ships with CPython (``pydoc_data.topics``):
a few topics rendered to a PDF with PyMuPDF at run time (nothing third-party is committed), so the
quickstart exercises the PDF loader on a machine without network.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opro.errors import DataError

QUICKSTART_TOPICS: tuple[str, ...] = (
    "if",
    "while",
    "for",
    "break",
    "continue",
    "try",
    "raise",
    "exceptions",
    "with",
    "function",
    "class",
    "return",
    "lambda",
)
QUICKSTART_FILE = "python-language-reference.pdf"

LLAMA2_PAPER_URL = "https://arxiv.org/pdf/2307.09288"
# LlamaIndex's Llama2PaperDataset (llama-hub "llama_datasets/llama2_paper"), served from Git LFS.
LLAMA2_DATASET_URL = (
    "https://media.githubusercontent.com/media/run-llama/llama-datasets/main/llama_datasets/llama2_paper/rag_dataset.json"
)


def _topic_html(name: str, text: str) -> str:
    """pydoc topic text (reST-like) to simple HTML: headings, code blocks, paragraphs."""
    lines = text.splitlines()
    out: list[str] = []
    para: list[str] = []
    code: list[str] = []

    def flush_para() -> None:
        if para:
            out.append(f"<p>{html.escape(' '.join(s.strip() for s in para))}</p>")
            para.clear()

    def flush_code() -> None:
        if code:
            while code and not code[-1].strip():
                code.pop()
            out.append(f"<pre>{html.escape(chr(10).join(code))}</pre>")
            code.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and re.fullmatch(r"([*=\-~^])\1{2,}", nxt.strip()) and len(nxt.strip()) >= len(line.strip()) - 1:
            flush_para()
            flush_code()
            tag = "h1" if nxt.strip()[0] == "*" else "h2"
            out.append(f"<{tag}>{html.escape(line.strip())}</{tag}>")
            i += 2
            continue
        if line.startswith("   ") and (code or not para):
            flush_para()
            code.append(line[3:])
        elif not line.strip():
            if code:
                code.append("")
            else:
                flush_para()
        else:
            flush_code()
            para.append(line)
        i += 1
    flush_para()
    flush_code()
    return f'<section id="{html.escape(name)}">' + "\n".join(out) + "</section>"


def write_quickstart_corpus(out_dir: str | Path, *, topics: Sequence[str] = QUICKSTART_TOPICS) -> Path:
    """Render ``topics`` of this Python's language reference to ``out_dir/python-language-reference.pdf``."""
    import pydoc_data.topics

    import pymupdf

    available = pydoc_data.topics.topics
    unknown = [t for t in topics if t not in available]
    if unknown:
        raise DataError(f"unknown pydoc topic(s) {unknown}; available: {', '.join(sorted(available))}")
    if not topics:
        raise DataError("no topics given for the quickstart corpus")
    version = ".".join(map(str, sys.version_info[:3]))
    body = "\n".join(_topic_html(t, available[t]) for t in topics)
    page_html = (
        f"<h1>The Python Language Reference (excerpts, Python {version})</h1>"
        "<p>Generated from the pydoc topics that ship with CPython (pydoc_data.topics). "
        "Python documentation, Copyright Python Software Foundation, PSF License.</p>" + body
    )
    css = "body {font-family: sans-serif; font-size: 10pt;} pre {font-family: monospace; font-size: 8pt;}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / QUICKSTART_FILE
    tmp = out / f".{QUICKSTART_FILE}.{os.getpid()}.tmp"  # one per process: runs share the cache folder
    story = pymupdf.Story(html=page_html, user_css=css)
    writer = pymupdf.DocumentWriter(str(tmp))
    mediabox = pymupdf.paper_rect("a4")
    where = mediabox + (50, 50, -50, -50)  # noqa: RUF005 - a Rect inset, not a tuple concatenation
    more = True
    while more:
        device = writer.begin_page(mediabox)
        more, _ = story.place(where)
        story.draw(device)
        writer.end_page()
    writer.close()
    tmp.replace(path)
    return path


# --- online: the reference notebooks' Llama 2 setup ------------------------------------------------


@dataclass(frozen=True)
class FetchResult:
    paper: Path
    dataset: Path
    downloaded: tuple[Path, ...]  # empty when both were already present


def _download(url: str, dest: Path, *, timeout_s: float, what: str) -> None:
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        req = urllib.request.Request(url, headers={"User-Agent": "opro-data-fetcher"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp, tmp.open("wb") as fh:
            while block := resp.read(1 << 16):
                fh.write(block)
    except urllib.error.HTTPError as exc:
        tmp.unlink(missing_ok=True)
        raise DataError(f"downloading the {what} from {url} failed: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        tmp.unlink(missing_ok=True)
        reason = getattr(exc, "reason", exc)
        raise DataError(
            f"cannot download the {what} from {url} ({reason}): are you offline? Download it by hand and save it "
            f"as {dest}, or run offline with `opro dataset corpus` (the bundled quickstart corpus)"
        ) from exc
    tmp.replace(dest)


def fetch_llama2_paper(
    out_dir: str | Path,
    *,
    paper_url: str = LLAMA2_PAPER_URL,
    dataset_url: str = LLAMA2_DATASET_URL,
    timeout_s: float = 60.0,
    force: bool = False,
) -> FetchResult:
    """Download the Llama 2 paper PDF and LlamaIndex's Llama2PaperDataset into ``out_dir``.

    Layout: ``out_dir/source_files/llama2.pdf`` and ``out_dir/rag_dataset.json``. Files already
    present are kept unless ``force``. Raises :class:`DataError` (saying what to do) when offline or
    when a download is not what it should be.
    """
    from opro.data.dataset import load_labelled_rag_dataset

    out = Path(out_dir)
    paper = out / "source_files" / "llama2.pdf"
    dataset = out / "rag_dataset.json"
    paper.parent.mkdir(parents=True, exist_ok=True)
    downloaded: list[Path] = []
    if force or not paper.exists():
        _download(paper_url, paper, timeout_s=timeout_s, what="Llama 2 paper")
        downloaded.append(paper)
    with paper.open("rb") as fh:
        if fh.read(5) != b"%PDF-":
            paper.unlink()
            raise DataError(f"{paper_url} did not return a PDF (removed {paper}); check the URL")
    if force or not dataset.exists():
        _download(dataset_url, dataset, timeout_s=timeout_s, what="Llama2PaperDataset")
        downloaded.append(dataset)
    head = dataset.read_bytes()[:200]
    if head.startswith(b"version https://git-lfs"):
        dataset.unlink()
        raise DataError(f"{dataset_url} returned a Git LFS pointer, not the dataset; use the media.githubusercontent.com URL")
    try:
        load_labelled_rag_dataset(dataset)
    except (DataError, json.JSONDecodeError) as exc:
        dataset.unlink()
        raise DataError(f"{dataset_url} did not return a LabelledRagDataset (removed the file): {exc}") from exc
    return FetchResult(paper=paper, dataset=dataset, downloaded=tuple(downloaded))


__all__ = [
    "LLAMA2_DATASET_URL",
    "LLAMA2_PAPER_URL",
    "QUICKSTART_FILE",
    "QUICKSTART_TOPICS",
    "FetchResult",
    "fetch_llama2_paper",
    "write_quickstart_corpus",
]
