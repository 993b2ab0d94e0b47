"""Export a tuned prompt for use elsewhere, and load the exports back.

:mod:`~opro.export.formats` writes one (text, JSON, LlamaIndex, DSPy, the MLflow Prompt Registry: one
entry of :data:`EXPORTERS` each) and :mod:`~opro.export.load` reads one back. Users import from here
(``from opro.export import export_prompt, load_dspy_signature``), as before the room existed.
"""

from opro.export.formats import (
    DSPY_SIGNATURE,
    EXPORT_FORMATS,
    EXPORTERS,
    FILE_ONLY_FORMATS,
    LLAMAINDEX_PROMPT_KEY,
    REGISTRY_FORMATS,
    SNIPPET_FORMATS,
    STDOUT_FORMATS,
    ExportFormat,
    ExportResult,
    FileExporter,
    RegistryExporter,
    export_prompt,
    export_record,
    prompt_json,
    provenance,
)
from opro.export.load import (
    load_dspy_program,
    load_dspy_signature,
    load_llamaindex_prompt,
    load_llamaindex_settings,
    load_prompt_json,
)

__all__ = [
    "DSPY_SIGNATURE",
    "EXPORTERS",
    "EXPORT_FORMATS",
    "FILE_ONLY_FORMATS",
    "LLAMAINDEX_PROMPT_KEY",
    "REGISTRY_FORMATS",
    "SNIPPET_FORMATS",
    "STDOUT_FORMATS",
    "ExportFormat",
    "ExportResult",
    "FileExporter",
    "RegistryExporter",
    "export_prompt",
    "export_record",
    "load_dspy_program",
    "load_dspy_signature",
    "load_llamaindex_prompt",
    "load_llamaindex_settings",
    "load_prompt_json",
    "prompt_json",
    "provenance",
]
