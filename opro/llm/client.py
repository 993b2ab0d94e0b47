"""One chat-completion interface for every part of opro.

A *backend* (:class:`LLM` subclass: ``openai``, ``llamacpp``, ``scripted``) knows how to run one
call. A :class:`ChatClient` wraps a backend for one *role* (task, judge, optimizer, generator) and
adds what every caller wants: the persistent call cache, usage accounting, sample indices for
reproducible sampling, and sync / async / batched entry points.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol, TypedDict, cast

from opro.errors import LLMBadRequestError, LLMError

Role = Literal["system", "user", "assistant"]
#: The model roles, one ``[models.<role>]`` table each, in the order every listing uses: the one list.
ROLES: tuple[str, ...] = ("task", "judge", "optimizer", "generator")


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


MessagesLike = Sequence[Message] | Sequence[Mapping[str, str]] | str


def as_messages(messages: MessagesLike) -> tuple[Message, ...]:
    """Accept a bare user string, dicts or :class:`Message` objects."""
    if isinstance(messages, str):
        return (Message("user", messages),)
    out: list[Message] = []
    for m in messages:
        if isinstance(m, Message):
            out.append(m)
        else:
            out.append(Message(m["role"], m["content"]))  # type: ignore[arg-type]
    return tuple(out)


@dataclass(frozen=True)
class GenerationOptions:
    """Sampling settings of one call. Part of the cache key."""

    temperature: float = 0.0
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # A JSON schema (as JSON text in the caller's key order, so the dataclass stays hashable) the reply must follow.
    json_schema: str | None = None
    # Ask for the top-N alternatives of each generated token (judges' expected score).
    top_logprobs: int | None = None

    def schema(self) -> dict[str, Any] | None:
        return json.loads(self.json_schema) if self.json_schema else None


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    # Per generated token: {token_text: logprob} of the top alternatives, when asked and supported.
    top_logprobs: tuple[dict[str, float], ...] | None = None
    finish_reason: str | None = None

    def to_json(self) -> str:
        data = asdict(self)
        data["top_logprobs"] = list(self.top_logprobs) if self.top_logprobs is not None else None
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Completion:
        data = json.loads(text)
        if data.get("top_logprobs") is not None:
            data["top_logprobs"] = tuple(data["top_logprobs"])
        return cls(**data)


class LLM(ABC):
    """A chat-completion backend. Subclasses implement :meth:`generate`."""

    provider: str = "base"
    #: How many calls the backend can usefully run at once (1 for an in-process model).
    max_concurrency: int = 8
    supports_json_schema: bool = False
    supports_logprobs: bool = False
    #: Can score the next token after an assistant prefix without decoding (:meth:`choice_logprobs`).
    supports_choice_logprobs: bool = False
    #: :meth:`generate_many` decodes several calls together (faster than one after another).
    supports_batch: bool = False

    @property
    @abstractmethod
    def model(self) -> str:
        """Human-readable model id."""

    @property
    def identity(self) -> str:
        """What makes two backends give the same answer: part of the cache key."""
        return f"{self.provider}:{self.model}"

    @abstractmethod
    def generate(self, messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
        """Run one call. Raise :class:`opro.errors.LLMError` subclasses on failure."""

    async def agenerate(self, messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
        return await asyncio.to_thread(self.generate, messages, options)

    def generate_many(
        self, calls: Sequence[tuple[tuple[Message, ...], GenerationOptions]]
    ) -> list[Completion | LLMError]:
        """Run several calls; each result is the call's completion or its :class:`LLMError`, in input
        order. This default runs them one after another; backends with ``supports_batch`` decode
        them together, with the same replies."""
        out: list[Completion | LLMError] = []
        for messages, options in calls:
            try:
                out.append(self.generate(messages, options))
            except LLMError as exc:
                out.append(exc)
        return out

    @property
    def slots(self) -> threading.BoundedSemaphore:
        """At most ``max_concurrency`` calls of this backend at once, whoever the callers are: the limit
        the endpoint sees. Created on first use (``setdefault`` is atomic, so racing threads share one)."""
        sem = self.__dict__.get("_opro_slots")
        if sem is None:
            sem = self.__dict__.setdefault("_opro_slots", threading.BoundedSemaphore(max(1, self.max_concurrency)))
        return sem  # type: ignore[no-any-return]

    def choice_logprobs(self, messages: tuple[Message, ...], *, prefix: str, choices: tuple[str, ...]) -> Completion:
        """Log-probabilities of each of ``choices`` as the next token of the assistant's reply after
        ``prefix``, read from one forward pass (nothing is decoded).

        The completion's ``text`` is the most likely choice and ``top_logprobs`` holds one step:
        ``{choice: logprob}`` over the whole vocabulary, so their probabilities may sum to less than 1.
        Backends that cannot do this (remote chat APIs) leave ``supports_choice_logprobs`` False.
        """
        raise LLMBadRequestError(
            f"{self.provider} backend {self.model!r} cannot score choices from logits; "
            "use a judge that generates its score",
            model=self.model,
            provider=self.provider,
        )

    def describe(self) -> dict[str, str]:
        """Settings safe to log (never secrets)."""
        return {"provider": self.provider, "model": self.model}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (model memory, HTTP pools)."""


@dataclass
class RoleUsage:
    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    cost_usd: float | None = None


class UsageRecord(TypedDict, total=False):
    """One role's :class:`RoleUsage` as it is saved and passed around (:meth:`UsageLedger.as_dict`, the
    study, ``summary.json``, reports): the same fields by name. A record saved by an older opro may
    lack the newer fields."""

    calls: int
    cache_hits: int
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    cost_usd: float | None


#: Usage by role as saved: ``{"task": UsageRecord, "judge": ...}``.
UsageByRole = dict[str, UsageRecord]


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    prompt: float
    completion: float


# A small built-in price table; users may pass their own to UsageLedger.
DEFAULT_PRICES: dict[str, Price] = {
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-3.5-turbo": Price(0.50, 1.50),
}


class CallLog:
    """Which calls were asked while it listened (:meth:`UsageLedger.listen`), by role and call key
    (:func:`cache_key`): those sent to the model, and those answered from the call cache. Counts by
    key, not estimates: what one command's calls saved another is the keys they share."""

    def __init__(self) -> None:
        self.made: dict[str, set[str]] = {}
        self.cached: dict[str, set[str]] = {}

    def add(self, role: str, key: str, *, cached: bool) -> None:
        (self.cached if cached else self.made).setdefault(role, set()).add(key)

    def asked(self, role: str) -> set[str]:
        """Every key of ``role`` asked, made or answered from the cache."""
        return self.made.get(role, set()) | self.cached.get(role, set())


class UsageLedger:
    """Thread-safe usage accounting per role. ``calls`` counts real (uncached) calls."""

    def __init__(self, *, prices: Mapping[str, Price] | None = None) -> None:
        self._prices = dict(DEFAULT_PRICES if prices is None else prices)
        self._lock = threading.Lock()
        self._by_role: dict[str, RoleUsage] = {}
        # The same by role and model: a role several models serve (the task models of a search).
        self._by_model: dict[tuple[str, str], RoleUsage] = {}
        self._logs: list[CallLog] = []

    @contextmanager
    def listen(self, log: CallLog) -> Iterator[CallLog]:
        """Tell ``log`` the key of every call recorded until the block ends."""
        with self._lock:
            self._logs.append(log)
        try:
            yield log
        finally:
            with self._lock:
                self._logs.remove(log)

    def record(self, role: str, completion: Completion, *, key: str | None = None) -> None:
        with self._lock:
            if key is not None:
                for log in self._logs:
                    log.add(role, key, cached=completion.cached)
            for usage in (self._by_role.setdefault(role, RoleUsage()),
                          self._by_model.setdefault((role, completion.model), RoleUsage())):
                self._add(usage, completion)

    def _add(self, usage: RoleUsage, completion: Completion) -> None:
        if completion.cached:
            usage.cache_hits += 1
            return
        usage.calls += 1
        usage.prompt_tokens += completion.prompt_tokens
        usage.completion_tokens += completion.completion_tokens
        usage.wall_s += completion.latency_s
        price = self._prices.get(completion.model)
        if price is not None:
            cost = (completion.prompt_tokens * price.prompt + completion.completion_tokens * price.completion) / 1e6
            usage.cost_usd = (usage.cost_usd or 0.0) + cost

    def snapshot(self) -> dict[str, RoleUsage]:
        with self._lock:
            return {role: replace(u) for role, u in self._by_role.items()}

    def by_model(self) -> dict[tuple[str, str], RoleUsage]:
        """Usage by (role, model name as the answers carry it)."""
        with self._lock:
            return {key: replace(u) for key, u in self._by_model.items()}

    def total_calls(self) -> int:
        with self._lock:
            return sum(u.calls for u in self._by_role.values())

    def total_tokens(self) -> int:
        with self._lock:
            return sum(u.prompt_tokens + u.completion_tokens for u in self._by_role.values())

    def as_dict(self) -> UsageByRole:
        return {role: cast(UsageRecord, asdict(u)) for role, u in self.snapshot().items()}


def cache_key(identity: str, messages: tuple[Message, ...], options: GenerationOptions, sample_index: int) -> str:
    """Stable key of one call. The sample index only matters when sampling (temperature > 0)."""
    payload = {
        "identity": identity,
        "messages": [[m.role, m.content] for m in messages],
        "options": asdict(options),
        "sample": sample_index if options.temperature > 0 else 0,
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def choice_cache_key(identity: str, messages: tuple[Message, ...], *, prefix: str, choices: tuple[str, ...]) -> str:
    """Stable key of one :meth:`ChatClient.choose` call (a different kind of call than a completion)."""
    payload = {
        "identity": identity,
        "messages": [[m.role, m.content] for m in messages],
        "choice_prefix": prefix,
        "choices": list(choices),
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


_CALL_OPTIONS = frozenset({"temperature", "max_tokens", "seed", "stop", "json_schema", "top_logprobs", "sample_index"})


@dataclass(frozen=True)
class Request:
    """One call for :meth:`ChatClient.map`."""

    messages: MessagesLike
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    json_schema: Mapping[str, Any] | None = None
    top_logprobs: int | None = None
    sample_index: int = 0


class _InFlight:
    """One lock per call key while that call is being asked: a second thread asking the same call waits
    and then reads the first one's reply from the cache, instead of sending it again."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


class CompletionCache(Protocol):
    """What the client asks of its call cache (:class:`opro.llm.cache.CallCache`). Named here, not
    imported: the cache stores :class:`Completion` objects, so the dependency goes cache -> client."""

    def get(self, key: str) -> Completion | None: ...
    def put(self, key: str, completion: Completion) -> None: ...
    def delete(self, key: str) -> None: ...
    def close(self) -> None: ...


@dataclass
class ChatClient:
    """A backend serving one role, with the call cache and usage accounting."""

    llm: LLM
    role: str = "task"
    cache: CompletionCache | None = None
    usage: UsageLedger = field(default_factory=UsageLedger)
    #: Base seed; a call's seed is ``seed + sample_index`` so k samples differ but reproduce.
    seed: int = 0
    #: The limit this client's calls count against (None: its backend's, :attr:`LLM.slots`): the
    #: models of one role on one endpoint share one (:class:`opro.llm.factory.ClientFactory`).
    limit: threading.BoundedSemaphore | None = field(default=None, repr=False, compare=False)
    _inflight: _InFlight = field(default_factory=_InFlight, repr=False, compare=False)

    @property
    def slots(self) -> threading.BoundedSemaphore:
        """What a call of this client holds while the backend answers it."""
        return self.limit if self.limit is not None else self.llm.slots

    def _options(
        self,
        *,
        temperature: float,
        max_tokens: int,
        seed: int | None,
        stop: Iterable[str],
        json_schema: Mapping[str, Any] | None,
        top_logprobs: int | None,
        sample_index: int,
    ) -> GenerationOptions:
        schema = None
        if json_schema is not None and self.llm.supports_json_schema:
            # Keep the caller's key order: grammar-constrained backends (llama.cpp) and OpenAI
            # structured outputs generate properties in schema order, so sorting would change replies.
            schema = json.dumps(json_schema)
        logprobs = top_logprobs if (top_logprobs and self.llm.supports_logprobs) else None
        return GenerationOptions(
            temperature=temperature,
            max_tokens=max_tokens,
            # Greedy decoding ignores the sample index, so the key (which holds the seed) must too.
            seed=(self.seed if seed is None else seed) + (sample_index if temperature > 0 else 0),
            stop=tuple(stop),
            json_schema=schema,
            top_logprobs=logprobs,
        )

    def _prepare(self, messages: MessagesLike, kwargs: Mapping[str, Any]) -> tuple[tuple[Message, ...], GenerationOptions, str]:
        unknown = set(kwargs) - _CALL_OPTIONS
        if unknown:
            raise TypeError(f"unknown completion option(s): {sorted(unknown)}; allowed: {sorted(_CALL_OPTIONS)}")
        msgs = as_messages(messages)
        sample_index = int(kwargs.get("sample_index", 0))
        options = self._options(
            temperature=float(kwargs.get("temperature", 0.0)),
            max_tokens=int(kwargs.get("max_tokens", 512)),
            seed=kwargs.get("seed"),
            stop=kwargs.get("stop", ()),
            json_schema=kwargs.get("json_schema"),
            top_logprobs=kwargs.get("top_logprobs"),
            sample_index=sample_index,
        )
        return msgs, options, cache_key(self.llm.identity, msgs, options, sample_index)

    def _lookup(self, key: str) -> Completion | None:
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is not None:
            self.usage.record(self.role, hit, key=key)
        return hit

    def _store(self, key: str, result: Completion, started: float) -> Completion:
        if result.latency_s == 0.0:
            result = replace(result, latency_s=time.perf_counter() - started)
        if self.cache is not None:
            self.cache.put(key, result)
        self.usage.record(self.role, result, key=key)
        return result

    def forget(self, messages: MessagesLike, **options: Any) -> None:
        """Drop the cached reply of this call (same arguments as :meth:`complete`), so the next
        identical call asks the model again: for replies that turned out unusable, which a cache
        must not replay as successes."""
        if self.cache is not None:
            self.cache.delete(self._prepare(messages, options)[2])

    def complete(self, messages: MessagesLike, **options: Any) -> Completion:
        """One call. Options: temperature, max_tokens, seed, stop, json_schema, top_logprobs, sample_index.

        A JSON schema or logprobs are only sent when the backend supports them (callers must still
        parse defensively). The cache returns a stored completion with ``cached=True``.
        """
        msgs, opts, key = self._prepare(messages, options)
        hit = self._lookup(key)
        if hit is not None:
            return hit
        with self._inflight.hold(key) if self.cache is not None else nullcontext():
            hit = self._lookup(key)  # asked meanwhile by another thread
            return hit if hit is not None else self._ask(msgs, opts, key)

    def _ask(self, msgs: tuple[Message, ...], opts: GenerationOptions, key: str) -> Completion:
        started = time.perf_counter()
        try:
            with self.slots:
                result = self.llm.generate(msgs, opts)
            return self._store(key, result, started)
        except LLMError as exc:
            exc.role = exc.role or self.role  # the message then names the [models.ROLE] table to fix
            raise

    def complete_many(self, calls: Sequence[tuple[MessagesLike, Mapping[str, Any]]]) -> list[Completion | LLMError]:
        """Several calls at once: ``(messages, options)`` pairs with :meth:`complete`'s options.

        Each call is cached and counted on its own (a warm rerun makes no call, an interrupted batch
        keeps what was stored); the misses go to the backend's :meth:`LLM.generate_many` together,
        which decodes them in one batch where the backend can. Results in input order: a completion,
        or the call's :class:`LLMError` (permanent errors included: the caller decides)."""
        prepared = [self._prepare(messages, options) for messages, options in calls]
        out: list[Completion | LLMError | None] = [self._lookup(key) for _, _, key in prepared]
        # One request per distinct call: the same call twice in a batch (two compared prompts with
        # the same text) is asked once and answered from it, as the cache would answer it one at a
        # time; decoded twice, the copies could differ (batch numerics) and cost a second decode.
        first: dict[str, int] = {}
        for i, hit in enumerate(out):
            if hit is None:
                first.setdefault(prepared[i][2], i)
        missing = list(first.values())
        if missing:
            started = time.perf_counter()
            with self.slots:
                results = self.llm.generate_many([prepared[i][:2] for i in missing])
            for i, result in zip(missing, results, strict=True):
                if isinstance(result, LLMError):
                    result.role = result.role or self.role
                    out[i] = result
                else:
                    out[i] = self._store(prepared[i][2], result, started)
            for i, hit in enumerate(out):
                if hit is None:
                    got = out[first[prepared[i][2]]]
                    if isinstance(got, Completion):
                        got = replace(got, cached=True)
                        self.usage.record(self.role, got, key=prepared[i][2])
                    out[i] = got
        return [r for r in out if r is not None]

    async def acomplete(self, messages: MessagesLike, **options: Any) -> Completion:
        msgs, opts, key = self._prepare(messages, options)
        hit = self._lookup(key)
        if hit is not None:
            return hit
        started = time.perf_counter()
        slots = self.slots
        # Never block the event loop on the backend's limit: poll for a free slot.
        while not slots.acquire(blocking=False):
            await asyncio.sleep(0.002)
        try:
            try:
                result = await self.llm.agenerate(msgs, opts)
            finally:
                slots.release()
            return self._store(key, result, started)
        except LLMError as exc:
            exc.role = exc.role or self.role
            raise

    def choose(self, messages: MessagesLike, *, prefix: str, choices: Sequence[str]) -> Completion:
        """The next-token log-probabilities of ``choices`` after the assistant ``prefix`` (see
        :meth:`LLM.choice_logprobs`), cached and counted like :meth:`complete`. Check
        ``self.llm.supports_choice_logprobs`` first."""
        msgs = as_messages(messages)
        wanted = tuple(choices)
        key = choice_cache_key(self.llm.identity, msgs, prefix=prefix, choices=wanted)
        hit = self._lookup(key)
        if hit is not None:
            return hit
        with self._inflight.hold(key) if self.cache is not None else nullcontext():
            hit = self._lookup(key)  # asked meanwhile by another thread
            return hit if hit is not None else self._ask_choice(msgs, key, prefix=prefix, choices=wanted)

    def _ask_choice(self, msgs: tuple[Message, ...], key: str, *, prefix: str, choices: tuple[str, ...]) -> Completion:
        started = time.perf_counter()
        try:
            with self.slots:
                result = self.llm.choice_logprobs(msgs, prefix=prefix, choices=choices)
            return self._store(key, result, started)
        except LLMError as exc:
            exc.role = exc.role or self.role
            raise

    async def achoose(self, messages: MessagesLike, *, prefix: str, choices: Sequence[str]) -> Completion:
        # The backend call blocks (one forward pass): run it, with its cache look-up, off the event loop.
        return await asyncio.to_thread(self.choose, messages, prefix=prefix, choices=choices)

    def map(self, requests: Sequence[Request], *, workers: int | None = None) -> list[Completion]:
        """Run many calls, concurrently up to what the backend allows; results in input order."""
        n = max(1, min(workers or self.llm.max_concurrency, self.llm.max_concurrency, len(requests) or 1))

        def run(r: Request) -> Completion:
            return self.complete(
                r.messages,
                temperature=r.temperature,
                max_tokens=r.max_tokens,
                seed=r.seed,
                stop=r.stop,
                json_schema=r.json_schema,
                top_logprobs=r.top_logprobs,
                sample_index=r.sample_index,
            )

        if n == 1:
            return [run(r) for r in requests]
        with ThreadPoolExecutor(max_workers=n) as pool:
            return list(pool.map(run, requests))

    @property
    def model(self) -> str:
        return self.llm.model


__all__ = [
    "LLM",
    "ROLES",
    "CallLog",
    "ChatClient",
    "Completion",
    "CompletionCache",
    "GenerationOptions",
    "Message",
    "MessagesLike",
    "Price",
    "Request",
    "RoleUsage",
    "UsageByRole",
    "UsageLedger",
    "UsageRecord",
    "as_messages",
    "cache_key",
    "choice_cache_key",
]
