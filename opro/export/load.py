"""Load an export back: a JSON prompt as a :class:`~opro.program.prompts.QATemplate`, a LlamaIndex
``PromptTemplate`` and its settings, a DSPy signature or program (see :mod:`opro.export.formats`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import DataError
from opro.export.formats import DSPY_FORMAT, LLAMAINDEX_FORMAT
from opro.export.sources import PROMPT_JSON_FORMAT
from opro.program.dimensions import DIMENSIONS, Value
from opro.program.prompts import QATemplate

if TYPE_CHECKING:
    import dspy
    from llama_index.core.prompts import PromptTemplate


def _read(path: str | Path, expected: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != expected:
        raise DataError(f"{p}: not an opro export of format {expected!r}; create it with `opro export`")
    return data


def load_prompt_json(path: str | Path) -> QATemplate:
    """An ``opro export --format json`` file -> :class:`QATemplate` (with its demonstrations and settings)."""
    data = _read(path, PROMPT_JSON_FORMAT)
    return QATemplate.from_json(data, where=str(path))


def load_llamaindex_prompt(path: str | Path) -> PromptTemplate:
    """An ``opro export --format llamaindex`` JSON -> a LlamaIndex QA ``PromptTemplate``."""
    from llama_index.core.prompts import PromptTemplate
    from llama_index.core.prompts.prompt_type import PromptType

    data = _read(path, LLAMAINDEX_FORMAT)
    return PromptTemplate(str(data["template"]), prompt_type=PromptType.QUESTION_ANSWER)


def load_llamaindex_settings(path: str | Path) -> dict[str, Value]:
    """The settings an ``opro export --format llamaindex`` prompt was scored with, under LlamaIndex's
    names: ``similarity_top_k`` (for ``index.as_query_engine`` or a retriever), ``max_tokens`` (the
    LLM's) and ``chunk_size`` (a ``SentenceSplitter``'s); empty when the prompt keeps the engine's own."""
    data = _read(path, LLAMAINDEX_FORMAT)
    return {name: d.coerce(data[name]) for d in DIMENSIONS if d.is_setting
            and data.get(name := d.export_name("llamaindex")) is not None}


def load_dspy_program(path: str | Path) -> dspy.Predict:
    """An ``opro export --format dspy`` JSON -> a ``dspy.Predict`` with the tuned instruction and its
    demonstrations in DSPy's own demo fields (``context``, ``question``, ``answer``)."""
    data = _read(path, DSPY_FORMAT)
    import dspy

    predict = dspy.Predict(load_dspy_signature(path))
    predict.demos = [dspy.Example(context=str(d["context"]), question=str(d["question"]), answer=str(d["answer"]))
                     for d in data.get("demos") or ()]
    return predict


def load_dspy_signature(path: str | Path) -> type[dspy.Signature]:
    """An ``opro export --format dspy`` JSON -> a DSPy signature class with the tuned instruction."""
    data = _read(path, DSPY_FORMAT)
    import dspy  # slow to import: only here

    signature: type[dspy.Signature] = dspy.Signature(str(data["signature"]), instructions=str(data["instructions"]))
    return signature


__all__ = [
    "load_dspy_program",
    "load_dspy_signature",
    "load_llamaindex_prompt",
    "load_llamaindex_settings",
    "load_prompt_json",
]
