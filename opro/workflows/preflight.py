"""What a command checks before it says or spends anything: every file the config names exists.

Without it, ``opro optimize`` printed its whole plan and then failed with "No such file or directory"
naming a path but not the key that named it. Here the first missing path is refused with its key, the
value as written, where it was looked for and what to do.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from opro.config import BUILTIN_PYTHON_REFERENCE, OproConfig
from opro.errors import ConfigError


def named_paths(config: OproConfig) -> list[tuple[str, str, Path, str]]:
    """Every path the config names that must exist before a run: (key, value as written, where it is
    looked for, what to do when it is missing)."""
    from opro.judges.factory import TEMPLATE_FILE_SUFFIXES
    from opro.llm.packs import EMBEDDED_MODELS

    d = config.data
    out = [(f"[data].docs[{i}]", entry, config.resolve(entry), "name a file or folder of documents (PDF, .txt, .md)")
           for i, entry in enumerate(d.docs) if entry != BUILTIN_PYTHON_REFERENCE]
    if d.dataset:
        out.append(("[data].dataset", d.dataset, config.resolve(d.dataset),
                    "fix the path, or remove the key to generate a dataset from [data].docs"))
    local = config.rag.embeddings.local_path if config.rag.embeddings is not None else ""
    if local:
        out.append(("[rag.embeddings].local_path", local, config.resolve(local),
                    "name a sentence-transformers model folder"))
    if config.judge.template.endswith(TEMPLATE_FILE_SUFFIXES):
        out.append(("[judge].template", config.judge.template, config.resolve(config.judge.template),
                    "name a template file, or a built-in template"))
    tables = {f"[models.{f.name}]": getattr(config.models, f.name) for f in dataclasses.fields(config.models)
              if f.name != "task_choices"}
    tables.update({f"[models.task_choices.{name}]": spec for name, spec in config.models.task_choices})
    for where, spec in tables.items():
        looks_like_a_path = spec.model.endswith(".gguf") or "/" in spec.model
        if spec.backend == "llamacpp" and spec.model not in EMBEDDED_MODELS and looks_like_a_path:
            # The model pool opens a GGUF path as given (relative to the working folder); a bare name
            # that is no embedded model is the pool's to refuse ("unknown model", with the names).
            out.append((f"{where}.model", spec.model, Path(spec.model).expanduser(),
                        f"name a GGUF file or an embedded model ({', '.join(EMBEDDED_MODELS)})"))
    return out


def check_paths(config: OproConfig) -> None:
    """Refuse the first path the config names that does not exist (:class:`ConfigError`, exit 2), naming
    its key: ``[data].dataset = 'qa.jsonl': no such file or folder (looked for /abs/qa.jsonl): ...``."""
    for key, value, path, todo in named_paths(config):
        if not path.exists():
            where = "" if str(path) == value else f" (looked for {path})"
            raise ConfigError(f"{config.source}: {key} = {value!r}: no such file or folder{where}; {todo}")
