"""Experiment configuration: a TOML file validated into frozen dataclasses.

Every table and key is checked on load: an unknown key, a wrong type or a value outside its allowed
set is a :class:`ConfigError` naming the file, the key and what is allowed. Relative paths are
resolved against the directory of the config file, so a config works from any working directory.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from opro.config.checks import check_mlflow_uri, check_optuna_storage, check_ranges
from opro.data.dataset import SPLIT_NAMES, SplitName
from opro.errors import ConfigError, PromptError
from opro.judges.correctness import SCORE_SOURCES, ScoreFrom, check_score_from
from opro.judges.sidebyside import PairedMode
from opro.llm.client import DEFAULT_PRICES, ROLES, Price
from opro.llm.pool import ModelSpec, check_endpoint
from opro.llm.speed import TokenRate
from opro.program.choices import (
    check_name,
    check_served,
    config_cost_model,
    initial_name,
    searched_models,
    task_models,
)
from opro.program.cost import CostModel
from opro.program.dimensions import DIMENSIONS, Value, dimension
from opro.program.dimensions import names as dimension_names
from opro.program.prompts import DEFAULT_INSTRUCTION, validate_instruction

#: ``docs`` entry that stands for the offline quickstart corpus (CPython's own language reference).
BUILTIN_PYTHON_REFERENCE = "builtin:python-reference"


@dataclass(frozen=True)
class ExperimentSection:
    name: str = "opro"
    output_dir: str = "runs/opro"
    seed: int = 0
    #: The persistent LLM call cache; off makes every call real.
    cache: bool = True
    #: Empty: the per-user cache (``~/.cache/opro/llm_calls.sqlite``).
    cache_path: str = ""
    progress: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)
        if not self.output_dir.strip():
            raise ConfigError('[experiment].output_dir is empty: name a folder for the run (for example "runs/opro")')


@dataclass(frozen=True)
class SplitSection:
    exemplar: int = 3
    optimization: int = 6
    #: Questions the search never selects on: a few choose a finalist, the rest test it against the
    #: initial instruction (0: no validation stage, which needs ``[optimizer].finalists = 0``).
    validation: int = 48
    heldout: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(self)
        for name in SPLIT_NAMES:
            if getattr(self, name) < 0:
                raise ConfigError(f"[data.split].{name} must be >= 0, got {getattr(self, name)}")
        if self.optimization < 1:
            raise ConfigError("[data.split].optimization must be >= 1: candidates are scored on it")

    @property
    def sizes(self) -> dict[SplitName, int]:
        """Each split's size, in dealing order (what :func:`opro.data.dataset.check_split_fits` checks)."""
        return {name: getattr(self, name) for name in SPLIT_NAMES}


DOCS_REQUIRED = "[data].docs is required: the documents (PDF, .txt, .md, directories) to retrieve from"


@dataclass(frozen=True)
class DataSection:
    #: The corpus to retrieve from (files or directories), or ``builtin:python-reference``.
    docs: tuple[str, ...] = ()
    #: A labelled dataset (LabelledRagDataset JSON, an opro dataset dir, JSON/JSONL/CSV); empty:
    #: generate a golden dataset from ``docs`` with the generator model.
    dataset: str = ""
    #: Field names of plain QA records; empty: detected (query/question/input/prompt, ...).
    query_field: str = ""
    answer_field: str = ""
    contexts_field: str = ""
    questions_per_chunk: int = 2
    max_chunks: int = 0
    skip_bad: bool = False
    #: Share of the questions made unanswerable: their reference contexts are taken out of the corpus
    #: and their reference answer says so (:mod:`opro.judges.withheld`); 0: the corpus as it is.
    not_in_context: float = 0.0
    split: SplitSection = field(default_factory=SplitSection)

    def __post_init__(self) -> None:
        check_ranges(self)
        if not self.docs and not self.dataset:  # with a dataset, [program].factory may stand for them (OproConfig)
            raise ConfigError(DOCS_REQUIRED)
        for i, entry in enumerate(self.docs):
            if not entry.strip():
                raise ConfigError(f"[data].docs[{i}] is empty: name a file or folder of documents")
            if entry.startswith("builtin:") and entry != BUILTIN_PYTHON_REFERENCE:
                raise ConfigError(
                    f"[data].docs[{i}] = {entry!r} is not a built-in corpus; the one there is {BUILTIN_PYTHON_REFERENCE!r}"
                )
        if self.questions_per_chunk < 1:
            raise ConfigError(f"[data].questions_per_chunk must be >= 1, got {self.questions_per_chunk}")


@dataclass(frozen=True)
class EmbeddingsSection:
    #: OpenAI-compatible /v1/embeddings endpoint, or a local sentence-transformers directory.
    base_url: str = ""
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    local_path: str = ""

    def __post_init__(self) -> None:
        # The same rules as [models.*] (checked here: at call time they would read "cannot reach").
        if self.local_path:
            return
        if not self.model.strip():
            raise ConfigError("[rag.embeddings] needs `model` (the endpoint's embedding model) or `local_path`")
        check_endpoint(base_url=self.base_url or None, api_key_env=self.api_key_env, where="[rag.embeddings].")


@dataclass(frozen=True)
class RAGSection:
    chunk_size: int = 512
    chunk_overlap: int = 32
    retriever: Literal["bm25", "dense"] = "bm25"
    top_k: int = 2
    #: "after" by measurement (docs/benchmarks.md, "The embedded engine against its floor"): no worse on held-out
    #: questions, and every candidate of a question shares the retrieved context as a KV prefix.
    instruction_position: Literal["before", "after"] = "after"
    answer_max_tokens: int = 128
    initial_instructions: tuple[str, ...] = (DEFAULT_INSTRUCTION,)
    embeddings: EmbeddingsSection | None = None

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.chunk_size < 32:
            raise ConfigError(f"[rag].chunk_size must be >= 32 tokens, got {self.chunk_size}")
        if not 0 <= self.chunk_overlap < self.chunk_size:
            raise ConfigError(f"[rag].chunk_overlap must be in [0, chunk_size), got {self.chunk_overlap}")
        if self.top_k < 1:
            raise ConfigError(f"[rag].top_k must be >= 1, got {self.top_k}")
        if not self.initial_instructions:
            raise ConfigError("[rag].initial_instructions needs at least one instruction")
        for i, instruction in enumerate(self.initial_instructions):
            if not instruction.strip():
                raise ConfigError(f"[rag].initial_instructions[{i}] is empty: write the instruction the search starts from")
            try:
                validate_instruction(instruction)
            except PromptError as exc:  # at load, not seconds later when the first template is built
                raise ConfigError(f"[rag].initial_instructions[{i}]: {exc}") from None
        if self.retriever == "dense" and self.embeddings is None:
            raise ConfigError("[rag].retriever = 'dense' needs a [rag.embeddings] table (base_url + model, or local_path)")


@dataclass(frozen=True)
class ModelsSection:
    task: ModelSpec = field(default_factory=lambda: ModelSpec.embedded("task"))
    judge: ModelSpec = field(default_factory=lambda: ModelSpec.embedded("judge"))
    optimizer: ModelSpec = field(default_factory=lambda: ModelSpec.embedded("optimizer"))
    generator: ModelSpec = field(default_factory=lambda: ModelSpec.embedded("generator"))
    #: ``[models.task_choices.NAME]``: other task models by name (:mod:`opro.program.choices`), each a full model
    #: table, for ``[search.space].task_model`` and ``opro compare --set task_model=NAME``.
    task_choices: tuple[tuple[str, ModelSpec], ...] = ()


@dataclass(frozen=True)
class JudgeSection:
    template: str = "llamaindex"
    threshold: float = 4.0
    structured: bool = True
    expected_score: bool = False
    max_tokens: int = 256
    #: ``reply``: parse the score from the judge's reply; ``logits``: the probability-weighted score from
    #: the logits at the score position (llamacpp only, nothing decoded); ``auto`` (default): logits where
    #: the backend can, else the reply (on 40 AlexNet questions, better separation: docs/benchmarks.md).
    score_from: ScoreFrom = "auto"
    paired: PairedMode = "pointwise"  # a paired decision's judge: docs/configuration.md
    both_orders: bool = False  # side by side: also ask with the answers swapped, and average

    def __post_init__(self) -> None:
        check_ranges(self)
        if not 1.0 <= self.threshold <= 5.0:
            raise ConfigError(f"[judge].threshold must be within 1..5, got {self.threshold}")
        check_score_from(self.score_from, where="[judge].score_from")
        if self.both_orders and self.paired != "side_by_side":  # [judge].paired's values: checked on load
            raise ConfigError("[judge].both_orders = true needs [judge].paired = 'side_by_side' (or drop both_orders)")


@dataclass(frozen=True)
class OptimizerSection:
    #: The proposal strategy (a name in :data:`opro.search.proposers.PROPOSERS`): ``opro``, the OPRO
    #: meta-prompt; ``reflect``, a rewrite of the best instruction from the judge's reasons on the
    #: exemplar questions it fails.
    proposer: str = "opro"
    steps: int = 2
    candidates_per_step: int = 3
    temperature: float = 1.0
    max_history: int = 20
    min_history_score: float = 0.0
    exemplars: int = 3
    #: ``random``: drawn without replacement across steps; ``failures``: the drawn questions the best
    #: instruction so far gets wrong are shown with its answer and the judge's reason; ``hardest``:
    #: the exemplar questions it scores lowest. Both score exemplar questions only (extra calls).
    exemplar_strategy: Literal["random", "hardest", "failures"] = "random"
    score_scale: Literal["1-5", "0-100"] = "1-5"
    answer_format: Literal["ins", "brackets"] = "ins"
    max_instruction_chars: int = 400
    max_tokens: int = 200
    minibatch_size: int = 2
    #: ``race``: stop a candidate once the upper confidence bound of its paired difference to the
    #: incumbent is below zero; ``best``: running mean ``prune_margin`` below the best; ``median``; ``none``.
    pruner: Literal["none", "median", "best", "race"] = "race"
    prune_margin: float = 0.5
    prune_warmup_minibatches: int = 1
    #: While a candidate's pruning decision on one minibatch is pending, answer its next minibatch on
    #: task slots that would otherwise idle (its judgments wait for the decision): a candidate's
    #: minibatches overlap instead of running answer-then-judge in series. Costs at most one
    #: minibatch of task calls per pruned candidate; scores and decisions are the same.
    lookahead: bool = True
    #: One-sided confidence of the racing pruner's bound (higher: prunes less, later).
    race_confidence: float = 0.95
    #: Finalists (best by search score) taken to the validation stage; 0 turns it off (the search
    #: score is then in-sample only). With more than one, the first ``selection_questions``
    #: validation questions choose the one that is tested against the initial instruction.
    finalists: int = 2
    selection_questions: int = 4
    #: Significance level of the validation decision (one-sided, over all its looks).
    alpha: float = 0.05
    #: The chosen finalist and the initial instruction are asked the other validation questions in
    #: this many batches, with a decision after each (group-sequential, O'Brien-Fleming-type alpha
    #: spending: see opro/stats/sequential.py); ``futility``: stop once the finalist is not ahead.
    validation_looks: int = 3
    futility: bool = True
    #: The confirmation may go on past the validation split by one more look of up to this many
    #: questions that are in no split (never held-out; the dataset's unused questions, in a seeded
    #: order), asked only when the split's looks did not decide. Planned before the first look, so the
    #: error rate holds; 0: the validation split only.
    validation_extension: int = 20
    #: A candidate counts as complete only if this share of its questions was scored validly.
    min_coverage: float = 0.9
    #: When the validation questions already decided a verdict under another design or other settings
    #: (:mod:`opro.search.ledger`): ``refuse`` the run; ``label`` runs it as an exploration, every record
    #: labelled "re-decided after a seen verdict", the initial instruction returned, never validated.
    seen_validation: Literal["refuse", "label"] = "refuse"
    #: Without prices for the task model, an answer's cost is its task tokens, prompt + this x
    #: completion (:mod:`opro.program.cost`): decoding a token is slower and dearer than reading one.
    completion_weight: float = 4.0
    #: ``quality``: return a finalist only if it beats the initial configuration. ``cost``: the
    #: cheapest finalist whose quality is not worse than the initial one's by more than ``margin``
    #: judge points (a validated non-inferiority claim) and whose cost per answer is lower.
    objective: Literal["quality", "cost"] = "quality"
    margin: float = 0.25
    patience: int = 0
    max_calls: int = 0
    max_tokens_budget: int = 0

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.score_scale == "1-5" and self.min_history_score > 5:
            raise ConfigError(f"[optimizer].min_history_score must be within 0..5 with score_scale '1-5', got {self.min_history_score}")
        if self.steps < 0:
            raise ConfigError(f"[optimizer].steps must be >= 0, got {self.steps}")
        if self.candidates_per_step < 1:
            raise ConfigError(f"[optimizer].candidates_per_step must be >= 1, got {self.candidates_per_step}")
        if self.minibatch_size < 1:
            raise ConfigError(f"[optimizer].minibatch_size must be >= 1, got {self.minibatch_size}")
        if self.max_history < 1:
            raise ConfigError(f"[optimizer].max_history must be >= 1, got {self.max_history}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ConfigError(f"[optimizer].temperature must be within 0..2, got {self.temperature}")
        if self.finalists < 0:
            raise ConfigError(f"[optimizer].finalists must be >= 0 (0: no validation stage), got {self.finalists}")
        if self.selection_questions < 0:
            raise ConfigError(f"[optimizer].selection_questions must be >= 0, got {self.selection_questions}")
        if self.validation_looks < 1:
            raise ConfigError(f"[optimizer].validation_looks must be >= 1 (1: one test at the end), got {self.validation_looks}")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"[optimizer].alpha must be between 0 and 1 (e.g. 0.05), got {self.alpha}")
        if not 0.0 < self.min_coverage <= 1.0:
            raise ConfigError(f"[optimizer].min_coverage must be in (0, 1] (e.g. 0.9), got {self.min_coverage}")
        if not 0.5 <= self.race_confidence < 1.0:
            raise ConfigError(f"[optimizer].race_confidence must be in [0.5, 1) (e.g. 0.95), got {self.race_confidence}")
        if isinstance(self.margin, bool) or not 0.0 <= self.margin < math.inf:
            raise ConfigError(f"[optimizer].margin must be a number of judge points >= 0 (e.g. 0.25), got {self.margin!r}")
        if self.objective == "cost" and self.margin <= 0:
            # As compare --margin: at 0 the test is a superiority test, which "not worse" would misname.
            raise ConfigError(f"[optimizer].margin must be a positive number of judge points (e.g. 0.25) with "
                              f"objective = \"cost\", got {self.margin!r}: at 0 the claim would be a gain, which "
                              "objective = \"quality\" tests")
        if isinstance(self.completion_weight, bool) or not 0.0 <= self.completion_weight < math.inf:
            raise ConfigError(f"[optimizer].completion_weight must be a number >= 0 (e.g. 4), got {self.completion_weight!r}")


@dataclass(frozen=True)
class SpaceSection:
    """What the search may change beside the wording: for each dimension of the table
    (:data:`opro.program.dimensions.DIMENSIONS`), a list of values to choose from (absent or empty: not
    searched). Optuna's sampler proposes a value of each for every new candidate, from the scores of
    the candidates before it, while the optimizer LLM proposes the wording. In TOML each dimension is
    a key of ``[search.space]`` (``top_k = [1, 3]``); in Python, ``choices``."""

    #: Demonstrations: the exemplar questions' reference answers, or the task model's own answers
    #: that the judge passed (DSPy's BootstrapFewShot).
    demo_source: Literal["references", "bootstrapped"] = "references"
    #: A demonstration's context is cut to this many characters.
    demo_chars: int = 600
    sampler: Literal["tpe", "random"] = "tpe"
    #: The dimensions' lists of values, by name (each dimension a TOML key of its own, not this).
    choices: tuple[tuple[str, tuple[Value, ...]], ...] = field(default=(), metadata={"toml": False})

    def __post_init__(self) -> None:
        check_ranges(self)
        given = dict(self.choices.items() if isinstance(self.choices, dict) else self.choices)
        for name in given:
            dimension(name)  # an unknown one: a ConfigError naming the dimensions
        for d in DIMENSIONS:
            values = given.get(d.name, ())
            for v in values:
                error = d.value_error(v)
                if error and error.startswith("must be >="):
                    raise ConfigError(f"[search.space].{d.name} values must be >= {d.floor:g}, got {v}")
                if error:
                    raise ConfigError(f"[search.space].{d.name} value {v!r} {error}")
            if len(set(values)) != len(values):
                raise ConfigError(f"[search.space].{d.name} lists a value twice: {list(values)}")
        object.__setattr__(self, "choices", tuple((d.name, tuple(given[d.name])) for d in DIMENSIONS
                                                  if given.get(d.name)))

    def __getattr__(self, name: str) -> Any:
        # ``space.top_k``: a dimension's values (empty: not searched).
        if name in dimension_names():
            return dict(self.choices).get(name, ())
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def dimensions(self) -> dict[str, tuple[Value, ...]]:
        """The open dimensions and their choices (in the table's order)."""
        return dict(self.choices)

    def params(self) -> dict[str, Any]:
        """Its keys as the TOML gives them (the open dimensions, then the other keys)."""
        return {**self.dimensions, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                      if f.metadata.get("toml", True)}}

    @classmethod
    def from_table(cls, table: dict[str, Any], source: str) -> SpaceSection:
        """``[search.space]``: the table's dimensions (kinds and floors from the table), then its other keys."""
        keys = [f.name for f in dataclasses.fields(cls) if f.metadata.get("toml", True)]
        unknown = sorted(set(table) - set(keys) - set(dimension_names()))
        if unknown:
            raise ConfigError(f"{source}: unknown key [search.space].{unknown[0]}"
                              f"{_did_you_mean(unknown[0], [*dimension_names(), *keys], prefix='[search.space].')}; the dimensions: "
                              f"{', '.join(dimension_names())}; other keys: {', '.join(keys)}")
        choices = []
        for name in dimension_names():
            if name in table:
                values = [table[name]] if isinstance(table[name], str) else table[name]
                if not isinstance(values, list):
                    d = dimension(name)
                    raise ConfigError(f"{source}: [search.space].{name} must be a list of values, each {d.expects} "
                                      f"({name} is {d.kind_said}), got {type(values).__name__}")
                choices.append((name, tuple(values)))
        rest = {k: v for k, v in table.items() if k in keys}
        return _build(cls, rest, "search.space", source, choices=tuple(choices))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class SearchSection:
    space: SpaceSection = field(default_factory=SpaceSection)


@dataclass(frozen=True)
class TrackingSection:
    #: Empty: ``sqlite:///<output_dir>/mlflow.db``.
    mlflow_uri: str = ""
    mlflow_experiment: str = ""
    #: Empty: ``sqlite:///<output_dir>/optuna.db``. Any Optuna RDB URL (PostgreSQL) to share a study.
    optuna_storage: str = ""
    study_name: str = ""
    register_prompt: bool = True
    #: MLflow 3 GenAI records of finished evaluations: evaluation datasets, evaluation runs with
    #: per-question traces and judge assessments (the GenAI recorder in opro/tracking/). The search's candidates stay metrics.
    genai: bool = True
    #: The lead's MLflow work during ``optimize`` (imports, store set-up, run, metrics, artifacts,
    #: registry, GenAI records) in a child process, so its CPU never takes the search's GIL; false:
    #: on a thread of the searching process (less CPU in all where MLflow is already imported).
    sidecar: bool = True
    prompt_name: str = ""
    prompt_alias: str = "latest-best"
    #: Seconds a worker of a shared study waits for a worker that is not running (worker 0's
    #: proposals, or a missing worker's candidates) before it gives up, naming that worker.
    worker_wait_s: float = 600.0

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.mlflow_uri:
            check_mlflow_uri(self.mlflow_uri, where="[tracking].mlflow_uri")
        if self.optuna_storage:
            check_optuna_storage(self.optuna_storage, where="[tracking].optuna_storage")


@dataclass(frozen=True)
class ProgramSection:
    #: ``package.module:function`` building the user's LlamaIndex query engine (:mod:`opro.program.factory`);
    #: empty: opro's own program over ``[data].docs``.
    factory: str = ""

    def __post_init__(self) -> None:
        if self.factory:
            from opro.program.factory import check_factory  # lazily: that module loads the RAG program

            check_factory(self.factory)


@dataclass(frozen=True)
class OproConfig:
    experiment: ExperimentSection = field(default_factory=ExperimentSection)
    data: DataSection = field(default_factory=lambda: DataSection(docs=(BUILTIN_PYTHON_REFERENCE,)))
    rag: RAGSection = field(default_factory=RAGSection)
    models: ModelsSection = field(default_factory=ModelsSection)
    judge: JudgeSection = field(default_factory=JudgeSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    search: SearchSection = field(default_factory=SearchSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    program: ProgramSection = field(default_factory=ProgramSection)
    #: Directory relative paths are resolved against (the config file's directory).
    base_dir: Path = field(default_factory=Path.cwd)
    source: str = "<defaults>"

    def __post_init__(self) -> None:
        if not self.data.docs and not self.program.factory:
            raise ConfigError(f"{DOCS_REQUIRED} (or name your own query engine's builder in [program].factory)")
        if self.program.factory and self.data.not_in_context and not self.data.docs:
            raise ConfigError("[data].not_in_context takes answers out of opro's index of [data].docs, which "
                              "[program].factory's engine does not search: set it to 0 with [program].factory")
        for d in DIMENSIONS:  # what a dimension's values need of the rest of the config
            values = self.search.space.dimensions.get(d.name)
            error = d.check(values, self) if values else None
            if error:
                raise ConfigError(error)
        check_served(self.task_models(), prices=self.prices(), where=f"{self.source}: [models.task_choices]")

    def prices(self) -> dict[str, Price]:
        """USD per million tokens by model name: the usage ledger's table, overridden by the prices the
        model tables give (``price_prompt``, ``price_completion``; the task choices' too)."""
        table = dict(DEFAULT_PRICES)
        for spec in [*(getattr(self.models, role) for role in ROLES), *dict(self.models.task_choices).values()]:
            if spec.price_prompt is not None and spec.price_completion is not None:
                table[spec.model] = Price(float(spec.price_prompt), float(spec.price_completion))
        return table

    def task_models(self) -> dict[str, ModelSpec]:
        """Every task model this config can answer with, by name (:mod:`opro.program.choices`)."""
        return task_models(self.models.task, dict(self.models.task_choices))

    def initial_task_model(self) -> str:
        """``[models.task]``'s name among them (:func:`opro.program.choices.initial_name`)."""
        return initial_name(self.task_models(), prefer=[str(v) for v in searched_models(self)])

    def cost_model(self, names: Sequence[str] = (), *, rates: Mapping[str, TokenRate] | None = None) -> CostModel:
        """What an answer costs (:mod:`opro.program.cost`): the task model's prices where known, else its
        tokens weighted by ``[optimizer].completion_weight``; where several task models may answer (the
        searched ones and ``names``), each answer at its own model's prices, or at its seconds per token
        (``rates``, else those measured here: :func:`opro.program.choices.config_cost_model`)."""
        return config_cost_model(self, names, rates=rates)

    # -- derived locations -------------------------------------------------------------------
    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    @property
    def output_dir(self) -> Path:
        return self.resolve(self.experiment.output_dir)

    @property
    def call_cache_path(self) -> Path:
        """The call cache's file: ``[experiment].cache_path``, else the per-user one."""
        from opro.paths import default_call_cache_path

        return self.resolve(self.experiment.cache_path) if self.experiment.cache_path else default_call_cache_path()

    @property
    def pool_folder(self) -> Path:
        """The dataset folder this config's runs extend into (:func:`opro.data.pool.pool_folder`)."""
        from opro.data.pool import pool_folder

        return pool_folder(dataset=self.resolve(self.data.dataset) if self.data.dataset else None,
                           output_dir=self.output_dir)

    @property
    def mlflow_uri(self) -> str:
        return self.tracking.mlflow_uri or f"sqlite:///{self.output_dir / 'mlflow.db'}"

    @property
    def optuna_storage(self) -> str:
        return self.tracking.optuna_storage or f"sqlite:///{self.output_dir / 'optuna.db'}"

    @property
    def study_name(self) -> str:
        return self.tracking.study_name or self.experiment.name

    @property
    def prompt_name(self) -> str:
        return self.tracking.prompt_name or f"{self.experiment.name}-qa"


# -- generic validated construction ------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str, source: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(value, args[0], where, source)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{source}: {where} = {value!r} is not allowed; use one of {', '.join(map(repr, allowed))}")
        return value
    if origin is tuple:
        (item_tp, *_rest) = typing.get_args(tp)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {where} must be a list of {_type_name(item_tp)}, got {type(value).__name__}")
        return tuple(_coerce(v, item_tp, f"{where}[{i}]", source) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {where} must be a table, got {type(value).__name__}")
        return _build(tp, value, where, source)  # type: ignore[arg-type]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            # NaN passes every range check (each comparison is false): refused here, for every key.
            raise ConfigError(f"{source}: {where} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {where} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{source}: {where}: unsupported type {tp!r}")


def _did_you_mean(key: str, allowed: Sequence[str], *, prefix: str = "", suffix: str = "") -> str:
    """``" (did you mean [data].dataset?)"`` for the allowed key closest to a misspelt one (difflib), else ""."""
    import difflib

    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}{suffix}?)" if close else ""


def _build(cls: type[Any], table: dict[str, Any], where: str, source: str, **given: Any) -> Any:
    if cls is SpaceSection and not given:  # one key per dimension of the table
        return SpaceSection.from_table(table, source)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)
             if f.init and f.name not in ("base_dir", "source") and f.metadata.get("toml", True)]
    unknown = sorted(set(table) - set(names))
    if unknown:
        prefix = f"[{where}]." if where else ""
        raise ConfigError(
            f"{source}: unknown key {prefix}{unknown[0]}"
            f"{_did_you_mean(unknown[0], names, prefix=prefix or '[', suffix='' if prefix else ']')}; "
            f"allowed keys{' in [' + where + ']' if where else ''}: {', '.join(names)}"
        )
    kwargs = dict(given)
    for name, value in table.items():
        key = f"{where}.{name}" if where else name
        kwargs[name] = _coerce(value, hints[name], key, source)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        msg = str(exc)
        if where and f"[{where}]" not in msg and not msg.startswith(source):
            msg = f"[{where}] {msg}"  # a role's settings say which role (ModelSpec's own messages do not)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def _model_table(base: dict[str, Any], override: Any, where: str, source: str) -> ModelSpec:
    """``[where]`` over ``base``: the checks every model table passes."""
    if not isinstance(override, dict):
        raise ConfigError(f"{source}: [{where}] must be a table")
    if override.get("backend", "llamacpp") != "llamacpp" and "model" not in override:
        raise ConfigError(f"{source}: [{where}] sets backend = {override['backend']!r} but no `model`")
    return _build(ModelSpec, {**base, **override}, where, source)  # type: ignore[no-any-return]


def _default_models(table: dict[str, Any], source: str) -> ModelsSection:
    """Each role starts from its embedded default, so ``[models.judge] model = ...`` is enough; each
    ``[models.task_choices.NAME]`` from the model table's defaults (the embedded 0.5B on llama.cpp)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: models must be a table ([models.task], [models.judge], ...), got {table!r}")
    defaults = ModelsSection()
    roles = {f.name for f in dataclasses.fields(ModelsSection)} - {"task_choices"}
    unknown = sorted(set(table) - roles - {"task_choices"})
    if unknown:
        raise ConfigError(f"{source}: unknown key [models].{unknown[0]}"
                          f"{_did_you_mean(unknown[0], sorted(roles), prefix='[models.', suffix=']')}; "
                          f"allowed: the roles {', '.join(sorted(roles))}, and task_choices")
    built: dict[str, Any] = {}
    for role in roles:
        base = {k: v for k, v in dataclasses.asdict(getattr(defaults, role)).items() if v is not None}
        built[role] = _model_table(base, table.get(role, {}), f"models.{role}", source)
    choices = table.get("task_choices", {})
    if not isinstance(choices, dict):
        raise ConfigError(f"{source}: [models.task_choices] must hold tables, [models.task_choices.NAME]")
    built["task_choices"] = tuple(
        (check_name(name, where=f"{source}: [models.task_choices.{name}]"),
         _model_table({}, spec, f"models.task_choices.{name}", source)) for name, spec in choices.items())
    return ModelsSection(**built)


def config_from_dict(data: dict[str, Any], *, base_dir: Path | None = None, source: str = "<dict>") -> OproConfig:
    data = dict(data)
    models = _default_models(data.pop("models", {}), source)
    # With its models: the search space's task models are checked against them.
    cfg = _build(OproConfig, data, "", source, models=models)
    return dataclasses.replace(cfg, base_dir=(base_dir or Path.cwd()).resolve(), source=source)


def load_config(path: str | Path) -> OproConfig:
    """Read and validate an experiment TOML file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8-sig"))  # -sig: a byte-order mark is read past
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}): save the config as UTF-8") from None
    return config_from_dict(data, base_dir=p.parent, source=str(p))


__all__ = [
    "BUILTIN_PYTHON_REFERENCE",
    "DEFAULT_INSTRUCTION",
    "SCORE_SOURCES",
    "SPLIT_NAMES",
    "DataSection",
    "EmbeddingsSection",
    "ExperimentSection",
    "JudgeSection",
    "ModelsSection",
    "OproConfig",
    "OptimizerSection",
    "ProgramSection",
    "RAGSection",
    "ScoreFrom",
    "SearchSection",
    "SpaceSection",
    "SplitName",
    "SplitSection",
    "TrackingSection",
    "check_mlflow_uri",
    "check_optuna_storage",
    "check_score_from",
    "config_from_dict",
    "load_config",
]
