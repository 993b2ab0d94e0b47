"""Export a tuned prompt for use elsewhere (:mod:`opro.export.load` reads the exports back).

Formats:

- ``text``: the full template (``{context_str}`` / ``{query_str}``), ready to paste.
- ``json``: instruction, full template, base, position, variables and provenance (run id, scores,
  models, dataset hash; never secrets). ``opro compare`` / ``export`` read it back as a prompt file.
- ``llamaindex``: a JSON that :func:`load_llamaindex_prompt` turns into a ``PromptTemplate`` for
  ``query_engine.update_prompts({"response_synthesizer:text_qa_template": ...})``, plus a ``.py``
  snippet that builds the same template without opro.
- ``dspy``: a JSON that :func:`load_dspy_signature` turns into ``dspy.Signature("context, question
  -> answer", instructions=<the tuned instruction>)``, plus a ``.py`` snippet.
- ``mlflow``: a new version in the MLflow Prompt Registry (``{{var}}`` syntax), with an alias.

Each format is one entry of :data:`EXPORTERS` (a render function and where its text goes, or a
publish function for a registry); the dispatch, the default file names and the command line's
``--format`` choices and help all read that table, so a new format is one function and one entry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from opro.errors import ConfigError, PromptError
from opro.export.sources import PROMPT_JSON_FORMAT, ResolvedPrompt
from opro.llm import ROLES
from opro.paths import RunDir
from opro.program.configurations import settings_text
from opro.program.dimensions import DIMENSIONS, Value, dimension, model_of
from opro.program.prompts import TEMPLATE_VARIABLES, QATemplate
from opro.redaction import redact
from opro.search.records import CommandRecord, Recorded
from opro.stats.objectives import COST_FIELD

if TYPE_CHECKING:
    from opro.config import OproConfig

#: The names of :data:`EXPORTERS`, for type checkers (a test keeps the two the same).
ExportFormat = Literal["text", "json", "llamaindex", "dspy", "mlflow"]
LLAMAINDEX_FORMAT = "opro.llamaindex_prompt/v1"
DSPY_FORMAT = "opro.dspy_signature/v1"
DSPY_SIGNATURE = "context, question -> answer"
#: The LlamaIndex prompt key a RAG query engine's QA template lives under.
LLAMAINDEX_PROMPT_KEY = "response_synthesizer:text_qa_template"


@dataclass(frozen=True)
class ExportResult:
    format: str
    #: Files written (the main file first; a ``.py`` snippet second where there is one).
    paths: tuple[Path, ...] = ()
    #: The exported text when no file was asked for (``text`` / ``json`` to stdout).
    content: str | None = None
    #: ``prompts:/name/version`` for ``mlflow``.
    uri: str | None = None
    version: int | None = None
    alias: str | None = None
    #: Where the export was recorded (:func:`export_record`; empty: not recorded).
    recorded: tuple[Recorded, ...] = ()


def export_record(prompt: ResolvedPrompt, result: ExportResult) -> CommandRecord:
    """An export as one command record (``opro.kind = export``, named ``export <format>: <label>``): the
    prompt and format as params, the registered version (``opro.registered``) as a tag, the files
    written as the record's files (under ``export``)."""
    params: dict[str, Any] = {"export.format": result.format, "export.prompt": prompt.spec[:500],
                              "export.source": prompt.kind, "export.instruction": prompt.template.instruction[:500]}
    tags = {"opro.spec": prompt.spec[:250]}
    if result.uri is not None:
        tags["opro.registered"] = result.uri + (f"@{result.alias}" if result.alias else "")
    return CommandRecord(kind="export", name=f"export {result.format}: {prompt.label}", params=params, tags=tags,
                         files={path: "export" for path in result.paths})


def _models_from_config(config: OproConfig, *, task_model: str | None = None) -> dict[str, dict[str, Any]]:
    """Each role's model; the task's is the one the prompt was scored with (its ``task_model``, by name)."""
    out = {}
    for role in ROLES:
        table = config.task_models().get(task_model) if role == "task" and task_model else None
        spec = (table or getattr(config.models, role)).safe_dict()
        out[role] = {k: spec[k] for k in ("backend", "model", "base_url") if spec.get(k) is not None}
        if table is not None:
            out[role]["name"] = task_model
    return out


def _models_from_run(run_dir: Path, run_id: str) -> dict[str, dict[str, Any]]:
    """The models an optimization used, from its MLflow run params (best effort)."""
    db = run_dir / "mlflow.db"
    if not db.is_file():
        return {}
    try:
        from opro.tracking.mlflow import run_params

        params = run_params(tracking_uri=f"sqlite:///{db}", run_id=run_id)
    except Exception:  # a moved or foreign store: provenance is optional
        return {}
    out: dict[str, dict[str, Any]] = {}
    for key, value in params.items():
        m = re.fullmatch(r"models\.(\w+)\.(backend|model|base_url)", key)
        if m and value not in ("None", ""):
            out.setdefault(m.group(1), {})[m.group(2)] = value
    return out


def _latest_comparison(run_dir: Path, template_text: str) -> dict[str, Any] | None:
    """This template's result in the newest ``compare/*/report.json`` of the run, if any."""
    reports = RunDir(run_dir).comparison_reports()
    for path in reports:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        for p in data.get("prompts", []):
            if p.get("template") == template_text and p.get("mean"):
                entry = {"report": str(path), "split": data.get("split"), "n_questions": data.get("n_questions"),
                         "mean": p["mean"], "pass_rate": p.get("pass_rate"), "baseline": data.get("baseline"),
                         # Its cost per answer on that comparison's questions (the split above).
                         COST_FIELD: p.get(COST_FIELD)}
                if "versus_baseline" in p:
                    v = p["versus_baseline"]
                    entry.update({"mean_difference": v.get("mean_difference"), "wilcoxon_p": v.get("wilcoxon_p"),
                                  "permutation_p": v.get("permutation_p"),
                                  "cost_difference": v.get("cost_difference")})
                    if data.get("margin") is not None:
                        entry.update({"margin": data["margin"], "non_inferiority": v.get("non_inferiority")})
                return entry
    return None


def provenance(prompt: ResolvedPrompt, *, config: OproConfig | None = None) -> dict[str, Any]:
    """Where the prompt came from and how it scored; secrets and URL credentials removed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        opro_version = version("opro")
    except PackageNotFoundError:
        opro_version = "unknown"
    # A missing gain stays, as null: "no gain was claimed" is information, not an absent field.
    info: dict[str, Any] = {k: v for k, v in prompt.provenance.items() if v is not None or k == "gain"}
    info["kind"] = prompt.kind
    if config is not None:
        info["models"] = _models_from_config(config, task_model=model_of(prompt.template.setting))
        info["config"] = config.source
    elif prompt.run_dir is not None and info.get("mlflow_run_id"):
        models = _models_from_run(prompt.run_dir, str(info["mlflow_run_id"]))
        if models:
            info["models"] = models
    if prompt.run_dir is not None:
        compared = _latest_comparison(prompt.run_dir, prompt.template_text)
        if compared:
            info["comparison"] = compared
    info["exported_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    info["opro_version"] = opro_version
    return redact(info)  # type: ignore[no-any-return]


def prompt_json(prompt: ResolvedPrompt, *, config: OproConfig | None = None) -> dict[str, Any]:
    """The whole configuration (wording, frame, demonstrations, settings), its full template and provenance."""
    t = prompt.template
    return {
        "format": PROMPT_JSON_FORMAT,
        **t.to_json(),
        "template": t.template_text,
        "variables": list(TEMPLATE_VARIABLES),
        "provenance": provenance(prompt, config=config),
    }


def _target(out: str | Path, file_name: str) -> Path:
    p = Path(out).expanduser()
    if p.is_dir() or (not p.suffix and not p.exists()):
        return p / file_name
    return p


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _snippet_path(path: Path) -> Path:
    name = path.name.removesuffix(".json").replace(".", "_")
    return path.with_name(name + ".py")


def export_prompt(
    prompt: ResolvedPrompt,
    *,
    format: ExportFormat,
    out: str | Path | None = None,
    config: OproConfig | None = None,
    name: str | None = None,
    alias: str | None = None,
    tracking_uri: str | None = None,
    snippet: bool = True,
) -> ExportResult:
    """Export ``prompt`` (see :func:`opro.export.sources.resolve_prompt`) in ``format`` (a name of :data:`EXPORTERS`).

    ``out`` is a file or a directory; ``text`` and ``json`` without ``out`` return the content
    instead. ``mlflow`` registers a version named ``name`` (default: the config's prompt name)
    at ``tracking_uri`` (default: the config's tracking URI) and points ``alias`` at it.
    """
    exporter = EXPORTERS.get(format)
    if exporter is None:
        raise ConfigError(f"export format {format!r} is not one of {', '.join(EXPORT_FORMATS)}")
    if isinstance(exporter, RegistryExporter):
        return exporter.publish(prompt, config=config, name=name, alias=alias, tracking_uri=tracking_uri)
    if alias is not None:
        raise ConfigError(f"--alias only applies to --format {' or '.join(REGISTRY_FORMATS)}")
    # Rendered before the missing --out is reported: a prompt the format cannot hold says so first.
    text = exporter.render(prompt, config)
    if out is None:
        if exporter.stdout:
            return ExportResult(format=format, content=text)
        raise ConfigError(f"--format {format} writes files: give --out PATH (a file or a directory)")
    path = _write(_target(out, exporter.file_name), text)
    paths = [path]
    if snippet and exporter.snippet is not None:
        paths.append(_write(_snippet_path(path), exporter.snippet(prompt)))
    return ExportResult(format=format, paths=tuple(paths))


def _render_text(prompt: ResolvedPrompt, config: OproConfig | None) -> str:
    return prompt.template_text


def _render_json(prompt: ResolvedPrompt, config: OproConfig | None) -> str:
    return json.dumps(prompt_json(prompt, config=config), indent=2, ensure_ascii=False) + "\n"


def _llamaindex_settings(template: QATemplate) -> dict[str, Value]:
    """The configuration's settings under LlamaIndex's names (the table's: a retriever's
    ``similarity_top_k``, the LLM's ``max_tokens``, the node parser's ``chunk_size``, ...)."""
    return {dimension(k).export_name("llamaindex"): v for k, v in template.settings.items()}


def _render_llamaindex(prompt: ResolvedPrompt, config: OproConfig | None) -> str:
    data = {
        "format": LLAMAINDEX_FORMAT,
        # Demonstrations are text of the template, before the question's own context and query.
        "template": prompt.template_text,
        "prompt_type": "text_qa",
        "prompt_key": LLAMAINDEX_PROMPT_KEY,
        "template_vars": list(TEMPLATE_VARIABLES),
        **_llamaindex_settings(prompt.template),
        "metadata": prompt_json(prompt, config=config),
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _dspy_demos(template: QATemplate) -> list[dict[str, str]]:
    """The demonstrations in DSPy's own demo fields (a Predict's ``demos``), not text in the instructions."""
    return [{"context": d.context, "question": d.query, "answer": d.answer} for d in template.demos]


def _render_dspy(prompt: ResolvedPrompt, config: OproConfig | None) -> str:
    if not prompt.instruction:
        raise PromptError(
            f"prompt {prompt.spec!r} has no instruction separate from its template; a DSPy signature needs "
            "the instruction (export --format text or llamaindex for a custom template)"
        )
    t = prompt.template
    data = {
        "format": DSPY_FORMAT,
        "signature": DSPY_SIGNATURE,
        "instructions": prompt.instruction,
        "demos": _dspy_demos(t),
        **t.settings,
        "metadata": prompt_json(prompt, config=config),
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _llamaindex_snippet(prompt: ResolvedPrompt) -> str:
    settings = _llamaindex_settings(prompt.template)
    top_k = settings.get("similarity_top_k")
    notes = {d.export_name("llamaindex"): d.export_note for d in DIMENSIONS}
    lines = (
        '"""The opro-tuned QA prompt as a LlamaIndex PromptTemplate (generated by `opro export`)."""\n\n'
        "from llama_index.core import PromptTemplate\n"
        "from llama_index.core.prompts.prompt_type import PromptType\n\n"
        f"TEXT_QA_TEMPLATE = PromptTemplate(\n    {prompt.template_text!r},\n    prompt_type=PromptType.QUESTION_ANSWER,\n)\n"
    )
    for name, value in settings.items():  # each setting it was scored with, and what it means there
        lines += f"{name.upper()} = {value!r}" + (f"  # {notes[name]}" if notes.get(name) else "") + "\n"
    return lines + (
        f"\n# query_engine = index.as_query_engine({'similarity_top_k=SIMILARITY_TOP_K' if top_k is not None else ''})\n"
        f'# query_engine.update_prompts({{"{LLAMAINDEX_PROMPT_KEY}": TEXT_QA_TEMPLATE}})\n'
    )


def _dspy_snippet(prompt: ResolvedPrompt) -> str:
    demos = _dspy_demos(prompt.template)
    return (
        '"""The opro-tuned instruction as a DSPy signature (generated by `opro export`)."""\n\n'
        "import dspy\n\n"
        f"OproQA = dspy.Signature(\n    {DSPY_SIGNATURE!r},\n    instructions={prompt.instruction!r},\n)\n\n"
        "qa = dspy.Predict(OproQA)\n"
        + (f"qa.demos = [dspy.Example(**d) for d in {demos!r}]\n" if demos else "")
        # The settings it was scored with, the task model among them: what to build the program with.
        + (f"# scored with: {settings_text(prompt.template.settings)}\n" if prompt.template.settings else "")
        + "# qa(context=..., question=...).answer\n"
    )


def _cost_tags(prov: dict[str, Any]) -> dict[str, str]:
    """Mean tokens, seconds and cost per answer, each with the data it was measured on: the run's
    search questions, and the split of the newest comparison of this prompt."""
    tags: dict[str, str] = {}
    for prefix, cost, basis in (
        ("opro", prov.get(COST_FIELD), prov.get("cost_basis")),
        ("opro.compared", (prov.get("comparison") or {}).get(COST_FIELD),
         f"{(prov.get('comparison') or {}).get('split')} questions of {(prov.get('comparison') or {}).get('report')}"),
    ):
        if not cost:
            continue
        tags.update({
            f"{prefix}.tokens_per_answer": f"{cost['prompt_tokens'] + cost['completion_tokens']:.1f}",
            f"{prefix}.seconds_per_answer": f"{cost['seconds']:.3f}",
            f"{prefix}.cost_per_answer": f"{cost['cost']:.6g}",
            f"{prefix}.cost_unit": str(cost.get("unit", "tokens")),
            f"{prefix}.cost_basis": f"{basis}, {cost['n']} answers"[:250],
        })
    return tags


def _export_mlflow(
    prompt: ResolvedPrompt,
    *,
    config: OproConfig | None,
    name: str | None,
    alias: str | None,
    tracking_uri: str | None,
) -> ExportResult:
    uri = tracking_uri or (config.mlflow_uri if config is not None else None)
    if uri is None:
        raise ConfigError("--format mlflow: which MLflow store? pass --config CONFIG.toml or --tracking-uri URI")
    prompt_name = name or (config.prompt_name if config is not None else None)
    if not prompt_name:
        raise ConfigError("--format mlflow: name the registered prompt with --name NAME (or pass --config)")
    if alias is not None and not re.fullmatch(r"[A-Za-z0-9_\-]+", alias):
        raise ConfigError(f"alias {alias!r}: use letters, digits, '_' and '-' only (for example production)")
    from opro.tracking import MlflowTracker

    prov = provenance(prompt, config=config)
    tags = {"opro.source": prompt.spec[:250], "opro.kind": prompt.kind}
    for key in ("mlflow_run_id", "run_dir", "score", "score_basis", "dataset_hash"):
        if prov.get(key) is not None:
            tags[f"opro.{key}"] = str(prov[key])
    if prompt.kind == "run":
        tags["opro.gain"] = "none" if prov.get("gain") is None else f"{prov['gain']:.4f}"
    # Not text of the template, answered with it (its demonstrations are in the text); prompts:/ reads them back.
    tags.update({f"opro.{k}": str(v) for k, v in prompt.template.settings.items()})
    tags.update(_cost_tags(prov))
    tracker = MlflowTracker(tracking_uri=uri, experiment_name=prompt_name)
    try:
        version = tracker.register_prompt(
            name=prompt_name,
            template_text=prompt.template_text,
            alias=alias,
            commit_message=f"opro export of {prompt.spec}"[:500],
            tags=tags,
        )
    except ConfigError:
        raise
    except Exception as exc:  # MLflow's own errors (a reserved alias, an unreachable server)
        raise ConfigError(f"cannot register prompt {prompt_name!r} in {uri}: {exc}") from exc
    return ExportResult(format="mlflow", uri=f"prompts:/{prompt_name}/{version}", version=version, alias=alias)


# -- the formats ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileExporter:
    """A format whose export is a text: written to a file, or returned when ``stdout`` allows."""

    #: The exported text of a prompt (the config, when given, adds models to the provenance).
    render: Callable[[ResolvedPrompt, OproConfig | None], str]
    #: The file written when ``out`` is a directory.
    file_name: str
    #: Without ``out`` the text is returned (printed by the CLI) rather than refused.
    stdout: bool = False
    #: A ``.py`` snippet written beside the file (unless ``snippet=False``).
    snippet: Callable[[ResolvedPrompt], str] | None = None


class _Publish(Protocol):
    def __call__(
        self,
        prompt: ResolvedPrompt,
        *,
        config: OproConfig | None,
        name: str | None,
        alias: str | None,
        tracking_uri: str | None,
    ) -> ExportResult: ...


@dataclass(frozen=True)
class RegistryExporter:
    """A format whose export is a new version in a prompt registry (``alias`` applies only here)."""

    publish: _Publish


#: Every export format, by its ``--format`` name, in the order help texts list them.
EXPORTERS: Mapping[str, FileExporter | RegistryExporter] = MappingProxyType(
    {
        "text": FileExporter(render=_render_text, file_name="prompt.txt", stdout=True),
        "json": FileExporter(render=_render_json, file_name="prompt.json", stdout=True),
        "llamaindex": FileExporter(
            render=_render_llamaindex, file_name="prompt.llamaindex.json", snippet=_llamaindex_snippet
        ),
        "dspy": FileExporter(render=_render_dspy, file_name="prompt.dspy.json", snippet=_dspy_snippet),
        "mlflow": RegistryExporter(publish=_export_mlflow),
    }
)
EXPORT_FORMATS: tuple[str, ...] = tuple(EXPORTERS)
#: Formats printed when no ``--out`` is given; the other file formats need a file or directory.
STDOUT_FORMATS: tuple[str, ...] = tuple(k for k, e in EXPORTERS.items() if isinstance(e, FileExporter) and e.stdout)
FILE_ONLY_FORMATS: tuple[str, ...] = tuple(
    k for k, e in EXPORTERS.items() if isinstance(e, FileExporter) and not e.stdout
)
SNIPPET_FORMATS: tuple[str, ...] = tuple(
    k for k, e in EXPORTERS.items() if isinstance(e, FileExporter) and e.snippet is not None
)
REGISTRY_FORMATS: tuple[str, ...] = tuple(k for k, e in EXPORTERS.items() if isinstance(e, RegistryExporter))


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
    "prompt_json",
    "provenance",
]
