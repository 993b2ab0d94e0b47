"""DSPy on opro's models, cache, ledger and judges.

- :class:`OproLM`: a ``dspy.LM`` (so a ``dspy.BaseLM``) whose calls go through an opro
  :class:`~opro.llm.ChatClient`: any opro backend (embedded llama.cpp, an OpenAI-compatible server,
  the scripted test backend) serves DSPy, with opro's call cache and per-role usage ledger. DSPy's
  own cache is off, so opro's is the one that counts.
- :func:`judge_metric`: a DSPy metric from an opro judge: the 1-5 judge score rescaled to 0..1 and,
  with ``feedback=True`` (for GEPA), ``dspy.Prediction(score=..., feedback=<the judge's reasoning>)``.
- :class:`OproRAG`: a DSPy module equivalent to opro's :class:`~opro.program.rag.RAGProgram`: the same
  retriever and the same template frame, sent as the same single user message (so the same cache
  entries); only the instruction (its predictor's signature instructions) varies. A tuned DSPy
  instruction can therefore be scored by opro, and an opro instruction by DSPy.

Importing this module imports DSPy (slow, seconds); ``import opro`` never does. DSPy imports
LiteLLM, which fetches a price map at import unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set: it is
set here (if unset) before DSPy is imported, as opro runs offline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
from dspy.lm15 import Message as DspyMessage
from dspy.lm15 import Response, TextPart, Usage

from opro.errors import ConfigError
from opro.llm import ChatClient, Completion, Message, Role, cache_key
from opro.program.prompts import DEFAULT_BASE_TEMPLATE, Demo, QATemplate

if TYPE_CHECKING:
    from opro.judges.metrics import Metric
    from opro.program.rag import RAGProgram

#: The signature of :class:`OproRAG` (the same as ``opro export --format dspy``).
RAG_SIGNATURE = "context, question -> answer"


# -- the LM ----------------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(getattr(p, "text", "") or "" for p in content)


def _json_schema(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema of a ``response_format`` (``{"type": "json_schema", "schema": ...}``), if any."""
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    # lm15's canonical form holds the schema at the top; OpenAI's wire form under "json_schema".
    spec = response_format.get("json_schema") or response_format
    schema = spec.get("schema") if isinstance(spec, dict) else None
    return dict(schema) if isinstance(schema, dict) else None


class _ChatClientEngine:
    """A DSPy engine (``complete(Request) -> Response``) over an opro ChatClient.

    DSPy asks for ``n`` samples by sending the same request ``n`` times; opro's cache would answer
    all of them with the first sample, so repeated sampled requests get increasing sample indices
    (reproducible: the k-th identical request is always sample k).
    """

    def __init__(self, client: ChatClient) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}
        # Capabilities DSPy reads from a custom engine: structured output where the opro backend can
        # constrain replies (llama.cpp grammars, OpenAI), so DSPy's JSONAdapter sends its schema.
        self.supports_response_schema = bool(client.llm.supports_json_schema)
        self.supported_params = {"temperature", "max_tokens", "stop", "seed"} | (
            {"response_format"} if client.llm.supports_json_schema else set()
        )

    def _call(self, request: Any) -> tuple[tuple[Message, ...], dict[str, Any]]:
        messages: list[Message] = []
        system = _text(request.system)
        if system:
            messages.append(Message("system", system))
        for m in request.messages:
            role: Role = m.role if m.role in ("system", "assistant") else "user"
            messages.append(Message(role, _text(m.parts) if m.text is None else m.text))
        cfg = request.config
        options: dict[str, Any] = {
            "temperature": 0.0 if cfg.temperature is None else float(cfg.temperature),
            "max_tokens": 512 if cfg.max_tokens is None else int(cfg.max_tokens),
            "stop": tuple(cfg.stop or ()),
        }
        if cfg.seed is not None:
            options["seed"] = int(cfg.seed)
        schema = _json_schema(cfg.response_format)
        if schema is not None:
            # DSPy's JSONAdapter (GEPA's proposer) asks for structured output: a grammar-constrained
            # backend (llama.cpp) then always returns parseable JSON, even from a small model.
            options["json_schema"] = schema
        if options["temperature"] > 0:
            key = cache_key(self.client.llm.identity, tuple(messages), self.client._options(
                temperature=options["temperature"], max_tokens=options["max_tokens"], seed=options.get("seed"),
                stop=options["stop"], json_schema=schema, top_logprobs=None, sample_index=0,
            ), 0)
            with self._lock:
                options["sample_index"] = self._seen.get(key, 0)
                self._seen[key] = options["sample_index"] + 1
        return tuple(messages), options

    def _response(self, completion: Completion) -> Response:
        return Response(
            id=None,
            model=completion.model,
            message=DspyMessage.assistant([TextPart(completion.text)]),
            finish_reason="length" if completion.finish_reason == "length" else "stop",
            usage=Usage(input_tokens=completion.prompt_tokens, output_tokens=completion.completion_tokens),
        )

    def complete(self, request: Any) -> Response:
        messages, options = self._call(request)
        return self._response(self.client.complete(messages, **options))

    def stream(self, request: Any) -> Any:
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        """The ChatClient's backend is owned by opro (its model pool), not by DSPy."""


class _AsyncChatClientEngine:
    def __init__(self, sync: _ChatClientEngine) -> None:
        self.sync = sync

    async def complete(self, request: Any) -> Response:
        messages, options = self.sync._call(request)
        return self.sync._response(await self.sync.client.acomplete(messages, **options))

    async def stream(self, request: Any) -> Any:
        for event in self.sync.stream(request):
            yield event

    async def aclose(self) -> None:
        """Nothing to release: see :meth:`_ChatClientEngine.close`."""


class OproLM(dspy.LM):  # type: ignore[misc]
    """A DSPy LM served by an opro :class:`~opro.llm.ChatClient` (cache, usage ledger, any backend).

    ``temperature`` and ``max_tokens`` are the defaults of calls that do not set them. DSPy's own
    response cache is off: opro's call cache answers repeated calls, and a rerun with a warm cache
    makes no model call. Example::

        exp = Experiment.from_file("opro.toml")
        dspy.configure(lm=OproLM(exp.client("task"), max_tokens=128))
    """

    def __init__(self, client: ChatClient, *, temperature: float = 0.0, max_tokens: int = 512) -> None:
        engine = _ChatClientEngine(client)
        super().__init__(
            model=f"opro/{client.role}",
            engine=engine,
            async_engine=_AsyncChatClientEngine(engine),
            cache=False,
            num_retries=0,  # the opro backend retries transient errors itself
            temperature=temperature,
            max_tokens=max_tokens,
        )
        self.client = client

    def __deepcopy__(self, memo: dict[int, Any]) -> OproLM:
        return self  # DSPy deep-copies programs; the client (model, cache, ledger) is shared, not copied


# -- the metric ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgedPrediction:
    """One metric call, as the :class:`ScoreLog` keeps it."""

    instruction: str
    question: str
    score: float | None  # the judge's 1-5 score; None when the judgment was unreadable
    feedback: str


@dataclass
class ScoreLog:
    """Every judgment a :func:`judge_metric` made, by the instruction that produced the answer.

    It tells which instructions a DSPy optimizer evaluated and how they scored (on opro's 1-5
    scale), so a search stopped by a budget can still return its best-so-far.
    """

    entries: list[JudgedPrediction] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, entry: JudgedPrediction) -> None:
        with self._lock:
            self.entries.append(entry)

    def scores(self, questions: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
        """instruction -> question -> last valid 1-5 score (only ``questions`` when given)."""
        wanted = None if questions is None else set(questions)
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for e in self.entries:
                if e.score is not None and (wanted is None or e.question in wanted):
                    out.setdefault(e.instruction, {})[e.question] = e.score
        return out

    def best(self, questions: Sequence[str]) -> tuple[str, float, int] | None:
        """(instruction, mean 1-5 score, questions scored) of the best instruction judged on the most of
        ``questions``: instructions scored on all of them come first, then by mean score."""
        table = self.scores(questions)
        if not table:
            return None
        ranked = sorted(
            table.items(), key=lambda item: (len(item[1]), sum(item[1].values()) / len(item[1])), reverse=True
        )
        instruction, per_q = ranked[0]
        return instruction, sum(per_q.values()) / len(per_q), len(per_q)


def judge_metric(
    judge: Metric, *, feedback: bool = False, log: ScoreLog | None = None
) -> Callable[..., Any]:
    """A DSPy metric ``metric(example, prediction, trace=None, pred_name=None, pred_trace=None)``.

    ``judge`` is any opro :class:`~opro.judges.metrics.Metric` that grades against the reference on 1-5 (e.g.
    :class:`~opro.judges.CorrectnessJudge`); the example needs ``question`` and ``answer`` fields, the
    prediction an ``answer``. The score is the judge's 1-5 grade rescaled to 0..1 (DSPy optimizers and
    GEPA's perfect score of 1 expect that range); an unreadable judgment scores 0. With
    ``feedback=True`` the metric returns ``dspy.Prediction(score=..., feedback=...)``, the judge's
    reasoning as GEPA's textual feedback. ``log`` records every judgment on the 1-5 scale.
    """

    def metric(
        example: Any, prediction: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None
    ) -> Any:
        question = str(example.question)
        reference = str(example.answer)
        answer = str(getattr(prediction, "answer", "") or "")
        result = judge.measure(query=question, answer=answer, reference=reference)
        score = None if getattr(result, "invalid", False) else result.score
        reason = str(getattr(result, "feedback", "") or getattr(result, "invalid_reason", "") or "")
        if log is not None:
            log.add(JudgedPrediction(str(getattr(prediction, "instruction", "")), question, score, reason))
        unit = 0.0 if score is None else (float(score) - 1.0) / 4.0
        if not feedback:
            return unit
        if score is None:
            text = f"The judge's reply could not be read ({reason or 'no score'}); the answer counts as wrong."
        else:
            text = f"Judge score {score:g} of 5 against the reference answer {reference!r}. {reason}".strip()
        return dspy.Prediction(score=unit, feedback=text)

    return metric


# -- the RAG module --------------------------------------------------------------------------------


class _Shared:
    """Holds an object DSPy must not deep-copy when it copies a program (the retriever's index)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __deepcopy__(self, memo: dict[int, Any]) -> _Shared:
        return self


class OproTemplateAdapter(dspy.Adapter):  # type: ignore[misc]
    """Formats a ``context, question -> answer`` call exactly as opro's RAG program does: the QA
    template with the signature's instructions, as one user message; the reply is the answer."""

    def __init__(self, *, base: str = DEFAULT_BASE_TEMPLATE, position: str = "before") -> None:
        super().__init__()
        self.base = base
        self.position = position

    def template(self, instruction: str) -> QATemplate:
        return QATemplate(instruction=instruction, base=self.base, position=self.position)  # type: ignore[arg-type]

    def format(self, signature: Any, demos: list[dict[str, Any]], inputs: dict[str, Any]) -> list[dict[str, Any]]:
        # Each demonstration in the template's own fields before the question, as opro shows them.
        shown = []
        for d in demos:
            if not all(str(d.get(k) or "").strip() for k in ("context", "question", "answer")):
                raise ConfigError(
                    "OproRAG shows a demonstration with its context, question and answer; one lacks some of them: "
                    "bootstrap demos with their contexts, or compile with 0 labeled demos"
                )
            shown.append(Demo(query=str(d["question"]), context=str(d["context"]), answer=str(d["answer"])))
        prompt = self.template(signature.instructions).with_demos(shown).format(
            context_str=str(inputs["context"]), query_str=str(inputs["question"])
        )
        return [{"role": "user", "content": prompt}]

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        return {"answer": completion.strip()}


class OproRAG(dspy.Module):  # type: ignore[misc]
    """opro's RAG program as a DSPy module: same retriever, template frame, task model and options.

    The only thing DSPy optimizers can change is ``self.generate.signature.instructions``. The
    prediction carries the ``instruction`` it was made with (for :class:`ScoreLog`) and the context.
    """

    def __init__(self, program: RAGProgram, *, instruction: str, lm: OproLM | None = None) -> None:
        super().__init__()
        template = program.template
        self._program = _Shared(program)
        self._adapter = OproTemplateAdapter(base=template.base, position=template.position)
        self.generate = dspy.Predict(dspy.Signature(RAG_SIGNATURE, instructions=instruction))
        # The program's configuration whole: its demonstrations in DSPy's demo fields, its settings below.
        self.generate.demos = [dspy.Example(context=d.context, question=d.query, answer=d.answer) for d in template.demos]
        self._template = template
        # The same options as RAGProgram.answer, so both ask the task model the same call (one cache entry).
        max_tokens = template.int_setting("answer_max_tokens") or program.max_tokens
        self.generate.set_lm(lm or OproLM(program.client_for(template), temperature=program.temperature, max_tokens=max_tokens))

    @property
    def instruction(self) -> str:
        return str(self.generate.signature.instructions)

    def forward(self, question: str) -> Any:
        program: RAGProgram = self._program.value
        contexts = program.retrieve(question, template=self._template)
        context = program.context_separator.join(c.text for c in contexts)
        with dspy.context(adapter=self._adapter):
            pred = self.generate(context=context, question=question)
        return dspy.Prediction(answer=pred.answer, context=context, instruction=self.instruction)


def to_dspy_examples(examples: Sequence[Any]) -> list[Any]:
    """opro examples (``query``, ``reference_answer``) -> ``dspy.Example(question=, answer=)`` inputs."""
    return [dspy.Example(question=e.query, answer=e.reference_answer).with_inputs("question") for e in examples]


__all__ = [
    "RAG_SIGNATURE",
    "JudgedPrediction",
    "OproLM",
    "OproRAG",
    "OproTemplateAdapter",
    "ScoreLog",
    "judge_metric",
    "to_dspy_examples",
]
