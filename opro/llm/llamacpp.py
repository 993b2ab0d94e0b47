"""Backend ``llamacpp``: a GGUF model run in-process by ``llama-cpp-python``.

- The chat template comes from the GGUF (``create_chat_completion``).
- JSON-schema constrained output through a llama.cpp grammar (``response_format`` with a schema).
- One lock per loaded model: llama.cpp contexts are not thread-safe, so calls run one at a time
  (``max_concurrency = 1``); any number of threads may call :meth:`generate`.
- KV-prefix reuse is left on: llama-cpp-python keeps the evaluated tokens between calls and only
  evaluates the part of the next prompt that differs, so we never call ``reset()``. Prompts that
  share a long prefix (one instruction, many questions) get cheaper.
- :meth:`LlamaCppLLM.choice_logprobs` renders the chat with the GGUF's template, appends an
  assistant prefix and reads the next-token logits at the last position only (no ``logits_all``,
  nothing decoded): a judge's score distribution for the price of a prefill, with the same
  KV-prefix reuse as generation.
- :meth:`LlamaCppLLM.generate_many` answers several greedy calls together: the prompts' common
  token prefix is evaluated once (or kept from the previous call) on sequence 0 and copied to the
  other sequences in the KV cache (``llama_memory_seq_cp``), their different tails are prefilled in
  one batch, and every step decodes one token of each live sequence in one ``llama_decode``. On a CPU
  a decode step costs about the same for 1 or 4 sequences (it reads the weights once), so answers of
  a question's candidates come almost for the price of one. The stop rules are those of
  ``create_chat_completion`` (end-of-generation token, stop strings, ``max_tokens``), so the text is
  the one-at-a-time text on short answers (tested; long ones can part at some token, as a batch's
  floating-point sums differ). Sampled, grammar-constrained or logprob calls run one at a time.
- Drafted tokens (``draft_fill``): on a CPU, llama.cpp multiplies the weights by 4 token columns at a
  time and by fewer one column at a time, so a decode step of 3 tokens costs about what one of 4 costs
  (80 and 76 ms for the 0.5B model on 2 cores, ``experiments/bench_drafts.py``) and one of 2 twice one
  of 1. Steps with 2 or 3 live answers are filled to 4 tokens (generally: to a multiple of
  ``draft_fill``) with guesses from each answer's own prompt and text (prompt lookup decoding); greedy
  verification keeps a guess only where it is the arg-max, so the stop rules are applied token by
  token and the text is greedy decoding's (up to a batch's floating-point sums, as above).
- Saved prefixes (``prefix_cache_mb``): the KV state of a prefix that several prompts share (the
  common prefix of a batch; where a judge prompt leaves the previous one) is copied out
  (``llama_state_seq_get_data``) and kept in memory, one per prompt family, least recently used out
  first. A later prompt that shares more with a saved state than with what the context holds starts
  from it (``llama_state_seq_set_data``, cut to the shared length): a question's retrieved context
  (instruction after it), or the judge's template with the question and reference, is prefilled once
  per run instead of once per step.
- The model loads lazily on the first call, so a run whose calls all hit the cache never loads it.
  Before the first load on a machine, a child process loads it and decodes a few tokens
  (:mod:`opro.llm.probe`): llama.cpp's extra buffer types (AMX, repacked weights) crash some builds on
  some CPUs, and a crash there picks plain buffers here instead of killing the run
  (``extra_buffers``: "auto", "on", "off").
- Threads: unless ``n_threads`` is set, every computation takes the usable cores that other processes
  are not keeping busy, shared with this pool's other models computing at that moment
  (:class:`opro.llm.cpu.CpuShare`): ggml's threads spin-wait for each other, so one thread more than
  the free cores costs several times the time.
- ``identity`` is ``llamacpp:<sha256 of the GGUF>``, taken from the pack's known checksum or a
  hash cached by path, size and mtime (:func:`opro.llm.packs.gguf_sha256`).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import ConfigError, LLMBadRequestError, LLMError, ModelPackError
from opro.llm.client import LLM, Completion, GenerationOptions, Message
from opro.llm.cpu import CpuShare
from opro.llm.packs import EMBEDDED_MODELS, gguf_sha256
from opro.llm.packs import model_path as resolve_model_path

if TYPE_CHECKING:
    from llama_cpp import Llama

    from opro.llm.probe import ProbeResult

_OVERFLOW = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


def _import_llama() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError(
            "the llamacpp backend needs llama-cpp-python: pip install llama-cpp-python "
            "(or use backend 'openai' with any OpenAI-compatible server)."
        ) from exc
    return llama_cpp


@dataclass
class _Seq:
    """One sequence of a batched generation: its prompt, the tokens so far and how it ended."""

    index: int
    prompt: list[int]
    max_tokens: int
    stops: list[bytes]
    tokens: list[int] = field(default_factory=list)
    text: bytes = b""
    finish: str | None = None
    multibyte_fix: int = 0


class _SavedPrefixes:
    """KV states of sequence 0 by the tokens they hold, within ``capacity`` bytes, least recently
    used out first. One state per prompt family: saving tokens that agree with a saved state up to
    (nearly) the end of the shorter of the two replaces it (the same question a step later)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._states: OrderedDict[tuple[int, ...], bytearray] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.restored_tokens = 0  # prefill avoided by restoring, in tokens

    def best(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], bytearray, int] | None:
        """The saved state sharing the longest prefix with ``tokens``: (its tokens, state, shared)."""
        from llama_cpp import Llama

        found: tuple[tuple[int, ...], bytearray, int] | None = None
        for key, state in self._states.items():
            n = Llama.longest_token_prefix(key, tokens)
            if n and (found is None or n > found[2]):
                found = (key, state, n)
        if found is not None:
            self._states.move_to_end(found[0])
        return found

    def put(self, tokens: Sequence[int], state: bytearray) -> None:
        from llama_cpp import Llama

        key = tuple(tokens)
        for old in [k for k in self._states if Llama.longest_token_prefix(k, key) >= min(len(k), len(key)) - 16]:
            self._bytes -= len(self._states.pop(old))
        if len(state) > self.capacity:
            return
        self._states[key] = state
        self._bytes += len(state)
        while self._bytes > self.capacity:
            _, dropped = self._states.popitem(last=False)
            self._bytes -= len(dropped)


def _check_settings(*, n_ctx: int, n_batch: int, batch_width: int, n_threads: int | None, extra_buffers: str,
                    prefix_cache_mb: int, draft_fill: int) -> None:
    """Refuse a :class:`LlamaCppLLM` setting out of range, before the model is resolved or loaded."""
    if n_ctx < 256:
        raise ConfigError(f"n_ctx must be >= 256, got {n_ctx}")
    if n_batch < 1:
        raise ConfigError(f"n_batch must be >= 1, got {n_batch}")
    if batch_width < 1:
        raise ConfigError(f"batch_width must be >= 1, got {batch_width}")
    if n_threads is not None and n_threads < 1:
        raise ConfigError(f"n_threads must be >= 1 or None (the free usable cores), got {n_threads}")
    from opro.llm.probe import EXTRA_BUFFERS

    if extra_buffers not in EXTRA_BUFFERS:
        raise ConfigError(f"extra_buffers must be one of {', '.join(EXTRA_BUFFERS)}, got {extra_buffers!r}")
    if prefix_cache_mb < 0:
        raise ConfigError(f"prefix_cache_mb must be >= 0 (0: off), got {prefix_cache_mb}")
    if draft_fill < 0:
        raise ConfigError(f"draft_fill must be >= 0 (0 or 1: off), got {draft_fill}")


class LlamaCppLLM(LLM):
    """Chat completions from a local GGUF model."""

    provider = "llamacpp"
    max_concurrency = 1
    supports_json_schema = True
    supports_choice_logprobs = True
    supports_batch = True

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str],
        n_threads: int | None = None,
        n_ctx: int = 4096,
        n_batch: int = 512,
        verbose: bool = False,
        logprobs: bool = False,
        kv_reuse: bool = True,
        batch_width: int = 4,
        prefix_cache_mb: int = 512,
        draft_fill: int = 4,
        extra_buffers: str = "auto",
        probe: bool = True,
        cpu: CpuShare | None = None,
    ) -> None:
        """``model_path``: an embedded model name (assembled on demand) or a path to a GGUF file.

        ``logprobs=True`` makes llama.cpp keep the logits of every position (``logits_all``):
        needed for ``top_logprobs``, but it costs ``n_ctx * vocab * 4`` bytes of memory (about
        2.5 GB for Qwen2.5 at n_ctx 4096, committed only for evaluated positions) and some
        prefill speed, so it is off by default.

        ``kv_reuse=False`` evaluates every prompt from scratch. With reuse on (the default, much
        faster for prompts sharing a prefix) the logits can differ in the last bits from a cold
        evaluation, so a *sampled* (temperature > 0) reply may depend on the previous call; the
        call cache, not the seed, is what makes reruns reproduce. Greedy replies are stable in
        practice.

        ``prefix_cache_mb``: memory for saved KV prefixes (see the module notes; 0 turns them off).
        A state costs the model's KV bytes per token (about 12 KB for the 0.5B embedded model and
        28 KB for the 1.5B one), so a 700-token context takes 8 to 20 MB.

        ``draft_fill``: a batched decode step of 2 or more answers is filled up to a multiple of this
        many tokens with drafted tokens that greedy decoding then keeps or drops (:meth:`_drafts`);
        0 or 1 turns drafting off.

        ``n_threads``: llama.cpp's threads (prefill and decode); None takes, at every call, the cores
        this process may use that other processes leave free, shared with the other models of ``cpu``
        computing at that moment (one :class:`CpuShare` per pool).

        ``extra_buffers``: llama.cpp's extra buffer types (AMX, repacked weights): "auto" probes them
        in a child process at the first load on a machine and falls back to plain buffers where they
        crash; "on" / "off" force either (probed too). ``probe=False`` loads without the probe (the
        probe's own child does).
        """
        _check_settings(n_ctx=n_ctx, n_batch=n_batch, batch_width=batch_width, n_threads=n_threads,
                        extra_buffers=extra_buffers, prefix_cache_mb=prefix_cache_mb, draft_fill=draft_fill)
        name = os.fspath(model_path)
        self.path: Path = resolve_model_path(name)
        self._model = name if name in EMBEDDED_MODELS else self.path.stem
        pack = EMBEDDED_MODELS.get(name)
        self.sha256 = pack.sha256 if pack is not None else gguf_sha256(self.path)
        self.n_threads = n_threads  # None: chosen at every call (self.cpu)
        self.cpu = cpu or CpuShare()
        self.extra_buffers = extra_buffers
        self.probe = probe
        self.probed: ProbeResult | None = None  # what the model was loaded under (None: not probed)
        self._threads_now = 0
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.verbose = verbose
        self.supports_logprobs = logprobs
        self.kv_reuse = kv_reuse
        self.batch_width = batch_width
        self.prefix_cache_mb = prefix_cache_mb
        self.draft_fill = draft_fill
        self.drafted = 0  # drafted tokens fed to batched steps, and those greedy decoding kept
        self.draft_hits = 0
        self._saved = _SavedPrefixes(prefix_cache_mb * 2**20)
        self._lock = threading.Lock()
        self._llama: Llama | None = None
        self._formatter: Any = None
        self.load_s: float | None = None

    # -- identity ------------------------------------------------------------------------------

    @property
    def model(self) -> str:
        return self._model

    @property
    def identity(self) -> str:
        return f"llamacpp:{self.sha256}"

    def describe(self) -> dict[str, str]:
        return {
            "provider": self.provider,
            "model": self._model,
            "path": str(self.path),
            "sha256": self.sha256,
            "n_ctx": str(self.n_ctx),
            "n_threads": str(self.n_threads or "auto"),
            "extra_buffers": self.extra_buffers,
        }

    def __repr__(self) -> str:
        return f"LlamaCppLLM(model={self._model!r}, n_ctx={self.n_ctx}, n_threads={self.n_threads or 'auto'})"

    # -- loading -------------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._llama is not None

    def load(self) -> Llama:
        """Load the model now (otherwise the first call does)."""
        with self._lock:
            return self._load_locked()

    def _load_locked(self) -> Llama:
        if self._llama is None:
            llama_cpp = _import_llama()
            mode = self.extra_buffers
            if self.probe:
                from opro.llm.probe import choose_extra_buffers

                self.probed = choose_extra_buffers(self.path, self.sha256, self.extra_buffers)
                mode = self.probed.mode
            started = time.perf_counter()
            threads = self.n_threads or self.cpu.choose().n_threads
            try:
                with _extra_buffers(llama_cpp, mode):
                    self._llama = llama_cpp.Llama(
                        model_path=str(self.path),
                        n_ctx=self.n_ctx,
                        n_batch=self.n_batch,
                        n_threads=threads,
                        n_threads_batch=threads,
                        logits_all=self.supports_logprobs,
                        verbose=self.verbose,
                    )
            except (ValueError, RuntimeError, OSError) as exc:
                raise ModelPackError(f"llama.cpp cannot load {self.path}: {exc}") from exc
            self._threads_now = threads
            if self.batch_width > 1:
                self._multi_sequence_context(self._llama)
            self.load_s = time.perf_counter() - started
        return self._llama

    def _multi_sequence_context(self, llama: Llama) -> None:
        """Give the model a context that holds ``batch_width + 1`` sequences in one KV cache.

        ``Llama`` creates its context with one sequence and no way to ask for more, so the context is
        created again from the same parameters (a unified KV cache: a split one would give each
        sequence n_ctx / n_seq cells, too few for a long shared prefix).
        """
        from llama_cpp import _internals

        params = llama.context_params
        params.n_seq_max = self.batch_width + 1
        params.kv_unified = True
        try:
            ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=self.verbose)
        except (ValueError, RuntimeError) as exc:
            raise ModelPackError(f"llama.cpp cannot create a {self.batch_width}-sequence context: {exc}") from exc
        old = llama._ctx
        llama._ctx = llama._stack.enter_context(contextlib.closing(ctx))
        old.close()
        llama.n_tokens = 0

    @contextlib.contextmanager
    def _computing(self) -> Iterator[Llama]:
        """The loaded model, locked, with this moment's thread count set (a cheap call where it changes)."""
        with self._lock:
            llama = self._load_locked()
            with self.cpu.threads(self.n_threads) as n:
                if n != self._threads_now:
                    import llama_cpp

                    llama_cpp.llama_set_n_threads(llama._ctx.ctx, n, n)
                    self._threads_now = n
                yield llama

    @property
    def threads_now(self) -> int:
        """The threads of the last computation (0: not loaded yet)."""
        return self._threads_now

    def prompt_tokens(self, messages: tuple[Message, ...], *, prefix: str = "") -> list[int]:
        """The token ids a call evaluates: the chat rendered with the GGUF's template (plus an
        assistant ``prefix``, as :meth:`choice_logprobs` appends). Loads the model."""
        with self._lock:
            llama = self._load_locked()
            return self._prompt_tokens_locked(llama, messages, prefix)

    def _prompt_tokens_locked(self, llama: Llama, messages: tuple[Message, ...], prefix: str = "") -> list[int]:
        # Tokenized as the chat handler does (the template adds its special tokens itself).
        return list(llama.tokenize((self._render(llama, messages) + prefix).encode("utf-8"), add_bos=False, special=True))

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in this model's vocabulary (loads the model)."""
        with self._lock:
            llama = self._load_locked()
            return len(llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    # -- calls ---------------------------------------------------------------------------------

    def _kwargs(self, messages: tuple[Message, ...], options: GenerationOptions) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "temperature": options.temperature,
            "max_tokens": options.max_tokens,
            "stop": list(options.stop) or None,
        }
        if options.seed is not None:
            kwargs["seed"] = options.seed
        schema = options.schema()
        if schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
        if options.top_logprobs and self.supports_logprobs:
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = options.top_logprobs
        return kwargs

    def _error(self, exc: BaseException) -> LLMError:
        where: dict[str, Any] = {"model": self._model, "provider": self.provider}
        text = str(exc)
        m = _OVERFLOW.search(text)
        if m:
            return LLMBadRequestError(
                f"the prompt has {m.group(1)} tokens but the context window (n_ctx) is {m.group(2)}; "
                "shorten the prompt (fewer or smaller retrieved chunks) or raise n_ctx",
                **where,
            )
        if isinstance(exc, ValueError | TypeError | KeyError):
            return LLMBadRequestError(f"llama.cpp rejected the request: {type(exc).__name__}: {text}", **where)
        return LLMError(f"llama.cpp failed: {type(exc).__name__}: {text}", **where)

    def generate(self, messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
        kwargs = self._kwargs(messages, options)
        with self._computing() as llama:
            if not self.kv_reuse:
                llama.reset()
            started = time.perf_counter()
            try:
                # A greedy call alone (a step with one candidate) keeps its prompt's state too: the
                # next step's candidates of the same question start from its retrieved context.
                tokens = self._state_tokens(llama, messages) if self._keeps_states(options) else None
                if tokens is not None and len(tokens) >= self.n_ctx:
                    tokens = None  # create_chat_completion says why
                keep = self._start_from_saved(llama, tokens) if tokens is not None else 0
                response: Any = llama.create_chat_completion(**kwargs)
                if tokens is not None and list(llama.input_ids[: len(tokens)]) == tokens:
                    self._save(llama, tokens, keep, truncate=True)
            except Exception as exc:
                raise self._error(exc) from exc
            latency = time.perf_counter() - started
        choice = response["choices"][0]
        usage = response.get("usage") or {}
        top: tuple[dict[str, float], ...] | None = None
        content = (choice.get("logprobs") or {}).get("content") if options.top_logprobs else None
        if content:
            top = tuple(
                {alt["token"]: float(alt["logprob"]) for alt in (tok.get("top_logprobs") or [])} for tok in content
            )
        return Completion(
            text=choice["message"].get("content") or "",
            model=self._model,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            latency_s=latency,
            top_logprobs=top,
            finish_reason=choice.get("finish_reason"),
        )

    def _render(self, llama: Llama, messages: tuple[Message, ...]) -> str:
        """The prompt text ``create_chat_completion`` would build: the GGUF's own chat template."""
        if self._formatter is None:
            template = llama.metadata.get("tokenizer.chat_template")
            if not template:
                raise LLMBadRequestError(
                    f"{self.path.name} carries no chat template (tokenizer.chat_template), so its prompt cannot "
                    "be rendered for logit scoring; use a judge that generates its score",
                    model=self._model,
                    provider=self.provider,
                )
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            def text(token: int) -> str:
                return llama._model.token_get_text(token) if token != -1 else ""

            self._formatter = Jinja2ChatFormatter(
                template=template, eos_token=text(llama.token_eos()), bos_token=text(llama.token_bos())
            )
        prompt: str = self._formatter(messages=[{"role": m.role, "content": m.content} for m in messages]).prompt
        return prompt

    def _choice_tokens(self, llama: Llama, choices: tuple[str, ...]) -> list[int]:
        ids: list[int] = []
        for choice in choices:
            tokens = llama.tokenize(choice.encode("utf-8"), add_bos=False, special=False)
            if len(tokens) != 1:
                raise LLMBadRequestError(
                    f"choice {choice!r} is {len(tokens)} tokens in {self._model}'s vocabulary; logit scoring "
                    "needs single-token choices (such as the digits 1..5)",
                    model=self._model,
                    provider=self.provider,
                )
            ids.append(tokens[0])
        return ids

    def choice_logprobs(self, messages: tuple[Message, ...], *, prefix: str, choices: tuple[str, ...]) -> Completion:
        import numpy as np

        if not choices:
            raise LLMBadRequestError("choice_logprobs needs at least one choice", model=self._model, provider=self.provider)
        with self._computing() as llama:
            started = time.perf_counter()
            try:
                tokens = self._prompt_tokens_locked(llama, messages, prefix)
                if len(tokens) > self.n_ctx:
                    raise ValueError(f"Requested tokens ({len(tokens)}) exceed context window of {self.n_ctx}")
                ids = self._choice_tokens(llama, choices)
                # KV-prefix reuse as in Llama.generate: keep the evaluated tokens this prompt shares
                # (at least one token is evaluated so the last position's logits are fresh).
                keep = 0
                if self.kv_reuse:
                    # Where this prompt leaves the previous one is a prefix two prompts share (a judge
                    # prompt up to the answer): worth keeping for the same question's next step.
                    keep = self._start_from_saved(llama, tokens, keep_shared=True)
                llama.n_tokens = keep
                llama.eval(tokens[keep:])
                # Without logits_all llama.cpp keeps the logits of the batch's last position only.
                logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(-1), shape=(llama.n_vocab(),))
                logits = logits.astype(np.float64)
                top = float(logits.max())
                log_norm = top + float(np.log(np.exp(logits - top).sum()))
            except LLMError:
                raise
            except Exception as exc:
                raise self._error(exc) from exc
            latency = time.perf_counter() - started
        logprobs = {choice: float(logits[i]) - log_norm for choice, i in zip(choices, ids, strict=True)}
        return Completion(
            text=max(logprobs, key=lambda c: logprobs[c]),
            model=self._model,
            prompt_tokens=len(tokens),
            completion_tokens=0,
            latency_s=latency,
            top_logprobs=(logprobs,),
            finish_reason="choices",
        )

    # -- batched generation ------------------------------------------------------------------------

    @staticmethod
    def _batchable(options: GenerationOptions) -> bool:
        return options.temperature == 0.0 and options.json_schema is None and not options.top_logprobs

    def generate_many(
        self, calls: Sequence[tuple[tuple[Message, ...], GenerationOptions]]
    ) -> list[Completion | LLMError]:
        """Several calls; greedy plain-text calls are decoded together, ``batch_width`` at a time
        (the others, and every call when ``batch_width`` is 1, one after another)."""
        out: list[Completion | LLMError | None] = [None] * len(calls)
        group = [i for i, (_, options) in enumerate(calls) if self._batchable(options)]
        if self.batch_width < 2 or len(group) < 2 or not self.kv_reuse:
            group = []
        for i, result in zip(group, self._generate_batched([calls[i] for i in group]), strict=True):
            out[i] = result
        for i, (messages, options) in enumerate(calls):
            if out[i] is None:
                try:
                    out[i] = self.generate(messages, options)
                except LLMError as exc:
                    out[i] = exc
        return [r for r in out if r is not None]

    def _generate_batched(
        self, calls: Sequence[tuple[tuple[Message, ...], GenerationOptions]]
    ) -> list[Completion | LLMError]:
        results: list[Completion | LLMError | None] = [None] * len(calls)
        with self._computing() as llama:
            seqs: list[_Seq] = []
            for i, (messages, options) in enumerate(calls):
                try:
                    tokens = self._prompt_tokens_locked(llama, messages)
                    if len(tokens) >= self.n_ctx:
                        raise ValueError(f"Requested tokens ({len(tokens)}) exceed context window of {self.n_ctx}")
                except LLMError as exc:
                    results[i] = exc
                    continue
                except Exception as exc:
                    results[i] = self._error(exc)
                    continue
                # As create_completion: max_tokens cut to what the context leaves; the template's
                # end-of-turn text is a stop string too.
                max_tokens = options.max_tokens if options.max_tokens > 0 else self.n_ctx - len(tokens)
                max_tokens = min(max_tokens, self.n_ctx - len(tokens))
                stops = [s.encode("utf-8") for s in (*options.stop, *self._template_stops(llama))]
                seqs.append(_Seq(index=i, prompt=tokens, max_tokens=max_tokens, stops=stops))
            for group in self._groups(seqs):
                started = time.perf_counter()
                try:
                    self._decode_group(llama, group)
                except Exception as exc:
                    error = self._error(exc)
                    for seq in group:
                        results[seq.index] = error
                    continue
                share = (time.perf_counter() - started) / len(group)
                for seq in group:
                    results[seq.index] = Completion(
                        text=seq.text.decode("utf-8", errors="ignore"),
                        model=self._model,
                        prompt_tokens=len(seq.prompt),
                        completion_tokens=len(seq.tokens),
                        latency_s=share,
                        finish_reason=seq.finish,
                    )
        return [r for r in results if r is not None]

    #: Fewer new tokens than this are not worth a saved state (copying one costs milliseconds).
    _MIN_SAVED = 64

    def _keeps_states(self, options: GenerationOptions) -> bool:
        return self.kv_reuse and self._saved.capacity > 0 and self._batchable(options)

    def _state_tokens(self, llama: Llama, messages: tuple[Message, ...]) -> list[int] | None:
        """The prompt's tokens as saved states are keyed, or None where this model's GGUF cannot
        render them (``create_chat_completion`` then uses its own chat handler, without saved states)."""
        try:
            return self._prompt_tokens_locked(llama, messages)
        except LLMError:
            return None

    def _start_from_saved(self, llama: Llama, tokens: list[int], *, keep_shared: bool = False) -> int:
        """Before one prompt is evaluated alone: sequence 0 starts from the saved state that shares the
        most of ``tokens`` (when that beats what the context holds; at least the last token is left to
        evaluate); the tokens it holds. ``keep_shared``: first save what ``tokens`` shares with the
        prompt the context holds."""
        keep = min(llama.longest_token_prefix(llama._input_ids.tolist(), tokens), len(tokens) - 1)
        if keep_shared:
            self._save(llama, tokens[:keep], 0, truncate=True)
        keep = self._restore(llama, tokens, keep, limit=len(tokens) - 1)
        llama._ctx.kv_cache_seq_rm(0, keep, -1)
        llama.n_tokens = keep
        return keep

    def _restore(self, llama: Llama, tokens: Sequence[int], keep: int, *, limit: int) -> int:
        """Start sequence 0 from the saved state sharing the most of ``tokens`` (at most ``limit``)
        when that is clearly more than the ``keep`` tokens the context holds; the tokens it holds now."""
        import ctypes

        import llama_cpp

        found = self._saved.best(tokens) if self._saved.capacity else None
        if found is None:
            return keep
        key, state, shared = found
        shared = min(shared, limit)
        if shared < keep + self._MIN_SAVED // 2:
            return keep
        mem = llama_cpp.llama_get_memory(llama._ctx.ctx)
        llama_cpp.llama_memory_seq_rm(mem, 0, -1, -1)
        data = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if llama_cpp.llama_state_seq_set_data(llama._ctx.ctx, data, len(state), 0) == 0:
            llama_cpp.llama_memory_seq_rm(mem, 0, -1, -1)  # a state that does not load: prefill instead
            return 0
        llama._ctx.kv_cache_seq_rm(0, shared, -1)
        llama.input_ids[:shared] = key[:shared]
        self._saved.hits += 1
        self._saved.restored_tokens += shared - keep
        return shared

    def _save(self, llama: Llama, tokens: Sequence[int], keep: int, *, truncate: bool = False) -> None:
        """Keep the state of sequence 0, which holds ``tokens`` (``truncate``: and more, dropped
        first), when at least ``_MIN_SAVED`` of them were prefilled after the ``keep`` it started from
        and no saved state holds them already."""
        import ctypes

        import llama_cpp

        if not self._saved.capacity or len(tokens) - keep < self._MIN_SAVED:
            return
        found = self._saved.best(tokens)
        if found is not None and found[2] >= len(tokens):
            return
        if truncate:
            llama._ctx.kv_cache_seq_rm(0, len(tokens), -1)
            llama.n_tokens = len(tokens)
        size = llama_cpp.llama_state_seq_get_size(llama._ctx.ctx, 0)
        state = bytearray(size)
        buffer = (ctypes.c_uint8 * size).from_buffer(state)
        if llama_cpp.llama_state_seq_get_data(llama._ctx.ctx, buffer, size, 0) == size:
            self._saved.put(tokens, state)

    def _template_stops(self, llama: Llama) -> list[str]:
        if self._formatter is None:
            self._render(llama, (Message("user", ""),))
        stop = self._formatter(messages=[{"role": "user", "content": ""}]).stop
        return [] if stop is None else [stop] if isinstance(stop, str) else list(stop)

    def _groups(self, seqs: list[_Seq]) -> list[list[_Seq]]:
        """At most ``batch_width`` sequences whose prompts and replies fit the KV cache together."""
        groups: list[list[_Seq]] = []
        current: list[_Seq] = []
        for seq in seqs:
            trial = [*current, seq]
            prefix = _common_prefix([s.prompt for s in trial])
            # A sequence's drafted tokens take cells past its answer for one step.
            need = prefix + sum(len(s.prompt) - prefix + s.max_tokens + self.draft_fill for s in trial)
            if current and (len(trial) > self.batch_width or need > self.n_ctx):
                groups.append(current)
                trial = [seq]
            current = trial
        if current:
            groups.append(current)
        return groups

    def _decode_group(self, llama: Llama, group: list[_Seq]) -> None:
        """Greedy decoding of ``group`` with a shared prefix, the stop rules of ``create_completion``."""
        import llama_cpp

        mem = llama_cpp.llama_get_memory(llama._ctx.ctx)
        prefix = self._share_prefix(llama, group, mem)
        vocab = llama._model.vocab
        n_vocab = llama.n_vocab()
        capacity = max(self.n_batch, len(group))
        batch = llama_cpp.llama_batch_init(capacity, 0, 1)
        try:
            live = self._decode_tails(llama, batch, group, prefix=prefix, capacity=capacity, vocab=vocab,
                                      n_vocab=n_vocab)
            # Then one step per decode: each live sequence's last token, plus drafted tokens when the
            # step would hold fewer than a multiple of ``draft_fill`` tokens (see _drafts).
            while live:
                live = self._decode_step(llama, batch, group, live, mem=mem, vocab=vocab, n_vocab=n_vocab)
        finally:
            llama_cpp.llama_batch_free(batch)
            for seq_id in range(1, self.batch_width + 1):
                llama_cpp.llama_memory_seq_rm(mem, seq_id, -1, -1)
        # What sequence 0 holds now is the shared prefix: the next call can reuse it.
        llama._ctx.kv_cache_seq_rm(0, prefix, -1)
        llama.input_ids[:prefix] = group[0].prompt[:prefix]
        llama.n_tokens = prefix

    def _share_prefix(self, llama: Llama, group: list[_Seq], mem: Any) -> int:
        """Sequence 0 holds the prefix the group's prompts share (what the context kept of it, a saved
        state, then prefill), and sequence j + 1 a copy of it for answer j; returns the prefix's
        length (the shortest prompt's last token left out: its logits start that answer)."""
        import llama_cpp

        prefix = min(_common_prefix([s.prompt for s in group]), min(len(s.prompt) for s in group) - 1)
        # Sequence 0 keeps what the previous call left that this prefix shares (KV-prefix reuse).
        keep = min(llama.longest_token_prefix(llama._input_ids[: llama.n_tokens].tolist(), group[0].prompt), prefix)
        for seq_id in range(1, self.batch_width + 1):
            llama_cpp.llama_memory_seq_rm(mem, seq_id, -1, -1)
        keep = self._restore(llama, group[0].prompt, keep, limit=prefix)
        llama.n_tokens = keep
        if prefix > keep:
            llama.eval(group[0].prompt[keep:prefix])  # on sequence 0, n_batch tokens per decode
            self._save(llama, group[0].prompt[:prefix], keep)
        else:
            llama._ctx.kv_cache_seq_rm(0, prefix, -1)
        # Sequence j + 1 gets a copy of the prefix's cells (shared, not duplicated, in a unified cache).
        for j in range(len(group)):
            llama_cpp.llama_memory_seq_cp(mem, 0, j + 1, -1, -1)
        return prefix

    def _decode_tails(self, llama: Llama, batch: Any, group: list[_Seq], *, prefix: int, capacity: int,
                      vocab: Any, n_vocab: int) -> list[int]:
        """The prompts' tails after the prefix, as many per decode as the batch holds; the logits at each
        sequence's last token give its first answer token. Returns the positions in ``group`` of the
        answers still going."""
        import numpy as np

        pending = [(j, s.prompt[prefix:], prefix) for j, s in enumerate(group)]
        live: list[int] = []
        while pending:
            rows = _fill(batch, pending, capacity)  # what did not fit stays in pending
            self._decode(llama, batch)
            for j, row in rows:
                seq = group[j]
                logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(row), shape=(n_vocab,))
                if self._step(llama, vocab, seq, int(np.argmax(logits))):
                    live.append(j)
        return live

    def _decode_step(self, llama: Llama, batch: Any, group: list[_Seq], live: list[int], *, mem: Any,
                     vocab: Any, n_vocab: int) -> list[int]:
        """One decode of each live answer's last token and its drafts (:meth:`_drafts`), the drafts
        checked greedily; returns the positions in ``group`` of the answers still going."""
        import llama_cpp
        import numpy as np

        # (sequence, position of its last token, drafts after it)
        runs = [
            (j, len(group[j].prompt) + len(group[j].tokens) - 1, drafts)
            for j, drafts in zip(live, self._drafts([group[j] for j in live]), strict=True)
        ]
        n = 0
        for j, pos, drafts in runs:
            for k, token in enumerate([group[j].tokens[-1], *drafts]):
                _put(batch, n, token=token, pos=pos + k, seq_id=j + 1, logits=True)
                n += 1
        batch.n_tokens = n
        self._decode(llama, batch)
        row = 0
        still: list[int] = []
        for j, pos, drafts in runs:
            seq = group[j]
            # Greedy verification: a drafted token stands only where it is the arg-max after
            # the tokens before it, so the answer is the one decoded token by token.
            accepted = 0
            while True:
                logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(row + accepted), shape=(n_vocab,))
                token = int(np.argmax(logits))
                going = self._step(llama, vocab, seq, token)
                if not going or accepted == len(drafts) or drafts[accepted] != token:
                    break
                accepted += 1
            self.drafted += len(drafts)
            self.draft_hits += accepted
            if going:
                still.append(j)
                # Cells of the drafts that were not taken go; the new last token is fed next step.
                llama_cpp.llama_memory_seq_rm(mem, j + 1, pos + accepted + 1, -1)
            row += 1 + len(drafts)
        return still

    @staticmethod
    def _decode(llama: Llama, batch: Any) -> None:
        import llama_cpp

        if llama_cpp.llama_decode(llama._ctx.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed (the KV cache may be full: lower batch_width or raise n_ctx)")

    def _drafts(self, live: list[_Seq]) -> list[list[int]]:
        """Tokens to try after each live sequence's last one this step (prompt lookup decoding).

        On a CPU llama.cpp multiplies the weights by 4 token columns at a time (and by fewer one column
        at a time), so a step of 3 tokens costs about what one of 4 costs, and one of 2 twice one of 1.
        Such steps are filled up to a multiple of ``draft_fill`` tokens with guesses: what followed the
        latest earlier occurrence of the sequence's last 3 (else 2, else 1) tokens in its prompt and
        answer. A guess costs nearly nothing and is kept only where greedy decoding would have chosen
        it. A sequence decoding alone is not filled: one token is the cheapest step there is.
        """
        drafts: list[list[int]] = [[] for _ in live]
        if self.draft_fill < 2 or len(live) < 2:
            return drafts
        # At most what one llama_decode takes (n_batch tokens).
        need = max(0, min(-len(live) % self.draft_fill, self.n_batch - len(live)))
        guesses = [_lookup(seq.prompt + seq.tokens, need) for seq in live]
        while need:
            grown = False
            for guess, draft in zip(guesses, drafts, strict=True):
                if need and len(draft) < len(guess):
                    draft.append(guess[len(draft)])
                    need -= 1
                    grown = True
            if not grown:
                break
        return drafts

    @staticmethod
    def _step(llama: Llama, vocab: Any, seq: _Seq, token: int) -> bool:
        """Take ``token`` as create_completion does; False once the sequence is finished."""
        import llama_cpp

        if llama_cpp.llama_vocab_is_eog(vocab, token):
            seq.text = llama.detokenize(seq.tokens, prev_tokens=seq.prompt)
            seq.finish = "stop"
            return False
        seq.tokens.append(token)
        all_text = llama.detokenize(seq.tokens, prev_tokens=seq.prompt)
        # An incomplete UTF-8 character is neither a stop nor the end (create_completion's rule).
        for k, char in enumerate(all_text[-3:]):
            k = 3 - k
            for num, pattern in ((2, 192), (3, 224), (4, 240)):
                if num > k and pattern & char == pattern:
                    seq.multibyte_fix = num - k
        if seq.multibyte_fix > 0:
            seq.multibyte_fix -= 1
            return True
        hits = [s for s in seq.stops if s in all_text]
        if hits:
            seq.text = all_text[: all_text.index(hits[0])]
            seq.finish = "stop"
            return False
        if len(seq.tokens) >= seq.max_tokens:
            seq.text = all_text
            seq.finish = "length"
            return False
        return True

    def close(self) -> None:
        with self._lock:
            if self._llama is not None:
                self._llama.close()
                self._llama = None
                self._formatter = None


#: llama-cpp-python's ``Llama`` builds its model parameters inside its constructor and ignores keywords it
#: does not know, so ``use_extra_bufts`` is set on the parameters as they reach the model's loader.
_LOADER_LOCK = threading.Lock()


@contextlib.contextmanager
def _extra_buffers(llama_cpp: Any, mode: str) -> Iterator[None]:
    """While a ``Llama`` is constructed in this block, its model loads with extra buffers ``mode``
    ("on" / "off"; "auto" leaves llama.cpp's default). The parameters keep the value, so
    ``llama.model_params.use_extra_bufts`` reads it back."""
    from opro.llm.probe import supports_extra_buffers_switch

    if mode == "auto" or not supports_extra_buffers_switch():
        if mode == "off":
            raise ModelPackError(
                f"llama-cpp-python {llama_cpp.__version__} has no switch for extra buffer types "
                "(model parameter use_extra_bufts); upgrade it, or set extra_buffers = \"auto\""
            )
        yield
        return
    internals = llama_cpp._internals
    with _LOADER_LOCK:
        real = internals.LlamaModel

        def loader(*args: Any, **kwargs: Any) -> Any:
            params = kwargs["params"] if "params" in kwargs else args[1]
            params.use_extra_bufts = mode == "on"
            return real(*args, **kwargs)

        internals.LlamaModel = loader
        try:
            yield
        finally:
            internals.LlamaModel = real


def _fill(batch: Any, pending: list[tuple[int, list[int], int]], capacity: int) -> list[tuple[int, int]]:
    """Put the pending (sequence, tokens, first position) runs into ``batch``, up to ``capacity``
    tokens; what does not fit stays in ``pending`` for the next decode. Returns (sequence, batch
    row) of each run that ended in this batch: its last token's logits are computed."""
    n = 0
    rows: list[tuple[int, int]] = []
    rest: list[tuple[int, list[int], int]] = []
    for j, tokens, pos in pending:
        take = tokens[: capacity - n]
        for k, token in enumerate(take):
            _put(batch, n, token=token, pos=pos + k, seq_id=j + 1, logits=False)
            n += 1
        if len(take) < len(tokens):
            rest.append((j, tokens[len(take) :], pos + len(take)))
        else:
            batch.logits[n - 1] = True
            rows.append((j, n - 1))
    batch.n_tokens = n
    pending[:] = rest
    return rows


def _put(batch: Any, row: int, *, token: int, pos: int, seq_id: int, logits: bool) -> None:
    """Row ``row`` of a llama_batch: ``token`` at ``pos`` of one sequence, logits computed or not."""
    batch.token[row] = token
    batch.pos[row] = pos
    batch.n_seq_id[row] = 1
    batch.seq_id[row][0] = seq_id
    batch.logits[row] = logits


def _lookup(tokens: Sequence[int], size: int) -> list[int]:
    """Up to ``size`` tokens that followed the latest earlier occurrence of the last 3 (else 2, else 1)
    of ``tokens``: an answer that quotes its context continues as the context did."""
    for n in (3, 2, 1):
        if len(tokens) <= n:
            continue
        tail = list(tokens[-n:])
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i] == tail[0] and list(tokens[i : i + n]) == tail:
                return list(tokens[i + n : i + n + size])
    return []


def _common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix all ``prompts`` share."""
    if not prompts:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        token = first[i]
        if any(p[i] != token for p in prompts[1:]):
            return i
    return n


__all__ = ["LlamaCppLLM"]
