"""A user's own LlamaIndex query engine as the program opro tunes: ``[program].factory``.

The factory is a function (or any callable) named ``"package.module:function"``, called as
``factory(llm, **settings)``: ``llm`` is opro's LlamaIndex LLM for the task role (every call through opro's
:class:`~opro.llm.ChatClient`: call cache, budgets, usage ledger), and ``settings`` are the values the search
chose for the dimensions the function declares as parameters, by opro's names (``top_k``,
``answer_max_tokens``, ``chunk_size``, ``retriever``, ``task_model``). It returns a query engine with a
``response_synthesizer:text_qa_template`` prompt, which opro sets to each candidate's template through
``update_prompts``. A dimension the factory does not name stays closed.

Concurrency without a shared engine: :class:`FactoryProgram` keeps a small pool of engines per setting, one
per answer in flight (an engine's template is its state, so two questions never share one at once).
A factory that cannot be imported, raises, or returns something else fails with a :class:`ConfigError`
naming ``[program].factory`` when the program is built, before any model call.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import re
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from opro.errors import ConfigError, OproError, PromptError
from opro.llm import ChatClient, Completion
from opro.program.dimensions import DIMENSIONS, Value
from opro.program.prompts import QATemplate
from opro.program.rag import TEXT_QA_KEY, Answer, _map_with_progress, apply_template, chat_client_llm
from opro.program.retrieval import RetrievedContext

KEY = "[program].factory"

#: ``package.module:function`` (the function may be an attribute path: ``module:Class.build``).
_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def check_factory(text: str, *, where: str = KEY) -> str:
    """``text`` if it reads ``package.module:function``, else a :class:`ConfigError` saying what it should be
    (the config checks ``[program].factory`` with it on load)."""
    if not _FACTORY.match(text):
        raise ConfigError(f'{where} = {text!r} is not "package.module:function": name the module that defines the '
                          "function that builds your query engine, a colon, and the function")
    return text


def load_factory(text: str, *, base_dir: Path | None = None) -> Callable[..., Any]:
    """The callable ``package.module:function`` names. The module is imported as Python imports it; where it
    is not found, the config's folder ``base_dir`` is tried too (added to ``sys.path``, as ``python -m`` adds
    the working folder), so a ``rag.py`` beside the config works without installing it."""
    module_name, _, attribute = check_factory(text, where=KEY).partition(":")
    try:
        module = _import(module_name, base_dir)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{KEY} = {text!r}: no module {exc.name!r} (imported from {module_name!r}): install the "
                          "package that defines it, or put the module beside the config") from None
    except Exception as exc:  # the user's module failed while importing: say where, not a traceback
        raise ConfigError(f"{KEY} = {text!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{KEY} = {text!r}: {module_name!r} has no {attribute!r}: name the function that "
                              "builds your query engine")
        found = getattr(found, part)
    if not callable(found):
        raise ConfigError(f"{KEY} = {text!r} is a {type(found).__name__}, not a function: name the function that "
                          "builds your query engine")
    return found  # type: ignore[no-any-return]


def _import(name: str, base_dir: Path | None) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        top = name.split(".")[0]
        if base_dir is None or exc.name not in (top, name) or str(base_dir) in sys.path:
            raise
    sys.path.insert(0, str(base_dir))
    return importlib.import_module(name)


def reference_of(factory: Callable[..., Any]) -> str:
    """How a factory given in Python is named in the fingerprint: ``module:qualified name``."""
    name = getattr(factory, "__qualname__", None) or type(factory).__qualname__
    return f"{getattr(factory, '__module__', None) or type(factory).__module__}:{name}"


def taken_settings(factory: Callable[..., Any], *, name: str) -> tuple[str, ...]:
    """The dimensions ``factory`` declares as parameters (by opro's names, in the table's order): the
    settings the search may open. ``**kwargs`` declares none: a setting is opened only by its name."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        raise ConfigError(f"{KEY} = {name!r}: its parameters cannot be read; make it a Python function "
                          "build(llm, **settings)") from None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if not positional:
        raise ConfigError(f"{KEY} = {name!r} takes no positional parameter: it is called as {name.split(':')[-1]}"
                          "(llm, **settings) with opro's LLM first")
    named = {p.name for p in parameters[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return tuple(d.name for d in DIMENSIONS if d.is_setting and d.name in named)


class _Engine:
    """One query engine from the factory and the completions its LLM made for the current question."""

    def __init__(self, build: Callable[[Callable[[Completion], None]], Any]) -> None:
        self.completions: list[Completion] = []
        self.engine = build(self.completions.append)
        #: The template text the engine holds (set again only when another one is asked: LlamaIndex's
        #: ``update_prompts`` rebuilds the synthesizer's prompts, a cost per question otherwise).
        self.applied: str | None = None


class FactoryProgram:
    """A query engine from a user's factory as a program: ``answer(query, *, template)`` like
    :class:`~opro.program.rag.RAGProgram`, answers made concurrently on engines of their own."""

    def __init__(
        self,
        *,
        factory: Callable[..., Any],
        llm: ChatClient,
        initial: Mapping[str, Value | None],
        name: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        models: Callable[[str], ChatClient] | None = None,
    ) -> None:
        """``initial``: every dimension's initial value (what a template that sets none is answered with);
        ``models(name)``: the client of a task model a template names. The factory is called once here,
        with the initial values, and what it returns is checked: a :class:`ConfigError` before any call."""
        self.factory = factory
        self.name = name or reference_of(factory)
        self.llm = llm
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.models = models
        #: The dimensions the factory takes (the only settings a template may carry here).
        self.takes = taken_settings(factory, name=self.name)
        self.initial = {k: initial.get(k) for k in self.takes}
        #: Used when a call gives no template (opro's default frame replaces the engine's own template).
        self.template = QATemplate()
        self._free: dict[str, list[_Engine]] = {}
        self._lock = threading.Lock()
        #: LlamaIndex's tokenizer, remembered for this program's engines (:func:`_share_token_counts`).
        self._tokens: Callable[[str], list[int]] | None = None
        try:
            from llama_index.core.utils import get_tokenizer

            self._tokens = functools.lru_cache(maxsize=1024)(get_tokenizer())
        except ImportError:  # pragma: no cover - the llamaindex extra is what builds an engine at all
            pass
        self._release(self._key(self.initial), self._build(self.initial))  # checked now, reused later

    # -- engines ------------------------------------------------------------------------------------
    def values(self, template: QATemplate) -> dict[str, Value | None]:
        """The values of the factory's settings ``template`` is answered with (its own, else the initial)."""
        refused = [k for k in template.settings if k not in self.takes]
        if refused:
            raise PromptError(
                f"this prompt sets {refused[0]} = {template.settings[refused[0]]!r}, but {KEY} = {self.name!r} takes "
                f"no {refused[0]} parameter: add one to it (build(llm, *, {refused[0]})) or remove the setting")
        return {k: v if (v := template.setting(k)) is not None else self.initial[k] for k in self.takes}

    @staticmethod
    def _key(values: Mapping[str, Value | None]) -> str:
        return json.dumps(values, sort_keys=True)

    def _client(self, values: Mapping[str, Value | None]) -> ChatClient:
        name = values.get("task_model")
        if name is None or name == self.initial.get("task_model") or self.models is None:
            return self.llm
        return self.models(str(name))

    def _build(self, values: Mapping[str, Value | None]) -> _Engine:
        def build(record: Callable[[Completion], None]) -> Any:
            tokens = values.get("answer_max_tokens")
            llm = chat_client_llm(self._client(values), max_tokens=int(tokens) if tokens else self.max_tokens,
                                  temperature=self.temperature, on_complete=record)
            try:
                engine = self.factory(llm, **values)
            except OproError:
                raise
            except Exception as exc:
                said = ", ".join(f"{k}={v!r}" for k, v in values.items())
                raise ConfigError(f"{KEY} = {self.name!r} raised {type(exc).__name__} when called with the LLM"
                                  f"{', ' + said if said else ''}: {exc}") from None
            _check_engine(engine, name=self.name)
            _share_token_counts(engine, self._tokens)
            return engine

        return _Engine(build)

    def _take(self, values: Mapping[str, Value | None], text: str) -> tuple[str, _Engine]:
        """A free engine of these settings, one that holds the template ``text`` where there is one."""
        key = self._key(values)
        with self._lock:
            free = self._free.setdefault(key, [])
            if free:
                same = [i for i, e in enumerate(free) if e.applied == text]
                return key, free.pop(same[-1] if same else -1)
        return key, self._build(values)  # outside the lock: another question's engine may be built meanwhile

    def _release(self, key: str, engine: _Engine) -> None:
        with self._lock:
            self._free.setdefault(key, []).append(engine)

    def engines(self) -> int:
        """How many engines the factory has built so far (one per answer in flight at most, per setting)."""
        with self._lock:
            return sum(len(v) for v in self._free.values())

    # -- answers ------------------------------------------------------------------------------------
    def answer(self, query: str, *, template: QATemplate | None = None) -> Answer:
        use = template or self.template
        key, held = self._take(self.values(use), use.template_text)
        try:
            held.completions.clear()
            if held.applied != use.template_text:
                apply_template(held.engine, use)
                held.applied = use.template_text
            started = time.perf_counter()
            response = held.engine.query(query)
            latency = time.perf_counter() - started
            completions = list(held.completions)
        finally:
            self._release(key, held)
        sources = getattr(response, "source_nodes", None) or []
        if not completions and sources:  # retrieved, then answered by something opro does not see
            raise ConfigError(f"the query engine {KEY} = {self.name!r} built answered without calling the LLM it was "
                              "given: build it with that LLM (index.as_query_engine(llm=llm, ...)) so opro can "
                              "cache, count and limit its calls")
        contexts = tuple(
            RetrievedContext(text=n.node.get_content(), score=float(n.score or 0.0), metadata=dict(n.node.metadata),
                             chunk_id=n.node.node_id)
            for n in sources
        )
        text = str(getattr(response, "response", response) or "")
        # Nothing retrieved: LlamaIndex answers "Empty Response" without a call, a completion of no tokens.
        completion = (_together(completions, text=text, latency_s=latency) if completions
                      else Completion(text=text, model=self.llm.model, latency_s=latency))
        return Answer(query=query, text=text.strip(), contexts=contexts, completion=completion)

    def answer_many(self, queries: Sequence[str], *, template: QATemplate | None = None, workers: int | None = None,
                    progress: bool = True) -> list[Answer]:
        """Answers in input order, as many at once as the task model's endpoint allows."""
        n = max(1, min(workers or self.llm.llm.max_concurrency, self.llm.llm.max_concurrency))
        return _map_with_progress(lambda q: self.answer(q, template=template), list(queries), workers=n,
                                  description="answering", progress=progress)

    def describe(self) -> dict[str, Any]:
        """What names this program in the fingerprint and the run's parameters: the factory, the settings it
        takes, and what it reports about itself (its ``describe()``, where it has one)."""
        return {"factory": self.name, "takes": list(self.takes), "model": self.llm.model, **reported(self.factory)}


def check_opened(program: FactoryProgram, *, opened: Collection[str], source: str) -> FactoryProgram:
    """``program`` if it takes every setting ``opened`` (the ``[search.space]`` dimensions of the config
    ``source``), else a :class:`ConfigError` naming the first it does not take."""
    closed = [d.name for d in DIMENSIONS if d.is_setting and d.name in opened and d.name not in program.takes]
    if closed:
        raise ConfigError(f"{source}: [search.space].{closed[0]} is open, but {KEY} = {program.name!r} takes no "
                          f"{closed[0]} parameter: add one to it, or remove the dimension (it takes: "
                          f"{', '.join(program.takes) or 'none'})")
    return program


def closed_settings(*, factory: str, base_dir: Path | None = None) -> str:
    """What the plan says of ``[program].factory`` (``factory``, found as :func:`load_factory` finds it): the
    settings it takes, and those that stay closed."""
    takes = taken_settings(load_factory(factory, base_dir=base_dir), name=factory)
    closed = [d.name for d in DIMENSIONS if d.is_setting and d.name not in takes]
    return (f"{KEY} = {factory!r} takes {', '.join(takes) or 'no setting'} as parameters; "
            f"{', '.join(closed) or 'no setting'} stay closed (the factory does not take them)")


def reported(factory: Callable[..., Any]) -> dict[str, Any]:
    """What a factory reports about itself: its ``describe()`` (the collection, the embedding model, the
    chunking...), as JSON-able values; {} without one."""
    describe = getattr(factory, "describe", None)
    if not callable(describe):
        return {}
    said = describe()
    if not isinstance(said, Mapping):
        raise ConfigError(f"{KEY}: its describe() returned {type(said).__name__}, not a dict of what names the engine")
    return {"reports": json.loads(json.dumps(dict(said), sort_keys=True, default=str))}


def _check_engine(engine: Any, *, name: str) -> None:
    what = type(engine).__name__
    if not callable(getattr(engine, "query", None)) or not callable(getattr(engine, "get_prompts", None)):
        raise ConfigError(f"{KEY} = {name!r} returned {what}, not a LlamaIndex query engine: return one built with "
                          "the LLM it is given (index.as_query_engine(llm=llm, ...))")
    if TEXT_QA_KEY not in engine.get_prompts():
        raise ConfigError(f"{KEY} = {name!r} returned a {what} without a {TEXT_QA_KEY!r} prompt, where opro puts the "
                          "instruction it tunes: return a query engine whose response synthesizer has a QA template")


def _share_token_counts(engine: Any, tokens: Callable[[str], list[int]] | None) -> None:
    """Let the engine's prompt helper count tokens through ``tokens``, LlamaIndex's own tokenizer remembered:
    a compact or refining synthesizer tokenizes the same context and the same empty prompt several times per
    question (and again under each candidate), a quarter of an answer's CPU. Only a helper that is the
    engine's own (not ``Settings.prompt_helper``) and counts with the very tokenizer ``tokens`` remembers
    (LlamaIndex's default when the program was built) is changed, so the counts, the packing and the prompts
    stay the same; any other engine is left as it is."""
    from llama_index.core import Settings

    helper = getattr(getattr(engine, "_response_synthesizer", None), "_prompt_helper", None)
    counter = getattr(helper, "_token_counter", None)
    if (tokens is None or helper is None or helper is Settings._prompt_helper
            or getattr(counter, "tokenizer", None) is not getattr(tokens, "__wrapped__", None)):
        return
    counter.tokenizer = tokens  # type: ignore[union-attr]


def _together(completions: list[Completion], *, text: str, latency_s: float) -> Completion:
    """The engine's calls for one answer as one completion (a refining synthesizer may make several)."""
    if len(completions) == 1:
        return completions[0]
    return Completion(
        text=text, model=completions[-1].model, latency_s=latency_s,
        prompt_tokens=sum(c.prompt_tokens for c in completions),
        completion_tokens=sum(c.completion_tokens for c in completions),
        cached=all(c.cached for c in completions), finish_reason=completions[-1].finish_reason,
    )


__all__ = ["KEY", "FactoryProgram", "check_factory", "check_opened", "closed_settings", "load_factory", "reference_of", "reported",
           "taken_settings"]
