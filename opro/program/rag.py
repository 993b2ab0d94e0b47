"""The RAG program being optimized, and its LlamaIndex integration.

:class:`RAGProgram` retrieves contexts, fills a :class:`~opro.program.prompts.QATemplate` and asks the task
model through a :class:`~opro.llm.ChatClient` (cache + usage). The prompt is sent as one user message
so the token prefix (chat header + context + query) stays stable across candidate instructions.

LlamaIndex users have three ways in:

- :func:`template_from_query_engine` / :func:`apply_template`: read and write a query engine's
  ``response_synthesizer:text_qa_template`` through ``get_prompts()`` / ``update_prompts()``;
- :class:`QueryEngineProgram`: any query engine as a program the optimizer can score;
- ``RAGProgram.get_prompts()`` / ``update_prompts()`` (same key) and :meth:`RAGProgram.as_query_engine`,
  with :func:`chat_client_llm` and :func:`as_llama_index_retriever` adapters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Any

from opro.errors import ConfigError, LLMError, PromptError
from opro.llm import ChatClient, Completion, Message
from opro.program.dimensions import DIMENSIONS, model_of
from opro.program.prompts import DEFAULT_BASE_TEMPLATE, QATemplate
from opro.program.retrieval import RetrievedContext, Retriever, retrieve_top
from opro.progress import progress_bar

TEXT_QA_KEY = "response_synthesizer:text_qa_template"
CONTEXT_SEPARATOR = "\n\n"  # what LlamaIndex's compact synthesizer puts between chunks


@dataclass(frozen=True)
class Answer:
    query: str
    text: str
    contexts: tuple[RetrievedContext, ...]
    completion: Completion


def _index_settings(template: QATemplate) -> dict[str, Any]:
    """The values ``template`` sets of the table's ``index`` dimensions (its chunking, ...)."""
    return {d.name: v for d in DIMENSIONS if d.applies == "index" and (v := template.setting(d.name)) is not None}


def _map_with_progress(
    fn: Callable[[str], Answer], queries: Sequence[str], *, workers: int, description: str, progress: bool
) -> list[Answer]:
    results: list[Answer | None] = [None] * len(queries)
    with progress_bar(description, total=len(queries), enabled=progress) as bar:
        if workers <= 1:
            for i, q in enumerate(queries):
                results[i] = fn(q)
                bar.advance()
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(fn, q): i for i, q in enumerate(queries)}
                for fut, i in futures.items():
                    results[i] = fut.result()
                    bar.advance()
    return [r for r in results if r is not None]


class RAGProgram:
    """Retrieve, fill the QA template, answer with the task model."""

    def __init__(
        self,
        *,
        retriever: Retriever,
        llm: ChatClient,
        max_tokens: int = 256,
        temperature: float = 0.0,
        template: QATemplate | None = None,
        context_separator: str = CONTEXT_SEPARATOR,
        chunked: Callable[..., Retriever] | None = None,
        models: Callable[[str], ChatClient] | None = None,
    ) -> None:
        """``chunked(**index)`` gives the retriever over the corpus indexed with these values of the
        ``index`` dimensions, the chunk size first (``chunked(256)``: chunked at that size; built once, kept): what
        answers a template that sets one. Without it, such a template is refused. ``models(name)`` gives
        the client of the task model a template names (its ``task_model`` setting); without it, such a
        template is refused too."""
        if max_tokens <= 0:
            raise ConfigError(f"max_tokens must be positive, got {max_tokens}")
        self.retriever = retriever
        self.llm = llm
        self.max_tokens = max_tokens
        self.temperature = temperature
        #: Used when a call gives no template; what get_prompts()/update_prompts() read and write.
        self.template = template or QATemplate()
        self.context_separator = context_separator
        self.chunked = chunked
        self.models = models

    def retriever_for(self, template: QATemplate) -> Retriever:
        """The retriever over ``template``'s index (its chunking, ...: searched settings), else the program's."""
        index = _index_settings(template)
        if not index:
            return self.retriever
        if self.chunked is None:
            said = ", ".join(f"{k} = {v!r}" for k, v in index.items())
            raise PromptError(
                f"this prompt is answered with {said}, but the program has one index: "
                f"build it with chunked= (an experiment's program has it), or remove the prompt's {', '.join(index)}"
            )
        size = index.pop("chunk_size", None)  # positional: a ``chunked(size)`` of one index dimension keeps working
        return self.chunked(**index) if size is None else self.chunked(size, **index)

    def client_for(self, template: QATemplate) -> ChatClient:
        """The client of the task model ``template`` is answered by (a searched setting), else the program's.
        A template that sets what only a user's engine takes (its ``response_mode``) is refused here, where
        every answer passes."""
        foreign = [d.name for d in DIMENSIONS if not d.builtin and template.setting(d.name) is not None]
        if foreign:
            raise PromptError(f"this prompt sets {foreign[0]} = {template.setting(foreign[0])!r}, which opro's own "
                              "program does not take (a [program].factory's query engine does): answer it with "
                              f"that engine, or remove the prompt's {foreign[0]}")
        name = model_of(template.setting)
        if name is None:
            return self.llm
        if self.models is None:
            raise PromptError(f"this prompt is answered by the task model {name!r}, but the program has one model: "
                              "build it with models= (an experiment's program has it), or remove the prompt's model")
        return self.models(name)

    def retrieve(self, query: str, *, template: QATemplate | None = None) -> tuple[RetrievedContext, ...]:
        """The contexts ``template`` is answered with: its own chunking and top_k over the program's."""
        use = template or self.template
        return tuple(retrieve_top(self.retriever_for(use), query, top_k=use.int_setting("top_k")))

    def _max_tokens(self, template: QATemplate) -> int:
        return template.int_setting("answer_max_tokens") or self.max_tokens

    def build_prompt(self, query: str, *, template: QATemplate | None = None) -> tuple[str, tuple[RetrievedContext, ...]]:
        use = template or self.template
        contexts = self.retrieve(query, template=use)
        context_str = self.context_separator.join(c.text for c in contexts)
        return use.format(context_str=context_str, query_str=query), contexts

    def answer(self, query: str, *, template: QATemplate | None = None) -> Answer:
        prompt, contexts = self.build_prompt(query, template=template)
        completion = self.client_for(template or self.template).complete(
            [Message("user", prompt)], temperature=self.temperature,
            max_tokens=self._max_tokens(template or self.template),
        )
        return Answer(query=query, text=completion.text.strip(), contexts=contexts, completion=completion)

    def answer_group(self, query: str, *, templates: Sequence[QATemplate]) -> list[Answer | LLMError]:
        """One question under several templates, asked together: retrieval runs once and the calls go
        to the backend as one batch (:meth:`ChatClient.complete_many`), which a llama.cpp model decodes
        together over their shared prefix. Each call is cached on its own; a failed call gives its
        :class:`LLMError` in its place."""
        found: dict[tuple[Any, ...], tuple[RetrievedContext, ...]] = {}  # once per retrieval setting
        calls, contexts, clients = [], [], []
        for t in templates:
            key = tuple(t.setting(d.name) for d in DIMENSIONS if d.applies in ("index", "retrieval"))
            if key not in found:
                found[key] = self.retrieve(query, template=t)
            contexts.append(found[key])
            context_str = self.context_separator.join(c.text for c in found[key])
            options = {"temperature": self.temperature, "max_tokens": self._max_tokens(t)}
            calls.append(([Message("user", t.format(context_str=context_str, query_str=query))], options))
            clients.append(self.client_for(t))
        # One batch per task model (each its own backend), the results back in the templates' order.
        results: list[Completion | LLMError | None] = [None] * len(calls)
        for client in {id(c): c for c in clients}.values():
            mine = [i for i, c in enumerate(clients) if c is client]
            for i, r in zip(mine, client.complete_many([calls[i] for i in mine]), strict=True):
                results[i] = r
        return [
            r if isinstance(r, LLMError) else Answer(query=query, text=r.text.strip(), contexts=c, completion=r)
            for r, c in zip(results, contexts, strict=True) if r is not None
        ]

    def answer_many(
        self,
        queries: Sequence[str],
        *,
        template: QATemplate | None = None,
        workers: int | None = None,
        progress: bool = True,
    ) -> list[Answer]:
        """Answers in input order; concurrency up to what the backend allows."""
        n = max(1, min(workers or self.llm.llm.max_concurrency, self.llm.llm.max_concurrency))
        return _map_with_progress(
            lambda q: self.answer(q, template=template), list(queries), workers=n, description="answering", progress=progress
        )

    def describe(self) -> dict[str, Any]:
        return {
            "retriever": self.retriever.describe(),
            "model": self.llm.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }

    # -- LlamaIndex-style prompt access (PromptMixin's public methods) ----------------------------

    def get_prompts(self) -> dict[str, Any]:
        return {TEXT_QA_KEY: self.template.to_llama_index()}

    def update_prompts(self, prompts_dict: Mapping[str, Any]) -> None:
        for key, prompt in prompts_dict.items():
            if key != TEXT_QA_KEY:
                raise PromptError(f"unknown prompt key {key!r}; RAGProgram has only {TEXT_QA_KEY!r}")
            self.template = _to_qa_template(prompt, like=self.template)

    def as_query_engine(self, **kwargs: Any) -> Any:
        """A LlamaIndex ``RetrieverQueryEngine`` over the same retriever, model and template."""
        from llama_index.core.query_engine import RetrieverQueryEngine

        return RetrieverQueryEngine.from_args(
            retriever=as_llama_index_retriever(self.retriever_for(self.template), top_k=self.template.int_setting("top_k")),
            llm=chat_client_llm(self.client_for(self.template), max_tokens=self._max_tokens(self.template),
                                temperature=self.temperature),
            text_qa_template=self.template.to_llama_index(),
            **kwargs,
        )


def _to_qa_template(prompt: Any, *, like: QATemplate | None = None) -> QATemplate:
    if isinstance(prompt, QATemplate):
        return prompt
    if isinstance(prompt, str):
        text = prompt
    elif hasattr(prompt, "get_template"):
        text = prompt.get_template()  # PromptTemplate / SelectorPromptTemplate (default template)
    else:
        raise PromptError(f"cannot read a QA template from {type(prompt).__name__}")
    return QATemplate.from_template_text(text, base=like.base if like is not None else DEFAULT_BASE_TEMPLATE)


# --- query engines --------------------------------------------------------------------------------


def template_from_query_engine(engine: Any) -> QATemplate:
    """The QA template of a LlamaIndex query engine (its ``response_synthesizer:text_qa_template``).

    LlamaIndex's default template maps to the default base template with its sentences as the
    instruction; a template made by :meth:`QATemplate.to_llama_index` maps back exactly.
    """
    prompts = engine.get_prompts()
    if TEXT_QA_KEY not in prompts:
        raise PromptError(f"the query engine has no {TEXT_QA_KEY!r} prompt; it has: {sorted(prompts)}")
    return _to_qa_template(prompts[TEXT_QA_KEY])


def apply_template(engine: Any, template: QATemplate) -> None:
    """Set a query engine's ``response_synthesizer:text_qa_template`` via ``update_prompts``."""
    engine.update_prompts({TEXT_QA_KEY: template.to_llama_index()})


class QueryEngineProgram:
    """A LlamaIndex query engine as a program: ``answer(query, *, template)`` like :class:`RAGProgram`.

    The template is applied through ``update_prompts`` and the engine is queried under a lock, since
    the template is engine state (calls are serialized; use ``RAGProgram`` for concurrency).
    """

    def __init__(self, engine: Any, *, model: str | None = None) -> None:
        self.engine = engine
        self.template = template_from_query_engine(engine)
        self._model = model or _engine_model(engine)
        self._lock = threading.Lock()

    def answer(self, query: str, *, template: QATemplate | None = None) -> Answer:
        import time

        use = template or self.template
        if use.settings:
            raise PromptError(
                f"a LlamaIndex query engine keeps its own retrieval and generation settings; this prompt sets "
                f"{use.settings}: build the engine with them (similarity_top_k, the LLM's max_tokens, the node "
                "parser's chunk_size) or evaluate it with opro's RAG program"
            )
        with self._lock:
            apply_template(self.engine, use)
            started = time.perf_counter()
            response = self.engine.query(query)
            latency = time.perf_counter() - started
        contexts = tuple(
            RetrievedContext(
                text=n.node.get_content(), score=float(n.score or 0.0), metadata=dict(n.node.metadata), chunk_id=n.node.node_id
            )
            for n in (getattr(response, "source_nodes", None) or [])
        )
        text = str(getattr(response, "response", response) or "")
        completion = Completion(text=text, model=self._model, latency_s=latency)
        return Answer(query=query, text=text.strip(), contexts=contexts, completion=completion)

    def answer_many(
        self,
        queries: Sequence[str],
        *,
        template: QATemplate | None = None,
        workers: int | None = None,
        progress: bool = True,
    ) -> list[Answer]:
        return _map_with_progress(
            lambda q: self.answer(q, template=template), list(queries), workers=1, description="answering", progress=progress
        )

    def describe(self) -> dict[str, Any]:
        return {"engine": type(self.engine).__name__, "model": self._model}


def _engine_model(engine: Any) -> str:
    llm = getattr(getattr(engine, "_response_synthesizer", None), "_llm", None)
    try:
        return str(llm.metadata.model_name) if llm is not None else "llama-index"
    except Exception:
        return "llama-index"


# --- adapters (classes built on first use so importing opro.program.rag stays light) -----------------------


@cache
def _chat_client_llm_class() -> type:
    from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen, LLMMetadata
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.llms.callbacks import llm_completion_callback
    from llama_index.core.llms.custom import CustomLLM

    class ChatClientLLM(CustomLLM):
        """A LlamaIndex LLM that sends each prompt as one user message through an opro ChatClient."""

        max_tokens: int = Field(default=256)
        temperature: float = Field(default=0.0)
        context_window: int = Field(default=4096)
        _client: Any = PrivateAttr()
        _on_complete: Any = PrivateAttr(default=None)
        _metadata: Any = PrivateAttr(default=None)

        def __init__(self, client: ChatClient, on_complete: Callable[[Completion], None] | None = None,
                     **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self._client = client
            self._on_complete = on_complete

        @classmethod
        def class_name(cls) -> str:
            return "opro_ChatClientLLM"

        @property
        def metadata(self) -> LLMMetadata:
            # Read several times per query (prompt helper, synthesizer, events): a pydantic model built once
            # per setting instead of each time, a cost per answer in a factory's engines.
            held = self._metadata
            if held is None or (held.context_window, held.num_output) != (self.context_window, self.max_tokens):
                held = self._metadata = LLMMetadata(context_window=self.context_window, num_output=self.max_tokens,
                                                    model_name=self._client.model, is_chat_model=False)
            return held

        @llm_completion_callback()
        def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            c = self._client.complete(
                [Message("user", prompt)], temperature=self.temperature, max_tokens=self.max_tokens
            )
            if self._on_complete is not None:
                self._on_complete(c)
            return CompletionResponse(
                text=c.text,
                raw={"completion": c},
                additional_kwargs={"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens},
            )

        @llm_completion_callback()
        def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
            response = self.complete(prompt, formatted=formatted, **kwargs)

            def gen() -> CompletionResponseGen:
                yield CompletionResponse(text=response.text, delta=response.text, raw=response.raw)

            return gen()

    return ChatClientLLM


def chat_client_llm(client: ChatClient, *, max_tokens: int = 256, temperature: float = 0.0, context_window: int = 4096,
                    on_complete: Callable[[Completion], None] | None = None) -> Any:
    """Wrap a ChatClient as a LlamaIndex ``LLM`` (calls keep opro's cache and usage accounting);
    ``on_complete`` is handed each call's :class:`Completion` (its tokens, whether it was cached)."""
    cls = _chat_client_llm_class()
    return cls(client, on_complete, max_tokens=max_tokens, temperature=temperature, context_window=context_window)


@cache
def _retriever_adapter_class() -> type:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    class OproRetriever(BaseRetriever):
        """A LlamaIndex retriever over an opro :class:`~opro.program.retrieval.Retriever`."""

        def __init__(self, retriever: Retriever, top_k: int | None = None) -> None:
            super().__init__()
            self._opro = retriever
            self._top_k = top_k

        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            return [
                NodeWithScore(
                    node=TextNode(
                        text=c.text,
                        metadata=dict(c.metadata),
                        # Metadata kept for users but not shown to the LLM: same prompt as RAGProgram.
                        excluded_llm_metadata_keys=list(c.metadata),
                        excluded_embed_metadata_keys=list(c.metadata),
                        **_node_id(c),
                    ),
                    score=c.score,
                )
                for c in retrieve_top(self._opro, query_bundle.query_str, top_k=self._top_k)
            ]

    return OproRetriever


def _node_id(c: RetrievedContext) -> dict[str, str]:
    return {"id_": c.chunk_id} if c.chunk_id else {}


def as_llama_index_retriever(retriever: Retriever, *, top_k: int | None = None) -> Any:
    """Wrap an opro retriever as a LlamaIndex ``BaseRetriever`` (``top_k``: chunks per query, else
    the retriever's own)."""
    return _retriever_adapter_class()(retriever, top_k)


__all__ = [
    "CONTEXT_SEPARATOR",
    "TEXT_QA_KEY",
    "Answer",
    "QueryEngineProgram",
    "RAGProgram",
    "apply_template",
    "as_llama_index_retriever",
    "chat_client_llm",
    "template_from_query_engine",
]
