"""Where a prompt comes from: one spec syntax shared by ``opro compare`` and ``opro export``.

============================  ==================================================================
``best``                      the best prompt of the config's optimization (its ``summary.json``, else
                              the summary worker 0 left in the study: any worker or machine with the
                              stores can use it)
``run:DIR`` / ``run:X.toml``  the best prompt of the optimization in DIR (or that config's output);
                              a bare ``X.toml`` path means the same
``initial``                   the config's first initial instruction (``initial:2``: the third)
``prompts:/name@alias``       a version in the MLflow Prompt Registry (``prompts:/name/3`` by number)
``file:PATH`` or ``PATH``     a text file (an instruction, or a full template with ``{context_str}``
                              and ``{query_str}``) or an exported JSON (``opro export --format json``)
``text:...`` or any text      a literal instruction
============================  ==================================================================

Any of them may end in settings, ``initial {top_k=1, answer_max_tokens=48}``: the same source answered
with those settings (:mod:`opro.program.configurations`, the names the search gives its candidates;
``opro compare --set NAME=VALUE`` adds them to every ``--prompt``, as a
:class:`~opro.program.configurations.Configuration` that is never written back to text). Its kind, provenance and held-out
check stay its source's, with the settings recorded in its provenance.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from opro.errors import ConfigError, DataError, PromptError
from opro.paths import RunDir
from opro.program.configurations import Configuration, settings_text
from opro.program.dimensions import DIMENSIONS, Value, dimension
from opro.program.prompts import DEFAULT_BASE_TEMPLATE, QATemplate
from opro.redaction import redact_url
from opro.stats.objectives import COST_FIELD

if TYPE_CHECKING:
    from opro.config import OproConfig

SourceKind = Literal["run", "initial", "registry", "file", "literal"]

#: ``format`` of opro's exported prompt JSON.
PROMPT_JSON_FORMAT = "opro.prompt/v1"
_LOOKS_LIKE_PATH = re.compile(r"^[\w.~-]*[/\\]|\.(txt|md|json|toml|prompt)$", re.I)


@dataclass(frozen=True)
class ResolvedPrompt:
    """A prompt ready to evaluate or export, with what is known about where it came from."""

    spec: str
    kind: SourceKind
    label: str
    template: QATemplate
    #: Run id, scores, study, dataset hash, models... whatever the source tells (never secrets).
    provenance: Mapping[str, Any] = field(default_factory=dict)
    #: The optimization output directory for ``run:`` / ``best`` (its dataset split guards leakage).
    run_dir: Path | None = None

    @property
    def instruction(self) -> str:
        return self.template.instruction

    @property
    def template_text(self) -> str:
        return self.template.template_text


def _template(instruction: str, config: OproConfig | None) -> QATemplate:
    position = config.rag.instruction_position if config is not None else "before"
    return QATemplate(instruction=instruction, base=DEFAULT_BASE_TEMPLATE, position=position)


def _need_config(spec: str, config: OproConfig | None) -> OproConfig:
    if config is None:
        raise ConfigError(f"prompt {spec!r} refers to an experiment: pass its config (opro ... --config CONFIG.toml)")
    return config


def run_dir_of(target: str | Path) -> Path:
    """An optimization output directory, or an experiment TOML -> its output directory."""
    p = Path(target).expanduser()
    if p.suffix == ".toml":
        from opro.config import load_config

        return load_config(p).output_dir
    return p.resolve()


def _study_summary(config: OproConfig) -> dict[str, Any] | None:
    """The summary worker 0 stored in the config's Optuna study, or None (no study, not finished)."""
    from opro.search.study import SearchStudy

    storage = config.optuna_storage
    if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).is_file():
        return None  # loading would create an empty database file
    try:
        study = SearchStudy.load(storage, name=config.study_name)
    except Exception as exc:  # an unreachable server, a missing driver: say which store
        raise DataError(
            f"the Optuna study {config.study_name!r} in {redact_url(storage)} cannot be read "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    return None if study is None else study.summary()


def _config_of(target: str | Path) -> OproConfig | None:
    p = Path(target).expanduser()
    if p.suffix != ".toml":
        return None
    from opro.config import load_config

    return load_config(p)


def _from_run(spec: str, run_dir: Path, config: OproConfig | None, label: str) -> ResolvedPrompt:
    summary_path = RunDir(run_dir).summary
    where = str(summary_path)
    own = config is not None and run_dir.resolve() == config.output_dir.resolve()
    stored = _study_summary(config) if own and config is not None and not summary_path.is_file() else None
    if not summary_path.is_file() and stored is None:
        hint = f"`opro optimize {config.source}`" if config is not None else "`opro optimize CONFIG.toml`"
        if own and config is not None:
            raise DataError(
                f"prompt {spec!r}: {run_dir} has no summary.json and the study {config.study_name!r} in "
                f"{redact_url(config.optuna_storage)} holds no finished optimization; run {hint} first "
                "(with several workers: wait for worker 0 to finish)"
            )
        raise DataError(
            f"prompt {spec!r}: {run_dir} has no summary.json: no finished optimization there; run {hint} first"
        )
    if stored is not None and config is not None:
        where = f"the study {config.study_name!r} in {redact_url(config.optuna_storage)}"
    try:
        summary = stored if stored is not None else json.loads(summary_path.read_text(encoding="utf-8"))
        best_template = str(summary["best_template"])
        best_instruction = str(summary["best_instruction"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{where}: not an opro optimization summary ({exc!r})") from exc
    configuration = summary.get("best_configuration")
    if configuration:
        # The whole configuration as it was scored: wording, demonstrations and settings.
        try:
            template = QATemplate.from_json(configuration, where=f"{where}: best_configuration")
        except PromptError as exc:
            raise DataError(str(exc)) from None
        if template.template_text != best_template:
            raise DataError(f"{where}: best_configuration does not give best_template; the file was edited?")
    else:
        template = QATemplate.from_template_text(best_template)
        if template.template_text != best_template:
            # Not the default base template: keep the full template exactly as it was scored.
            template = QATemplate(instruction="", base=best_template)
    if template.instruction and template.instruction != best_instruction.strip():
        raise DataError(f"{where}: best_template does not contain best_instruction; the file was edited?")
    provenance = {
        "source": spec,
        "run_dir": str(Path(run_dir).resolve()),
        "mlflow_run_id": summary.get("mlflow_run_id"),
        "study_name": summary.get("study_name"),
        # Each score with the data it was measured on: the returned prompt's on score_basis
        # (validation, or search without a validation stage), the initial one's on both.
        "score": summary.get("best_score"),
        "score_basis": summary.get("score_basis"),
        "score_label": summary.get("score_label"),
        "initial_search_score": summary.get("initial_score"),
        "initial_validation_score": (summary.get("validation") or {}).get("initial_score"),
        # None where no gain was claimed: "no gain found", not a gain of 0.
        "gain": summary.get("gain"),
        "gain_ci": summary.get("gain_ci"),
        "initial_instruction": summary.get("initial_instruction"),
        # Its cost per answer (opro.program.cost) with the data it was measured on; under the cost objective also
        # the validated saving against the initial configuration on the confirmation questions.
        COST_FIELD: (summary.get(COST_FIELD) or {}).get("returned"),
        "cost_saving": (summary.get("validation") or {}).get("saving"),
    }
    if provenance[COST_FIELD] is not None:
        provenance["cost_basis"] = "search questions (means per answered question of the task calls)"
    if provenance["cost_saving"] is not None:
        provenance["cost_saving_basis"] = "validation confirmation questions, paired with the initial configuration"
    if stored is not None:
        provenance["summary_from"] = where
    dataset_dir = RunDir(run_dir).dataset
    if RunDir(run_dir).has_dataset():
        try:
            from opro.data.dataset import load_dataset

            ds = load_dataset(dataset_dir)
            provenance["dataset_hash"] = ds.content_hash
            if ds.split is not None:
                provenance["split_sizes"] = ds.split.sizes
        except DataError:
            pass  # provenance is best effort; the comparison re-checks the split itself
    return ResolvedPrompt(spec=spec, kind="run", label=label, template=template, provenance=provenance, run_dir=run_dir)


def _from_registry(spec: str, config: OproConfig | None, tracking_uri: str | None) -> ResolvedPrompt:
    uri = tracking_uri or (config.mlflow_uri if config is not None else None)
    if uri is None:
        raise ConfigError(f"prompt {spec!r}: which MLflow store? pass --config CONFIG.toml or --tracking-uri URI")
    if not re.fullmatch(r"prompts:/[A-Za-z0-9_.\-]+(@[A-Za-z0-9_.\-]+|/\d+)", spec):
        raise ConfigError(f"prompt {spec!r}: use prompts:/NAME@ALIAS or prompts:/NAME/VERSION")
    from opro.tracking import load_registered_prompt

    text, tags = load_registered_prompt(tracking_uri=uri, uri=spec)
    provenance: dict[str, Any] = {"source": spec, "tracking_uri": redact_url(uri)}
    # What opro tagged the version with when it registered it: the run it came from (the held-out
    # guard reads that run's split record).
    for key in ("run_dir", "run_id", "mlflow_run_id", "dataset_hash", "score", "score_basis"):
        if tags.get(f"opro.{key}"):
            provenance[key] = tags[f"opro.{key}"]
    template = QATemplate.from_template_text(text)
    settings = {d.name: v for d in DIMENSIONS if d.is_setting
                and (v := d.parse_text(tags.get(f"opro.{d.name}", ""))) is not None}
    if settings:  # the settings opro registered the version with (the demonstrations are in its text)
        template = template.with_settings(**settings)
    return ResolvedPrompt(
        spec=spec,
        kind="registry",
        label=spec,
        template=template,
        provenance=provenance,
        run_dir=Path(provenance["run_dir"]) if "run_dir" in provenance else None,
    )


def _from_file(spec: str, path: Path, config: OproConfig | None) -> ResolvedPrompt:
    if not path.is_file():
        raise DataError(f"prompt {spec!r}: file {path} does not exist (for a literal instruction write text:...)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"prompt {spec!r}: {path} is not UTF-8 text (byte {exc.start}): give a text file with the instruction "
            "(or a prompt JSON)"
        ) from None
    provenance: dict[str, Any] = {"source": spec, "file": str(path)}
    if path.suffix.lower() == ".json":
        template, extra = _from_json(text, path)
        provenance.update(extra)
    elif "{context_str}" in text and "{query_str}" in text:
        template = _parse_full_template(text)
    else:
        try:
            template = _template(text, config)
        except PromptError as exc:
            raise PromptError(f"{path}: {exc}") from None
    run_dir = provenance.get("run_dir")  # an exported prompt JSON names the run it came from
    return ResolvedPrompt(spec=spec, kind="file", label=path.name, template=template, provenance=provenance,
                          run_dir=Path(run_dir) if isinstance(run_dir, str) and run_dir else None)


def _parse_full_template(text: str) -> QATemplate:
    """A full template from a file; tolerant of the newline or trailing space an editor adds or strips."""
    first = QATemplate.from_template_text(text)
    if first.instruction:
        return first
    for variant in (text.rstrip("\n"), text.rstrip() + " "):
        parsed = QATemplate.from_template_text(variant)
        if parsed.instruction:
            return parsed
    return first


def _from_json(text: str, path: Path) -> tuple[QATemplate, dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise DataError(f"{path}: expected a JSON object with 'template' or 'instruction'")
    prov = dict(data.get("provenance") or data.get("metadata") or {})
    if isinstance(data.get("template"), str):
        if isinstance(data.get("base"), str) and isinstance(data.get("instruction"), str):
            # The structured fields win over the rendered "template" (a hand-edited instruction counts).
            return QATemplate.from_json(data, where=str(path)), prov
        return QATemplate.from_template_text(data["template"]), prov
    if isinstance(data.get("instruction"), str):
        return QATemplate(instruction=data["instruction"]), prov
    if isinstance(data.get("instructions"), str):  # an exported DSPy signature
        return QATemplate(instruction=data["instructions"]), prov
    raise DataError(f"{path}: no 'template' or 'instruction' string in this JSON; export it with `opro export --format json`")


def resolve_prompt(
    spec: str | Configuration,
    *,
    config: OproConfig | None = None,
    tracking_uri: str | None = None,
) -> ResolvedPrompt:
    """Turn a prompt spec (see the module doc) into a :class:`ResolvedPrompt`.

    ``config`` is needed by ``best``, ``initial`` and (unless ``tracking_uri`` is given)
    ``prompts:/`` URIs; literal instructions take the config's instruction position. A
    :class:`~opro.program.configurations.Configuration` (a source and its settings, read already) is
    resolved as it is, its text form its spec.
    """
    configuration = spec if isinstance(spec, Configuration) else None
    text = str(spec) if configuration is not None else spec
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("an empty prompt spec; use best, initial, run:DIR, prompts:/NAME@ALIAS, a file or text:...")
    s = text.strip()
    if configuration is None:
        configuration = Configuration.parse(s, where=f"prompt {s!r}")
    if configuration.settings:
        head = configuration.instruction.strip()
        if not head:
            raise ConfigError(f"prompt {s!r} names settings but no prompt: write a source before them, "
                              "e.g. initial {top_k=1}")
        return with_settings(resolve_prompt(head, config=config, tracking_uri=tracking_uri), configuration.settings,
                             spec=s, config=config)
    if s == "best":
        cfg = _need_config(s, config)
        return _from_run(s, cfg.output_dir, cfg, "best")
    if s == "initial" or re.fullmatch(r"initial:\d+", s):
        cfg = _need_config(s, config)
        index = int(s.split(":")[1]) if ":" in s else 0
        initials = cfg.rag.initial_instructions
        if index >= len(initials):
            raise ConfigError(f"prompt {s!r}: {cfg.source} has {len(initials)} initial instruction(s) (0-based index)")
        return ResolvedPrompt(
            spec=s, kind="initial", label=s, template=_template(initials[index], cfg),
            provenance={"source": s, "config": cfg.source},
        )
    if s.startswith("run:"):
        target = s[4:].strip()
        if not target:
            raise ConfigError("prompt 'run:' needs a directory or config: run:runs/quickstart or run:experiments/x.toml")
        return _from_run(s, run_dir_of(target), _config_of(target) or config, s)
    if s.startswith("prompts:"):
        return _from_registry(s, config, tracking_uri)
    if s.startswith("file:"):
        return _from_file(s, Path(s[5:]).expanduser(), config)
    if s.startswith("initial:"):  # initial:x, initial:-1 are typos, not instructions
        raise ConfigError(f"prompt {s!r}: write initial (the first initial instruction) or initial:N with N = 0, 1, ...")
    if s.startswith("text:"):
        instruction = s[5:].strip()
        if not instruction:
            raise ConfigError("prompt 'text:' has no instruction after the colon: text:Answer from the context.")
        return ResolvedPrompt(spec=s, kind="literal", label=_short(instruction), template=_template(instruction, config),
                              provenance={"source": "literal"})
    path = Path(s).expanduser()
    if path.is_file() and path.suffix == ".toml":  # an experiment config: its optimization's best
        return _from_run(s, run_dir_of(path), _config_of(path) or config, path.stem)
    if path.is_file():
        return _from_file(s, path, config)
    if path.is_dir():
        raise ConfigError(f"prompt {s!r} is a directory; for an optimization's best prompt write run:{s}")
    if "\n" not in s and _LOOKS_LIKE_PATH.search(s):
        raise DataError(f"prompt {s!r}: no such file (for a literal instruction write text:{s})")
    return ResolvedPrompt(spec=s, kind="literal", label=_short(s), template=_template(s, config),
                          provenance={"source": "literal"})


def with_settings(prompt: ResolvedPrompt, settings: Mapping[str, Value], *, spec: str | None = None,
                  config: OproConfig | None = None) -> ResolvedPrompt:
    """``prompt`` answered with ``settings`` (values of the table's dimensions a template carries, checked
    there and against ``config``), labelled ``LABEL {name=value, ...}``; its kind and provenance stay
    its source's (the held-out guard checks it as it checks that source), the settings added to them."""
    where = f"prompt {spec or prompt.spec!r}"
    for name, value in settings.items():
        d = dimension(name)
        if not d.is_setting:
            raise ConfigError(
                f"{where}: {name} cannot be set on a prompt: it is the template's own content (the demonstrations "
                "are drawn from the exemplar split by `opro optimize`); compare a prompt that has them instead "
                "(best, run:DIR or an exported JSON)")
        # The value as the prompt's own settings give it (not a [search.space] entry).
        error = d.check([value], config, said=functools.partial("{} = {!r}".format, name)) if config is not None else None
        if error:
            raise ConfigError(f"{where}: {error}")
    try:
        template = prompt.template.with_settings(**{**prompt.template.settings, **settings})
    except PromptError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    shown = settings_text(settings)
    provenance = {**prompt.provenance, "settings": {**dict(prompt.provenance.get("settings") or {}), **settings}}
    return ResolvedPrompt(spec=spec or f"{prompt.spec} {{{shown}}}", kind=prompt.kind,
                          label=f"{prompt.label} {{{shown}}}", template=template, provenance=provenance,
                          run_dir=prompt.run_dir)


def _short(text: str, n: int = 40) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


__all__ = ["PROMPT_JSON_FORMAT", "ResolvedPrompt", "SourceKind", "resolve_prompt", "run_dir_of", "with_settings"]
