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
- Drafted tokens (``draft_fill``) fill a batch's decode steps with guesses greedy decoding keeps
  or drops (:mod:`opro.llm.llamacpp_batch`, which says why).
- Saved prefixes (``prefix_cache_mb``): a shared prefix's KV state is kept and restored
  (:mod:`opro.llm.llamacpp_prefixes`, which says when).
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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import LLMBadRequestError, LLMError, ModelPackError
from opro.llm.client import LLM, Completion, GenerationOptions, Message
from opro.llm.cpu import CpuShare
from opro.llm.llamacpp_batch import (
    Seq,
    common_prefix,
    decode,
    draft_tokens,
    fill_batch,
    groups,
    put_token,
    take_token,
)
from opro.llm.llamacpp_loading import check_settings, extra_buffers, import_llama
from opro.llm.llamacpp_prefixes import SavedPrefixes
from opro.llm.packs import EMBEDDED_MODELS, gguf_sha256
from opro.llm.packs import model_path as resolve_model_path

if TYPE_CHECKING:
    from llama_cpp import Llama

    from opro.llm.probe import ProbeResult

_OVERFLOW = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


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
        many tokens with drafted tokens that greedy decoding then keeps or drops (:func:`~opro.llm.llamacpp_batch.draft_tokens`);
        0 or 1 turns drafting off.

        ``n_threads``: llama.cpp's threads (prefill and decode); None takes, at every call, the cores
        this process may use that other processes leave free, shared with the other models of ``cpu``
        computing at that moment (one :class:`CpuShare` per pool).

        ``extra_buffers``: llama.cpp's extra buffer types (AMX, repacked weights): "auto" probes them
        in a child process at the first load on a machine and falls back to plain buffers where they
        crash; "on" / "off" force either (probed too). ``probe=False`` loads without the probe (the
        probe's own child does).
        """
        check_settings(n_ctx=n_ctx, n_batch=n_batch, batch_width=batch_width, n_threads=n_threads,
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
        self._saved = SavedPrefixes(prefix_cache_mb * 2**20)
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
            llama_cpp = import_llama()
            mode = self.extra_buffers
            if self.probe:
                from opro.llm.probe import choose_extra_buffers

                self.probed = choose_extra_buffers(self.path, self.sha256, self.extra_buffers)
                mode = self.probed.mode
            started = time.perf_counter()
            threads = self.n_threads or self.cpu.choose().n_threads
            try:
                with extra_buffers(llama_cpp, mode):
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
            seqs: list[Seq] = []
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
                seqs.append(Seq(index=i, prompt=tokens, max_tokens=max_tokens, stops=stops))
            for group in groups(seqs, width=self.batch_width, n_ctx=self.n_ctx, fill=self.draft_fill):
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

    def _decode_group(self, llama: Llama, group: list[Seq]) -> None:
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
            # step would hold fewer than a multiple of ``draft_fill`` tokens (see llamacpp_batch.draft_tokens).
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

    def _share_prefix(self, llama: Llama, group: list[Seq], mem: Any) -> int:
        """Sequence 0 holds the prefix the group's prompts share (what the context kept of it, a saved
        state, then prefill), and sequence j + 1 a copy of it for answer j; returns the prefix's
        length (the shortest prompt's last token left out: its logits start that answer)."""
        import llama_cpp

        prefix = min(common_prefix([s.prompt for s in group]), min(len(s.prompt) for s in group) - 1)
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

    def _decode_tails(self, llama: Llama, batch: Any, group: list[Seq], *, prefix: int, capacity: int,
                      vocab: Any, n_vocab: int) -> list[int]:
        """The prompts' tails after the prefix, as many per decode as the batch holds; the logits at each
        sequence's last token give its first answer token. Returns the positions in ``group`` of the
        answers still going."""
        import numpy as np

        pending = [(j, s.prompt[prefix:], prefix) for j, s in enumerate(group)]
        live: list[int] = []
        while pending:
            rows = fill_batch(batch, pending, capacity)  # what did not fit stays in pending
            decode(llama, batch)
            for j, row in rows:
                seq = group[j]
                logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(row), shape=(n_vocab,))
                if take_token(llama, vocab, seq, int(np.argmax(logits))):
                    live.append(j)
        return live

    def _decode_step(self, llama: Llama, batch: Any, group: list[Seq], live: list[int], *, mem: Any,
                     vocab: Any, n_vocab: int) -> list[int]:
        """One decode of each live answer's last token and its drafts (:func:`~opro.llm.llamacpp_batch.draft_tokens`), the drafts
        checked greedily; returns the positions in ``group`` of the answers still going."""
        import llama_cpp
        import numpy as np

        # (sequence, position of its last token, drafts after it)
        runs = [
            (j, len(group[j].prompt) + len(group[j].tokens) - 1, drafts)
            for j, drafts in zip(live, draft_tokens([group[j] for j in live], fill=self.draft_fill, n_batch=self.n_batch), strict=True)
        ]
        n = 0
        for j, pos, drafts in runs:
            for k, token in enumerate([group[j].tokens[-1], *drafts]):
                put_token(batch, n, token=token, pos=pos + k, seq_id=j + 1, logits=True)
                n += 1
        batch.n_tokens = n
        decode(llama, batch)
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
                going = take_token(llama, vocab, seq, token)
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

    def close(self) -> None:
        with self._lock:
            if self._llama is not None:
                self._llama.close()
                self._llama = None
                self._formatter = None


__all__ = ["LlamaCppLLM"]
