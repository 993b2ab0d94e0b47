"""One table of the search's dimensions: a :class:`Dimension` per setting ``[search.space]`` may open.

As ``optuna/distributions.py`` is the one place that knows every kind of parameter, this table is the
one place that knows every dimension: its name, its kind (``int``, ``float`` or a ``choice`` of
strings), its floor, its initial value (a ``[rag]`` key, else a default), where it applies (the
template's content, or a setting the template carries for generation, for retrieval, or for the index
it is retrieved from, or the model that answers), its names in the export formats and its effect on an
answer's tokens for the plan. A ``choice`` dimension's choices are fixed strings (the retriever kinds)
or the names a config gives (the task models: ``choices_from``). The config, the search space, the
experiment, the RAG program, the exports and the plan read it; none of them names a dimension in a
list of its own.

Adding a dimension is one :class:`Dimension` in :data:`DIMENSIONS`, then the behaviour in the module
that implements it (an ``index`` dimension is a keyword of :func:`opro.program.retrieval.build_retriever`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opro.errors import ConfigError

#: A dimension's value: Optuna's CategoricalDistribution takes each of these.
Value = int | float | str
Kind = Literal["int", "float", "choice"]
#: ``template``: the template's own content (the demonstrations); ``generation``: the task model's
#: call; ``retrieval``: a query's retrieval; ``index``: the index the corpus is retrieved from (each
#: value its own index, built once: a keyword of :func:`opro.program.retrieval.build_retriever`);
#: ``model``: the task model that answers (each value a model the config names, one client each).
Applies = Literal["template", "generation", "retrieval", "index", "model"]
#: What a name a config gives may look like (``small``, ``0.5b``, ``gpt-4o-mini``): it is written in a
#: configuration's name (``{task_model=0.5b}``) and a TOML table's name, so no braces, commas, ``=`` or spaces.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Tokens:
    """A dimension's effect on one task answer (:mod:`opro.probe.plan`): prompt tokens it adds, and the cap
    it puts on the completion (None: none)."""

    prompt: float = 0.0
    completion_cap: float | None = None


@dataclass(frozen=True)
class Dimension:
    """One searchable setting (see the module's docstring)."""

    name: str
    kind: Kind
    help: str
    applies: Applies
    #: The least value (int and float kinds).
    floor: float = 0
    #: The values a ``choice`` dimension takes.
    choices: tuple[str, ...] = ()
    #: A ``choice`` dimension whose values are names the config gives: config -> those names (a template
    #: may carry any name of :data:`NAME_PATTERN`; ``requires`` checks it against the config).
    choices_from: Callable[[Any], Sequence[str]] | None = None
    #: The ``[rag]`` key that holds the initial configuration's value; None: :attr:`default`.
    rag_key: str | None = None
    #: The initial value where no ``[rag]`` key holds it (None: the program's own).
    default: Value | None = None
    #: The initial value read from the config where neither a ``[rag]`` key nor a default holds it.
    initial_from: Callable[[Any], Value] | None = None
    #: The keyword the behaviour takes the value by (``build_retriever(kind=...)``); None: the name.
    argument: str | None = None
    #: Its name in each export format (``{"llamaindex": "similarity_top_k"}``); absent: the name.
    export: Mapping[str, str] = field(default_factory=dict)
    #: A comment for the LlamaIndex snippet of an exported prompt (what the value means there).
    export_note: str = ""
    #: Its effect on a task answer's tokens, given its value, every dimension's value and the config.
    tokens: Callable[[Any, Mapping[str, Any], Any], Tokens] | None = None
    #: What the plan says of its cost when ``tokens`` is None (or beside the estimate).
    cost_note: str = ""
    #: What the plan adds where it is open.
    plan_note: str = ""
    #: How a ``template`` dimension changes a template: (template, value, the demonstration pool) -> template.
    change: Callable[[Any, Any, Sequence[Any]], Any] | None = None
    #: A check of its values against the whole config: (values, config, how a value was given) -> the
    #: error, or None (:meth:`check`).
    requires: Callable[[Sequence[Any], Any, Callable[[Any], str]], str | None] | None = None
    #: Whether opro's own program takes it; False: only a ``[program].factory`` that declares it as a parameter
    #: (a setting of the user's LlamaIndex engine that opro's program has no counterpart of).
    builtin: bool = True

    def check(self, values: Sequence[Any], config: Any, *, said: Callable[[Any], str] | None = None) -> str | None:
        """What its values need of the rest of ``config`` (:attr:`requires`): the error, or None. ``said``
        shows a value as the user gave it (``--set task_model=ghost``); by default as a ``[search.space]``
        entry, so an error names where the value came from."""
        if self.requires is None or not values:
            return None
        return self.requires(values, config, said or (lambda v: f"[search.space].{self.name} = {v!r}"))

    @property
    def is_setting(self) -> bool:
        """Whether a template carries it as a setting (else it is the template's own content)."""
        return self.applies != "template"

    @property
    def numeric(self) -> bool:
        return self.kind != "choice"

    @property
    def expects(self) -> str:
        """The kind as an error names it."""
        if self.choices_from is not None:
            return "a name (letters, digits, '.', '_' or '-')"
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        what = "an integer" if self.kind == "int" else "a number"
        return f"{what} >= {self.floor:g}"

    def configure(self, template: Any, value: Any, pool: Sequence[Any]) -> Any:
        """``template`` with this (``template``) dimension at ``value``."""
        if self.change is None:
            raise ConfigError(f"the dimension {self.name!r} is a setting, not the template's content")
        return self.change(template, value, pool)

    @property
    def kind_said(self) -> str:
        return f"{'an' if self.kind == 'int' else 'a'} {self.kind} dimension"

    def export_name(self, fmt: str) -> str:
        return self.export.get(fmt, self.name)

    def keyword(self) -> str:
        return self.argument or self.name

    def initial(self, config: Any) -> Value | None:
        """The initial configuration's value under ``config`` (its ``[rag]`` key, else the default, else
        what the config says)."""
        if self.rag_key:
            return getattr(config.rag, self.rag_key)  # type: ignore[no-any-return]
        return self.initial_from(config) if self.initial_from is not None else self.default

    def _known(self, value: Any) -> bool:
        if self.choices_from is not None:  # a name the config gives: checked against it by ``requires``
            return isinstance(value, str) and NAME_PATTERN.match(value) is not None
        return value in self.choices

    def value_error(self, value: Any) -> str | None:
        """Why ``value`` is not one of this dimension's values, or None."""
        if self.kind == "choice":
            return None if isinstance(value, str) and self._known(value) else f"must be {self.expects}"
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                self.kind == "int" and not isinstance(value, int)):
            return f"must be {'an integer' if self.kind == 'int' else 'a number'} ({self.name} is {self.kind_said})"
        if math.isnan(value) or value < self.floor:
            return f"must be >= {self.floor:g}"
        return None

    def setting_error(self, value: Any) -> str | None:
        """Why a template cannot carry ``value`` (None: unset or fine). Numbers: positive (the
        config's floors are the search's; a template may carry any positive value)."""
        if value is None:
            return None
        if self.kind == "int":
            ok = not isinstance(value, bool) and isinstance(value, int) and value >= 1
            return None if ok else f"{self.name} must be a positive integer or unset, got {value!r}"
        if self.kind == "float":
            ok = not isinstance(value, bool) and isinstance(value, int | float) and value > 0
            return None if ok else f"{self.name} must be a positive number or unset, got {value!r}"
        return None if self._known(value) else f"{self.name} must be {self.expects} or unset, got {value!r}"

    def coerce(self, value: Any) -> Value:
        """A stored value (Optuna's, a study's JSON) as this dimension's type."""
        if self.kind == "int":
            return int(value)
        if self.kind == "float":
            return float(value)
        return str(value)

    def parse_text(self, text: str) -> Value | None:
        """A value written as text (an MLflow tag), or None when it is not one."""
        try:
            value = self.coerce(text)
        except ValueError:
            return None
        return None if self.setting_error(value) else value


def _demo_tokens(value: Any, values: Mapping[str, Any], config: Any) -> Tokens:
    # A demonstration: its context (demo_chars, about 4 characters a token), question, answer, field names.
    return Tokens(prompt=value * (config.search.space.demo_chars / 4 + 60))


def _context_tokens(value: Any, values: Mapping[str, Any], config: Any) -> Tokens:
    return Tokens(prompt=0.8 * value * values["chunk_size"])


def _answer_tokens(value: Any, values: Mapping[str, Any], config: Any) -> Tokens:
    return Tokens(completion_cap=value)


def _above_overlap(values: Sequence[Any], config: Any, said: Callable[[Any], str]) -> str | None:
    small = [v for v in values if v <= config.rag.chunk_overlap]
    if small:
        return (f"{said(small[0])} is not above [rag].chunk_overlap ({config.rag.chunk_overlap}): "
                "every chunk size must be larger than the overlap")
    return None


def _needs_embeddings(values: Sequence[Any], config: Any, said: Callable[[Any], str]) -> str | None:
    embedded = [v for v in values if v != "bm25"]
    if embedded and config.rag.embeddings is None:
        return (f"{said(embedded[0])} needs a [rag.embeddings] table (base_url + model, or "
                "local_path): dense and hybrid retrieval embed the chunks")
    return None


def _needs_factory(values: Sequence[Any], config: Any, said: Callable[[Any], str]) -> str | None:
    if config.program.factory:  # the factory's parameters are checked when its program is built
        return None
    return (f"{said(values[0])} is a setting of a LlamaIndex query engine's response synthesizer, which opro's own "
            "program does not have: name your engine's builder in [program].factory (with a response_mode "
            "parameter), or remove the dimension")


def _mode_tokens(value: Any, values: Mapping[str, Any], config: Any) -> Tokens:
    # refine: a call per retrieved chunk, each later one with the refine frame and the answer so far (about
    # the frame's 120 and an answer's 70 tokens); compact and simple_summarize: one call when the chunks fit.
    return Tokens(prompt=(values["top_k"] - 1) * 190.0 if value == "refine" else 0.0)


def unknown_model(name: str, config: Any, *, where: str = "", said: str = "") -> str:
    """Why ``name`` (at the key ``where``, or as ``said``: ``--set task_model=ghost``) names no task model
    of ``config``: what the choices are, by config key."""
    models = config.task_models()
    declared = [n for n, _ in config.models.task_choices]
    builtin = [n for n in models if n != "task" and n not in declared]
    return (f"{said or f'{where} = {name!r}'} names no task model: use 'task' ([models.task]), a [models.task_choices.NAME] "
            "table's name" + (f" ({', '.join(declared)})" if declared else "")
            + f" or an embedded model's ({', '.join(builtin)})")


def _known_models(values: Sequence[Any], config: Any, said: Callable[[Any], str]) -> str | None:
    models = config.task_models()
    unknown = [v for v in values if v not in models]
    if unknown:
        return unknown_model(unknown[0], config, said=said(unknown[0]))
    same = [(a, b) for i, a in enumerate(values) for b in values[i + 1:] if models[a] == models[b]]
    if same:
        return (f"[search.space].task_model lists {same[0][0]!r} and {same[0][1]!r}, which are the same model table: "
                "list one of them")
    return None


#: Every dimension, in order (the order of the search space, of a prompt's settings and of the plan).
DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("demos", "int", "worked examples from the exemplar split shown before the question (0: none)",
              applies="template", floor=0, default=0, tokens=_demo_tokens,
              change=lambda template, value, pool: template.with_demos(pool[:value])),
    Dimension("top_k", "int", "retrieved chunks per question", applies="retrieval", floor=1, rag_key="top_k",
              export={"llamaindex": "similarity_top_k"}, export_note="the retrieved chunks it was scored with",
              tokens=_context_tokens),
    Dimension("answer_max_tokens", "int", "the task model's answer length", applies="generation", floor=1,
              rag_key="answer_max_tokens", export={"llamaindex": "max_tokens"},
              export_note="the answer length it was scored with (the LLM's max_tokens)", tokens=_answer_tokens),
    Dimension("chunk_size", "int", "the chunking the corpus is indexed in (tokens per chunk, [rag].chunk_overlap "
              "kept): each value is chunked and indexed once, and kept on disk", applies="index", floor=32,
              rag_key="chunk_size", export_note="the chunking it was scored with: index = VectorStoreIndex."
              "from_documents(docs, transformations=[SentenceSplitter(chunk_size=CHUNK_SIZE)])",
              plan_note="each chunk size is chunked and indexed once, then kept", requires=_above_overlap),
    Dimension("retriever", "choice", "the retriever: bm25 (words), dense (embeddings) or hybrid (both, fused by "
              "reciprocal rank); dense and hybrid need [rag.embeddings]", applies="index",
              choices=("bm25", "dense", "hybrid"), rag_key="retriever", argument="kind",
              export_note="the retriever it was scored with: bm25 (BM25Retriever), dense (VectorIndexRetriever) or "
              "hybrid (QueryFusionRetriever over both, mode='reciprocal_rerank')",
              cost_note="the same tokens for every kind: it changes which chunks are retrieved, not how many",
              plan_note="each retriever kind is indexed once, then kept", requires=_needs_embeddings),
    Dimension("task_model", "choice", "the task model that answers: 'task' ([models.task]), a "
              "[models.task_choices.NAME] table, or an embedded model by name with no table (0.5b, 1.5b)",
              applies="model", choices_from=lambda config: tuple(config.task_models()),
              initial_from=lambda config: config.initial_task_model(),
              export_note="the task model it was scored with (opro's name for it; the model itself: the metadata's "
              "provenance.models.task)",
              cost_note="each model's tokens at its own prices, or at its own measured seconds per token",
              plan_note="each model is loaded or reached once; without prices each one's speed is calibrated here",
              requires=_known_models),
    Dimension("response_mode", "choice", "how the query engine's response synthesizer answers from the retrieved "
              "chunks (LlamaIndex's ResponseMode): compact (as few calls as fit), refine (a call per chunk, each "
              "refining the answer so far) or simple_summarize (one call, the chunks truncated to fit); only a "
              "[program].factory with a response_mode parameter takes it", applies="generation",
              choices=("compact", "refine", "simple_summarize"), default="compact", builtin=False,
              export_note="the response synthesizer it was scored with: index.as_query_engine(response_mode=...)",
              tokens=_mode_tokens, cost_note="refine makes top_k task calls per answer: the estimate adds each later "
              "call's frame and answer to the prompt, and counts one call", requires=_needs_factory),
)

#: The dimensions a template carries as settings (beside its text), by name, in order.
SETTINGS: tuple[str, ...] = tuple(d.name for d in DIMENSIONS if d.is_setting)
_BY_NAME = {d.name: d for d in DIMENSIONS}


def dimension(name: str) -> Dimension:
    """The dimension called ``name``; a :class:`ConfigError` naming the valid ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(f"no search dimension {name!r}; the dimensions: {', '.join(_BY_NAME)}") from None


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def model_of(setting: Callable[[str], Any]) -> str | None:
    """The task model a configuration is answered by: the value ``setting(name)`` gives the ``model``
    dimension (a template's ``setting``, a dict's ``get``); None: the initial configuration's."""
    return next((str(v) for d in DIMENSIONS if d.applies == "model" and (v := setting(d.name)) is not None), None)


def initial_values(config: Any) -> dict[str, Value | None]:
    """Every dimension's initial value under ``config``."""
    return {d.name: d.initial(config) for d in DIMENSIONS}


def task_tokens(config: Any, values: Mapping[str, Any]) -> tuple[float, float]:
    """Prompt and completion tokens of one task answer with these settings: the frame, then each
    dimension's effect (:attr:`opro.program.dimensions.Dimension.tokens`)."""
    prompt, completion = 120.0, 70.0
    for d in DIMENSIONS:
        if d.tokens is None or values.get(d.name) is None:
            continue
        effect = d.tokens(values[d.name], values, config)
        prompt += effect.prompt
        if effect.completion_cap is not None:
            completion = min(effect.completion_cap, completion)
    return prompt, completion


def answer_cost(config: Any, values: Mapping[str, Any]) -> float:
    """What one task answer is expected to cost (:meth:`opro.program.cost.CostModel.of`) with these
    values of the dimensions (the others: the initial configuration's): the prompt-length estimate of
    :func:`task_tokens`. The plan prices each choice with it and the search's first moves
    (:func:`opro.search.space.first_moves`) order the choices by it: one price for both."""
    full = {**initial_values(config), **values}
    prompt, completion = task_tokens(config, full)
    return config.cost_model().of(prompt_tokens=prompt, completion_tokens=completion, model=model_of(full.get))


__all__ = ["DIMENSIONS", "SETTINGS", "Applies", "Dimension", "Kind", "Tokens", "Value", "answer_cost", "dimension",
           "initial_values", "model_of", "names", "task_tokens", "unknown_model"]
